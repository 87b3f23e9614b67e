"""The router's hand-over (roles/router/files/narwhal_router.py): fronts bound with SO_REUSEPORT, a second start script
on the same ports that listens once it serves and takes every new connection (a classic BPF program on the port's
reuseport group), the first one stopped then, and no request refused or reset across it. The kernel's part with plain
sockets in this process; the hand-over with two real start scripts (the real vllm-router, requirements/router.txt) in
front of stand-in engines served as processes."""
import json
import signal
import socket
import threading
import time

import pytest
from test_support.paths import REPO, load_file
from test_support.router import router_next, router_process, wait_serving
from test_support.standin import engine_process, free_port

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._router import container

FRONT = load_file("narwhal_router", REPO / "roles" / "router" / "files" / "narwhal_router.py")
KEY = "sk-narwhal-handover-test-key-0123456789abcdef"
BODY = {"model": "tiny", "prompt": "hand-over", "max_tokens": 4}


def _listening(port):
    sock = FRONT.listen("127.0.0.1", port)
    sock.listen(64)
    return sock


def _land(listener, count=40):
    """`count` connections to the listener's address -> how many the given socket accepted (the rest went to another
    socket of its reuseport group)."""
    listener.setblocking(False)
    got = 0
    for _n in range(count):
        with socket.create_connection(listener.getsockname()[:2], timeout=5):
            time.sleep(0.001)
            try:
                listener.accept()[0].close()
                got += 1
            except BlockingIOError:
                pass
    return got


def test_a_second_front_binds_the_port_and_takes_every_new_connection_once_it_steers():
    port = free_port()
    first = _listening(port)
    bound = FRONT.listen("127.0.0.1", port)  # SO_REUSEPORT: bound next to a listening front, it gets nothing yet
    assert FRONT.listeners(first) == 1 and FRONT.listeners(bound) == 1
    bound.listen(64)
    assert FRONT.listeners(bound) == 2
    assert FRONT.steer(bound) == 1  # the second socket of the group
    assert _land(bound) == 40  # the kernel's hash would have sent about half to the first
    assert FRONT.queued(first) == 0
    first.close()  # the previous front closes an empty queue
    assert FRONT.listeners(bound) == 1 and FRONT.steer(bound) is None
    assert _land(bound) == 40  # index 1 is out of range now: the kernel's hash over the one socket left
    bound.close()


def test_a_process_without_so_reuseport_is_refused_as_before(capsys):
    port = free_port()
    front = _listening(port)
    plain = socket.socket()
    with pytest.raises(OSError) as err:
        plain.bind(("127.0.0.1", port))
    assert err.value.errno == 98  # EADDRINUSE: anything else on the router's port is refused
    plain.close()
    front.close()
    holder = socket.socket()  # a port held without SO_REUSEPORT: the start script is refused by name
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    with pytest.raises(SystemExit):
        FRONT.listen("127.0.0.1", port)
    assert "cannot listen on 127.0.0.1 port %d: Address already in use" % port in capsys.readouterr().err
    holder.close()


class Traffic:
    """Completions from a few client threads, each on a new connection -> (time, status) per request."""

    def __init__(self, url, clients=4):
        self.url, self.results, self.errors, self.running = url, [], [], True
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(clients)]
        for thread in self.threads:
            thread.start()

    def run(self, number):
        n = 0
        while self.running:
            n += 1
            status, answer = call(self.url + "/v1/completions", KEY, dict(BODY, prompt="client %d %d" % (number, n)),
                                  timeout=30)
            self.results.append((time.time(), status))
            if status != 200:
                self.errors.append("%s %s" % (status, str(answer)[:200]))

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join(40)
        return self.results


@pytest.fixture
def fleet(tmp_path):
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY)
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    yield engines
    for proc in procs:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def routers():
    started = []
    yield started
    for router in started:
        if router["proc"].poll() is None:
            router["proc"].kill()
        router["proc"].wait(10)


def test_a_second_router_takes_over_and_no_request_fails(fleet, tmp_path, routers):
    first = router_process(tmp_path, fleet, KEY, drain_timeout=20)
    routers.append(first)
    traffic = Traffic(first["url"])
    time.sleep(1)
    second = router_next(first, tmp_path)
    routers.append(second)
    log = wait_serving(second)
    (line,) = [line for line in log.splitlines() if line.startswith(container.SERVING)]  # what the module waits for
    assert "hand-over: every new connection comes here (reuseport index 1, 1)" in line
    first["proc"].send_signal(signal.SIGTERM)  # docker stop of the old container, once the new one serves
    assert first["proc"].wait(30) == 0
    ended = time.time()
    time.sleep(1)
    results = traffic.stop()
    assert not traffic.errors, traffic.errors[:3]
    assert len(results) > 20 and {s for _t, s in results} == {200}
    assert [t for t, _s in results if t > ended]  # the second router served on its own
    old = first["log"].read_text(errors="replace")
    assert "another router listens on the fronts' addresses; the fronts take what reached them" in old
    assert call(first["url"] + "/v1/completions", KEY, BODY, timeout=30)[0] == 200
    assert KEY not in old + second["log"].read_text(errors="replace")


def test_a_second_router_whose_workers_do_not_answer_never_listens(fleet, tmp_path, routers):
    first = router_process(tmp_path, fleet, KEY)
    routers.append(first)
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads(first["config"].read_text())
    (other / "workers.json").write_text(json.dumps({"prefill": [fleet[0]["url"]],
                                                    "decode": [fleet[1]["url"], "http://127.0.0.1:9"]}))
    config.update(workers_file=str(other / "workers.json"), ready_timeout=6)
    (other / "router.json").write_text(json.dumps(config))
    second = router_next(first, tmp_path, config=other / "router.json")
    routers.append(second)
    traffic = Traffic(first["url"], clients=2)
    assert second["proc"].wait(60) == 1
    results = traffic.stop()
    log = second["log"].read_text(errors="replace")
    assert "did not serve within 6 s (ready_timeout): not answering /health: http://127.0.0.1:9; the fronts do " \
           "not listen" in log and "narwhal_router: serving" not in log
    assert results and {s for _t, s in results} == {200}, traffic.errors[:3]  # the first kept serving alone
