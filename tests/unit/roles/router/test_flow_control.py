"""Flow control at the front door (_router/plan.py::flow_control_args, docs/router.md): the real vllm-router
(requirements/router.txt) behind the start script, with the plan's admission options, in front of one prefill and one
decode stand-in engine served as processes; the decode engine behind a relay that holds every request whose body
asks for it until the test lets it go, so a request keeps its admission token as long as the test wants, with no
sleep. What is asserted is what the router answers, and what reaches an engine."""
import http.client
import json
import re
import threading
import time
import urllib.request

import pytest
from test_support.relay import Relay
from test_support.router import router_process
from test_support.standin import engine_process

KEY = "sk-narwhal-flow-test-key-0123456789abcdef"
HOLD = "hold-please"


class HoldDoor(Relay):
    """A TCP relay in front of an engine: bytes pass both ways as they come, but a chunk from the router that holds
    HOLD waits until `release` is set. `arrived`: the requests (POSTs) that reached it."""

    def __init__(self, upstream_port):
        self.release, self.arrived, self.lock = threading.Event(), 0, threading.Lock()
        super().__init__(upstream_port)

    def chunk(self, data, dst, inbound, state):
        if inbound and data.startswith(b"POST"):
            with self.lock:
                self.arrived += 1
        if inbound and HOLD.encode() in data:
            self.release.wait(60)
        return False


def send(url, prompt):
    """One non-streamed completion -> (status, Retry-After, body bytes)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=90)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2}),
                     {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Retry-After"), resp.read()
    finally:
        conn.close()


class Sent(threading.Thread):
    def __init__(self, url, prompt, start=None):
        super().__init__(daemon=True)
        self.url, self.prompt, self.start_at, self.answer = url, prompt, start, None
        self.start()

    def run(self):
        if self.start_at is not None:
            self.start_at.wait(30)
        self.answer = send(self.url, self.prompt)


def wait_until(predicate, what, timeout=30):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError("%s did not happen within %d s" % (what, timeout))
        time.sleep(0.02)


def admitted(router):
    """vllm-router's own count of the P/D requests it took (vllm_router_pd_requests_total)."""
    with urllib.request.urlopen(router["metrics_url"], timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(r'^vllm_router_pd_requests_total\{[^}]*\} ([0-9.e+]+)$', text, re.M))


@pytest.fixture
def door(tmp_path):
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY)
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    hold = HoldDoor(int(engines[1]["url"].rsplit(":", 1)[1]))
    engines[1]["url"] = hold.url
    hold.engines = engines
    yield hold
    hold.release.set()
    hold.sock.close()
    for proc in procs:
        proc.kill()
        proc.wait(10)


def start(door, tmp_path, **inputs):
    started = router_process(tmp_path, door.engines, KEY, site=dict(NARWHAL_ROUTER_MAX_CONCURRENT=1, **inputs))
    door.router = started
    return started


@pytest.fixture
def stop_router():
    started = []
    yield started
    for router in started:
        router["proc"].kill()
        router["proc"].wait(10)


def test_beyond_the_cap_the_router_refuses_at_once_and_refused_requests_reach_no_engine(door, tmp_path, stop_router):
    """The plan's defaults (no queue, refill 1 per second) with a cap of 1: while a held request has the one token,
    requests sent together are refused with 429, Retry-After: 1 and an empty body, and never reach an engine; the
    refill lets one more in within about a second, so the cap is not a hard bound (a second request in flight); the
    router's metrics count only what it took."""
    router = start(door, tmp_path)
    stop_router.append(router)
    first = Sent(router["url"], HOLD + " first")
    wait_until(lambda: door.arrived == 1, "the first request reaching the decode engine")
    go = threading.Event()
    burst = [Sent(router["url"], HOLD + " burst %d" % n, go) for n in range(8)]
    go.set()
    # every request of the burst is either answered or held at the decode engine (admitted)
    wait_until(lambda: sum(s.answer is not None for s in burst) + door.arrived - 1 == len(burst),
               "every request of the burst answered or admitted")
    refused = [s.answer for s in burst if s.answer is not None]
    assert refused and all(answer == (429, "1", b"") for answer in refused), refused
    assert door.arrived - 1 == len(burst) - len(refused)  # a refused request reached no engine
    # the bucket's refill (1 per second, the least vllm-router takes) admits one more: two in flight, cap 1
    held = door.arrived
    while door.arrived == held:
        late = Sent(router["url"], HOLD + " late")
        wait_until(lambda sent=late: sent.answer is not None or door.arrived > held, "an answer or an admission")
        if late.answer is not None:
            assert late.answer == (429, "1", b"")
            time.sleep(0.1)
    door.release.set()
    for sent in [first, late] + burst:
        sent.join(60)
    statuses = [s.answer[0] for s in [first, late] + burst]
    assert set(statuses) <= {200, 429}
    assert admitted(router) == statuses.count(200) == door.arrived  # no refusal in the router's own counters


def test_queued_requests_that_get_no_token_in_time_are_answered_408(door, tmp_path, stop_router):
    """NARWHAL_ROUTER_QUEUE_SIZE above 0: requests that find the cap taken wait (NARWHAL_ROUTER_QUEUE_TIMEOUT 1 s, and
    no longer than the bucket's own wait for its next token, about a second at a refill of 1 per second) and, as the
    held request keeps its token, are answered 408 with an empty body while it is still in flight, without reaching an
    engine; the refill's one token may let one of them in (measured: 1 of 15 runs of a single queued request)."""
    router = start(door, tmp_path, NARWHAL_ROUTER_QUEUE_SIZE=4, NARWHAL_ROUTER_QUEUE_TIMEOUT=1)
    stop_router.append(router)
    first = Sent(router["url"], HOLD + " first")
    wait_until(lambda: door.arrived == 1, "the first request reaching the decode engine")
    go = threading.Event()
    queued = [Sent(router["url"], HOLD + " queued %d" % n, go) for n in range(4)]
    go.set()
    wait_until(lambda: sum(s.answer is not None for s in queued) + door.arrived - 1 == len(queued),
               "every queued request answered or admitted")
    answers = [s.answer for s in queued if s.answer is not None]
    assert len(answers) >= len(queued) - 1 and all(answer == (408, None, b"") for answer in answers), answers
    assert first.answer is None  # still held: the queued ones did not wait for it
    assert door.arrived - 1 == len(queued) - len(answers)  # a request answered 408 reached no engine
    door.release.set()
    for sent in [first] + queued:
        sent.join(60)
    assert first.answer[0] == 200 and admitted(router) == door.arrived
