#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cost of the engines' key guard per request (issue 35): roles/install/files/guard/narwhal_guard.py, the ASGI
middleware every engine loads through `vllm serve --middleware narwhal_guard.KeyGuard`.

Drives the guard as the ASGI server does, in one event loop, in front of an app that answers at once, and prints the
time per request of each case next to the same app without the guard: an open path (GET /metrics), a request with
the key (POST /v1/completions, Authorization: Bearer <64-character key>), and a refusal (POST /invocations without
the key). The difference is what the guard adds to a request. The guard reads its keys from the file
NARWHAL_GUARD_KEY_FILE names (a temporary file here) and looks at it again at most once a second (RECHECK_S); the
cases "key file, 2 keys" (a rotation: the key and the previous one, each compared) and "stat on every request"
(RECHECK_S = 0: an os.stat of the key file per keyed request, the alternative) show what that choice saves. vLLM's
own key check is off on narwhal's engines (VLLM_API_KEY empty), so a keyed /v1 request pays the guard only.

Usage: .venv/bin/python bench/guard_cost.py [--requests 200000]

Measured on the development machine (2 CPU cores, shared with other jobs: load about 3; Python 3.11.7), microseconds
per request, the median of five runs of 200 000 requests, 2026-12-06:

    case                            bare app   with guard   added
    GET /metrics (open)                 0.59         1.32    0.73
    POST /v1/completions (key)          0.63         3.12    2.49
      key file, 2 keys (rotation)       0.54         2.94    2.40
      stat on every request             0.58         6.24    5.66
    POST /invocations (no key, 401)       -          1.67       -

The guard with its key in VLLM_API_KEY (before issue 36), run alongside: 0.60 (open) and 2.46 (key) added. So
reading the key from a file costs a request nothing measurable: a clock read, and a stat once a second; a second key
during a rotation adds one compare_digest (within the noise). A stat on every request would add about 3.5
microseconds (os.stat of a file on ext4 under this load), more than the rest of the guard: hence RECHECK_S = 1 (a
new key is in force within a second). Against the tens of milliseconds of a token on the CPU engines
(docs/fleet-benchmark.md) and the 0.2 ms the router's TLS front adds (bench/router_tls_front.py) all of it is
noise; a proxy in front of each engine would add a loopback hop and a TLS session per request instead
(docs/security.md).
"""

import argparse
import asyncio
import importlib.util
import os
import pathlib
import statistics
import tempfile
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
    folder = tempfile.mkdtemp(prefix="guard-cost-")
    key_file = os.path.join(folder, "engine-api.key")
    os.environ["NARWHAL_GUARD_KEY_FILE"] = key_file
    module = load_guard()
    with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
        handle.write(KEY + "\n")
    guard = module.KeyGuard(app)
    with open(key_file, "w") as handle:
        handle.write("%s\n%s\n" % (KEY, "p" * 64))
    rotating = module.KeyGuard(app)
    keyed, recheck = scope("POST", "/v1/completions", KEY), module.RECHECK_S
    # the last but one: RECHECK_S = 0, the alternative of an os.stat of the key file on every keyed request
    cases = [("GET /metrics (open)", scope("GET", "/metrics"), guard, recheck, True),
             ("POST /v1/completions (key)", keyed, guard, recheck, True),
             ("  key file, 2 keys (rotation)", keyed, rotating, recheck, True),
             ("  stat on every request", keyed, guard, 0.0, True),
             ("POST /invocations (no key, 401)", scope("POST", "/invocations"), guard, recheck, False)]
    print("%-32s %9s %12s %7s" % ("case (us per request)", "bare app", "with guard", "added"))
    for name, request, handler, seconds, passes in cases:
        module.RECHECK_S = seconds
        bare = [asyncio.run(per_request(app, request, args.requests)) for _run in range(args.runs)] if passes else []
        guarded = [asyncio.run(per_request(handler, request, args.requests)) for _run in range(args.runs)]
        b, g = (statistics.median(bare) if bare else None), statistics.median(guarded)
        print("%-32s %9s %12.2f %7s" % (name, "%.2f" % b if b else "-", g, "%.2f" % (g - b) if b else "-"))
    os.unlink(key_file)
    os.rmdir(folder)


if __name__ == "__main__":
    main()
