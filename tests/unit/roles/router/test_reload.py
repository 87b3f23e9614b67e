"""The router's reload and drain (roles/router/files/narwhal_router.py): the worker set from workers.json, a SIGHUP
that starts a new vllm-router, switches new connections to it once it serves and drains the previous one, a reload
that cannot come up (the previous router keeps serving), and a SIGTERM that drains. The pure parts in this process;
the swap with the real vllm-router (requirements/router.txt) in front of stand-in engines served as processes."""
import json
import os
import signal
import threading
import time

import pytest
from test_support.paths import REPO, load_file
from test_support.relay import Relay
from test_support.router import router_process
from test_support.standin import engine_process

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import stream

FRONT = load_file("narwhal_router", REPO / "roles" / "router" / "files" / "narwhal_router.py")
KEY = "sk-narwhal-reload-test-key-0123456789abcdef"
BODY = {"model": "tiny", "prompt": "reload", "max_tokens": 4}
# a request whose prompt holds this takes SlowDoor.DELAY_S longer at the decode engine (vllm-router 0.1.17 does not
# pass the stand-in's own delay header, X-Narwhal-Standin-Token-Seconds, to its workers)
SLOW = dict(BODY, prompt="slow-please")


class SlowDoor(Relay):
    """A TCP relay in front of a stand-in engine (its URL the worker's): bytes pass both ways as they come, but a chunk
    from the router that holds `slow-please` is held DELAY_S seconds first, so a test keeps a request in flight."""

    DELAY_S = 4

    def chunk(self, data, dst, inbound, state):
        if inbound and b"slow-please" in data:
            time.sleep(self.DELAY_S)
        return False


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def _config(tmp_path, **more):
    doc = {"args": ["--vllm-pd-disaggregation"], "api_key_file": "/k",
           "fronts": [{"listen": ["127.0.0.1", 1], "to": "port"},
                      {"listen": ["127.0.0.1", 2], "to": "prometheus_port"}]}
    doc.update(more)
    return _write(tmp_path / "router.json", doc)


@pytest.mark.parametrize("workers, words", [
    ({"prefill": ["http://a:1"], "decode": []}, "no decode worker"),
    ({"prefill": [], "decode": ["http://b:1"]}, "no prefill worker"),
    ({"prefill": ["http://a:1"]}, "must be {\"prefill\""),
    ({"prefill": ["a:1"], "decode": ["http://b:1"]}, "prefill worker 'a:1' is not an http(s) URL"),
    ({"prefill": ["http://a:1"], "decode": ["http://a:1"]}, "listed twice"),
    ([], "must be {\"prefill\""),
])
def test_a_worker_set_vllm_router_cannot_serve_is_refused_by_name(tmp_path, workers, words):
    path = _write(tmp_path / "workers.json", workers)
    with pytest.raises(FRONT.Refused) as err:
        FRONT.read_workers(path)
    assert words in str(err.value) and path in str(err.value)


def test_a_missing_worker_set_or_configuration_is_refused_by_name(tmp_path):
    with pytest.raises(FRONT.Refused, match="cannot read the worker set %s" % (tmp_path / "absent.json")):
        FRONT.read_workers(str(tmp_path / "absent.json"))
    with pytest.raises(FRONT.Refused, match="args hold --port, --host"):
        FRONT.read_config(_config(tmp_path, args=["--port", "1", "--host=0.0.0.0"]))
    with pytest.raises(FRONT.Refused, match="fronts must list"):
        FRONT.read_config(_config(tmp_path, fronts=[{"listen": ["127.0.0.1", 1], "to": "elsewhere"}]))
    assert FRONT.read_config(_config(tmp_path))["args"] == ["--vllm-pd-disaggregation"]


def test_a_child_gets_the_worker_set_its_own_loopback_ports_and_the_key_check_urls(tmp_path):
    workers = _write(tmp_path / "workers.json", {"prefill": ["http://p:1"], "decode": ["http://d:1/", "http://e:1"]})
    config = FRONT.read_config(_config(tmp_path, workers_file=workers))
    plan = FRONT.child_plan(config)
    args = plan["args"]
    assert args[:1] == ["--vllm-pd-disaggregation"]
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--prometheus-host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == str(plan["ports"]["port"]) != str(plan["ports"]["prometheus_port"])
    assert [args[i + 1] for i, a in enumerate(args) if a == "--prefill"] == ["http://p:1"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--decode"] == ["http://d:1/", "http://e:1"]
    assert plan["validation"] == ["http://d:1/v1/models", "http://e:1/v1/models", "http://p:1/v1/models"]
    # a router.json without workers_file (the benchmark's second router) runs its args as they are
    plain = FRONT.child_plan(FRONT.read_config(_config(tmp_path, api_key_validation_urls=["http://w:1/v1/models"])))
    assert "--prefill" not in plain["args"] and plain["validation"] == ["http://w:1/v1/models"]


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        return [int(p) for p in handle.read().split()]


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait(predicate, timeout=30, what="a condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("%s did not hold within %d s" % (what, timeout))


def _workers(url):
    status, answer = call(url + "/workers", KEY, timeout=2)
    return sorted((w["worker_type"], w["url"], w["is_healthy"]) for w in answer["workers"]) if status == 200 else None


class Traffic:
    """Requests through the router one after another in a thread, each on a new connection -> statuses."""

    def __init__(self, url):
        self.url, self.statuses, self.errors, self.running = url, [], [], True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        n = 0
        while self.running:
            n += 1
            status, answer = call(self.url + "/v1/completions", KEY, dict(BODY, prompt="steady %d" % n), timeout=30)
            self.statuses.append(status)
            if status != 200:
                self.errors.append("%s %s" % (status, str(answer)[:200]))

    def stop(self):
        self.running = False
        self.thread.join(40)
        return self.statuses


@pytest.fixture
def fleet(tmp_path):
    """engine-1 prefill, engine-2 decode (behind a SlowDoor), engine-3 decode."""
    procs, engines = {}, []
    for n, role in ((1, "prefill"), (2, "decode"), (3, "decode")):
        url, procs["engine-%d" % n] = engine_process(tmp_path, str(n), KEY)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    door = SlowDoor(int(engines[1]["url"].rsplit(":", 1)[1]))
    engines[1]["url"] = door.url
    yield engines
    door.close()
    for proc in procs.values():
        proc.kill()
        proc.wait(10)


@pytest.fixture
def router(fleet, tmp_path):
    started = router_process(tmp_path, fleet[:2], KEY, drain_timeout=20)
    yield started
    if started["proc"].poll() is None:
        started["proc"].kill()
    started["proc"].wait(10)


def test_a_reload_serves_the_new_worker_set_and_drops_no_request(fleet, router):
    url, front = router["url"], router["proc"]
    (first,) = _children(front.pid)
    traffic = Traffic(url)
    slow = {}
    # a streamed request in flight across the switch (held at the decode engine): it stays with the first vllm-router
    streamer = threading.Thread(target=lambda: slow.update(result=stream(
        url + "/v1/completions", KEY, dict(SLOW, stream=True), timeout=30), ended=time.time()), daemon=True)
    streamer.start()
    time.sleep(0.5)
    workers = {"prefill": [fleet[0]["url"]], "decode": [fleet[1]["url"], fleet[2]["url"]]}
    router["workers"].write_text(json.dumps(workers))
    os.kill(front.pid, signal.SIGHUP)
    _wait(lambda: _workers(url) is not None and len(_workers(url)) == 3, what="the new worker set")
    switched = time.time()
    time.sleep(1)
    statuses = traffic.stop()
    streamer.join(30)
    assert statuses and set(statuses) == {200}, traffic.errors[:3]
    assert _workers(url) == sorted([("prefill", fleet[0]["url"], True), ("decode", fleet[1]["url"], True),
                                    ("decode", fleet[2]["url"], True)])
    log = router["log"].read_text(errors="replace")
    assert "reload 2 done: vllm-router pid" in log
    (second,) = [p for p in _children(front.pid) if p != first] or [None]
    assert second is not None
    # the start script logs the end once it has reaped the process: wait for the line, not only for the process
    ended = "the previous vllm-router (pid %d) ended" % first
    _wait(lambda: ended in router["log"].read_text(errors="replace"), timeout=25, what="the first vllm-router's end")
    assert _gone(first)
    status, events, _first, tail = slow["result"]
    assert status == 200 and not tail and events and slow["ended"] > switched  # it ended after the switch
    assert KEY not in router["log"].read_text(errors="replace")


def test_a_reload_that_cannot_come_up_keeps_the_previous_router_serving(fleet, router):
    url, front = router["url"], router["proc"]
    before = _workers(url)
    config = json.loads(router["config"].read_text())
    router["config"].write_text(json.dumps(dict(config, ready_timeout=8)))
    # a second decode worker that never answers /health: vllm-router 0.1.17 serves anyway (one decode answers), the
    # start script's own /health check holds the switch back
    router["workers"].write_text(json.dumps({"prefill": [fleet[0]["url"]],
                                             "decode": [fleet[1]["url"], "http://127.0.0.1:9"]}))
    os.kill(front.pid, signal.SIGHUP)
    _wait(lambda: "reload 2 failed" in router["log"].read_text(errors="replace"), what="the failed reload")
    assert "did not serve within 8 s (ready_timeout): not answering /health: http://127.0.0.1:9" in \
        router["log"].read_text(errors="replace")
    assert call(url + "/v1/completions", KEY, BODY, timeout=30)[0] == 200 and _workers(url) == before
    router["workers"].write_text(json.dumps({"prefill": [fleet[0]["url"]], "decode": []}))
    os.kill(front.pid, signal.SIGHUP)
    _wait(lambda: "reload 3 failed" in router["log"].read_text(errors="replace"), what="the refused reload")
    assert "no decode worker" in router["log"].read_text(errors="replace")
    assert call(url + "/v1/completions", KEY, BODY, timeout=30)[0] == 200 and _workers(url) == before
    assert len(_children(front.pid)) == 1 and front.poll() is None


def test_sigterm_stops_listening_and_drains_what_is_in_flight(router):
    url, front = router["url"], router["proc"]
    (child,) = _children(front.pid)
    slow = {}
    thread = threading.Thread(target=lambda: slow.update(answer=call(url + "/v1/completions", KEY, SLOW, timeout=30)),
                              daemon=True)
    started = time.time()
    thread.start()
    time.sleep(1)
    front.send_signal(signal.SIGTERM)  # docker stop
    time.sleep(0.3)
    assert call(url + "/v1/models", KEY, timeout=2)[0] == 0  # nothing listens any more
    thread.join(30)
    assert slow["answer"][0] == 200 and time.time() - started > SlowDoor.DELAY_S, slow  # it was in flight
    assert front.wait(30) == 0 and _gone(child)
    assert "drains (at most 20 s)" in router["log"].read_text(errors="replace")


def _replay_case(switch):
    """A client connection through the front's relay to upstream A, which reads the next request and closes the
    connection unanswered (a draining vllm-router closing an idle kept-alive connection as the request arrives);
    `switch`: B serves by then (a reload happened) -> what the client read, and what each upstream received."""
    import asyncio

    received = {"a": b"", "b": b""}

    async def run():
        async def upstream_a(reader, writer):
            received["a"] += await reader.read(65536)  # the first request: answered
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA")
            await writer.drain()
            received["a"] += await reader.read(65536)  # the next one: read, then the connection ends unanswered
            writer.close()

        async def upstream_b(reader, writer):
            received["b"] += await reader.read(65536)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nB")
            await writer.drain()
            writer.close()

        a = await asyncio.start_server(upstream_a, "127.0.0.1", 0)
        b = await asyncio.start_server(upstream_b, "127.0.0.1", 0)
        serving = [a.sockets[0].getsockname()[:2]]
        front = await asyncio.start_server(lambda r, w: FRONT.relay(lambda: serving[0], r, w), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*front.sockets[0].getsockname()[:2])
        writer.write(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        first = await asyncio.wait_for(reader.readexactly(39), 5)
        if switch:
            serving[0] = b.sockets[0].getsockname()[:2]
        writer.write(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]")
        second = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        for server in (front, a, b):
            server.close()
        return first, second

    first, second = asyncio.run(run())
    return first, second, received


def test_a_request_the_draining_router_closed_unread_goes_to_the_serving_one():
    first, second, received = _replay_case(switch=True)
    assert first.endswith(b"\r\n\r\nA")
    assert second.endswith(b"\r\n\r\nB"), second  # answered by the serving one, on the client's same connection
    assert received["a"].endswith(b"[]")
    assert received["b"] == b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]"


def test_a_request_the_serving_router_closed_unanswered_closes_the_client_connection():
    first, second, received = _replay_case(switch=False)
    assert first.endswith(b"\r\n\r\nA") and second == b""  # no answer, the connection closed: nothing was replayed
    assert received["b"] == b""
