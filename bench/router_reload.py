#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a router reload costs (issue 36): roles/router/files/narwhal_router.py on SIGHUP starts a new vllm-router with
the worker set of workers.json, switches new connections to it once it serves and every worker answers /health, and
drains the previous one (SIGTERM: vllm-router accepts nothing new and ends when its requests are done).

The real vllm-router (requirements/router.txt, the venv's) behind the start script (no TLS), in front of stand-in
engines served as processes (tests/unit/plugins/test_support: one prefill, two decode), under steady traffic from
client threads: half on a new connection per request, half on one kept-alive connection each (http.client, as
OpenAI clients and aiohttp pools keep them; a kept-alive connection the previous vllm-router closes while idle is
opened again, as those clients do, and counted). Each reload toggles the second decode engine in and out of
workers.json. Per reload: seconds from SIGHUP to the start script's "reload <n> done" (its own "ready in" figure)
and to the router's /workers reporting the new set; over the run: requests sent and failed (with the first errors).

Usage: .venv/bin/python bench/router_reload.py [--reloads 6] [--clients 4] [--pause 3]
Prints its figures; asserts nothing about time.
"""
import argparse
import http.client
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "collections"), str(REPO / "tests" / "unit" / "plugins"), str(REPO / "tests" / "unit")]

from test_support.router import router_process  # noqa: E402
from test_support.standin import engine_process  # noqa: E402

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call  # noqa: E402

KEY = "sk-narwhal-reload-bench-key-0123456789abcdef"
BODY = {"model": "tiny", "prompt": "steady traffic", "max_tokens": 4}


class Client(threading.Thread):
    """Completions one after another: on a new connection each (keep=False) or on one kept-alive connection."""

    def __init__(self, host, port, keep, number, key=KEY):
        super().__init__(daemon=True)
        self.host, self.port, self.keep, self.number, self.key = host, port, keep, number, key
        self.sent = self.failed = self.reconnects = 0
        self.errors, self.running, self.conn = [], True, None

    def request(self, n):
        if self.conn is None or not self.keep:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        body = json.dumps(dict(BODY, prompt="client %d request %d" % (self.number, n)))
        headers = {"Authorization": "Bearer " + self.key, "Content-Type": "application/json"}
        self.conn.request("POST", "/v1/completions", body, headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if not self.keep or resp.getheader("connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return resp.status, data

    def run(self):
        n = 0
        while self.running:
            n += 1
            self.sent += 1
            try:
                status, data = self.request(n)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                if self.keep and self.conn is not None:
                    # the server closed an idle kept-alive connection: a client opens a new one and sends again
                    # (http.client raises RemoteDisconnected only when no byte of an answer came)
                    self.conn.close()
                    self.conn, self.reconnects = None, self.reconnects + 1
                    try:
                        status, data = self.request(n)
                    except OSError as again:
                        status, data = 0, repr(again).encode()
                else:
                    status, data = 0, repr(exc).encode()
            except OSError as exc:
                status, data = 0, repr(exc).encode()
            if status != 200:
                self.failed += 1
                self.errors.append("%s %s" % (status, data[:160]))


def reported(url):
    status, answer = call(url + "/workers", KEY, timeout=5)
    return sorted((w["worker_type"], w["url"]) for w in answer["workers"]) if status == 200 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--reloads", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pause", type=float, default=3.0, help="seconds of traffic between reloads")
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="router-reload-"))
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode"), (3, "decode")):
        url, proc = engine_process(tmp, str(n), KEY)
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    router = router_process(tmp, engines[:2], KEY, drain_timeout=30)
    procs.append(router["proc"])
    host, port = router["url"].split("//")[1].rsplit(":", 1)
    clients = [Client(host, int(port), keep=i % 2 == 1, number=i) for i in range(opts.clients)]
    rows = []
    try:
        for client in clients:
            client.start()
        time.sleep(opts.pause)
        for r in range(opts.reloads):
            decodes = [engines[1]["url"]] + ([engines[2]["url"]] if r % 2 == 0 else [])
            router["workers"].write_text(json.dumps({"prefill": [engines[0]["url"]], "decode": decodes}))
            want = sorted([("prefill", engines[0]["url"])] + [("decode", u) for u in decodes])
            started = time.time()
            os.kill(router["proc"].pid, signal.SIGHUP)
            while reported(router["url"]) != want and time.time() - started < 60:
                time.sleep(0.05)
            seen = time.time() - started
            log = router["log"].read_text(errors="replace")
            done = re.findall(r"reload %d done: .*ready in ([0-9.]+) s" % (r + 2), log)
            rows.append((r + 2, len(decodes), float(done[0]) if done else None, seen))
            time.sleep(opts.pause)
    finally:
        for client in clients:
            client.running = False
        for client in clients:
            client.join(40)
        for proc in procs:
            proc.kill()
            proc.wait(10)
    print("reload  decodes  SIGHUP->serving (start script)  SIGHUP->/workers new set")
    for number, decodes, ready, seen in rows:
        print("%6d  %7d  %29s  %23.2f s" % (number, decodes, "%.2f s" % ready if ready is not None else "FAILED", seen))
    for kind, keep in (("new connection each", False), ("kept-alive", True)):
        group = [c for c in clients if c.keep == keep]
        print("%-20s clients %d: requests %d, failed %d, kept-alive connections closed by the router and opened again "
              "%d" % (kind, len(group), sum(c.sent for c in group), sum(c.failed for c in group),
                      sum(c.reconnects for c in group)))
    errors = [e for c in clients for e in c.errors]
    if errors:
        print("first errors: %s" % errors[:3])


if __name__ == "__main__":
    main()
