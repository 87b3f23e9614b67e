#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Figures of the deliver stage (issue 37 item 3, docs/delivery.md "Figures"): a checkpoint of a few GB to 1, 4 and
16 simulated hosts and an image pull on 1 and 16 hosts, each beside its physical limit, bytes x hosts / the
controller's link.

What it does, in order:
  1. brings up one bare simulated site `narwhal-sim-delivery` of max(N) engine hosts (tests/harness/site.yml,
     sim_preload: false: no image, no checkpoint) on 172.31.220.0/24 (management), 172.31.221.0/24 and
     fd00:6e77:d3::/64 (fabric); the proving ground's registry (tests/harness/registry.sh) on the management
     gateway 172.31.220.1:5443 with the CUDA stand-in image pushed to it; a checkpoint of --gib GiB in --shards random
     shards (tests/harness/models/shards.py) in .cache/narwhal-sim-delivery/model;
  2. the link: one plain `rsync -a` of the checkpoint over SSH to engine-1 (no ansible, no manifest, no
     compression), timed: bytes / seconds is the controller's link as the deliver stage sees it (SSH's cipher on
     these CPUs, the bridge); the physical limit of N hosts is bytes x N / that rate;
  3. images, for each N of --image-hosts: the image removed from hosts 1..N and the pin file removed, then
     `ansible-playbook playbooks/deliver.yml` on hosts 1..N (NARWHAL_DELIVER_PARALLEL = --parallel or N), timed;
  4. the checkpoint, for each N of --hosts: NARWHAL_MODEL_PATH removed on hosts 1..N, the deliver run timed; then
     once more on max(N) hosts with nothing to do (the checkpoint in place: one read per host);
  5. writes bench/results/delivery-<stamp>/{delivery.json,table.txt,logs/}, prints the table, tears the site down and
     stops the registry (--keep keeps both; --down only tears down).

It needs free disk for the checkpoint on every host: (max(N) + 2) x --gib GiB (checked first).
Usage: bench/delivery.py [--hosts 1,4,16] [--image-hosts 1,16] [--gib 2] [--shards 8] [--parallel P] [--keep]
       bench/delivery.py --down
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SITE = "narwhal-sim-delivery"
MGMT, FABRIC4, FABRIC6 = "172.31.220", "172.31.221", "fd00:6e77:d3:"
PORT = 5443
PROFILE = "nvidia-8gpu-rdma"
LOCAL_IMAGE = "narwhal-sim/engine-standin:latest"
IMAGE = "%s.1:%d/%s" % (MGMT, PORT, LOCAL_IMAGE)
MODEL_PATH = "/srv/models/tiny-llama"
STATE = os.path.join(ROOT, ".cache", SITE)
REGISTRY = os.path.join(STATE, "registry")
SOURCE = os.path.join(STATE, "model", "tiny-llama")
PROJECT = os.path.join(STATE, "project")
REGISTRY_SH = os.path.join(ROOT, "tests", "harness", "registry.sh")
SSH_OPTS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


def log(msg):
    print("delivery: %s" % msg, file=sys.stderr, flush=True)


def env(extra=None):
    """The controller environment: the checkout's venv and collections, no NARWHAL_* of the caller."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    e["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + e.get("PATH", "")
    e["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, "collections")
    e["ANSIBLE_NOCOLOR"] = "1"
    e.update(extra or {})
    return e


def timed(argv, logfile, extra_env=None, check=True):
    """Run argv from the checkout root with its output in logfile; wall seconds."""
    with open(logfile, "w") as out:
        out.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
        out.flush()
        begin = time.monotonic()
        rc = subprocess.call(argv, cwd=ROOT, env=env(extra_env), stdout=out, stderr=subprocess.STDOUT)
        wall = time.monotonic() - begin
    if check and rc != 0:
        raise RuntimeError("%s failed (rc %d), see %s" % (argv[0], rc, logfile))
    return wall


def sh(argv, check=True, **kw):
    return subprocess.run(argv, cwd=ROOT, env=env(), check=check, capture_output=True, text=True, **kw)


def host(i):
    return "engine-%d" % i


def on_hosts(n, argv_of):
    """docker exec argv_of(i) on engine-1..n at once (harness side, never timed)."""
    def one(i):
        return sh(["docker", "exec", "%s-%s" % (SITE, host(i))] + argv_of(i))
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
        return list(pool.map(one, range(1, n + 1)))


def write(path, text, mode=0o644):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


# --------------------------------------------------------------------------------------------- the site

def site_vars(n):
    return {"sim_site": SITE, "sim_preload": False,
            "sim_mgmt_subnet": MGMT + ".0/24", "sim_fabric_subnet4": FABRIC4 + ".0/24",
            "sim_fabric_subnet6": FABRIC6 + ":/64",
            "sim_hosts": [{"name": host(i), "profile": PROFILE, "mgmt_ip": "%s.%d" % (MGMT, 10 + i),
                           "fabric_ipv4": "%s.%d" % (FABRIC4, 10 + i), "fabric_ipv6": "%s:%d" % (FABRIC6, 10 + i)}
                          for i in range(1, n + 1)]}


def site(state, n, logs):
    path = os.path.join(logs, "site-%s.json" % state)
    write(path, json.dumps(site_vars(n), indent=2))
    timed(["ansible-playbook", "-i", "localhost,", os.path.join(ROOT, "tests/harness/site.yml"), "-e", "@" + path,
           "-e", "sim_state=%s" % state], os.path.join(logs, "site-%s.log" % state))


def inventory(n):
    """engine-1..n, reached as tests/harness/site.yml's inventory reaches them."""
    lines = ["engines:", "  hosts:"]
    for i in range(1, n + 1):
        lines += ["    %s:" % host(i), "      ansible_host: %s.%d" % (MGMT, 10 + i),
                  "      narwhal_sysfs_root: /opt/narwhal-sim/profiles/%s/sys" % PROFILE]
    lines += ["  vars:", "    ansible_user: narwhal", "    ansible_become_method: sudo",
              "    ansible_python_interpreter: /usr/bin/python3",
              "    ansible_private_key_file: %s/id_ed25519" % STATE,
              "    ansible_ssh_common_args: %s" % SSH_OPTS]
    return "\n".join(lines) + "\n"


def env_file(n, parallel, model):
    """The .env of a deliver run on n hosts: the registry image, the checkpoint when `model`."""
    lines = ["# bench/delivery.py: %d simulated engine hosts" % n, "NARWHAL_FABRIC_INTERFACE=eth1",
             "NARWHAL_FLEET=config/fleet.delivery.json", "NARWHAL_CONFIG_DIR=config/delivery",
             "NARWHAL_LAUNCH_CONFIG=config/engine-launch.delivery.json",
             "NARWHAL_IMAGE=%s" % IMAGE, "NARWHAL_MODEL_PATH=%s" % MODEL_PATH,
             "NARWHAL_REGISTRY_AUTH_FILE=%s/auth.json" % REGISTRY, "NARWHAL_REGISTRY_CA_FILE=%s/ca.crt" % REGISTRY,
             "NARWHAL_DELIVER_PARALLEL=%d" % parallel]
    if model:
        lines.append("NARWHAL_MODEL_SOURCE=%s" % SOURCE)
    lines += ["NARWHAL_NODE_%d_ROLE=%s" % (i, "prefill" if i % 2 else "decode") for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def deliver(n, parallel, model, name, logs):
    """One timed deliver run on engine-1..n from the project directory; wall seconds."""
    inv, envf = os.path.join(PROJECT, "hosts-%d.yml" % n), os.path.join(PROJECT, "%s.env" % name)
    write(inv, inventory(n))
    write(envf, env_file(n, parallel, model))
    return timed(["ansible-playbook", "-i", inv, os.path.join(ROOT, "playbooks/deliver.yml"), "-f", str(max(n, 5)),
                  "-e", "narwhal_project_dir=%s" % PROJECT],
                 os.path.join(logs, "%s.log" % name), extra_env={"NARWHAL_ENV_FILE": envf})


# ---------------------------------------------------------------------------------------------- figures

def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _dirs, files in os.walk(path) for f in files)


def image_bytes():
    """Bytes a pull carries: the compressed layers and config of the pushed image (its manifest, from the registry)."""
    with open(os.path.join(REGISTRY, "password")) as fh:
        password = fh.read().strip()
    name, tag = IMAGE.split("/", 1)[1].rsplit(":", 1)
    out = subprocess.run(["curl", "-sf", "--cacert", os.path.join(REGISTRY, "ca.crt"), "-K", "-",
                          "-H", "Accept: application/vnd.docker.distribution.manifest.v2+json",
                          "https://%s.1:%d/v2/%s/manifests/%s" % (MGMT, PORT, name, tag)],
                         input='user = "narwhal:%s"\n' % password, capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    return doc["config"]["size"] + sum(layer["size"] for layer in doc["layers"])


def link_rate(logs):
    """Bytes per second of one plain rsync of the checkpoint over SSH to engine-1 (the link, nothing else)."""
    dest = "/tmp/narwhal-link"
    on_hosts(1, lambda i: ["rm", "-rf", dest])
    wall = timed(["rsync", "-a", "--whole-file", "-e", "ssh -i %s/id_ed25519 %s" % (STATE, SSH_OPTS),
                  SOURCE + "/", "narwhal@%s.11:%s/" % (MGMT, dest)], os.path.join(logs, "link-rsync.log"))
    on_hosts(1, lambda i: ["rm", "-rf", dest])
    return tree_bytes(SOURCE) / wall, wall


def reset_images(n):
    on_hosts(n, lambda i: ["sh", "-c", "docker image rm -f $(docker image inspect -f '{{.Id}}' %s) >/dev/null 2>&1;"
                                       " true" % shlex.quote(IMAGE)])
    pins = os.path.join(PROJECT, "config", "delivery", "image-pins.json")
    if os.path.exists(pins):
        os.remove(pins)


def reset_model(n):
    on_hosts(n, lambda i: ["rm", "-rf", MODEL_PATH, MODEL_PATH + ".narwhal-partial", MODEL_PATH + ".narwhal-previous"])


def row(what, hosts, parallel, wall, nbytes, rate):
    limit = nbytes * hosts / rate
    return {"what": what, "hosts": hosts, "parallel": parallel, "wall_s": round(wall, 1), "bytes": nbytes * hosts,
            "aggregate_mb_s": round(nbytes * hosts / wall / 1e6, 1), "limit_s": round(limit, 1),
            "wall_over_limit": round(wall / limit, 2)}


def table(doc):
    lines = ["link (one plain rsync over SSH to one host): %.1f MB/s; checkpoint %.2f GB, image %.1f MB (compressed)"
             % (doc["link_mb_s"], doc["model_bytes"] / 1e9, doc["image_bytes"] / 1e6),
             "%-28s %5s %8s %8s %10s %9s %12s" % ("what", "hosts", "parallel", "wall s", "agg. MB/s", "limit s",
                                                  "wall/limit")]
    for r in doc["rows"]:
        rest = ("%10.1f %9.1f %12.2f" % (r["aggregate_mb_s"], r["limit_s"], r["wall_over_limit"]) if r["bytes"]
                else "%10s %9s %12s" % ("-", "-", "-"))
        lines.append("%-28s %5d %8d %8.1f %s" % (r["what"], r["hosts"], r["parallel"], r["wall_s"], rest))
    lines.append("limit = bytes x hosts / link; wall/limit 1.0 is the controller's link full the whole run")
    return "\n".join(lines)


def measure(args, logs):
    rate, link_wall = link_rate(logs)
    model_bytes, img_bytes = tree_bytes(SOURCE), image_bytes()
    log("link: %.1f MB/s (%.1f s for %d bytes)" % (rate / 1e6, link_wall, model_bytes))
    rows = []
    for n in args.image_hosts:
        reset_images(n)
        p = args.parallel or n
        log("image pull on %d hosts (parallel %d)" % (n, p))
        rows.append(row("image pull", n, p, deliver(n, p, False, "image-n%d" % n, logs), img_bytes, rate))
    top = max(args.hosts)
    # every host of the model runs holds the image: their image step is a read
    deliver(top, args.parallel or top, False, "image-all", logs)
    for n in args.hosts:
        reset_model(n)
        p = args.parallel or n
        log("checkpoint to %d hosts (parallel %d)" % (n, p))
        rows.append(row("checkpoint", n, p, deliver(n, p, True, "model-n%d" % n, logs), model_bytes, rate))
    wall = deliver(top, args.parallel or top, True, "model-in-place-n%d" % top, logs)
    rows.append({"what": "checkpoint in place (read)", "hosts": top, "parallel": args.parallel or top,
                 "wall_s": round(wall, 1), "bytes": 0, "aggregate_mb_s": None, "limit_s": None,
                 "wall_over_limit": None})
    return {"link_mb_s": round(rate / 1e6, 1), "link_rsync_s": round(link_wall, 1), "model_bytes": model_bytes,
            "image_bytes": img_bytes, "cpus": os.cpu_count(), "rows": rows,
            "hosts": args.hosts, "image_hosts": args.image_hosts, "gib": args.gib, "shards": args.shards}


def down(logs, n=16):
    site("absent", n, logs)
    subprocess.run([REGISTRY_SH, "down", REGISTRY], cwd=ROOT, check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--hosts", default="1,4,16", help="checkpoint runs: host counts (default 1,4,16)")
    ap.add_argument("--image-hosts", default="1,16", help="image pull runs: host counts (default 1,16)")
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size in GiB (default 2)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=0, help="NARWHAL_DELIVER_PARALLEL (default: the run's host count)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "delivery-" + time.strftime("%Y%m%d-%H%M%S")))
    ap.add_argument("--keep", action="store_true", help="keep the site and the registry")
    ap.add_argument("--down", action="store_true", help="only tear the site down and stop the registry")
    args = ap.parse_args()
    args.hosts = sorted({int(x) for x in args.hosts.split(",")})
    args.image_hosts = sorted({int(x) for x in args.image_hosts.split(",")})
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    top = max(args.hosts + args.image_hosts)
    if args.down:
        down(logs, max(top, 16))
        return 0
    need = (max(args.hosts) + 2) * args.gib * (1 << 30)
    free = shutil.disk_usage("/var/lib/docker" if os.path.isdir("/var/lib/docker") else ROOT).free
    if free < need + (8 << 30):
        sys.exit("delivery: %.1f GiB free, the run needs %.1f GiB (+8 GiB spare): a smaller --gib or --hosts"
                 % (free / (1 << 30), need / (1 << 30)))
    os.makedirs(os.path.join(PROJECT, "config"), exist_ok=True)
    try:
        log("bringing up %d bare simulated hosts (%s)" % (top, SITE))
        site("present", top, logs)
        timed([REGISTRY_SH, "up", REGISTRY, MGMT + ".1", str(PORT), "%s=%s" % (LOCAL_IMAGE, LOCAL_IMAGE)],
              os.path.join(logs, "registry-up.log"))
        log("checkpoint: %.1f GiB in %d shards -> %s" % (args.gib, args.shards, SOURCE))
        timed([sys.executable, os.path.join(ROOT, "tests/harness/models/shards.py"), SOURCE, "--like",
               os.path.join(ROOT, "tests/harness/models/tiny-llama"), "--shards", str(args.shards),
               "--shard-mib", str(args.gib * 1024 / args.shards)], os.path.join(logs, "shards.log"))
        doc = measure(args, logs)
    finally:
        if not args.keep:
            down(logs, top)
    with open(os.path.join(args.out, "delivery.json"), "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    text = table(doc)
    write(os.path.join(args.out, "table.txt"), text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
