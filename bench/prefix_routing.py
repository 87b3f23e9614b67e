#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prefix-routing benchmark (issue 38 item 3, docs/fleet-benchmark.md "Which prefill policy"): the fleet benchmark's
prefix workload run against each router prefill policy side by side, on a 2 prefill + 2 decode simulated site.

What it does, in order:
  1. brings up one simulated site `narwhal-sim-prefix` with tests/harness/site.yml (the harness bench/day_two.py and
     molecule use): four engine hosts engine-1..4 (nvidia-8gpu-rdma, prefill on the odd ones, decode on the even
     ones) holding the stand-in image, and a router host router-1 (the real vllm-router image, group routers), on
     172.31.216.0/24 (management), 172.31.217.0/24 and fd00:6e77:e8::/64 (fabric). The engine hosts get the
     checkpoint tiny-llama-real (.cache/models/real/, made by scripts/build-images.sh real: a config the stand-in
     reads and a real tokenizer, which the load generator needs to turn random token IDs into text; the sim
     checkpoint tests/harness/models/tiny-llama has no tokenizer.json). The benchmark host engine-2 (the first
     decode engine) also gets the real engine image narwhal-sim/vllm-cpu:latest, whose `vllm bench serve` is the load
     generator (the stand-in has none), from the harness's image cache when it is there;
  2. writes the site's .env (the operator's file): the engines publish KV events (NARWHAL_KV_EVENTS=on), each spends
     --prefill-s-per-token seconds per prompt token it did not find in its prefix cache before its first token
     (NARWHAL_STANDIN_PREFILL_S_PER_TOK through NARWHAL_ENGINE_ENV, one prefill at a time per engine), --max-model-len
     in NARWHAL_EXTRA_ARGS, and
     the benchmark's inputs: NARWHAL_BENCH_WORKLOAD=prefix, the lengths, the loads, NARWHAL_BENCH_POLICIES and
     NARWHAL_BENCH_IMAGE; runs playbooks/site.yml once (untimed);
  3. runs playbooks/benchmark.yml: every policy's P/D router beside the fleet's, every policy at every load, each
     step with its own seed (no policy finds another's prefixes in the caches);
  4. copies the benchmark's runs/bench-<stamp>/ (bench.json, table.txt, latency.png, policies.png) to
     bench/results/prefix-routing-<stamp>/ with prefix-routing.json (what ran, how long) and logs/, prints the
     table, tears the site down (--keep keeps it; --down only tears down).

Usage: bench/prefix_routing.py [--policies round_robin,cache_aware,kv_aware] [--rates 2,8] [--concurrency 4]
                               [--prompts 24] [--prefixes 8] [--prefix-len 384] [--suffix-len 32] [--output-len 16]
                               [--prefill-s-per-token 0.002] [--max-model-len 512] [--keep] [--out DIR]
       bench/prefix_routing.py --down
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench  # noqa: E402 - bench/bench.py: the controller environment, timed commands, JSON writing

SITE = "narwhal-sim-prefix"
MGMT = "172.31.216"
FABRIC4 = "172.31.217"
FABRIC6 = "fd00:6e77:e8:"
PROFILE = "nvidia-8gpu-rdma"
IMAGE = bench.IMAGE                          # narwhal-sim/engine-standin:latest
ROUTER_IMAGE = bench.ROUTER_IMAGE
LOAD_IMAGE = "narwhal-sim/vllm-cpu:latest"   # the real engine image: the real `vllm bench serve`
CHECKPOINT = ".cache/models/real/tiny-llama-real"  # scripts/build-images.sh real (tests/harness/models/generate.py)
MODEL = "/srv/models/tiny-llama-real"        # where tests/harness/tasks/up.yml puts it on the engine hosts
ROUTER = "router-1"
ENGINES = 4                                  # engine-1..4: prefill on the odd ones, decode on the even ones
BENCH_HOST = "engine-2"                      # the first decode engine's host runs the load generator
STATE = os.path.join(ROOT, ".cache", SITE)   # tests/harness/site.yml's sim_dir: SSH key, inventory (hosts.yml)
POLICIES = "round_robin,cache_aware,kv_aware"

log = bench.log


def host(name):
    return "%s-%s" % (SITE, name)


def site_vars():
    """tests/harness/site.yml variables of this benchmark's site (bench.sim_site_vars)."""
    return bench.sim_site_vars(SITE, MGMT, FABRIC4, FABRIC6, ENGINES, [IMAGE], models=[CHECKPOINT], profile=PROFILE)


def harness(out, state="present"):
    bench.sim_site(out, site_vars(), state)


def image_cache_tar(image, image_id):
    """The harness's cache of `docker save` (tests/harness/tasks/up.yml): .cache/images/<name>.<id[:12]>.tar."""
    base = image.replace("/", "_").replace(":", "_")
    return os.path.join(ROOT, ".cache", "images", "%s.%s.tar" % (base, image_id.split(":", 1)[-1][:12]))


def load_image(name, image):
    """`image` into host `name`'s own daemon (unless it holds that image ID already): from the harness's cached
    `docker save` when there is one, else saved now (the real engine image: ~100 s)."""
    want = bench.sh(["docker", "image", "inspect", "-f", "{{.Id}}", image]).stdout.strip()
    have = bench.sh(["docker", "exec", host(name), "docker", "image", "inspect", "-f", "{{.Id}}", image],
                    check=False).stdout.strip()
    if want == have:
        return "present"
    tar = image_cache_tar(image, want)
    log("loading %s into %s%s" % (image, name, " from %s" % os.path.relpath(tar, ROOT) if os.path.isfile(tar) else ""))
    load = ["docker", "exec", "-i", host(name), "docker", "load"]
    if os.path.isfile(tar) and os.path.getsize(tar) > 0:
        with open(tar, "rb") as fh:
            subprocess.run(load, stdin=fh, stdout=subprocess.DEVNULL, check=True)
        return "loaded from the cache"
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    try:
        subprocess.run(load, stdin=save.stdout, stdout=subprocess.DEVNULL, check=True)
    finally:
        save.stdout.close()
        if save.wait() != 0:
            raise RuntimeError("docker save %s failed (rc %d)" % (image, save.returncode))
    return "loaded"


def env_values(args):
    """The site's .env: what an operator writes for this benchmark."""
    values = {
        "NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_BIND_FAMILY": "ipv4",
        "NARWHAL_FLEET": "%s/config/fleet.json" % STATE,
        "NARWHAL_LAUNCH_CONFIG": "%s/config/engine-launch.json" % STATE,
        "NARWHAL_CONFIG_DIR": "%s/config" % STATE, "NARWHAL_RUNS_DIR": "%s/runs" % STATE,
        "NARWHAL_TLS_DIR": "%s/tls" % STATE, "NARWHAL_API_KEY_FILE": "%s/engine-api.key" % STATE,
        "NARWHAL_IMAGE": IMAGE, "NARWHAL_MODEL_PATH": MODEL, "NARWHAL_ROUTER_IMAGE": ROUTER_IMAGE,
        # the engines publish their KV events (the kv_aware router subscribes to the prefill engines')
        "NARWHAL_KV_EVENTS": "on",
        # the stand-in's cost of a prompt token its prefix cache does not hold (tests/harness/images/engine-standin),
        # so that routing by cache shows in the time to first token
        "NARWHAL_ENGINE_ENV": "NARWHAL_STANDIN_PREFILL_S_PER_TOK=%s" % args.prefill_s_per_token,
        # (with KV events on, the planner gives every prefill engine --enable-scale-out: the render route kv_aware
        # asks for token IDs, _plan/container.py::kv_events)
        "NARWHAL_EXTRA_ARGS": "--max-model-len %d" % args.max_model_len,
        "NARWHAL_BENCH_WORKLOAD": "prefix",
        "NARWHAL_BENCH_POLICIES": ",".join(args.policies),
        "NARWHAL_BENCH_PREFIX_LEN": str(args.prefix_len), "NARWHAL_BENCH_SUFFIX_LEN": str(args.suffix_len),
        "NARWHAL_BENCH_OUTPUT_LEN": str(args.output_len), "NARWHAL_BENCH_PREFIXES": str(args.prefixes),
        "NARWHAL_BENCH_PROMPTS": str(args.prompts), "NARWHAL_BENCH_RATES": args.rates,
        "NARWHAL_BENCH_CONCURRENCY": str(args.concurrency), "NARWHAL_BENCH_IMAGE": LOAD_IMAGE,
    }
    for i in range(1, ENGINES + 1):
        values["NARWHAL_NODE_%d_ROLE" % i] = "prefill" if i % 2 else "decode"
    return values


def env_text(values):
    lines = ["# bench/prefix_routing.py: the prefix-routing site (%d engines, %s)" % (ENGINES, ROUTER)]
    lines += ["%s=%s" % (k, shlex.quote(v) if " " in v else v) for k, v in values.items()]
    return "\n".join(lines) + "\n"


def api_key():
    path = os.path.join(STATE, "engine-api.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(18).hex() + "\n")
    return path


def bench_runs():
    runs = os.path.join(STATE, "runs")
    return sorted(d for d in os.listdir(runs) if d.startswith("bench-")) if os.path.isdir(runs) else []


def keep(out, before):
    """The benchmark run's directory (the one that was not there before it) copied into `out`, and its bench.json."""
    new = [d for d in bench_runs() if d not in before]
    if not new:
        return None, None
    source = os.path.join(STATE, "runs", new[-1])
    for name in sorted(os.listdir(source)):
        shutil.copyfile(os.path.join(source, name), os.path.join(out, name))
    with open(os.path.join(source, "bench.json")) as fh:
        return source, json.load(fh)


def missing_prerequisites():
    """What the benchmark needs that is not here, with the command that makes it."""
    found = []
    if not os.path.isfile(os.path.join(ROOT, CHECKPOINT, "tokenizer.json")):
        found.append("%s (with its tokenizer): scripts/build-images.sh real" % CHECKPOINT)
    for image, how in ((IMAGE, "scripts/build-images.sh sim"), (ROUTER_IMAGE, "scripts/build-images.sh sim"),
                       (LOAD_IMAGE, "scripts/build-images.sh real")):
        if bench.sh(["docker", "image", "inspect", image], check=False).returncode != 0:
            found.append("the image %s: %s" % (image, how))
    return found


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--policies", default=POLICIES, help="router prefill policies side by side, comma-separated "
                        "(NARWHAL_BENCH_POLICIES; default %s; power_of_two may be added)" % POLICIES)
    parser.add_argument("--rates", default="2,8", help="request rates of the sweep (NARWHAL_BENCH_RATES, default 2,8)")
    parser.add_argument("--concurrency", type=int, default=4, help="the closed-loop step's max concurrency "
                        "(NARWHAL_BENCH_CONCURRENCY, default 4)")
    parser.add_argument("--prompts", type=int, default=24, help="requests per step (NARWHAL_BENCH_PROMPTS, default "
                        "24: with 8 prefixes, each shared by 3 requests)")
    parser.add_argument("--prefixes", type=int, default=8, help="prefixes per step (NARWHAL_BENCH_PREFIXES, default 8)")
    parser.add_argument("--prefix-len", type=int, default=384, help="tokens per prefix (default 384)")
    parser.add_argument("--suffix-len", type=int, default=32, help="tokens each request adds (default 32)")
    parser.add_argument("--output-len", type=int, default=16, help="tokens generated per request (default 16)")
    parser.add_argument("--prefill-s-per-token", type=float, default=0.002, help="the stand-in's seconds per prompt "
                        "token not in its prefix cache (NARWHAL_STANDIN_PREFILL_S_PER_TOK, default 0.002)")
    parser.add_argument("--max-model-len", type=int, default=512, help="the engines' --max-model-len (default 512, "
                        "tiny-llama-real's max_position_embeddings)")
    parser.add_argument("--keep", action="store_true", help="keep the simulated site afterwards")
    parser.add_argument("--down", action="store_true", help="only tear the site down")
    parser.add_argument("--out", help="results directory (default bench/results/prefix-routing-<UTC stamp>)")
    args = parser.parse_args(argv)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.prefix_len + args.suffix_len + args.output_len > args.max_model_len:
        parser.error("--prefix-len + --suffix-len + --output-len = %d, more than --max-model-len %d"
                     % (args.prefix_len + args.suffix_len + args.output_len, args.max_model_len))
    if args.prompts % args.prefixes:
        parser.error("--prompts %d is not a multiple of --prefixes %d" % (args.prompts, args.prefixes))
    return args


def run(args, out, doc):
    """Steps 1-4 (the site is up when this returns or raises; main tears it down)."""
    harness(out)
    bench.forget_pins(STATE)  # the site's hosts are new
    doc["load_image"] = load_image(BENCH_HOST, LOAD_IMAGE)
    api_key()
    env_file = os.path.join(out, "site.env")
    with open(env_file, "w") as fh:
        fh.write(env_text(env_values(args)))
    inventory, extra = os.path.join(STATE, "hosts.yml"), {"NARWHAL_ENV_FILE": env_file}
    res = bench.timed(["ansible-playbook", "-i", inventory, "playbooks/site.yml", "-e",
                       "narwhal_launch_serial=%d" % ENGINES], os.path.join(out, "logs", "site.log"), extra_env=extra)
    doc["site_s"] = round(res["wall_s"], 1)
    if res["rc"]:
        raise RuntimeError("the site run failed (rc %d), see %s/logs/site.log" % (res["rc"], out))
    before = bench_runs()
    res = bench.timed(["ansible-playbook", "-i", inventory, "playbooks/benchmark.yml"],
                      os.path.join(out, "logs", "benchmark.log"), extra_env=extra)
    doc.update(benchmark_s=round(res["wall_s"], 1), benchmark_rc=res["rc"])
    source, figures = keep(out, before)
    if figures is None:
        raise RuntimeError("the benchmark wrote no runs/bench-<stamp>/ (rc %d), see %s/logs/benchmark.log"
                           % (res["rc"], out))
    doc.update(bench_dir=source, ok=figures.get("ok"), problems=figures.get("problems"),
               comparison=figures.get("comparison"))
    return res["rc"]


def main(argv=None):
    args = parse(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.abspath(args.out or os.path.join(ROOT, "bench", "results", "prefix-routing-" + stamp))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    if args.down:
        harness(out, "absent")
        return 0
    missing = missing_prerequisites()
    if missing:
        log("missing: %s" % "; ".join(missing))
        return 2
    commit = bench.sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    doc = {"command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
           "commit": commit, "started_at": stamp, "site": SITE, "nproc": os.cpu_count(),
           "inputs": env_values(args), "policies": args.policies}
    rc = 1
    try:
        rc = run(args, out, doc)
    finally:
        doc["finished_at"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        bench.write_json(os.path.join(out, "prefix-routing.json"), doc)
        if not args.keep:
            harness(out, "absent")
    if os.path.isfile(os.path.join(out, "table.txt")):
        with open(os.path.join(out, "table.txt")) as fh:
            print(fh.read())
    log("results in %s" % os.path.relpath(out, ROOT))
    for problem in doc.get("problems") or []:
        log("problem: " + problem)
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
