"""The router's TLS front (roles/router/files/narwhal_router.py: open_fronts, relay, server_context, listen) in this
process against a plain local upstream, with a temporary CA: TLS 1.2+ with the router host's certificate, a plaintext
client and a client trusting another CA refused, bytes passed both ways as they come (a streamed answer's chunks
arrive one by one, before the upstream has finished), and the start script's process layout with the real
vllm-router (the front in the parent, the router in the child; either ending ends the other)."""
import asyncio
import http.client
import os
import signal
import socket
import ssl
import threading
import time

import pytest
from test_support.paths import REPO, load_file
from test_support.router import router_process
from test_support.standin import engine_process, free_port
from test_support.tempca import CA

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.modules import router_traffic, router_workers

FRONT = load_file("narwhal_router", REPO / "roles" / "router" / "files" / "narwhal_router.py")
KEY = "sk-narwhal-front-test-key-0123456789abcdef"


def make_ca(directory, name="narwhal test CA"):
    """A temporary CA (test_support.tempca) with its certificate in directory/ca.crt -> {cert: path, ca: CA}."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CA(name)
    return {"cert": str(ca.write(directory / "ca.crt")), "ca": ca}


def make_leaf(ca, directory, names=("127.0.0.1",)):
    """directory/server.crt and server.key (0600) that `ca` signs for `names` -> (cert path, key path)."""
    directory.mkdir(parents=True, exist_ok=True)
    return tuple(str(p) for p in ca["ca"].write_server(directory, "server", list(names)))


class Upstream:
    """A plain HTTP/1.1 server on loopback: GET /small answers 2 bytes; GET /stream answers an SSE stream of
    `events` chunks, each sent only once the test releases it (`release`), so a chunk seen by the client before the
    next is released shows the front passes bytes as they come."""

    def __init__(self, events=3):
        self.events = events
        self.release = threading.Semaphore(0)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        with conn:
            reader = conn.makefile("rb")
            while True:
                line = reader.readline()
                if not line:
                    return
                path = line.split()[1].decode()
                while reader.readline() not in (b"\r\n", b""):
                    pass
                if path == "/small":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for n in range(self.events):
                    if not self.release.acquire(timeout=10):
                        return
                    data = b"data: %d\n\n" % n
                    conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))
                conn.sendall(b"0\r\n\r\n")

    def close(self):
        self.sock.close()


def serve_fronts(fronts, cert, key):
    """The start script's TLS fronts served by an asyncio loop in a thread, as its parent serves them -> stop().
    `fronts`: {listen, upstream} each, upstream the fixed (host, port) in place of the serving vllm-router's."""
    context = FRONT.server_context({"cert": cert, "key": key})
    sockets = [FRONT.listen(*f["listen"]) for f in fronts]
    named = [{"listen": f["listen"], "to": i} for i, f in enumerate(fronts)]
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(FRONT.quiet)
    ready = threading.Event()

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(FRONT.open_fronts(named, sockets, context, lambda to: tuple(fronts[to]["upstream"])))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)

    async def shutdown():
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        loop.stop()

    def stop():
        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(10)
        loop.close()

    return stop


@pytest.fixture
def front(tmp_path):
    """-> {port, ca, upstream}: the front on 127.0.0.1:<port> before the upstream."""
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "tls", ("127.0.0.1", "localhost"))
    upstream = Upstream()
    port = free_port()
    stop = serve_fronts([{"listen": ["127.0.0.1", port], "upstream": ["127.0.0.1", upstream.port]}], cert, key)
    yield {"port": port, "ca": ca, "upstream": upstream, "tmp": tmp_path}
    stop()
    upstream.close()


def _client(ca_file):
    return ssl.create_default_context(cafile=ca_file)


def test_a_client_trusting_the_ca_is_served_over_tls_1_2_or_later(front):
    conn = http.client.HTTPSConnection("127.0.0.1", front["port"], context=_client(front["ca"]["cert"]), timeout=10)
    conn.request("GET", "/small")
    answer = conn.getresponse()
    assert (answer.status, answer.read()) == (200, b"ok")
    assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
    conn.request("GET", "/small")  # the same connection again: keep-alive passes through
    assert conn.getresponse().read() == b"ok"
    conn.close()
    # and the hostname is checked: the certificate names 127.0.0.1 and localhost
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", front["port"]), timeout=10) as raw:
            _client(front["ca"]["cert"]).wrap_socket(raw, server_hostname="router.example")


def test_the_front_speaks_tls_1_2_or_later_only(tmp_path):
    # asserted on the context: this machine's OpenSSL would not even offer TLS 1.1 from a client to try it
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "tls")
    assert FRONT.server_context({"cert": cert, "key": key}).minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_plaintext_client_gets_no_answer(front):
    with socket.create_connection(("127.0.0.1", front["port"]), timeout=10) as raw:
        raw.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while True:
                chunk = raw.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
    assert b"HTTP/1.1 200" not in got and b"ok" not in got


def test_a_client_trusting_another_ca_refuses_the_front(front):
    other = make_ca(front["tmp"] / "other", "another CA")
    status, text = call("https://127.0.0.1:%d/small" % front["port"], cafile=other["cert"], timeout=10)
    assert status == 0 and "certificate verify failed" in str(text)
    status, text = call("https://127.0.0.1:%d/small" % front["port"], cafile=front["ca"]["cert"], timeout=10)
    assert (status, text) == (200, "ok")


def test_a_stream_passes_chunk_by_chunk(front):
    upstream = front["upstream"]
    conn = http.client.HTTPSConnection("127.0.0.1", front["port"], context=_client(front["ca"]["cert"]), timeout=10)
    conn.request("GET", "/stream")
    answer = conn.getresponse()
    assert answer.status == 200
    for n in range(upstream.events):
        upstream.release.release()  # the upstream sends event n only now
        assert answer.fp.readline().strip() == b"%x" % len(b"data: %d\n\n" % n)  # the chunk's size line
        assert answer.fp.readline() == b"data: %d\n" % n
        answer.fp.readline(), answer.fp.readline()  # the blank line ending the event, the chunk's CRLF
    assert answer.fp.readline().strip() == b"0"
    conn.close()


def test_a_relay_whose_client_left_is_kept_until_vllm_router_closes(tmp_path, monkeypatch):
    """The event loop holds tasks weakly and asyncio's stream protocol lets go of the connection's task when the client
    leaves: a relay still waiting for the upstream's end must not be garbage collected pending (it would never close
    its upstream connection)."""
    import gc

    seen = []
    monkeypatch.setattr(FRONT, "quiet", lambda loop, context: seen.append(context.get("message")))
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "tls")
    sticky = socket.socket()
    sticky.bind(("127.0.0.1", 0))
    sticky.listen(8)
    got_eof, release = threading.Event(), threading.Event()

    def hold(conn):  # reads the request to its end, then keeps the connection open until released
        with conn:
            while conn.recv(4096):
                pass
            got_eof.set()
            release.wait(20)

    def accept():
        while True:
            try:
                conn, _peer = sticky.accept()
            except OSError:
                return
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    port = free_port()
    stop = serve_fronts([{"listen": ["127.0.0.1", port], "upstream": ["127.0.0.1", sticky.getsockname()[1]]}],
                        cert, key)
    try:
        # How the client's TLS close reaches the front depends on timing: usually a clean end of its stream (the relay
        # then half-closes the upstream and waits for its end: the case under test), under heavy load sometimes a
        # close the front reads as an error (the relay then ends and closes the upstream at once: no leak either).
        # So a client leaves up to five times until its relay is the one left waiting; without RELAYS it is never
        # there (collected pending).
        for _attempt in range(5):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with _client(ca["cert"]).wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                    conn.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got_eof.wait(10)  # the client's end reached the upstream
            time.sleep(0.2)
            gc.collect()
            assert not [m for m in seen if "destroyed" in str(m)]
            if len(FRONT.RELAYS) == 1:
                break
            got_eof.clear()
        assert len(FRONT.RELAYS) == 1
        release.set()
        deadline = time.time() + 10
        while FRONT.RELAYS and time.time() < deadline:
            time.sleep(0.05)
        assert not FRONT.RELAYS
    finally:
        release.set()
        stop()
        sticky.close()


def test_a_key_readable_by_others_or_a_foreign_key_is_refused_by_name(tmp_path, capsys):
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "tls")
    os.chmod(key, 0o644)
    with pytest.raises(FRONT.Refused) as err:
        FRONT.server_context({"cert": cert, "key": key})
    assert "TLS private key %s is readable by others" % key in str(err.value)
    os.chmod(key, 0o600)
    _cert2, key2 = make_leaf(ca, tmp_path / "tls2")
    with pytest.raises(FRONT.Refused) as err:
        FRONT.server_context({"cert": cert, "key": key2})
    assert "cannot load the TLS certificate %s with its key %s" % (cert, key2) in str(err.value)


def test_accepted_connections_are_tcp_so_asyncio_turns_nagle_off():
    """asyncio sets TCP_NODELAY only on a socket whose proto is IPPROTO_TCP (asyncio/base_events.py::_set_nodelay), and
    an accepted connection inherits the listener's: with proto 0 every small TLS record of a stream waited for the
    client's delayed ACK (40 ms, bench/router_tls_front.py)."""
    import asyncio.base_events

    listener = FRONT.listen("127.0.0.1", free_port())
    listener.setblocking(True)
    listener.listen(8)  # the script's asyncio server listens once a vllm-router serves
    with listener, socket.create_connection(listener.getsockname()[:2], timeout=5):
        conn, _peer = listener.accept()
        with conn:
            asyncio.base_events._set_nodelay(conn)
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_an_address_the_host_lacks_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        FRONT.listen("192.0.2.1", free_port())  # TEST-NET-1: on no host
    assert "cannot listen on 192.0.2.1 port" in capsys.readouterr().err


@pytest.fixture
def tls_router(tmp_path):
    """The start script with router.json's tls: the real vllm-router behind its front, one stand-in engine each of
    prefill and decode (plain HTTP: the router's side of TLS to the engines is SSL_CERT_FILE, tried in the
    proving ground)."""
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "tls", ("127.0.0.2",))
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY, "--enable-prompt-tokens-details")
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    started = router_process(tmp_path, engines, KEY, tls={"cert": cert, "key": key, "ca": ca["cert"]})
    yield dict(started, ca=ca["cert"], engines=engines, tmp=tmp_path)
    for proc in procs + [started["proc"]]:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        return [int(p) for p in handle.read().split()]


def test_the_router_behind_its_front_serves_https_only_and_ends_with_it(tls_router):
    url, ca = tls_router["url"], tls_router["ca"]
    assert url.startswith("https://127.0.0.2:")
    assert call(url + "/v1/models", KEY, cafile=ca)[0] == 200
    assert call(url + "/v1/models", None, cafile=ca)[0] == 401  # the router's own key check, through the front
    status, text = call(tls_router["metrics_url"], cafile=ca)
    assert status == 200 and "vllm_router" in text
    # vllm-router itself is on loopback only, on ports of its own; the front's address answers TLS only
    assert call(url.replace("https://127.0.0.2", "http://127.0.0.1") + "/v1/models", KEY)[0] == 0
    assert call(url.replace("https://", "http://") + "/v1/models", KEY)[0] != 200
    front = tls_router["proc"]
    (router,) = _children(front.pid)
    os.kill(router, signal.SIGKILL)  # the router dies: the front ends the container's main process
    assert front.wait(15) == 128 + signal.SIGKILL
    assert "vllm-router (pid %d) ended (exit status 137)" % router in tls_router["log"].read_text()


def _gone(pid, timeout=10):
    """Whether process `pid` ended (gone, or a zombie nobody reaped yet) within `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                if handle.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_stops_the_front_and_the_router(tls_router):
    front = tls_router["proc"]
    (router,) = _children(front.pid)
    front.send_signal(signal.SIGTERM)  # docker stop
    assert front.wait(15) == 0
    assert _gone(router)


def test_router_workers_verifies_the_router_with_the_ca_and_reports_its_certificate(tls_router, module_runner):
    args = {"url": tls_router["url"], "engines": tls_router["engines"], "api_key_file": tls_router["key_file"],
            "ca_file": tls_router["ca"]}
    status, result = module_runner(router_workers.main, args)
    assert status == "exit" and result["report"]["ok"], result
    assert result["certificate"]["days_left"] in (29, 30) and result["certificate"]["not_after"].endswith("Z")
    other = make_ca(tls_router["tmp"] / "other", "another CA")
    status, result = module_runner(router_workers.main, dict(args, ca_file=other["cert"]))
    assert status == "fail" and "certificate verify failed" in result["msg"]
    assert "certificate verify failed" in result["certificate"]["error"]
    status, result = module_runner(router_workers.main, dict(args, ca_file=str(tls_router["tmp"] / "absent.crt")))
    assert status == "fail" and "the CA certificate %s is not on router host" % (tls_router["tmp"] / "absent.crt") \
        in result["msg"] and result["input"] == "NARWHAL_TLS"


def test_traffic_through_the_front_streams_and_all(tls_router, module_runner):
    """router_traffic's whole matrix (completions and chat, streamed and not) over https through the front."""
    status, result = module_runner(router_traffic.main, {
        "url": tls_router["url"], "engines": tls_router["engines"], "model": "tiny",
        "api_key_file": tls_router["key_file"], "ca_file": tls_router["ca"], "timeout": 20})
    assert status == "exit", result["msg"] if status == "fail" else result
    assert len(result["requests"]) == 8 and all(r["ok"] and r["equal"] for r in result["requests"])
    assert all(r["ttft_s"] is not None for r in result["requests"] if r["stream"])
    assert result["auth"] == {"none": 401, "wrong": 401, "key": 200}


@pytest.fixture
def https_engines(tmp_path):
    """Two stand-in engines reached over https: each behind a TLS front of its own on 127.0.0.3 (the same port), its
    certificate for 127.0.0.3 from the site CA -> {engines, ca, other_ca, tmp}."""
    ca = make_ca(tmp_path / "ca")
    cert, key = make_leaf(ca, tmp_path / "engine-tls", ("127.0.0.3",))
    procs, engines, fronts = [], [], []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY)
        procs.append(proc)
        port = int(url.rsplit(":", 1)[1])
        fronts.append({"listen": ["127.0.0.3", port], "upstream": ["127.0.0.1", port]})
        engines.append({"engine": "engine-%d" % n, "role": role, "url": "https://127.0.0.3:%d" % port})
    stop = serve_fronts(fronts, cert, key)
    yield {"engines": engines, "ca": ca["cert"], "other_ca": make_ca(tmp_path / "other", "another CA")["cert"],
           "tmp": tmp_path}
    stop()
    for proc in procs:
        proc.kill()
        proc.wait(10)


def test_the_router_verifies_https_engines_against_ssl_cert_file(https_engines):
    """vllm-router's client (reqwest) verifies the engines' certificates against SSL_CERT_FILE, as the router container
    sets it (_router/plan.py::tls_container): with the site CA every worker is healthy and a request is served; with
    another CA no worker becomes healthy, so the router does not serve."""
    (https_engines["tmp"] / "good").mkdir()
    good = router_process(https_engines["tmp"] / "good", https_engines["engines"], KEY,
                          env={"SSL_CERT_FILE": https_engines["ca"]})
    try:
        status, answer = call(good["url"] + "/workers", KEY)
        assert status == 200 and all(w["is_healthy"] for w in answer["workers"]) and len(answer["workers"]) == 2
        assert call(good["url"] + "/v1/completions", KEY, {"model": "tiny", "prompt": "over tls", "max_tokens": 4},
                    timeout=20)[0] == 200
    finally:
        good["proc"].terminate()
        good["proc"].wait(10)
    (https_engines["tmp"] / "bad").mkdir()
    bad = router_process(https_engines["tmp"] / "bad", https_engines["engines"], KEY,
                         env={"SSL_CERT_FILE": https_engines["other_ca"]}, wait=False)
    try:
        time.sleep(5)  # the good router served within about 2 s here; this one never does
        assert call(bad["url"] + "/workers", KEY, timeout=2)[0] != 200
        assert bad["proc"].poll() is None
    finally:
        bad["proc"].terminate()
        bad["proc"].wait(10)
