#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a router hand-over costs (issue 36): a replaced or restarted router container starts next to the old one
(roles/router/files/narwhal_router.py binds the fronts with SO_REUSEPORT, listens once its vllm-router serves, then
takes every new connection with a classic BPF program on the port's reuseport group); the old one is stopped then
(its fronts take what reached them, close an empty accept queue, and its vllm-router drains). router_container does
this with containers (_router/container.py); here the two start scripts run as processes, as the unit tests run them.

Three parts, each printed:
1. kernel: two SO_REUSEPORT listeners in this process under connection load (client threads: connect, read one byte,
   close), the first one busy (it accepts one connection every 2 ms, so connections queue on it); it closes either
   at once (`close`: what a plain close does, Linux resets what is queued on it unless net.ipv4.tcp_migrate_req=1) or
   after the second one took the new connections and its queue is empty (`steer`: the start script's way).
2. before: stop, then start (what router_container does for a container started before the hand-over existed):
   SIGTERM the router, wait until it ends, start a new one, until it serves.
3. hand-over: start the second start script, wait for its "serving" line, SIGTERM the first.
Parts 2 and 3: the real vllm-router (requirements/router.txt, the venv's) behind the start script (no TLS), one
prefill and one decode stand-in engine as processes, client threads in a loop (half on a new connection per request,
half on a kept-alive one; a failed request is followed by a pause of 50 ms, a kept-alive connection the server closed
while idle is opened again and the request sent again, as HTTP clients do, and counted): requests sent and failed
(with the first errors), the longest time without an answer, and per operation the seconds until the new router
serves and until the old one ended.

Usage: .venv/bin/python bench/router_handover.py [--handovers 4] [--clients 4] [--pause 2] [--trials 5]
Prints its figures; asserts nothing about time.
"""
import argparse
import http.client
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "collections"), str(REPO / "tests" / "unit" / "plugins"), str(REPO / "tests" / "unit"),
                str(REPO / "bench"), str(REPO / "roles" / "router" / "files")]

import narwhal_router as script  # noqa: E402
import router_reload  # noqa: E402 - bench/router_reload.py: its client
from test_support.router import router_next, router_process, wait_serving  # noqa: E402
from test_support.standin import engine_process  # noqa: E402

KEY = "sk-narwhal-handover-bench-key-0123456789abcdef"
RETRY_PAUSE_S = 0.05


class Client(router_reload.Client):
    """router_reload.py's client (completions one after another, on a new connection each or on one kept-alive
    connection) that also keeps `answered`, the times of its 200 answers, and pauses after a failure."""

    def __init__(self, host, port, keep, number):
        super().__init__(host, port, keep, number, key=KEY)
        self.answered = []

    def once(self, n):
        try:
            return self.request(n)
        except http.client.RemoteDisconnected:
            if not self.keep or self.conn is None:
                raise
            # the server closed an idle kept-alive connection (no byte of an answer came): a client opens a new one
            # and sends again
            self.conn.close()
            self.conn, self.reconnects = None, self.reconnects + 1
            return self.request(n)

    def run(self):
        n = 0
        while self.running:
            n += 1
            self.sent += 1
            try:
                status, data = self.once(n)
            except (http.client.HTTPException, OSError) as exc:
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                status, data = 0, repr(exc).encode()
            if status == 200:
                self.answered.append(time.time())
                continue
            self.failed += 1
            self.errors.append("%s %s" % (status, data[:160]))
            time.sleep(RETRY_PAUSE_S)


def _accept(sock, stop, pace):
    while not stop.is_set():
        if select.select([sock], [], [], 0.02)[0]:
            try:
                conn = sock.accept()[0]
            except OSError:
                continue
            conn.sendall(b"x")
            conn.close()
            time.sleep(pace)


def _connect(port, stop, counts):
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                ok = conn.recv(1) == b"x"
            counts["ok" if ok else "closed"] += 1
        except OSError as exc:
            counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1


def kernel_trial(mode, clients=8):
    """One switch from a busy listener to a second one -> the clients' outcomes and the first one's queue at close."""
    old = script.listen("127.0.0.1", 0)
    port = old.getsockname()[1]
    old.listen(128)
    new = script.listen("127.0.0.1", port)
    counts, stops = {"ok": 0, "closed": 0}, [threading.Event() for _n in range(3)]
    threads = [threading.Thread(target=_accept, args=(old, stops[0], 0.002))]
    threads += [threading.Thread(target=_connect, args=(port, stops[2], counts)) for _n in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    new.listen(128)
    second = threading.Thread(target=_accept, args=(new, stops[1], 0))
    second.start()
    if mode == "steer":
        script.steer(new)
        time.sleep(script.QUIET_S)
        while script.queued(old):
            time.sleep(script.POLL_S)
    stops[0].set()
    threads[0].join()
    queued = script.queued(old)
    old.close()
    time.sleep(0.5)
    stops[2].set()
    for thread in threads[1:]:
        thread.join()
    stops[1].set()
    second.join()
    new.close()
    return counts, queued


def kernel(trials):
    print("1. kernel: a busy SO_REUSEPORT listener closed under connection load (%d trials each)" % trials)
    for mode in ("close", "steer"):
        total, queued = {}, []
        for _trial in range(trials):
            counts, left = kernel_trial(mode)
            queued.append(left)
            for key, value in counts.items():
                total[key] = total.get(key, 0) + value
        failed = sum(v for k, v in total.items() if k != "ok")
        print("   %-5s connections %d, failed %d %s, queued on the first at its close: %s"
              % (mode, sum(total.values()), failed, {k: v for k, v in total.items() if k != "ok" and v}, queued))


def traffic(url, count):
    host, port = url.split("//")[1].rsplit(":", 1)
    clients = [Client(host, int(port), keep=i % 2 == 1, number=i) for i in range(count)]
    for client in clients:
        client.start()
    return clients


def report(title, clients, rows):
    for client in clients:
        client.running = False
    for client in clients:
        client.join(40)
    print(title)
    for what, serves, ended in rows:
        print("   %-10s new router serving after %5.2f s, old router ended %5.2f s after its SIGTERM"
              % (what, serves, ended))
    for kind, keep in (("new connection each", False), ("kept-alive", True)):
        group = [c for c in clients if c.keep == keep]
        print("   %-20s clients %d: requests %d, failed %d, kept-alive connections closed and opened again %d"
              % (kind, len(group), sum(c.sent for c in group), sum(c.failed for c in group),
                 sum(c.reconnects for c in group)))
    answered = sorted(t for c in clients for t in c.answered)
    gaps = [answered[i + 1] - answered[i] for i in range(len(answered) - 1)]
    print("   longest time without an answer: %.2f s" % max(gaps or [0]))
    errors = [e for c in clients for e in c.errors]
    if errors:
        print("   first errors: %s" % errors[:3])


def switch(tmp, current, number, handover):
    """One replacement -> (the new router, (what, seconds until it serves, seconds the old one took to end))."""
    began = time.time()
    if handover:
        new = router_next(current, tmp, name="%d" % number)
        wait_serving(new)
        serves = time.time() - began
        stopped = time.time()
        current["proc"].send_signal(signal.SIGTERM)
        current["proc"].wait(60)
        ended = time.time() - stopped
    else:
        current["proc"].send_signal(signal.SIGTERM)
        current["proc"].wait(60)
        ended = time.time() - began
        new = router_next(current, tmp, name="%d" % number)
        wait_serving(new)
        serves = time.time() - began
    new.update(config=current["config"], url=current["url"])
    return new, ("hand-over" if handover else "stop+start", serves, ended)


def routers(opts):
    tmp = Path(tempfile.mkdtemp(prefix="router-handover-"))
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, proc = engine_process(tmp, str(n), KEY)
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    current = router_process(tmp, engines, KEY, drain_timeout=30)
    number = 0
    try:
        for title, handover in (("2. before: stop, then start", False), ("3. hand-over", True)):
            clients, rows = traffic(current["url"], opts.clients), []
            time.sleep(opts.pause)
            for _n in range(opts.handovers):
                number += 1
                current, row = switch(tmp, current, number, handover)
                rows.append(row)
                time.sleep(opts.pause)
            report(title, clients, rows)
    finally:
        current["proc"].kill()
        for proc in procs:
            proc.kill()
            proc.wait(10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--handovers", type=int, default=4, help="replacements in each of parts 2 and 3")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds of traffic between replacements")
    parser.add_argument("--trials", type=int, default=5, help="switches per mode in part 1")
    opts = parser.parse_args()
    kernel(opts.trials)
    routers(opts)


if __name__ == "__main__":
    main()
