#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark of discovery, day-two and launch cost against what operators run anyway (issues #7, #16,
docs/benchmarks.md).

What it does, in order:
  1. brings up one simulated site `narwhal-sim-bench` of max(N) engine hosts with tests/harness/site.yml
     (sshd + own dockerd + the nvidia-8gpu-rdma profile; only the CUDA stand-in image is loaded and the
     tiny-llama checkpoint copied, the lighter part of the proving ground) and one router host router-1 (the
     real vllm-router image, group routers), on 172.31.200.0/24 (management),
     172.31.201.0/24 and fd00:6e77:b1::/64 (fabric);
  2. for each N: an inventory of engine-1..N, an untimed SSH warm-up and an untimed `site.yml` (all N engines
     launched), then R rounds that alternate
        `ansible engines -m ansible.builtin.setup -f N`   and
        [host inspection caches cleared] `ansible-playbook playbooks/discover.yml -f N` twice
        (first = cold, second = nothing changed), then `playbooks/status.yml` and `playbooks/site.yml`
        (nothing changed: every stage reruns, the probes of every pair and the router included), and the
        stages that grow with pairs alone: `probe.yml` (every pair), `probe.yml -e narwhal_probe_pairs=cover`,
        `router.yml`,
     swapping which goes first every round; wall times, PLAY RECAP changed counts, each command's largest
     process (wait4 ru_maxrss) and the containers the hosts' daemons created during each discover
     (`docker events`); then one more untimed run of setup, both discovers and status under a /proc sampler
     for the peak PSS of the controller process tree;
  3. the launcher: discover -> prepare -> launch on engine-1/engine-2, then on engine-1 R rounds that
     alternate `launch_engine.pyz start` (container removed first; checked.json reused, so the image check
     is excluded) and a bare `docker run -d` of the argv recorded in plan.json (API key filled in), each
     timed inside the host to `running`, plus `launch_engine.pyz check` alone (the image check);
  4. writes bench/results/<stamp>/{bench.json,bench.png,table.txt,logs/}, prints the table, tears the site
     down (--keep keeps it; --down only tears down).

Usage: bench/bench.py [--hosts 2,4,8,16,32] [--rounds 5] [--launch-rounds 7] [--out DIR] [--no-memory]
                      [--no-day-two] [--site-rounds R] [--keep] [--code DIR]
       bench/bench.py --down
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import report  # noqa: E402 - bench/report.py, beside this script

SITE = "narwhal-sim-bench"
MGMT = "172.31.200"
FABRIC4 = "172.31.201"
FABRIC6 = "fd00:6e77:b1:"
PROFILE = "nvidia-8gpu-rdma"
IMAGE = "narwhal-sim/engine-standin:latest"
ROUTER_IMAGE = "narwhal-sim/vllm-router:latest"   # tests/harness/images/vllm-router: the real vllm-router
ROUTER = "router-1"                                 # the one router host (group routers), beside the engine hosts
MODEL = "/srv/models/tiny-llama"
STATE = os.path.join(ROOT, ".cache", SITE)
CODE = [ROOT]  # the checkout whose playbooks are measured (--code: another one, on this checkout's site)
IMAGE_CACHE = "/var/cache/narwhal/image-facts"   # image_facts' default cache_dir on the hosts
CHECKOUT = "/opt/narwhal"                         # NARWHAL_ENGINE_CHECKOUT default on the hosts
MIB_PER_HOST = 160     # measured: sshd + dockerd + containerd of an idle simulated host, with margin
MEM_RESERVE_MIB = 3072  # kept free for the controller, the other engineer's work and the page cache
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def log(msg):
    print("bench: %s" % msg, file=sys.stderr, flush=True)


def env():
    """The controller environment of every command: the checkout's venv and collections, no NARWHAL_* leak."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    e["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + e.get("PATH", "")
    e["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(CODE[0], "collections")
    e["ANSIBLE_NOCOLOR"] = "1"
    return e


# ------------------------------------------------------------------------------------------ measuring

def _children_map():
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    return parents


def tree_pss_kib(root):
    """Sum of Pss (KiB) of `root` and all its descendants, from /proc/<pid>/smaps_rollup."""
    parents, todo, total = _children_map(), [root], 0
    while todo:
        pid = todo.pop()
        todo.extend(parents.get(pid, []))
        try:
            with open("/proc/%d/smaps_rollup" % pid) as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def timed(argv, logfile, sample_memory=False, extra_env=None):
    """Run argv from the checkout root, output to logfile. Returns wall seconds, rc, ru_maxrss (KiB) of the
    largest process of the command (wait4), the peak PSS of its process tree when sampled, and its output."""
    e = env()
    e.update(extra_env or {})
    peak = [0]
    with open(logfile, "w") as out:
        out.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
        out.flush()
        begin = time.monotonic()
        proc = subprocess.Popen(argv, cwd=CODE[0], env=e, stdout=out, stderr=subprocess.STDOUT)
        stop = threading.Event()
        sampler = None
        if sample_memory:
            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], tree_pss_kib(proc.pid))
                    stop.wait(0.1)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - begin
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        if sampler:
            sampler.join()
    with open(logfile) as fh:
        text = fh.read()
    return {"wall_s": wall, "rc": proc.returncode, "maxrss_kib": usage.ru_maxrss, "pss_peak_kib": peak[0],
            "output": text}


def changed_total(output):
    """Sum of changed= over the PLAY RECAP (failed/unreachable raise)."""
    total = 0
    for host, _ok, changed, unreachable, failed in RECAP.findall(output):
        if int(unreachable) or int(failed):
            raise RuntimeError("%s: unreachable=%s failed=%s" % (host, unreachable, failed))
        total += int(changed)
    return total


def run_checked(argv, logfile, what, **kw):
    result = timed(argv, logfile, **kw)
    if result["rc"] != 0:
        raise RuntimeError("%s failed (rc %d), see %s" % (what, result["rc"], logfile))
    return result


def forget_pins(state):
    """Remove the image pins a project of a simulated site kept (<state>/config/image-pins.json): the benchmarks bring
    their sites up new, and a pin an earlier run left before an image rebuild would refuse the rebuilt image as a moved
    tag (the deliver stage, docs/delivery.md)."""
    path = os.path.join(state, "config", "image-pins.json")
    if os.path.exists(path):
        os.remove(path)


def sh(argv, check=True, **kw):
    return subprocess.run(argv, cwd=ROOT, env=env(), check=check, capture_output=True, text=True, **kw)


def container(i):
    return "%s-engine-%d" % (SITE, i)


def on_hosts(n, fn):
    """fn(i) for engine-1..n in parallel (harness-side docker exec, never timed)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
        return list(pool.map(fn, range(1, n + 1)))


def clear_inspection_caches(n):
    on_hosts(n, lambda i: sh(["docker", "exec", container(i), "rm", "-rf", IMAGE_CACHE]))


def containers_created(n, since, until):
    """Containers created by the hosts' own daemons between since and until (unix times), summed."""
    def count(i):
        out = sh(["docker", "exec", container(i), "docker", "events", "--since", "%.6f" % since,
                  "--until", "%.6f" % until, "--filter", "type=container", "--filter", "event=create",
                  "--format", "{{.ID}}"]).stdout
        return len(out.split())
    return sum(on_hosts(n, count))


# --------------------------------------------------------------------------------------------- the site

def sim_site_vars(site, mgmt, fabric4, fabric6, engines, engine_images, models=None, profile=PROFILE):
    """tests/harness/site.yml variables of a simulated site: engine-1..`engines` (engine-i at .10+i of each subnet)
    and the router host router-1 (.250); `mgmt`, `fabric4`: the subnets' first three octets, `fabric6` the IPv6
    prefix up to its last ':'; `models`: checkpoints to put on the engine hosts (the harness's default without)."""
    hosts = [{"name": "engine-%d" % i, "profile": profile, "mgmt_ip": "%s.%d" % (mgmt, 10 + i),
              "fabric_ipv4": "%s.%d" % (fabric4, 10 + i), "fabric_ipv6": "%s:%d" % (fabric6, 10 + i)}
             for i in range(1, engines + 1)]
    hosts.append({"name": ROUTER, "profile": "cpu", "groups": ["routers"], "mgmt_ip": "%s.250" % mgmt,
                  "fabric_ipv4": "%s.250" % fabric4, "fabric_ipv6": "%s:250" % fabric6})
    out = {"sim_site": site, "sim_mgmt_subnet": mgmt + ".0/24", "sim_fabric_subnet4": fabric4 + ".0/24",
           "sim_fabric_subnet6": fabric6 + ":/64", "sim_engine_images": list(engine_images),
           "sim_router_images": [ROUTER_IMAGE], "sim_hosts": hosts}
    if models:
        out["sim_models"] = list(models)
    return out


def sim_site(out, doc, state="present"):
    """Bring the simulated site of `doc` (sim_site_vars) to `state` (present, absent) with tests/harness/site.yml,
    logging to <out>/logs/site-<state>.log."""
    path = os.path.join(out, "site-%s.json" % state)
    write_json(path, doc)
    log("simulated site %s: %s" % (doc["sim_site"], state))
    run_checked(["ansible-playbook", "-i", "localhost,", os.path.join(ROOT, "tests/harness/site.yml"),
                 "-e", "@" + path, "-e", "sim_state=" + state],
                os.path.join(out, "logs", "site-%s.log" % state), "site " + state)


def site_vars(n):
    """tests/harness/site.yml variables of the bench site with n hosts."""
    return sim_site_vars(SITE, MGMT, FABRIC4, FABRIC6, n, [IMAGE])


def inventory(n):
    """SSH inventory of engine-1..n and the router host (the same shape tests/harness/site.yml writes)."""
    common = {"ansible_user": "narwhal", "ansible_become_method": "sudo",
              "ansible_python_interpreter": "/usr/bin/python3",
              "ansible_private_key_file": os.path.join(STATE, "id_ed25519"),
              "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                         "-o LogLevel=ERROR"}
    return {"routers": {"hosts": {ROUTER: {"ansible_host": "%s.250" % MGMT}}, "vars": common},
            "engines": {
        "hosts": {"engine-%d" % i: {"ansible_host": "%s.%d" % (MGMT, 10 + i), "narwhal_sim_profile": PROFILE,
                                    "narwhal_sysfs_root": "/opt/narwhal-sim/profiles/%s/sys" % PROFILE}
                  for i in range(1, n + 1)},
        "vars": common}}


def env_file(n):
    """The site .env of the bench with n engines (alternating prefill/decode); outputs at ignored paths."""
    lines = ["# bench/bench.py: site of %d simulated engines" % n,
             "NARWHAL_FABRIC_INTERFACE=eth1", "NARWHAL_BIND_FAMILY=ipv4",
             "NARWHAL_FLEET=config/fleet.bench-n%d.json" % n,
             "NARWHAL_LAUNCH_CONFIG=config/engine-launch.bench-n%d.json" % n,
             "NARWHAL_CONFIG_DIR=config/bench-n%d" % n,
             "NARWHAL_RUNS_DIR=%s/runs" % STATE,
             "NARWHAL_API_KEY_FILE=%s/engine-api.key" % STATE,
             "NARWHAL_IMAGE=%s" % IMAGE, "NARWHAL_MODEL_PATH=%s" % MODEL, "NARWHAL_SERVED_MODEL_NAME=tiny-llama",
             "NARWHAL_ROUTER_IMAGE=%s" % ROUTER_IMAGE]
    lines += ["NARWHAL_NODE_%d_ROLE=%s" % (i, "prefill" if i % 2 else "decode") for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def write_json(path, doc):
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def site_up(out, n):
    path = os.path.join(out, "site.json")
    write_json(path, site_vars(n))
    log("bringing up %d simulated hosts (%s)" % (n, SITE))
    result = run_checked(["ansible-playbook", "-i", "localhost,", os.path.join(ROOT, "tests/harness/site.yml"),
                          "-e", "@" + path],
                         os.path.join(out, "logs", "site-up.log"), "site up")
    key = os.path.join(STATE, "engine-api.key")
    if not os.path.exists(key):
        fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(18).hex() + "\n")
    return result["wall_s"]


def site_down(out, n):
    path = os.path.join(out, "site-down.json")
    write_json(path, site_vars(n))
    log("tearing the site down")
    run_checked(["ansible-playbook", "-i", "localhost,", os.path.join(ROOT, "tests/harness/site.yml"), "-e",
                 "@" + path, "-e", "sim_state=absent"], os.path.join(out, "logs", "site-down.log"), "site down")


def probe_schedule():
    """(pairs, rounds) of the last probe run, from the results it keeps with the runs (each pair has its round)."""
    with open(os.path.join(STATE, "runs", "probes.json")) as fh:
        results = json.load(fh)
    return len(results), max((p.get("round") or 0 for p in results), default=0)


def site_host_count():
    """The engine hosts of the bench site (the router host apart)."""
    names = sh(["docker", "ps", "-a", "--filter", "label=org.narwhal.sim=" + SITE, "--format", "{{.Names}}"]).stdout
    return len([name for name in names.split() if name.startswith(SITE + "-engine-")])


# ----------------------------------------------------------------------------------------- the measures

def discovery_rounds(out, n, rounds, memory_runs=True, day_two=True, site_rounds=None):
    """R alternating rounds of setup, the cold+warm discover pair and (day_two) status and site on engine-1..n;
    then the memory runs."""
    inv = os.path.join(out, "inventory-n%d.json" % n)
    write_json(inv, inventory(n))
    envf = os.path.join(out, "n%d.env" % n)
    with open(envf, "w") as fh:
        fh.write(env_file(n))
    forks = str(n)
    extra = {"NARWHAL_ENV_FILE": envf}
    setup = ["ansible", "engines", "-i", inv, "-m", "ansible.builtin.setup", "-f", forks]
    discover = ["ansible-playbook", "-i", inv, "playbooks/discover.yml", "-f", forks]
    status = ["ansible-playbook", "-i", inv, "playbooks/status.yml", "-f", forks]
    site = ["ansible-playbook", "-i", inv, "playbooks/site.yml", "-f", forks]
    probe = ["ansible-playbook", "-i", inv, "playbooks/probe.yml", "-f", forks]
    router = ["ansible-playbook", "-i", inv, "playbooks/router.yml", "-f", forks]
    logs = os.path.join(out, "logs")
    # untimed warm-up: SSH control masters up, host keys known, one discover so that the outputs exist, one
    # site.yml that launches the N engines (all at once: the rolling default of one at a time is for replacing)
    run_checked(["ansible", "engines", "-i", inv, "-m", "ansible.builtin.ping", "-f", forks],
                os.path.join(logs, "n%d-warmup-ping.log" % n), "warm-up ping")
    run_checked(discover, os.path.join(logs, "n%d-warmup-discover.log" % n), "warm-up discover", extra_env=extra)
    if day_two:
        run_checked(site + ["-e", "narwhal_launch_serial=%d" % n], os.path.join(logs, "n%d-warmup-site.log" % n),
                    "warm-up site", extra_env=extra)

    def do_setup(r):
        res = run_checked(setup, os.path.join(logs, "n%d-r%d-setup.log" % (n, r)), "setup")
        return {"setup_s": res["wall_s"], "setup_maxrss_kib": res["maxrss_kib"]}

    def do_discover(r, which):
        t0 = time.time()
        res = run_checked(discover, os.path.join(logs, "n%d-r%d-discover-%s.log" % (n, r, which)),
                          "discover", extra_env=extra)
        t1 = time.time()
        return {"discover_%s_s" % which: res["wall_s"], "discover_%s_maxrss_kib" % which: res["maxrss_kib"],
                "%s_changed" % which: changed_total(res["output"]),
                "%s_containers" % which: containers_created(n, t0, t1)}

    def do_pair(r):
        clear_inspection_caches(n)
        row = do_discover(r, "cold")
        row.update(do_discover(r, "warm"))
        return row

    def do_day_two(r):
        res = run_checked(status, os.path.join(logs, "n%d-r%d-status.log" % (n, r)), "status", extra_env=extra)
        row = {"status_s": res["wall_s"], "status_maxrss_kib": res["maxrss_kib"]}
        if site_rounds is not None and r >= site_rounds:
            return row
        res = run_checked(site, os.path.join(logs, "n%d-r%d-site.log" % (n, r)), "site", extra_env=extra)
        row.update(site_s=res["wall_s"], site_maxrss_kib=res["maxrss_kib"], site_changed=changed_total(res["output"]),
                   site_probe_pairs=probe_schedule()[0])
        # the stages that grow with pairs and routers, alone: every pair, then the cover, then the router
        for key, args in (("probe", []), ("probe_cover", ["-e", "narwhal_probe_pairs=cover"])):
            res = run_checked(probe + args, os.path.join(logs, "n%d-r%d-%s.log" % (n, r, key)), key, extra_env=extra)
            pairs, rounds = probe_schedule()
            row.update({key + "_s": res["wall_s"], key + "_pairs": pairs, key + "_rounds": rounds})
        res = run_checked(router, os.path.join(logs, "n%d-r%d-router.log" % (n, r)), "router", extra_env=extra)
        row["router_s"] = res["wall_s"]
        return row

    samples = []
    for r in range(rounds):
        row = {"order": "setup-first" if r % 2 == 0 else "discover-first"}
        steps = (do_setup, do_pair) + ((do_day_two,) if day_two else ())
        for step in (steps if r % 2 == 0 else steps[::-1]):
            row.update(step(r))
        samples.append(row)
        day_two_text = ""
        if day_two:
            site_text = "%.2f" % row["site_s"] if "site_s" in row else "-"
            day_two_text = ", status %.2f s, site %s s (changed=%s)" % (
                row["status_s"], site_text, row.get("site_changed", "-"))
        log("N=%d round %d: setup %.2f s, discover cold %.2f s (changed=%d, %d containers), warm %.2f s "
            "(changed=%d, %d containers)%s" % (
                n, r + 1, row["setup_s"], row["discover_cold_s"], row["cold_changed"], row["cold_containers"],
                row["discover_warm_s"], row["warm_changed"], row["warm_containers"], day_two_text))
    if not memory_runs:
        return {"forks": n, "rounds": samples, "memory": {}}
    # peak PSS of the controller process tree, sampled every 0.1 s: separate, untimed runs
    memory = {"setup_pss_kib": timed(setup, os.path.join(logs, "n%d-mem-setup.log" % n),
                                     sample_memory=True)["pss_peak_kib"]}
    clear_inspection_caches(n)
    memory["discover_cold_pss_kib"] = timed(discover, os.path.join(logs, "n%d-mem-discover-cold.log" % n),
                                            sample_memory=True, extra_env=extra)["pss_peak_kib"]
    memory["discover_warm_pss_kib"] = timed(discover, os.path.join(logs, "n%d-mem-discover-warm.log" % n),
                                            sample_memory=True, extra_env=extra)["pss_peak_kib"]
    if day_two:
        memory["status_pss_kib"] = timed(status, os.path.join(logs, "n%d-mem-status.log" % n),
                                         sample_memory=True, extra_env=extra)["pss_peak_kib"]
    return {"forks": n, "rounds": samples, "memory": memory}


# Runs inside the simulated host (python3 - ARGS_JSON): times the launcher's start and a bare docker run
# of the recorded argv, alternating, both to the engine serving (start waits for /health and /version itself;
# after docker run the timer polls the same two URLs every 0.05 s), plus the image check alone; for the note,
# also `plan` (Python start + the plan, no Docker) and `python3 -c "import docker"` (the Docker SDK import).
LAUNCH_TIMER = r"""
import json, ssl, subprocess, sys, time, urllib.request
a = json.loads(sys.argv[1])
# the engine answers on its advertised address, over TLS with the site CA when NARWHAL_TLS is on (docs/tls.md)
tls = ssl.create_default_context(cafile=a["ca"]) if a["ca"] else None
def rm():
    subprocess.run(["docker", "rm", "-f", a["name"]], capture_output=True)
def running():
    p = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", a["name"]], capture_output=True, text=True)
    return p.stdout.strip() == "true"
def serving(deadline=120):
    end = time.monotonic() + deadline
    for path in ("/health", "/version"):
        while True:
            try:
                with urllib.request.urlopen(a["url"] + path, timeout=2, context=tls) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end:
                sys.exit("%s%s did not answer" % (a["url"], path))
            time.sleep(0.05)
def timed(argv, wait=False):
    t = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode:
        sys.exit("%s failed: %s %s" % (argv[:3], p.stdout, p.stderr))
    if wait:
        serving()
    return time.monotonic() - t, p.stdout.strip()
launcher = ["python3", a["launcher"], "--role-env", a["role_env"]]
rounds = []
for r in range(a["rounds"]):
    row = {"order": "start-first" if r % 2 == 0 else "docker-run-first"}
    for what in (("start", "run") if r % 2 == 0 else ("run", "start")):
        rm()
        if what == "start":
            row["start_s"], line = timed(launcher + ["start"])
            row["start_action"] = line.split()[0] if line else ""
            row["start_running"] = running()
        else:
            row["docker_run_s"], _ = timed(a["argv"], wait=True)
            row["docker_run_running"] = running()
    row["check_s"], _ = timed(launcher + ["check"])
    row["plan_s"], _ = timed(launcher + ["plan"])
    row["import_docker_s"], _ = timed(["python3", "-c", "import docker"])
    rounds.append(row)
rm()
subprocess.run(launcher + ["start"], capture_output=True)
print(json.dumps(rounds))
"""


def launcher_rounds(out, rounds):
    """discover -> prepare -> launch on a 2-engine inventory, then the start vs docker run rounds on engine-1."""
    inv = os.path.join(out, "inventory-n2.json")
    write_json(inv, inventory(2))
    envf = os.path.join(out, "n2.env")
    with open(envf, "w") as fh:
        fh.write(env_file(2))
    extra = {"NARWHAL_ENV_FILE": envf}
    logs = os.path.join(out, "logs")
    for book in ("discover", "prepare", "launch"):
        run_checked(["ansible-playbook", "-i", inv, "playbooks/%s.yml" % book], os.path.join(logs, "launch-%s.log"
                    % book), book, extra_env=extra)
    host, role_env = container(1), "%s/config/engine-1.env" % CHECKOUT
    launcher = "%s/bin/launch_engine.pyz" % CHECKOUT
    values = dict(line.split("=", 1) for line in sh(["docker", "exec", host, "cat", role_env]).stdout.splitlines()
                  if "=" in line and not line.startswith("#"))
    plan = json.loads(sh(["docker", "exec", host, "cat", values["NARWHAL_RUN_DIR"] + "/plan.json"]).stdout)
    # the recorded argv holds no key (the engine's guard reads the mounted key file) and the --gpus value quoted for
    # a shell: the same container
    argv = list(plan["argv"])
    address = values["NARWHAL_ADVERTISED_ADDRESS"]
    tls_dir = values.get("NARWHAL_TLS_DIR", "")
    url = "%s://%s:%s" % ("https" if tls_dir else "http", "[%s]" % address if ":" in address else address,
                          values["NARWHAL_HTTP_PORT"])
    args = {"name": plan["plan"]["name"], "launcher": launcher, "role_env": role_env, "argv": argv, "rounds": rounds,
            "url": url, "ca": tls_dir + "/ca.crt" if tls_dir else ""}
    log("launcher: %d rounds of start vs docker run on %s" % (rounds, host))
    proc = subprocess.run(["docker", "exec", "-i", host, "python3", "-", json.dumps(args)], input=LAUNCH_TIMER,
                          capture_output=True, text=True, check=False)
    with open(os.path.join(logs, "launch-timer.log"), "w") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError("launch timer failed: %s" % proc.stderr.strip())
    return {"host": "engine-1", "engine": plan["plan"]["engine"], "rounds": json.loads(proc.stdout),
            "argv_redacted": plan["argv"]}


# ------------------------------------------------------------------------------------------------ main

def render(out, doc):
    """Figures, goals, table and PNG from the raw samples of `doc`; writes bench.json, table.txt, bench.png."""
    discovery = report.summarize_discovery(doc["raw"]["discovery"])
    launcher = report.summarize_launcher(doc["raw"]["launcher"])
    goal_list = report.goals(discovery, launcher)
    doc.update(discovery=discovery, launcher=launcher, goals=goal_list, projection=report.projection(discovery))
    header = "narwhal.deploy bench %s (%s, %d CPUs, %d rounds)" % (
        doc["started_at"], doc["ansible_version"], doc["nproc"], doc["rounds"])
    text = report.table(discovery, launcher, goal_list, header=header)
    write_json(os.path.join(out, "bench.json"), doc)
    with open(os.path.join(out, "table.txt"), "w") as fh:
        fh.write(text + "\n")
    try:
        report.plot(discovery, os.path.join(out, "bench.png"), header)
    except ImportError:
        log("matplotlib is missing (requirements/bench.txt): no PNG")
    return text


def fit_hosts(wanted):
    """Drop the N that do not fit the available memory (MIB_PER_HOST each, MEM_RESERVE_MIB kept free)."""
    with open("/proc/meminfo") as fh:
        avail = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:")) // 1024
    existing = site_host_count()
    fits = [n for n in wanted if (n - existing) * MIB_PER_HOST <= avail - MEM_RESERVE_MIB]
    return fits, avail


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--hosts", default="2,4,8,16,32", help="comma-separated N (default 2,4,8,16,32)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per N (default 5)")
    parser.add_argument("--launch-rounds", type=int, default=7, help="launcher rounds (default 7; 0 skips)")
    parser.add_argument("--out", help="results directory (default bench/results/<UTC stamp>)")
    parser.add_argument("--no-memory", action="store_true", help="skip the sampled memory runs (smoke test)")
    parser.add_argument("--no-day-two", action="store_true", help="skip the status.yml and site.yml measures")
    parser.add_argument("--site-rounds", type=int, help="rounds that also time site.yml (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the simulated site afterwards")
    parser.add_argument("--down", action="store_true", help="only tear the bench site down")
    parser.add_argument("--render", metavar="DIR", help="only recompute figures, table and PNG of DIR/bench.json")
    parser.add_argument("--code", metavar="DIR", help="measure the playbooks of another checkout DIR (with its "
                        "collections/ tree) on this checkout's site: the same site before and after a change")
    args = parser.parse_args(argv)
    if args.code:
        CODE[0] = os.path.abspath(args.code)
    if args.render:
        with open(os.path.join(args.render, "bench.json")) as fh:
            print(render(os.path.abspath(args.render), json.load(fh)))
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.abspath(args.out or os.path.join(HERE, "results", stamp))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    if args.down:
        site_down(out, max(site_host_count(), 2))
        return 0
    wanted = sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    hosts, avail = fit_hosts(wanted)
    skipped = sorted(set(wanted) - set(hosts))
    if skipped:
        log("skipping N=%s: %d MiB available, %d MiB per host + %d MiB reserve needed"
            % (skipped, avail, MIB_PER_HOST, MEM_RESERVE_MIB))
    if not hosts:
        return 1
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:]))
    doc = {"command": command, "code": CODE[0], "started_at": stamp, "site": SITE, "profile": PROFILE, "image": IMAGE,
           "hosts_requested": wanted, "hosts_skipped_for_memory": skipped, "mem_available_mib": avail,
           "rounds": args.rounds, "nproc": os.cpu_count()}
    cfg = sh(["ansible-config", "dump", "--only-changed", "-t", "all"], check=False).stdout
    doc["ansible_config"] = [line for line in cfg.splitlines() if line.strip()]
    doc["ansible_version"] = sh(["ansible", "--version"]).stdout.splitlines()[0]
    ok = False
    try:
        doc["site_up_s"] = round(site_up(out, max(hosts)), 1)
        raw = {}
        for n in hosts:
            log("N=%d: %d rounds" % (n, args.rounds))
            raw[str(n)] = discovery_rounds(out, n, args.rounds, memory_runs=not args.no_memory,
                                           day_two=not args.no_day_two, site_rounds=args.site_rounds)
            write_json(os.path.join(out, "raw-partial.json"), raw)
        launch_raw = launcher_rounds(out, args.launch_rounds) if args.launch_rounds else None
        ok = True
    finally:
        if not args.keep:
            site_down(out, max(hosts))
        if not ok:
            log("failed; logs in %s" % out)
    finished = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    doc.update(raw={"discovery": raw, "launcher": launch_raw}, finished_at=finished)
    print(render(out, doc))
    log("results in %s" % os.path.relpath(out, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
