"""The stand-in engine as a data-parallel engine across hosts (vllm.standin.rendezvous): a head
(`--data-parallel-size N --data-parallel-size-local L --data-parallel-address A --data-parallel-rpc-port P`) and
headless workers (`--headless ... --data-parallel-start-rank k*L`), each a process of its own; the simulated hosts are
loopback addresses (the NIXL side channels of the head on 127.0.0.1, of its worker on 127.0.0.2, ...)."""
import importlib
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_support import standin as _standin
from test_support.standin import KEY, TINY, engine_log, engine_process, free_port, free_ports, wait_for_log

FAST = {"NARWHAL_STANDIN_HANDSHAKE_TIMEOUT_S": "2"}  # the stand-in's knob for vLLM's 5 minutes (core.py:110)
PRODUCE = {"max_tokens": 1, "stream": False,
           "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                  "remote_block_ids": None, "remote_host": None, "remote_port": None}}


@pytest.fixture
def procs(tmp_path):
    """Processes to end after the test (SIGKILL: a test's failure must not leave engines behind); their output is
    printed (pytest shows it when the test failed)."""
    started = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    for log in sorted(tmp_path.glob("engine-*.log")):
        print("==== %s\n%s" % (log.name, log.read_text()))


def call(url, path, body=None, headers=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers=dict({"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
                                              **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(url, rank, body, headers=None):
    status, text = call(url, "/v1/completions", dict({"model": "tiny"}, **body),
                        dict({"X-data-parallel-rank": str(rank)}, **(headers or {})))
    return status, json.loads(text)


def sample(text, name, **labels):
    """The value of the sample `name` whose labels include `labels` (0 when there is none)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all('%s="%s"' % kv in line for kv in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0


def refused(url):
    port = int(url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


class Engine:
    """A 2-host data-parallel engine: N ranks, L = N/2 per host; the worker on `hosts[1]` starts first."""

    def __init__(self, tmp_path, procs, name, hosts, size=4, flags=(), worker_flags=None, env=None,
                 worker_env=None, model_config=None, worker_model_config=None, start_head=True):
        self.tmp_path, self.procs, self.name, self.hosts, self.size = tmp_path, procs, name, hosts, size
        self.local = size // 2
        self.side_port = free_ports(size, hosts)
        self.rpc_port, self.http_port = free_port(), free_port()
        self.flags, self.env, self.model_config = list(flags), env, model_config
        self.worker = self.start_worker(1, self.local, worker_flags, worker_env, worker_model_config)
        self.url = self.head = None
        if start_head:
            self.start_head()

    def dp_flags(self):
        return ["--data-parallel-size", str(self.size), "--data-parallel-size-local", str(self.local),
                "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(self.rpc_port)]

    def start_worker(self, k, start_rank, flags=None, env=None, model_config=None, name=None):
        flags = self.flags if flags is None else list(flags)
        _url, proc = engine_process(self.tmp_path, name or "%s-w%d" % (self.name, k), KEY, "--headless",
                                    "--data-parallel-start-rank", str(start_rank), *(self.dp_flags() + flags),
                                    side_host=self.hosts[k], side_port=self.side_port, env=dict(FAST, **(env or {})),
                                    wait=False, model_config=model_config or self.model_config)
        self.procs.append(proc)
        return proc

    def start_head(self, wait=True, env=None):
        self.url, self.head = engine_process(self.tmp_path, self.name, KEY, *(self.dp_flags() + self.flags),
                                             port=self.http_port, side_host=self.hosts[0], side_port=self.side_port,
                                             env=dict(self.env or {}, **(env or {})), wait=wait,
                                             model_config=self.model_config)
        self.procs.append(self.head)
        return self.head

    def log(self, which=""):
        return engine_log(self.tmp_path, self.name + which)


def test_head_serves_every_rank_of_its_headless_worker(tmp_path, procs):
    """The worker (ranks 2-3) registers with the head (ranks 0-1); the head's API serves all four: a worker rank's
    answer comes from the worker (its own engine id, its host's side channel on base + rank), /metrics holds every
    rank's series, and a stream from a worker rank arrives whole."""
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"))
    assert "Launching 2 data parallel engine(s) in headless mode, with head node address tcp://127.0.0.1:%d." % (
        engine.rpc_port) in engine.log("-w1")
    assert call(engine.url, "/health")[0] == 200
    assert "READY from remote core engine proc(s) [2, 3]" in engine.log()
    answers = {rank: post(engine.url, rank, dict(PRODUCE, prompt="a b c %d" % rank)) for rank in range(4)}
    params = {rank: answer["kv_transfer_params"] for rank, (_status, answer) in answers.items()}
    assert {status for status, _a in answers.values()} == {200}
    assert [p["remote_host"] for p in params.values()] == ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"]
    assert [p["remote_port"] for p in params.values()] == [engine.side_port + r for r in range(4)]
    ids = [p["remote_engine_id"] for p in params.values()]
    assert [i.rsplit("_dp", 1)[1] for i in ids] == ["0", "1", "2", "3"]
    assert ids[0].rsplit("_", 1)[0] == ids[1].rsplit("_", 1)[0] != ids[2].rsplit("_", 1)[0]  # each process its uuid
    for rank in (2, 3):  # the worker's NIXL side channels, on its host
        socket.create_connection(("127.0.0.2", engine.side_port + rank), timeout=2).close()
    text = call(engine.url, "/metrics")[1]
    assert [sample(text, "vllm:request_success_total", engine=str(r), finished_reason="length")
            for r in range(4)] == [1, 1, 1, 1]
    assert [sample(text, "vllm:kv_cache_usage_perc", engine=str(r)) for r in range(4)] == [1 / 4096] * 4
    status, streamed = call(engine.url, "/v1/completions", {"model": "tiny", "prompt": "x y", "max_tokens": 3,
                                                            "stream": True}, {"X-data-parallel-rank": "3"})
    assert status == 200 and streamed.endswith("data: [DONE]\n\n") and streamed.count("data: ") == 4
    # without the header the ranks take turns, worker ranks included
    for _n in range(4):
        assert call(engine.url, "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 1})[0] == 200
    text = call(engine.url, "/metrics")[1]
    assert [sample(text, "vllm:request_success_total", engine=str(r), finished_reason="length")
            for r in range(4)] == [2, 2, 2, 3]


def test_pd_transfer_between_worker_ranks(tmp_path, procs):
    """A producer rank on one engine's worker and a consumer rank on another engine's worker: the consumer's worker
    reads the blocks from the producer's worker itself; each head's /metrics shows its worker rank's counters."""
    prod = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"))
    cons = Engine(tmp_path, procs, "d", ("127.0.0.3", "127.0.0.4"))
    prompt = "one two three four five six"
    for p_rank, c_rank in ((3, 2), (0, 3), (2, 0)):
        status, answer = post(prod.url, p_rank, dict(PRODUCE, prompt=prompt), {"X-Request-Id": "r%d" % p_rank})
        params = answer["kv_transfer_params"]
        assert status == 200 and params["remote_host"] == ("127.0.0.2" if p_rank >= 2 else "127.0.0.1")
        status, out = post(cons.url, c_rank, {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
        assert status == 200 and out["choices"][0]["finish_reason"] == "length", out
    text = call(cons.url, "/metrics")[1]
    moved = len(prompt.split()) * 256 // 32 * 32
    assert [sample(text, "vllm:nixl_bytes_transferred_sum", engine=str(r)) for r in range(4)] == [
        moved, 0, moved, moved]
    assert [sample(text, "vllm:nixl_num_failed_transfers_total", engine=str(r)) for r in range(4)] == [0] * 4
    assert [sample(text, "vllm:prompt_tokens_by_source_total", engine=str(r), source="external_kv_transfer")
            for r in range(4)] == [6, 0, 6, 6]
    text = call(prod.url, "/metrics")[1]
    assert [sample(text, "vllm:request_success_total", engine=str(r), finished_reason="length")
            for r in range(4)] == [1, 0, 1, 1]
    # a worker rank that consumes from a producer it cannot reach fails the request as vLLM does (HTTP 500)
    bad = dict(params, remote_host="127.0.0.1", remote_port=prod.side_port + 1)  # rank 1's agent, on the head
    status, out = post(cons.url, 3, {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": bad})
    assert status == 500 and "engine ID mismatch" in out["message"]
    assert sample(call(cons.url, "/metrics")[1], "vllm:nixl_num_failed_transfers_total", engine="3") == 1


def test_the_collections_probe_proves_every_rank_of_two_engines_across_hosts(tmp_path, procs, module_runner):
    """The transfer probe (plugins/module_utils/_probe/transfer.py) through both heads, every rank asked by
    header: each rank pair proven by the consumer rank's own counters, worker ranks included."""
    from ansible_collections.narwhal.deploy.plugins.modules import transfer_probe

    flags = ("--enable-prompt-tokens-details",)
    one = Engine(tmp_path, procs, "e1", ("127.0.0.1", "127.0.0.2"), flags=flags)
    two = Engine(tmp_path, procs, "e2", ("127.0.0.3", "127.0.0.4"), flags=flags)
    engines = {"engine-1": {"url": one.url, "role": "prefill"}, "engine-2": {"url": two.url, "role": "decode"}}
    args = {"engines": engines,
            "pairs": [["engine-1", "engine-2"], ["engine-2", "engine-1"]], "model": "tiny", "timeout": 10,
            "api_key": KEY, "data_parallel": {"engine-1": 4, "engine-2": 4}}
    status, result = module_runner(transfer_probe.main, args)
    assert status == "exit", result
    for row, producer in zip(result["results"], (one, two), strict=True):
        assert row["ok"], row
        assert [(r["producer_rank"], r["consumer_rank"]) for r in row["ranks"]] == [(r, r) for r in range(4)]
        assert [r["remote_host"] for r in row["ranks"]] == [producer.hosts[0]] * 2 + [producer.hosts[1]] * 2
        assert [r["remote_port"] for r in row["ranks"]] == [producer.side_port + r for r in range(4)]
        assert all(r["evidence"] == "request" and r["bytes"] > 0 for r in row["ranks"])


def test_head_refuses_connections_until_its_ranks_register_then_times_out(tmp_path, procs):
    """A head whose worker never comes: its API port refuses connections (bound, not listening), and after
    VLLM_ENGINE_READY_TIMEOUT_S its API servers give up and it exits with vLLM's messages."""
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"), start_head=False)
    engine.worker.kill()
    engine.worker.wait()
    head = engine.start_head(wait=False, env={"VLLM_ENGINE_READY_TIMEOUT_S": "2"})
    wait_for_log(tmp_path, "p", "remote core engine proc(s) (ranks 2-3) to connect", head)
    assert refused(engine.url)
    assert head.wait(timeout=20) == 1
    out = engine.log()
    assert ("TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow weight "
            "loading for large models. Waited 2s (configured by VLLM_ENGINE_READY_TIMEOUT_S).") in out
    assert ("RuntimeError: Frontend process failed during engine core initialization. See root cause above. Failed "
            "frontend proc(s): {'ApiServer_0': 1, 'ApiServer_1': 1, 'ApiServer_2': 1, 'ApiServer_3': 1}") in out
    assert "Uvicorn running" not in out


def test_worker_without_a_head_gives_up_after_its_handshake_timeout(tmp_path, procs):
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"), start_head=False)
    assert engine.worker.wait(timeout=20) == 0  # run_headless returns normally once its engine cores ended
    out = engine.log("-w1")
    for rank in (2, 3):
        assert "[EngineCore_DP%d] EngineCore failed to start." % rank in out
    assert "RuntimeError: Did not receive response from front-end process within 5 minutes" in out
    assert "NARWHAL_STANDIN_HANDSHAKE_TIMEOUT_S=2 shortened" in out and "NIXL side channel" not in out


def test_duplicate_rank_is_ignored_and_times_out(tmp_path, procs):
    """A second worker for ranks already connected: the head ignores it (a ZMQ ROUTER drops a duplicate routing id)
    and comes up with the first; the second gets no init message and gives up."""
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2", "127.0.0.5"), start_head=False)
    engine.start_head()
    dup = engine.start_worker(2, engine.local, name="p-dup")
    assert dup.wait(timeout=20) == 0
    assert "Did not receive response from front-end process" in engine.log("-dup")
    assert "NIXL side channel" not in engine.log("-dup")
    assert call(engine.url, "/health")[0] == 200 and post(engine.url, 2, {"prompt": "a", "max_tokens": 1})[0] == 200
    assert engine.worker.poll() is None


def test_duplicate_rank_before_the_head_is_ignored(tmp_path, procs):
    """Two workers for the same ranks wait for the head: the first to connect gets them, the other gives up."""
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2", "127.0.0.5"), start_head=False)
    dup = engine.start_worker(2, engine.local, name="p-dup")
    wait_for_log(tmp_path, "p-dup", "Launching 2 data parallel engine(s)", dup)
    engine.start_head()
    deadline = time.time() + 20
    while engine.worker.poll() is None and dup.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert sorted([engine.worker.poll(), dup.poll()], key=str) == [0, None]
    assert call(engine.url, "/health")[0] == 200
    for rank in range(4):
        assert post(engine.url, rank, {"prompt": "a", "max_tokens": 1})[0] == 200


@pytest.mark.parametrize("start_rank,refusal", [
    (3, "RuntimeError: Message from engine with unexpected data parallel rank: 4"),
    (1, "RuntimeError: HELLO message from remote engine 1, expected it to be local"),
])
def test_head_stops_on_a_rank_it_does_not_expect(tmp_path, procs, start_rank, refusal):
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"), start_head=False)
    engine.worker.kill()
    engine.worker.wait()
    worker = engine.start_worker(1, start_rank, name="p-bad")
    head = engine.start_head(wait=False)
    assert head.wait(timeout=20) == 1
    assert refusal in engine.log() and refused(engine.url)
    assert worker.wait(timeout=20) == 0 and "EngineCore failed to start." in engine.log("-bad")


@pytest.mark.parametrize("worker_flags,moe,refusal", [
    (("-tp", "2"), False, "ERROR narwhal stand-in: the headless worker of rank(s) [2, 3] differs from the head: "
                          "tensor_parallel_size 2 (head: 1)"),
    (("--enable-expert-parallel",), False, "enable_expert_parallel True (head: False)"),
    (("-tp", "2"), True, "RuntimeError: Configuration mismatch detected for engine 2. All DP workers must have "
                         "identical configurations for parameters that affect collective communication"),
])
def test_head_stops_on_a_worker_configured_otherwise(tmp_path, procs, worker_flags, moe, refusal):
    model = dict(TINY, n_routed_experts=8) if moe else None
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"), worker_flags=worker_flags, start_head=False,
                    model_config=model)
    head = engine.start_head(wait=False)
    assert head.wait(timeout=20) == 1
    assert refusal in engine.log()


def test_head_stops_on_a_worker_of_another_model(tmp_path, procs):
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"), start_head=False,
                    worker_model_config=dict(TINY, num_hidden_layers=4))
    assert engine.start_head(wait=False).wait(timeout=20) == 1
    assert "model " in engine.log() and "differs from the head" in engine.log()


def test_worker_outlives_its_head_and_a_new_head_waits_in_vain(tmp_path, procs):
    """vLLM's headless engine cores do not watch the front-end: with the head stopped the worker keeps running (and
    serving its side channels) and never registers again, so a new head times out."""
    engine = Engine(tmp_path, procs, "p", ("127.0.0.1", "127.0.0.2"))
    engine.head.send_signal(signal.SIGTERM)
    assert engine.head.wait(timeout=20) == 0
    wait_for_log(tmp_path, "p-w1", "the head closed the connection", engine.worker)
    assert engine.worker.poll() is None
    socket.create_connection(("127.0.0.2", engine.side_port + 2), timeout=2).close()
    head = engine.start_head(wait=False, env={"VLLM_ENGINE_READY_TIMEOUT_S": "2"})
    assert head.wait(timeout=20) == 1 and "Timed out waiting for engine core processes" in engine.log()
    engine.worker.send_signal(signal.SIGTERM)
    assert engine.worker.wait(timeout=20) == 0 and "Shutting down." in engine.log("-w1")


# the head's rendezvous in-process, with raw clients speaking the workers' part (vllm.standin.rendezvous)


@pytest.fixture
def rendezvous(monkeypatch):
    with _standin.loaded("0.33.0", monkeypatch) as _modules:
        yield importlib.import_module("vllm.standin.rendezvous")


def head_thread(rdv, port, size=4, local=2, own=None, coordinated=False):
    """wait_for_workers in a thread -> (thread, result dict: "remote" or "error")."""
    own = own or {"data_parallel_size": size, "model": "/m", "tensor_parallel_size": 1,
                  "enable_expert_parallel": False, "parallel_config_hash": "h"}
    result = {}

    def run():
        try:
            result["remote"] = rdv.wait_for_workers(size, local, "127.0.0.1", port, own, coordinated, 4)
        except rdv.StartupError as exc:
            result["error"] = exc.lines
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def client(port, hello_ranks, config=None, headless=True):
    """A worker's connection that sent HELLO -> (socket, reader)."""
    deadline = time.time() + 10
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except ConnectionRefusedError:
            assert time.time() < deadline
            time.sleep(0.02)
    config = config or {"data_parallel_size": 4, "model": "/m", "tensor_parallel_size": 1,
                        "enable_expert_parallel": False, "parallel_config_hash": "h"}
    sock.sendall(json.dumps({"msg": "HELLO", "ranks": hello_ranks, "local": False, "headless": headless,
                             "config": config}).encode() + b"\n")
    return sock, sock.makefile("rb")


def ready(sock, ranks):
    sock.sendall(json.dumps({"msg": "READY", "name": "w", "engines": [],
                             "ranks": [{"index": r, "engine_id": "e_dp%d" % r, "side_host": "127.0.0.2",
                                        "side_port": 5600 + r} for r in ranks]}).encode() + b"\n")


def test_rendezvous_ignores_a_duplicate_hello_and_closes_it_after_startup(rendezvous, capsys):
    port = free_port()
    thread, result = head_thread(rendezvous, port)
    first, first_in = client(port, [2, 3])
    assert json.loads(first_in.readline()) == {"msg": "INIT"}
    second, second_in = client(port, [3])
    time.sleep(0.3)
    ready(first, [2, 3])
    thread.join(10)
    assert sorted(result["remote"]) == [2, 3] and result["remote"][2].side_port == 5602
    assert second_in.readline() == b""  # never an init message: closed with the handshake socket
    assert "ignored a worker's HELLO for rank(s) [3]" in capsys.readouterr().out
    for sock in (first, second):
        sock.close()


def test_rendezvous_hello_again_for_a_connected_rank_stops_the_head(rendezvous):
    """An engine core that said HELLO and went away, then HELLO again (a restarted worker): vLLM's head keeps the
    rank CONNECTED and stops (utils.py:1518-1523)."""
    port = free_port()
    thread, result = head_thread(rendezvous, port)
    first, first_in = client(port, [2, 3])
    assert json.loads(first_in.readline()) == {"msg": "INIT"}
    first_in.close()
    first.close()
    time.sleep(0.3)
    again, _again_in = client(port, [2, 3])
    thread.join(10)
    assert result["error"] == ["RuntimeError: Unexpected HELLO message for remote engine 2 in CONNECTED state."]
    again.close()


def test_rendezvous_refuses_a_worker_that_is_not_headless(rendezvous):
    port = free_port()
    thread, result = head_thread(rendezvous, port)
    sock, _reader = client(port, [2, 3], headless=False)
    thread.join(10)
    assert result["error"] == ["RuntimeError: Remote engine 2 must use --headless unless in external or hybrid dp "
                               "lb mode"]
    sock.close()
