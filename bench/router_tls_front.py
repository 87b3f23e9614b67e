#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cost of the router's TLS front (roles/router/files/narwhal_router.py) per request (issue 35).

vllm-router 0.1.17 has no TLS listener, so with NARWHAL_TLS on the start script ends TLS in a front of its own
(asyncio + ssl, a byte pump to vllm-router on loopback). This measures what a client pays for it: the same requests
to a trivial local HTTP/1.1 upstream (an asyncio server in a process of its own, answering at once) directly over
plain HTTP, and through the front over TLS (the front in a process of its own, as in the container; its certificate
from a temporary EC P-256 CA made with `cryptography`, verified by the client). Added latency = through the front
minus direct, percentile by percentile, in one run.

- small: GET of a 2-byte answer on one kept-alive connection (what vllm bench serve's aiohttp pool does);
- stream: GET of a Server-Sent-Event stream of 64 events of 100 bytes, chunked, on one kept-alive connection: time
  to the first event and to the last;
- connect: a new connection per small request (TCP, and with the front the TLS handshake too).

Usage: .venv/bin/python bench/router_tls_front.py [--requests 2000] [--streams 300] [--connects 300]

Measured on the development machine (2 CPU cores shared with other work, load average about 1; Python 3.11.7,
OpenSSL 3, loopback; 2000 / 300 / 300 requests after 200 / 30 / 30 warm-up ones; the median of five runs of each
figure, in ms; "added" is the front's percentile minus the direct one of the same run, the median over the runs, so
it is not the difference of the columns beside it; the p99 figures move by a millisecond from run to run here):

    case                    direct p50   p99   front p50   p99   added p50   p99
    small (kept alive)            0.33  0.49        0.57  0.92        0.21  0.27
    stream, first event           0.35  0.56        1.22  2.42        0.87  1.69
    stream, last event            0.88  1.51        1.67  2.73        0.77  1.05
    connect + small               0.60  0.95        3.66  7.17        3.06  5.76

(the added p50 of the five runs: small 0.13-0.45, first event 0.40-1.03, last event 0.63-0.94, connect 2.53-5.28).
So the front adds about 0.2 ms to a request on a kept-alive connection (vllm bench serve's aiohttp pool and most
OpenAI clients keep connections), under 1 ms to a stream's first event and about as much over its 64 events (the
front's process, the client's and the upstream's share two busy cores here), and about 3 ms to a new connection (the
TLS 1.3 handshake with an ECDSA P-256 certificate). Against a P/D request's time to first token (tens of ms on the
CPU engines of docs/fleet-benchmark.md, more on real models) it is within the run-to-run noise of the fleet
benchmark. (Before the listening socket said IPPROTO_TCP, asyncio left Nagle's algorithm on for the accepted
connections and a stream or a new connection waited 40 ms for a delayed ACK: narwhal_router.py, listen.)
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import multiprocessing
import pathlib
import socket
import ssl
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
EVENTS, EVENT_BYTES = 64, 100


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def upstream(port, ready):
    """The trivial upstream: /small answers 2 bytes, /stream EVENTS chunked SSE events at once."""
    event = b"data: " + b"x" * (EVENT_BYTES - 8) + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(event), event)

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.split(b" ", 2)[1] == b"/stream":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                    for _event in range(EVENTS):
                        writer.write(chunk)
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def front(port, upstream_port, cert, key, ready):
    """The TLS front as the start script runs it (open_fronts on a listening socket, quiet exception handler)."""
    sys.path.insert(0, str(REPO / "roles" / "router" / "files"))
    import narwhal_router as script

    context = script.server_context({"cert": cert, "key": key})
    sockets = [script.listen("127.0.0.1", port)]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(script.quiet)
    loop.run_until_complete(script.open_fronts(
        [{"listen": ["127.0.0.1", port], "upstream": ["127.0.0.1", upstream_port]}], sockets, context))
    ready.set()
    loop.run_forever()


def material(directory):
    """A CA and a server certificate for 127.0.0.1 -> (ca path, cert path, key path)."""
    sys.path.insert(0, str(REPO / "tests" / "unit" / "plugins"))
    from test_support.tempca import CA

    ca = CA()
    cert, key = ca.write_server(directory, "server", ["127.0.0.1"])
    return str(ca.write(directory / "ca.crt")), str(cert), str(key)


def connection(port, context):
    if context is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def small(port, context, count, warm):
    conn, times = connection(port, context), []
    for i in range(warm + count):
        started = time.perf_counter()
        conn.request("GET", "/small")
        answer = conn.getresponse()
        assert answer.read() == b"ok"
        if i >= warm:
            times.append(time.perf_counter() - started)
    conn.close()
    return times


def stream(port, context, count, warm):
    conn, first, last = connection(port, context), [], []
    for i in range(warm + count):
        started = time.perf_counter()
        conn.request("GET", "/stream")
        answer = conn.getresponse()
        got = answer.read1(1)  # the first event's first byte
        at_first = time.perf_counter() - started
        got += answer.read()
        at_last = time.perf_counter() - started
        assert got.count(b"data: ") == EVENTS
        if i >= warm:
            first.append(at_first)
            last.append(at_last)
    conn.close()
    return first, last


def connects(port, context, count, warm):
    times = []
    for i in range(warm + count):
        started = time.perf_counter()
        conn = connection(port, context)
        conn.request("GET", "/small", headers={"Connection": "close"})
        assert conn.getresponse().read() == b"ok"
        conn.close()
        if i >= warm:
            times.append(time.perf_counter() - started)
    return times


def pct(values, p):
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] * 1000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--connects", type=int, default=300)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert, key = material(pathlib.Path(tmp))
        up_port, front_port = free_port(), free_port()
        procs = []
        for target, args in ((upstream, (up_port,)), (front, (front_port, up_port, cert, key))):
            ready = multiprocessing.Event()
            proc = multiprocessing.Process(target=target, args=args + (ready,), daemon=True)
            proc.start()
            procs.append(proc)
            if not ready.wait(30):
                raise SystemExit("the %s did not start" % target.__name__)
        client = ssl.create_default_context(cafile=ca)
        rows = []
        direct, tls = small(up_port, None, opts.requests, 200), small(front_port, client, opts.requests, 200)
        rows.append(("small (kept alive)", direct, tls))
        d_first, d_last = stream(up_port, None, opts.streams, 30)
        t_first, t_last = stream(front_port, client, opts.streams, 30)
        rows += [("stream, first event", d_first, t_first), ("stream, last event", d_last, t_last)]
        rows.append(("connect + small", connects(up_port, None, opts.connects, 30),
                     connects(front_port, client, opts.connects, 30)))
        for proc in procs:
            proc.terminate()
    print("%-22s %10s %6s %11s %6s %11s %6s"
          % ("case (ms)", "direct p50", "p99", "front p50", "p99", "added p50", "p99"))
    for name, plain, secure in rows:
        d50, d99, f50, f99 = pct(plain, 50), pct(plain, 99), pct(secure, 50), pct(secure, 99)
        print("%-22s %10.2f %6.2f %11.2f %6.2f %11.2f %6.2f" % (name, d50, d99, f50, f99, f50 - d50, f99 - d99))


if __name__ == "__main__":
    main()
