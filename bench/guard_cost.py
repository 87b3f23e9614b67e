#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cost of the engines' key guard per request (issue 35): roles/install/files/guard/narwhal_guard.py, the ASGI
middleware every engine loads through `vllm serve --middleware narwhal_guard.KeyGuard`.

Drives the guard as the ASGI server does, in one event loop, in front of an app that answers at once, and prints the
time per request of each case next to the same app without the guard: an open path (GET /metrics), a request with
the key (POST /v1/completions, Authorization: Bearer <64-character key>), and a refusal (POST /invocations without
the key). The difference is what the guard adds to a request; vLLM's own key check on /v1 (authenticate.py) does the
same sha256 and compare_digest, so a keyed /v1 request pays it twice.

Usage: .venv/bin/python bench/guard_cost.py [--requests 200000]

Measured on the development machine (2 CPU cores, otherwise idle; Python 3.11.7), microseconds per request, the
median of five runs of 200 000 requests:

    case                            bare app   with guard   added
    GET /metrics (open)                 0.72         1.45    0.73
    POST /v1/completions (key)          0.62         3.67    3.05
    POST /invocations (no key, 401)       -          2.85       -

So the guard adds about 3 microseconds to a request with the key and under 1 to an open path, against the tens of
milliseconds of a token on the CPU engines (docs/fleet-benchmark.md) and the 0.2 ms the router's TLS front adds
(bench/router_tls_front.py). A proxy in front of each engine would add a loopback hop and a TLS session per request
instead (docs/security.md).
"""

import argparse
import asyncio
import importlib.util
import os
import pathlib
import statistics
import time

GUARD = pathlib.Path(__file__).resolve().parents[1] / "roles" / "install" / "files" / "guard" / "narwhal_guard.py"
KEY = "k" * 64


def load_guard():
    spec = importlib.util.spec_from_file_location("narwhal_guard", GUARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message):
    return None


def scope(method, path, key=None):
    headers = [(b"host", b"engine"), (b"content-type", b"application/json")]
    if key:
        headers.append((b"authorization", ("Bearer %s" % key).encode("latin-1")))
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}


async def per_request(handler, request, n):
    started = time.perf_counter()
    for _request in range(n):
        await handler(request, receive, send)
    return (time.perf_counter() - started) / n * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--requests", type=int, default=200000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ["VLLM_API_KEY"] = KEY
    guard = load_guard().KeyGuard(app)
    cases = [("GET /metrics (open)", scope("GET", "/metrics"), True),
             ("POST /v1/completions (key)", scope("POST", "/v1/completions", KEY), True),
             ("POST /invocations (no key, 401)", scope("POST", "/invocations"), False)]
    print("%-32s %9s %12s %7s" % ("case (us per request)", "bare app", "with guard", "added"))
    for name, request, passes in cases:
        bare = [asyncio.run(per_request(app, request, args.requests)) for _run in range(args.runs)] if passes else []
        guarded = [asyncio.run(per_request(guard, request, args.requests)) for _run in range(args.runs)]
        b, g = (statistics.median(bare) if bare else None), statistics.median(guarded)
        print("%-32s %9s %12.2f %7s" % (name, "%.2f" % b if b else "-", g, "%.2f" % (g - b) if b else "-"))


if __name__ == "__main__":
    main()
