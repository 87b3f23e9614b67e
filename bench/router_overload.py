#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the router answers at overload (issue 38, docs/router.md "Flow control at the front door"): the real
vllm-router (requirements/router.txt, the venv's) behind the start script (no TLS), with the admission options of
the router plan (_router/plan.py::flow_control_args) from the inputs of each configuration, in front of two prefill
and two decode stand-in engines served as processes (tests/unit/plugins/test_support).

The stand-ins answer at once, so each engine sits behind a relay that stands for its batch: at most --slots requests
at once, each taking a fixed time (--prefill-cost, --decode-cost seconds) before it passes, the others waiting in
arrival order as in an engine's waiting queue. The fleet's capacity is then known: 2 decode engines x slots /
decode-cost requests per second.
1. saturation: closed-loop clients (each sends its next request when its last is answered), 4, 8 and 16 of them,
   against vllm-router's own defaults: the throughput plateau.
2. overload: Poisson arrivals at --load times that plateau for --seconds, per configuration (a new router each, on the
   same engines): vllm-router's own defaults (cap 32768, queue 100, queue timeout 60 s), the plan's defaults with
   the cap set to the fleet's slots (the cap the docs tell an operator to set: the decode engines' ranks x
   --max-num-seqs), that cap with a refill of the cap per second, that cap with a queue, and
   the plan's defaults with streamed requests. Then every request is waited for (at most --grace seconds after the
   last arrival; what is still open is counted unanswered).
Per configuration: offered requests per second and accepted ones answered per second (from the first arrival to the
last answer), the refused fraction and its statuses, the refusals'
latency p50/p99, the accepted requests' time to first token (streamed only) and latency p50/p99, and the most
requests at the decode engines at once (waiting or in a slot). Non-streamed requests' first token is their answer.

Usage: .venv/bin/python bench/router_overload.py [--seconds 12] [--load 2] [--slots 4] [--decode-cost 1.0]
Prints the table, writes bench/results/router-overload-<stamp>/{overload.json,table.txt}; asserts nothing about time.
"""
import argparse
import http.client
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "collections"), str(REPO / "tests" / "unit" / "plugins"), str(REPO / "tests" / "unit")]

from test_support.relay import Relay  # noqa: E402
from test_support.router import router_process  # noqa: E402
from test_support.standin import engine_process  # noqa: E402

KEY = "sk-narwhal-overload-bench-key-0123456789abcdef"
# vllm_router/router_args.py RouterArgs: max_concurrent_requests 32768, queue_size 100, queue_timeout_secs 60,
# rate_limit_tokens_per_second None (measured: refills 1 per second in P/D mode, as 1 and 0 do)
UPSTREAM = {"NARWHAL_ROUTER_MAX_CONCURRENT": 32768, "NARWHAL_ROUTER_QUEUE_SIZE": 100,
            "NARWHAL_ROUTER_QUEUE_TIMEOUT": 60, "NARWHAL_ROUTER_RATE_LIMIT": 1}


class Slots(Relay):
    """A TCP relay in front of a stand-in engine that stands for its batch: each request (a chunk from the router that
    starts with POST) passes at once, and its answer waits for one of `slots`, holds it `cost` seconds, then passes.
    A streamed answer's head (text/event-stream) passes before that wait, as vLLM starts a stream's response at once
    and schedules the request afterwards (Starlette's StreamingResponse sends its head before the first chunk; the
    stand-in does the same); a JSON answer waits whole. `inside`: answers waiting or in a slot, `peak` its most."""

    backlog = 1024

    def __init__(self, upstream, slots, cost):
        self.cost, self.turn = cost, threading.Semaphore(slots)
        self.inside = self.peak = 0
        self.lock = threading.Lock()
        super().__init__(upstream)

    def connection(self):
        return []  # one entry per request of the connection whose answer has not started

    def serve(self):
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        with self.turn:
            time.sleep(self.cost)
        with self.lock:
            self.inside -= 1

    def answer(self, data, dst):
        """The first bytes of an answer: a stream's head at once, then the slot; a JSON answer after the slot."""
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep and b"text/event-stream" in head.lower():
            dst.sendall(head + sep)
            data = rest
        self.serve()
        if data:
            dst.sendall(data)

    def chunk(self, data, dst, inbound, state):
        if inbound and data.startswith(b"POST"):
            state.append(1)
        elif not inbound and state and data.startswith(b"HTTP/"):
            state.pop()
            self.answer(data, dst)
            return True
        return False


def one(url, stream, n):
    """One completion on a new connection -> {status, first, end} (seconds from its send)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    began = time.time()
    row = {"status": 0, "first": None, "end": None}
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": "overload %d" % n,
                                                            "max_tokens": 4, "stream": stream}),
                     {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        resp = conn.getresponse()
        row["status"] = resp.status
        if stream and resp.status == 200:
            while True:
                line = resp.readline()
                if not line or line.startswith(b"data: [DONE]"):
                    break
                if line.startswith(b"data:") and row["first"] is None:
                    row["first"] = time.time() - began
        resp.read()
        conn.close()
    except (OSError, http.client.HTTPException) as exc:
        row["error"] = repr(exc)
    row["end"] = time.time() - began
    if row["first"] is None and row["status"] == 200:
        row["first"] = row["end"]
    return row


def closed_loop(url, clients, seconds):
    """`clients` threads, each sending its next request when its last is answered -> requests answered per second in
    the second half of `seconds` (the first half fills the engines)."""
    done, began = [], time.time()
    stop = began + seconds

    def client(c):
        n = 0
        while time.time() < stop:
            n += 1
            if one(url, False, c * 100000 + n)["status"] == 200 and began + seconds / 2 <= time.time() <= stop:
                done.append(time.time())
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return len(done) / (seconds / 2)


def open_loop(url, rate, seconds, stream, grace, seed):
    """Poisson arrivals at `rate` per second for `seconds` -> (rows, rows still open after `grace`)."""
    rng, rows, threads = random.Random(seed), [], []
    began = time.time()
    at, n = rng.expovariate(rate), 0
    while at < seconds:
        time.sleep(max(0.0, began + at - time.time()))
        n += 1
        holder = {"at": time.time() - began}
        thread = threading.Thread(target=lambda h=holder, k=n: h.update(one(url, stream, k)), daemon=True)
        thread.start()
        threads.append(thread)
        rows.append(holder)
        at += rng.expovariate(rate)
    deadline = time.time() + grace
    for thread in threads:
        thread.join(max(0.0, deadline - time.time()))
    return [r for r in rows if r.get("end") is not None], sum(1 for r in rows if r.get("end") is None)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def summary(rows, unanswered, seconds, offered, peak):
    ok = [r for r in rows if r["status"] == 200]
    refused = [r for r in rows if r["status"] != 200]
    statuses = {}
    for r in refused:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    total = len(rows) + unanswered
    span = max([r["at"] + r["end"] for r in ok] + [seconds])  # the first arrival to the last answer
    return {"offered_per_s": offered, "sent": total, "accepted": len(ok), "accepted_per_s": len(ok) / span,
            "refused_fraction": len(refused) / total if total else 0.0, "refused_statuses": statuses,
            "unanswered": unanswered,
            "refusal_ms_p50": _ms(pct([r["end"] for r in refused], 0.5)),
            "refusal_ms_p99": _ms(pct([r["end"] for r in refused], 0.99)),
            "ttft_s_p50": pct([r["first"] for r in ok], 0.5), "ttft_s_p99": pct([r["first"] for r in ok], 0.99),
            "latency_s_p50": pct([r["end"] for r in ok], 0.5), "latency_s_p99": pct([r["end"] for r in ok], 0.99),
            "peak_at_decode": peak}


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def fleet(tmp, opts):
    """2 prefill + 2 decode stand-ins behind Slots relays -> (engines, relays, processes)."""
    engines, relays, procs = [], [], []
    for n, role in enumerate(("prefill", "prefill", "decode", "decode"), 1):
        url, proc = engine_process(tmp, str(n), KEY)
        procs.append(proc)
        cost = opts.prefill_cost if role == "prefill" else opts.decode_cost
        relay = Slots(int(url.rsplit(":", 1)[1]), opts.slots, cost)
        relays.append(relay)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": relay.url})
    return engines, relays, procs


def configurations(cap):
    plan = {"NARWHAL_ROUTER_MAX_CONCURRENT": cap}  # the rest: the plan's defaults (queue 0, timeout 1 s, refill 1/s)
    return [("vllm-router defaults", UPSTREAM, False),
            ("plan defaults, cap %d" % cap, plan, False),
            ("cap %d, refill %d/s" % (cap, cap), dict(plan, NARWHAL_ROUTER_RATE_LIMIT=cap), False),
            ("cap %d, queue 100, timeout 1 s" % cap, dict(plan, NARWHAL_ROUTER_QUEUE_SIZE=100), False),
            ("plan defaults, cap %d, streamed" % cap, plan, True)]


def run(opts, tmp):
    engines, relays, procs = fleet(tmp, opts)
    results = {"parameters": vars(opts), "saturation": {}, "overload": {}}
    cap = 2 * opts.slots
    try:
        router = router_process(tmp / "saturation", engines, KEY, site=UPSTREAM)
        try:
            for clients in (4, 8, 16):
                answered = closed_loop(router["url"], clients, opts.saturation_seconds)
                results["saturation"][clients] = answered
                print("saturation: %2d closed-loop clients: %.2f answered/s" % (clients, answered), flush=True)
        finally:
            router["proc"].kill()
            router["proc"].wait(10)
        plateau = max(results["saturation"].values())
        rate = opts.load * plateau
        for number, (name, inputs, stream) in enumerate(configurations(cap)):
            (tmp / str(number)).mkdir()
            router = router_process(tmp / str(number), engines, KEY, site=inputs)
            for relay in relays:
                relay.peak = relay.inside
            try:
                rows, unanswered = open_loop(router["url"], rate, opts.seconds, stream, opts.grace, opts.seed)
            finally:
                router["proc"].kill()
                router["proc"].wait(10)
            peak = sum(r.peak for r in relays[2:])
            results["overload"][name] = dict(summary(rows, unanswered, opts.seconds, rate, peak), inputs=inputs,
                                             stream=stream)
            print("%s: done" % name, flush=True)
            while any(r.inside for r in relays):  # the next configuration starts on an idle fleet
                time.sleep(0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
    return results


def table(results):
    head = ("configuration", "offered/s", "accepted/s", "refused", "statuses", "refusal p50/p99 ms",
            "TTFT p50/p99 s", "latency p50/p99 s", "peak at decode")
    lines = [" | ".join(head), " | ".join("---" for _h in head)]
    for name, r in results["overload"].items():
        lines.append(" | ".join([
            name, "%.1f" % r["offered_per_s"], "%.2f" % r["accepted_per_s"],
            "%.0f%%" % (100 * r["refused_fraction"]),
            ", ".join("%s x%d" % kv for kv in sorted(r["refused_statuses"].items())) or "-",
            _pair(r["refusal_ms_p50"], r["refusal_ms_p99"], "%.1f"),
            _pair(r["ttft_s_p50"], r["ttft_s_p99"], "%.2f") if r["stream"] else "-",
            _pair(r["latency_s_p50"], r["latency_s_p99"], "%.2f") + (" (%d unanswered)" % r["unanswered"]
                                                                     if r["unanswered"] else ""),
            str(r["peak_at_decode"])]))
    return "\n".join("| %s |" % line for line in lines)


def _pair(a, b, fmt):
    return "-" if a is None else "%s / %s" % (fmt % a, fmt % b)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="seconds of arrivals per configuration")
    parser.add_argument("--saturation-seconds", type=float, default=6.0, help="seconds per closed-loop step")
    parser.add_argument("--load", type=float, default=2.0, help="offered load, times the saturation plateau")
    parser.add_argument("--slots", type=int, default=4, help="requests an engine serves at once")
    parser.add_argument("--prefill-cost", type=float, default=0.05, help="seconds a prefill takes in its slot")
    parser.add_argument("--decode-cost", type=float, default=1.0, help="seconds a decode takes in its slot")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds to wait for answers after the arrivals")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--out", help="results directory (default bench/results/router-overload-<UTC stamp>)")
    opts = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(opts.out or REPO / "bench" / "results" / ("router-overload-" + stamp))
    tmp = Path(tempfile.mkdtemp(prefix="router-overload-"))
    (tmp / "saturation").mkdir()
    results = run(opts, tmp)
    text = table(results)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overload.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out / "table.txt").write_text(text + "\n")
    print("results in %s" % out.relative_to(REPO) if out.is_relative_to(REPO) else out)


if __name__ == "__main__":
    main()
