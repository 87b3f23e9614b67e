#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Day-two benchmark: what each day-two operation costs the clients of a serving fleet (issue 36, docs/day-two.md).

What it does, in order:
  1. brings up one simulated site `d2-day-two` with tests/harness/site.yml (the harness bench/bench.py and molecule
     use): four engine hosts engine-1..4 (nvidia-8gpu-rdma, prefill on the odd ones, decode on the even ones) and a
     router host router-1 (the real vllm-router image, group routers), on 172.31.210.0/24 (management),
     172.31.211.0/24 and fd00:6e77:d2::/64 (fabric); the engine hosts' daemons hold the stand-in image and, when it
     exists, narwhal-sim/engine-standin:next (the same stand-in reporting another vLLM version, for the upgrade);
  2. writes the site's .env (the operator's file) and runs `playbooks/site.yml` once (untimed);
  3. for each operation: waits until the fleet is whole, takes a reference answer per prompt through the router
     (greedy), starts steady traffic through the router (the `openai` client, requirements/bench.txt, no retries,
     --rate requests a second, each request on its own: a slow answer does not hold the next back), does the
     operation as an operator does it, waits until the fleet is whole again, keeps the traffic a few seconds more,
     then counts: requests sent, failed (with the first error), answers that differ from the reference, the
     longest gap between two successive successful answers, and the seconds from the start of the operation until
     the fleet is whole (the router's /workers lists the four engines, all healthy, and every engine host's
     launcher `status` says its engine serves its installed plan);
  4. writes runs/day-two-<stamp>/{day-two.json,day-two.md,logs/}, prints the table, tears the site down (--keep
     keeps it; --down only tears down).

The operations (--ops, in this order):
  replace-prefill  NARWHAL_NODE_1_EXTRA_ARGS changes in .env (a harmless --max-num-seqs), `site` is rerun
  replace-decode   the same for NARWHAL_NODE_2_EXTRA_ARGS
  upgrade          NARWHAL_IMAGE=narwhal-sim/engine-standin:next in .env (another vLLM version, so another NIXL
                   compatibility hash), `site` is rerun; skipped (said so) when that image does not exist
  key-rotation     the key file gets a new first line and keeps the old key as its second, `site`; the clients move to
                   the new key; the second line removed, `site` again (docs/security.md "Rotating the key")
  router-restart   `docker restart narwhal-router` on router-1 (not the collection's: what a crash or an operator's
                   restart by hand costs)
  router-replace   a new router image (built on router-1 from the one it holds, one label more) in .env and the
                   router stage rerun: the collection replaces the container by hand-over
  kill-engine      `kill -9` of engine-4's (a decode) main process; Docker's restart policy brings it back
  host-cut         engine-3 (a prefill) cut off (its firewall drops every packet); --cut-s seconds later, with it still
                   off, an operator's change of engine-2 and `site` (it must go on for the others: exit status 4, the
                   closing table naming engine-3 unreachable); then the host is connected again and `site` rerun,
                   which takes engine-3 back. --strict counts only the requests that failed once the router had
                   dropped engine-3

Usage: bench/day_two.py [--ops replace-prefill,...] [--rate 5] [--load-s 20] [--cut-s 30] [--keep] [--out DIR]
       bench/day_two.py --down
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import itertools
import json
import os
import shlex
import ssl
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench  # noqa: E402 - bench/bench.py: the controller environment, timed commands, JSON writing

SITE = "d2-day-two"
MGMT = "172.31.210"
FABRIC4 = "172.31.211"
FABRIC6 = "fd00:6e77:d2:"
PROFILE = "nvidia-8gpu-rdma"
IMAGE = bench.IMAGE                          # narwhal-sim/engine-standin:latest
NEXT_IMAGE = "narwhal-sim/engine-standin:next"  # scripts/build-images.sh sim: the stand-in as another vLLM version
ROUTER_IMAGE = bench.ROUTER_IMAGE
NEXT_ROUTER = "narwhal-sim/vllm-router:next"  # built by router-replace on router-1: the same router, another image ID
ROUTER = "router-1"
ENGINES = 4                                  # engine-1..4: prefill on the odd ones, decode on the even ones
MODEL_NAME = "tiny-llama"
STATE = os.path.join(ROOT, ".cache", SITE)   # tests/harness/site.yml's sim_dir: SSH key, inventory (hosts.yml)
CHECKOUT = bench.CHECKOUT                     # /opt/narwhal on the hosts
ROUTER_PORT = 30000                           # NARWHAL_ROUTER_PORT default
OPS = ("replace-prefill", "replace-decode", "upgrade", "key-rotation", "router-restart", "router-replace",
       "kill-engine", "host-cut")
PROMPTS = ["Day two, prompt %d: the fleet keeps serving while %s" % (i, what) for i, what in enumerate(
    ("an engine is replaced", "the image is upgraded", "the router restarts", "a host is cut off",
     "a process is killed", "the operator reruns site", "nothing changes", "the traffic goes on"))]
MAX_TOKENS = 12
REQUEST_TIMEOUT_S = 60
WHOLE_TIMEOUT_S = 300
TAIL_S = 5          # traffic kept after the fleet is whole again
LEAD_S = 5          # traffic before the operation starts

log = bench.log


# ------------------------------------------------------------------------------------------------ the site

def host(name):
    return "%s-%s" % (SITE, name)


def harness(out, images, state="present"):
    bench.sim_site(out, bench.sim_site_vars(SITE, MGMT, FABRIC4, FABRIC6, ENGINES, images, profile=PROFILE), state)


def image_exists(name):
    return bench.sh(["docker", "image", "inspect", name], check=False).returncode == 0


def api_key():
    path = os.path.join(STATE, "engine-api.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(18).hex() + "\n")
    with open(path) as fh:
        return fh.read().splitlines()[0].strip()  # the key; a second line is the previous one (a rotation)


def write_key(text):
    """The site's key file replaced whole (0600), as an operator's editor would leave it."""
    path = os.path.join(STATE, "engine-api.key")
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(path + ".new", path)


def env_text(load_s, overrides):
    """The site's .env: what an operator writes; `overrides` are the operations' edits so far."""
    values = {
        "NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_BIND_FAMILY": "ipv4",
        "NARWHAL_FLEET": "%s/config/fleet.json" % STATE,
        "NARWHAL_LAUNCH_CONFIG": "%s/config/engine-launch.json" % STATE,
        "NARWHAL_CONFIG_DIR": "%s/config" % STATE, "NARWHAL_RUNS_DIR": "%s/runs" % STATE,
        "NARWHAL_TLS_DIR": "%s/tls" % STATE, "NARWHAL_API_KEY_FILE": "%s/engine-api.key" % STATE,
        "NARWHAL_IMAGE": IMAGE, "NARWHAL_MODEL_PATH": bench.MODEL, "NARWHAL_SERVED_MODEL_NAME": MODEL_NAME,
        "NARWHAL_ROUTER_IMAGE": ROUTER_IMAGE,
    }
    if load_s:
        # the stand-in's model-load time (tests/harness/images/engine-standin); an image without it ignores it
        values["NARWHAL_ENGINE_ENV"] = "NARWHAL_STANDIN_LOAD_S=%d" % load_s
    for i in range(1, ENGINES + 1):
        values["NARWHAL_NODE_%d_ROLE" % i] = "prefill" if i % 2 else "decode"
    values.update(overrides)
    lines = ["# bench/day_two.py: the day-two site (%d engines, router-1)" % ENGINES]
    lines += ["%s=%s" % (k, shlex.quote(v) if " " in v else v) for k, v in values.items()]
    return "\n".join(lines) + "\n"


class Site:
    """The operator's side: the .env file, the inventory, playbook runs."""

    def __init__(self, out, load_s):
        self.out, self.load_s, self.overrides = out, load_s, {}
        self.env_file = os.path.join(out, "site.env")
        self.inventory = os.path.join(STATE, "hosts.yml")
        self.write_env()

    def write_env(self):
        with open(self.env_file, "w") as fh:
            fh.write(env_text(self.load_s, self.overrides))

    def edit(self, key, value):
        self.overrides[key] = value
        self.write_env()

    def playbook(self, name, logname, extra=()):
        return bench.timed(["ansible-playbook", "-i", self.inventory, "playbooks/%s.yml" % name] + list(extra),
                           os.path.join(self.out, "logs", logname + ".log"),
                           extra_env={"NARWHAL_ENV_FILE": self.env_file})


# ------------------------------------------------------------------------------------------ the fleet's state

def tls_context():
    return ssl.create_default_context(cafile=os.path.join(STATE, "tls", "ca.crt"))


def router_url():
    return "https://%s.250:%d" % (MGMT, ROUTER_PORT)


def router_workers(key, context):
    """The router's /workers as [(url, type, healthy)], or an error text."""
    req = urllib.request.Request(router_url() + "/workers", headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=3, context=context) as resp:
            doc = json.load(resp)
    except (OSError, ValueError) as exc:
        return "router: %s" % exc
    return [(w.get("url"), w.get("worker_type"), bool(w.get("is_healthy"))) for w in doc.get("workers", [])]


def engine_status(i):
    """The engine host's launcher `status` (installed plan against the running container, /health, /version)."""
    proc = bench.sh(["docker", "exec", host("engine-%d" % i), "python3", "%s/bin/launch_engine.pyz" % CHECKOUT,
                     "--role-env", "%s/config/engine-%d.env" % (CHECKOUT, i), "status"], check=False, timeout=60)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return "engine-%d: no status (%s)" % (i, (proc.stderr or proc.stdout).strip()[-200:])
    if doc.get("serving") and doc.get("as_recorded"):
        return None
    return "engine-%d: %s" % (i, "; ".join(doc.get("problems") or ["not serving"]))


def whole(key, context):
    """None when the fleet is whole, else what is missing."""
    workers = router_workers(key, context)
    if isinstance(workers, str):
        return workers
    roles = collections.Counter(t for _u, t, ok in workers if ok)
    if len(workers) != ENGINES or roles.get("prefill") != ENGINES // 2 or roles.get("decode") != ENGINES // 2:
        shown = ["%s %s %s" % (t, u, "healthy" if ok else "unhealthy") for u, t, ok in workers]
        return "router workers: %s" % ", ".join(shown)
    with concurrent.futures.ThreadPoolExecutor(max_workers=ENGINES) as pool:
        problems = [p for p in pool.map(engine_status, range(1, ENGINES + 1)) if p]
    return "; ".join(problems) or None


def wait_whole(key, context, timeout=WHOLE_TIMEOUT_S):
    """Seconds (monotonic) at which the fleet was whole, or None with the last reason after `timeout`."""
    end, reason = time.monotonic() + timeout, None
    while time.monotonic() < end:
        reason = whole(key, context)
        if reason is None:
            return time.monotonic(), None
        time.sleep(1)
    return None, reason


# ---------------------------------------------------------------------------------------------- the traffic

def client(key, context):
    import openai  # requirements/bench.txt
    return openai.AsyncOpenAI(base_url=router_url() + "/v1", api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S,
                              http_client=openai.DefaultAsyncHttpxClient(verify=context))


async def ask(api, prompt):
    answer = await api.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    return answer.choices[0].text


def references(key, context):
    """One greedy answer per prompt, taken through the router before the operation (three tries each)."""
    async def run():
        api, refs = client(key, context), []
        for prompt in PROMPTS:
            for attempt in range(3):
                try:
                    refs.append(await ask(api, prompt))
                    break
                except Exception:  # noqa: BLE001 - any client error: try again, the third one raises
                    if attempt == 2:
                        raise
                    await asyncio.sleep(1)
        await api.close()
        return refs
    return asyncio.run(run())


def error_text(exc):
    """The client's error with its cause (the openai client's "Connection error." says nothing of why)."""
    status = getattr(exc, "status_code", None)
    if status is not None:  # openai.APIStatusError: the router's answer, its body when it has one
        body = (getattr(exc, "response", None) and exc.response.text or "").strip()
        return ("%s: HTTP %d %s" % (type(exc).__name__, status, body or "(empty body)"))[:400]
    text = "%s: %s" % (type(exc).__name__, exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) not in text:
        text += " (%s: %s)" % (type(cause).__name__, cause)
    return text[:400]


class Traffic:
    """Open-loop traffic at `rate` requests a second through the router, in a thread of its own. Every request is
    recorded as {"sent", "done" (monotonic seconds), "prompt", "ok", "text" | "error"}."""

    def __init__(self, key, context, rate):
        self.key, self.context, self.rate = key, context, rate
        self.records, self._stop, self._thread = [], threading.Event(), None

    def start(self):
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 10)
        return self.records

    async def _one(self, api, n):
        prompt = n % len(PROMPTS)
        rec = {"sent": time.monotonic(), "prompt": prompt}
        try:
            rec.update(ok=True, text=await ask(api, PROMPTS[prompt]))
        except Exception as exc:  # noqa: BLE001 - every client error is a failed request, with its text
            rec.update(ok=False, error=error_text(exc))
        rec["done"] = time.monotonic()
        self.records.append(rec)

    async def _run(self):
        api, tasks, n = client(self.key, self.context), set(), 0
        begin, apis, key = time.monotonic(), [api], self.key
        while not self._stop.is_set():
            if self.key != key:  # the clients moved to another key (key-rotation)
                key = self.key
                api = client(key, self.context)
                apis.append(api)
            task = asyncio.ensure_future(self._one(api, n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            await asyncio.sleep(max(0.0, begin + n / self.rate - time.monotonic()))
        if tasks:
            await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 5)
        for one in apis:
            await one.close()


def summarize(records, refs, start, end):
    """Figures of the requests sent in [start, end] (monotonic seconds)."""
    sent = sorted((r for r in records if start <= r["sent"] <= end), key=lambda r: r["sent"])
    failed = [r for r in sent if not r["ok"]]
    differ = [r for r in sent if r["ok"] and r["text"] != refs[r["prompt"]]]
    successes = sorted(r["done"] for r in sent if r["ok"])
    # from the window's start to the first success, between successes, from the last one to the window's end
    marks = [start] + successes + [max(end, successes[-1] if successes else end)]
    gap = max(b - a for a, b in itertools.pairwise(marks))
    errors = collections.Counter(r["error"] for r in failed)
    run = longest = 0
    for r in sent:
        run = 0 if r["ok"] else run + 1
        longest = max(longest, run)
    return {"requests": len(sent), "failed": len(failed), "failed_in_a_row": longest,
            "first_error": failed[0]["error"] if failed else None,
            "errors": [{"error": e, "count": c} for e, c in errors.most_common(5)],
            "differ": len(differ), "first_difference": {"prompt": PROMPTS[differ[0]["prompt"]],
                                                        "reference": refs[differ[0]["prompt"]],
                                                        "answer": differ[0]["text"]} if differ else None,
            "longest_gap_s": round(gap, 2)}


# ---------------------------------------------------------------------------------------------- the operations

def _site_run(site, name):
    res = site.playbook("site", "op-" + name)
    tail = [line for line in res["output"].splitlines() if line.strip()][-3:]
    return {"rc": res["rc"], "action_s": round(res["wall_s"], 1), "detail": "site rc %d" % res["rc"],
            "output_tail": tail}


def op_replace(site, args, node):
    # an operator's change of one engine's input; --max-num-seqs changes the plan, not the answers or the
    # NIXL compatibility (gate.factors)
    site.edit("NARWHAL_NODE_%d_EXTRA_ARGS" % node, "--max-num-seqs %d" % (64 + len(site.overrides)))
    return _site_run(site, "replace-%s" % ("prefill" if node % 2 else "decode"))


def op_upgrade(site, args):
    site.edit("NARWHAL_IMAGE", NEXT_IMAGE)
    return _site_run(site, "upgrade")


def op_key_rotation(site, args, traffic):
    """The key rotated as docs/security.md "Rotating the key" says: the new key on the first line of the key file
    and the old one on the second, `site` (the engines accept both at once, the routers reload with the new one);
    the clients move to the new key; the second line removed, `site` again. The traffic keeps the old key until the
    first run is done, then takes the new one."""
    begin, old, new = time.monotonic(), api_key(), os.urandom(18).hex()
    write_key("%s\n%s\n" % (new, old))
    both = site.playbook("site", "op-key-both")
    traffic.key = new
    time.sleep(3)
    write_key(new + "\n")
    only = site.playbook("site", "op-key-new")
    return {"rc": both["rc"] or only["rc"], "action_s": round(time.monotonic() - begin, 1),
            "detail": "key file new + old: site rc %d (%.0f s); clients on the new key; key file new: site rc %d "
                      "(%.0f s)" % (both["rc"], both["wall_s"], only["rc"], only["wall_s"])}


def op_router_restart(site, args):
    begin = time.monotonic()
    proc = bench.sh(["docker", "exec", host(ROUTER), "docker", "restart", "narwhal-router"], check=False)
    return {"rc": proc.returncode, "action_s": round(time.monotonic() - begin, 1),
            "detail": "docker restart narwhal-router on %s" % ROUTER}


def op_router_replace(site, args):
    # a new router image as an operator's upgrade brings one: built on router-1's daemon from the image it holds
    # (one label more, so another image ID; offline), NARWHAL_ROUTER_IMAGE changed in .env, the router stage rerun:
    # the container is replaced by hand-over (docs/router.md)
    begin = time.monotonic()
    script = "printf 'FROM %s\\nLABEL org.narwhal.bench=router-replace-%d\\n' | docker build -q -t %s -" % (
        ROUTER_IMAGE, len(site.overrides), NEXT_ROUTER)
    bench.sh(["docker", "exec", host(ROUTER), "sh", "-c", script])
    site.edit("NARWHAL_ROUTER_IMAGE", NEXT_ROUTER)
    res = site.playbook("router", "op-router-replace")
    return {"rc": res["rc"], "action_s": round(time.monotonic() - begin, 1),
            "detail": "NARWHAL_ROUTER_IMAGE=%s, router stage rc %d" % (NEXT_ROUTER, res["rc"])}


def op_kill_engine(site, args, node=4):
    begin = time.monotonic()
    script = "kill -9 $(docker inspect -f '{{.State.Pid}}' narwhal-engine-%d)" % node
    proc = bench.sh(["docker", "exec", host("engine-%d" % node), "sh", "-c", script], check=False)
    return {"rc": proc.returncode, "action_s": round(time.monotonic() - begin, 1),
            "detail": "kill -9 of engine-%d's main process (decode)" % node}


def dropped(key, context, url, timeout=60):
    """Seconds (monotonic) at which the router no longer routes to `url` (unhealthy or gone from its /workers)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        workers = router_workers(key, context)
        if not isinstance(workers, str) and not any(u.rstrip("/") == url and ok for u, _t, ok in workers):
            return time.monotonic()
        time.sleep(0.2)
    return None


def closing_lines(output, word):
    """The lines of a playbook's output (its closing table included) that name `word` (not its recap's `word=`)."""
    return [line.strip().strip('",') for line in output.splitlines() if word in line and word + "=" not in line][-4:]


# a host cut off: its own firewall drops every packet in or out but loopback's ({0}: -I cuts, -D mends)
CUT = "iptables {0} INPUT ! -i lo -j DROP && iptables {0} OUTPUT ! -o lo -j DROP"


def op_host_cut(site, args, node=3, key=None, context=None):
    """engine-<node> (a prefill) cut off from every network. While it is off, an operator's change of engine-2's input
    and a `site` run: it goes on for the others (ansible-playbook's exit status 4 says a host was unreachable), leaves
    engine-<node> out of the routers and names it in its closing table. Then the host comes back and `site` is run
    again: it takes the engine back."""
    name, begin = host("engine-%d" % node), time.monotonic()
    url = "https://%s.%d:8000" % (FABRIC4, 10 + node)
    # cut off as a dead link cuts it: every packet in or out of the host's interfaces dropped (its own firewall, so
    # its interfaces stay as they are: a docker network disconnect/connect renames them, which a real host does not)
    bench.sh(["docker", "exec", name, "sh", "-c", CUT.format("-I")])
    gone = dropped(key, context, url) if key else None
    time.sleep(args.cut_s)
    # a decode's change (engine-2): with engine-3 off, engine-1 is the only prefill the routers have, and an engine
    # a router cannot spare stays in it while it is replaced (_launch/roll.py::router_moves)
    site.edit("NARWHAL_NODE_2_EXTRA_ARGS", "--max-num-seqs %d" % (64 + len(site.overrides)))
    cut = site.playbook("site", "op-host-cut")
    bench.sh(["docker", "exec", name, "sh", "-c", CUT.format("-D")])
    back = site.playbook("site", "op-host-back")
    return {"rc": back["rc"], "action_s": round(time.monotonic() - begin, 1),
            "dropped_s": round(gone - begin, 2) if gone else None,
            "cut_rc": cut["rc"], "cut_site_s": round(cut["wall_s"], 1), "back_rc": back["rc"],
            "cut_closing": closing_lines(cut["output"], "unreachable"),
            "detail": "engine-%d (prefill) cut off; site with it off: rc %d (4: a host unreachable), %.0f s; "
                      "back, site: rc %d" % (node, cut["rc"], cut["wall_s"], back["rc"])}


ACTIONS = {
    "replace-prefill": lambda site, args: op_replace(site, args, 1),
    "replace-decode": lambda site, args: op_replace(site, args, 2),
    "upgrade": op_upgrade,
    "key-rotation": op_key_rotation,
    "router-restart": op_router_restart,
    "router-replace": op_router_replace,
    "kill-engine": op_kill_engine,
    "host-cut": op_host_cut,
}


def run_op(name, site, args, key):
    """One operation under traffic -> its figures."""
    context = tls_context()
    _at, reason = wait_whole(key, context)
    if reason:
        log("%s: the fleet is not whole before the operation (%s); measured anyway" % (name, reason))
    refs = references(key, context)
    traffic = Traffic(key, context, args.rate)
    traffic.start()
    time.sleep(LEAD_S)
    log("%s: start" % name)
    t0 = time.monotonic()
    if name == "host-cut":
        action = op_host_cut(site, args, key=key, context=context)
    elif name == "key-rotation":
        action = op_key_rotation(site, args, traffic)
    else:
        action = ACTIONS[name](site, args)
    time.sleep(2)
    at, not_whole = wait_whole(api_key(), context)  # the key now (key-rotation changes it)
    time.sleep(TAIL_S)
    end = time.monotonic()
    records = traffic.stop()
    figures = summarize(records, refs, t0 - LEAD_S, end)
    if action.get("dropped_s") is not None:  # a lost host: what failed once the router had dropped it
        late = summarize(records, refs, t0 + action["dropped_s"], end)
        figures.update(failed_after_drop=late["failed"], first_error_after_drop=late["first_error"])
    figures.update(operation=name, action=action, whole_after_s=round(at - t0, 1) if at else None,
                   not_whole=not_whole, not_whole_before=reason, references=refs,
                   requests_log=[{"sent_s": round(r["sent"] - t0, 3), "done_s": round(r["done"] - t0, 3),
                                  "prompt": r["prompt"], "ok": r["ok"], "error": r.get("error")}
                                 for r in sorted(records, key=lambda r: r["sent"])])
    log("%s: %d requests, %d failed, %d differ, longest gap %.2f s, whole after %s s (%s)" % (
        name, figures["requests"], figures["failed"], figures["differ"], figures["longest_gap_s"],
        figures["whole_after_s"], action["detail"]))
    return figures


# ------------------------------------------------------------------------------------------------ the report

COLUMNS = (("operation", "operation"), ("requests", "requests"), ("failed", "failed"),
           ("failed_after_drop", "failed once dropped"),
           ("failed_in_a_row", "failed in a row"), ("differ", "answers differ"),
           ("longest_gap_s", "longest gap (s)"), ("whole_after_s", "whole after (s)"), ("action_s", "action (s)"),
           ("first_error", "first error"))


def cell(row, key):
    value = row.get("action", {}).get(key) if key == "action_s" else row.get(key)
    if key == "whole_after_s" and value is None and not row.get("skipped"):
        return "not within %d s" % WHOLE_TIMEOUT_S
    if value is None:
        return "-"
    return str(value).replace("|", "\\|").replace("\n", " ")[:160]


def table(doc):
    lines = ["day-two %s, code %s, %s requests/s, load %s s, %s" % (
        doc["started_at"], doc["commit"], doc["rate"], doc["load_s"], doc["client"]), "",
        "| " + " | ".join(title for _k, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS)]
    for row in doc["operations"]:
        if row.get("skipped"):
            lines.append("| %s | skipped: %s |%s" % (row["operation"], row["skipped"], " |" * (len(COLUMNS) - 2)))
            continue
        lines.append("| " + " | ".join(cell(row, key) for key, _t in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def problems(doc):
    """What --strict refuses: an operation that lost or changed an answer, did not end whole, or whose action
    failed."""
    found = []
    for row in doc["operations"]:
        if row.get("skipped"):
            found.append("%s: skipped (%s)" % (row["operation"], row["skipped"]))
            continue
        if "failed_after_drop" in row:  # a lost host: only what failed once the router had dropped it counts
            if row["failed_after_drop"]:
                found.append("%s: %d requests failed after the router had dropped the host, first: %s"
                             % (row["operation"], row["failed_after_drop"], row["first_error_after_drop"]))
            named = [x for x in row["action"]["cut_closing"] if x.startswith("engine-") and " unreachable" in x]
            if row["action"]["cut_rc"] != 4 or not named:
                found.append("%s: the site run with the host off did not go on for the others (rc %d, want 4: a host "
                             "unreachable) or did not name it unreachable: %s"
                             % (row["operation"], row["action"]["cut_rc"], row["action"]["cut_closing"]))
        elif row["failed"]:
            found.append("%s: %d of %d requests failed, first: %s"
                         % (row["operation"], row["failed"], row["requests"], row["first_error"]))
        if row["differ"]:
            found.append("%s: %d answers differ from the reference, first: %s" % (
                row["operation"], row["differ"], row["first_difference"]))
        if row["whole_after_s"] is None:
            found.append("%s: the fleet was not whole within %d s (%s)"
                         % (row["operation"], WHOLE_TIMEOUT_S, row["not_whole"]))
        if row["action"]["rc"]:
            found.append("%s: %s" % (row["operation"], row["action"]["detail"]))
    return found


def write(out, doc):
    bench.write_json(os.path.join(out, "day-two.json"), doc)
    with open(os.path.join(out, "day-two.md"), "w") as fh:
        fh.write(table(doc))


# ------------------------------------------------------------------------------------------------ main

def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of %s" % ", ".join(OPS))
    parser.add_argument("--rate", type=float, default=5.0, help="requests a second through the router (default 5)")
    parser.add_argument("--load-s", type=int, default=20, help="NARWHAL_STANDIN_LOAD_S of the engines through "
                        "NARWHAL_ENGINE_ENV: the stand-in's model-load time (default 20; 0 leaves it out)")
    parser.add_argument("--cut-s", type=int, default=30, help="seconds host-cut keeps the host off (default 30)")
    parser.add_argument("--strict", action="store_true", help="exit 1 naming every operation that failed a request, "
                        "changed an answer, did not end whole or whose action failed (the CI short form)")
    parser.add_argument("--keep", action="store_true", help="keep the simulated site afterwards")
    parser.add_argument("--down", action="store_true", help="only tear the day-two site down")
    parser.add_argument("--out", help="results directory (default runs/day-two-<UTC stamp>)")
    parser.add_argument("--code", metavar="DIR", help="run the playbooks of another checkout DIR (with its "
                        "collections/ tree) on this checkout's site: the same site before and after a change")
    args = parser.parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown:
        parser.error("--ops: unknown operation(s) %s; choose from %s" % (", ".join(unknown), ", ".join(OPS)))
    args.ops = [op for op in OPS if op in args.ops]
    return args


def main(argv=None):
    args = parse(argv)
    if args.code:
        bench.CODE[0] = os.path.abspath(args.code)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.abspath(args.out or os.path.join(ROOT, "runs", "day-two-" + stamp))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    images = [IMAGE] + ([NEXT_IMAGE] if image_exists(NEXT_IMAGE) else [])
    if args.down:
        harness(out, images, "absent")
        return 0
    import openai  # requirements/bench.txt
    commit = bench.sh(["git", "-C", bench.CODE[0], "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    doc = {"command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
           "code": bench.CODE[0], "commit": commit, "started_at": stamp, "site": SITE, "rate": args.rate,
           "load_s": args.load_s, "client": "openai %s (max_retries=0)" % openai.__version__, "nproc": os.cpu_count(),
           "images": images, "operations": []}
    try:
        harness(out, images)
        bench.forget_pins(STATE)  # the site's hosts are new
        key = api_key()
        site = Site(out, args.load_s)
        res = site.playbook("site", "site-first", ["-e", "narwhal_launch_serial=%d" % ENGINES])
        if res["rc"]:
            raise RuntimeError("the first site run failed (rc %d), see %s/logs/site-first.log" % (res["rc"], out))
        doc["site_first_s"] = round(res["wall_s"], 1)
        for name in args.ops:
            if name == "upgrade" and NEXT_IMAGE not in images:
                doc["operations"].append({"operation": name, "skipped": "no image %s (scripts/build-images.sh sim "
                                                                        "builds it)" % NEXT_IMAGE})
                continue
            doc["operations"].append(run_op(name, site, args, key))
            write(out, doc)
    finally:
        doc["finished_at"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        write(out, doc)
        if not args.keep:
            harness(out, images, "absent")
    print(table(doc))
    log("results in %s" % os.path.relpath(out, ROOT))
    found = problems(doc) if args.strict else []
    for problem in found:
        log("refused: " + problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
