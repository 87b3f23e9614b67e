"""The stand-in engine's stop (tests/harness/images/engine-standin/site/vllm/standin/server.py, `drain`), as vLLM
0.32 stops on SIGTERM with --shutdown-timeout N (entrypoints/launchers/launcher.py:257-289, v1/engine/core.py:
1625-1664): in-flight requests finish within N seconds and then the process exits; N = 0 aborts them; what the
drain does not finish is aborted; the flag is unknown to a vLLM older than 0.18, and the version-dependent names
of the KV lease."""
import argparse
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_support import standin as _standin
from test_support.standin import KEY, engine_process

DELAY = {"X-Narwhal-Standin-Token-Seconds": "0.1"}


def completion(url, max_tokens, stream=False, headers=None, out=None):
    body = {"model": "tiny", "prompt": "drain me", "max_tokens": max_tokens, "stream": stream}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers=dict({"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
                                              **(headers or {})))
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            result = (resp.status, resp.read().decode())
    except urllib.error.HTTPError as exc:
        result = (exc.code, exc.read().decode())
    except OSError as exc:
        result = (None, str(exc))
    result += (time.monotonic() - started,)
    if out is not None:
        out.append(result)
    return result


def in_flight(url, max_tokens, stream=False):
    """Start one slow request in a thread -> (thread, results list)."""
    results = []
    thread = threading.Thread(target=completion, args=(url, max_tokens, stream, DELAY, results), daemon=True)
    thread.start()
    time.sleep(0.6)  # it is generating
    return thread, results


def log_of(tmp_path, name):
    return (tmp_path / ("engine-%s.log" % name)).read_text()


@pytest.mark.parametrize("stream", [False, True])
def test_sigterm_drains_the_request_in_flight(tmp_path, stream):
    url, proc = engine_process(tmp_path, "drain", KEY, "--shutdown-timeout", "10")
    try:
        thread, results = in_flight(url, 20, stream)  # about 2 s of tokens
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        refused = completion(url, 1)  # a new request while draining
        thread.join(30)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    status, text, took = results[0]
    assert status == 200, text
    if stream:
        assert '"finish_reason":"length"' in text and text.rstrip().endswith("data: [DONE]")
    else:
        answer = json.loads(text)
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == 20
    assert took >= 1.5
    assert refused[0] == 503
    log = log_of(tmp_path, "drain")
    assert "[shutdown] API server: stopping engine client mode=drain timeout=10s" in log
    assert "[shutdown] EngineCore: draining in-flight requests count=1 timeout=10s" in log


@pytest.mark.parametrize("flags, reason, seconds", [
    ((), "abort", (0, 1.5)),                              # vLLM's default 0: abort at once
    (("--shutdown-timeout", "0"), "abort", (0, 1.5)),
    (("--shutdown-timeout", "1"), "abort", (0.9, 3.5)),   # the drain ran out before the 50 tokens (5 s)
])
def test_what_the_drain_does_not_finish_is_aborted(tmp_path, flags, reason, seconds):
    url, proc = engine_process(tmp_path, "abort", KEY, *flags)
    try:
        thread, results = in_flight(url, 50)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert proc.wait(30) == 0
        stopped = time.monotonic() - signalled
    finally:
        proc.kill()
    status, text, _took = results[0]
    assert status == 200, text
    answer = json.loads(text)
    assert answer["choices"][0]["finish_reason"] == reason
    assert answer["usage"]["completion_tokens"] < 50
    assert seconds[0] <= stopped <= seconds[1]


@pytest.mark.parametrize("version, known", [("0.17.0", False), ("0.18.0", True), ("0.33.0", True)])
def test_shutdown_timeout_exists_from_vllm_0_18(version, known, monkeypatch, capsys):
    with _standin.loaded(version, monkeypatch) as (_server, serve):
        parser = serve.add_flags(argparse.ArgumentParser(prog="vllm serve"), serve.load_flags())
        if known:
            assert parser.parse_args(["/m", "--shutdown-timeout", "30"]).shutdown_timeout == 30
        else:
            with pytest.raises(SystemExit):
                parser.parse_args(["/m", "--shutdown-timeout", "30"])
            assert "unrecognized arguments: --shutdown-timeout" in capsys.readouterr().err


@pytest.mark.parametrize("version, has_variable", [("0.21.0", True), ("0.22.0", False), ("0.33.0", False)])
def test_the_lease_variable_exists_up_to_vllm_0_21(version, has_variable, monkeypatch):
    with _standin.loaded(version, monkeypatch):
        import importlib

        envs = importlib.import_module("vllm.envs")
        assert ("VLLM_NIXL_ABORT_REQUEST_TIMEOUT" in envs.environment_variables) is has_variable
        assert "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS" in envs.environment_variables


# ------------------------------------------------------------------ a draining producer serves what it answered

def prefill(url, prompt, request_id):
    """A router's prefill request (do_remote_decode) -> (status, its kv_transfer_params)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json",
                                          "X-Request-Id": request_id})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())["kv_transfer_params"]


def decode(url, prompt, params):
    """The consumer's request with the producer's kv_transfer_params -> (status, body text)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "stream": False, "kv_transfer_params": params}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_draining_producer_serves_the_kv_of_requests_it_answered_then_exits(tmp_path):
    """vLLM keeps a finished prefill request (its KV held for the decode) in the scheduler until the decode read it
    or its lease ended, and a drain lasts while the scheduler has requests (server.py unread_kv): the router's
    decode half of a request the prefill answered just before SIGTERM still reads its KV."""
    producer_url, producer = engine_process(tmp_path, "producer", KEY, "--shutdown-timeout", "20")
    consumer_url, consumer = engine_process(tmp_path, "consumer", KEY)
    try:
        status, params = prefill(producer_url, "keep my blocks", "drain-kv-1")
        assert status == 200 and params["remote_request_id"] == "drain-kv-1"
        signalled = time.monotonic()
        producer.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert producer.poll() is None, log_of(tmp_path, "producer")  # still serving the unread KV
        status, text = decode(consumer_url, "keep my blocks", params)
        assert status == 200, text
        assert producer.wait(10) == 0
        assert time.monotonic() - signalled < 8  # it left once the KV was read, not at the 20 s timeout
    finally:
        producer.kill()
        consumer.kill()
    log = log_of(tmp_path, "producer")
    assert "waiting for consumers to read the KV of finished requests count=1" in log
    assert "request processing complete" in log


@pytest.mark.parametrize("flags, seconds", [
    (("--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                          "kv_buffer_device": "cpu",
                                          "kv_connector_extra_config": {"kv_lease_duration": 1}}),
      "--shutdown-timeout", "20"), (0.8, 4.5)),         # the lease (1 s) ends first
    (("--shutdown-timeout", "2"), (1.8, 5.5)),          # the drain's timeout (2 s) ends before the lease (30 s)
    ((), (0, 2.0)),                                     # 0: abort at once, nothing waited for
])
def test_unread_kv_is_waited_for_until_its_lease_or_the_timeout_ends(tmp_path, flags, seconds):
    url, proc = engine_process(tmp_path, "unread", KEY, *flags)
    try:
        assert prefill(url, "nobody reads this", "unread-1")[0] == 200
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        stopped = time.monotonic() - signalled
    finally:
        proc.kill()
    assert seconds[0] <= stopped <= seconds[1], (stopped, log_of(tmp_path, "unread"))


# ------------------------------------------------------------------ NARWHAL_STANDIN_LOAD_S: loads like a model

def _connects(port):
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_api_port_listens_only_after_the_load_seconds(tmp_path):
    """As vLLM binds its API socket first and listens once the engine has loaded: connections are refused for
    NARWHAL_STANDIN_LOAD_S seconds, then /health answers."""
    started = time.monotonic()
    url, proc = engine_process(tmp_path, "loading", KEY, env={"NARWHAL_STANDIN_LOAD_S": "3"}, wait=False)
    port = int(url.rsplit(":", 1)[1])
    try:
        refused_until = None
        while time.monotonic() - started < 20 and proc.poll() is None:
            if _connects(port):
                break
            refused_until = time.monotonic() - started
            time.sleep(0.1)
        listening_after = time.monotonic() - started
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.kill()
    assert refused_until is not None and refused_until >= 2.5, (refused_until, log_of(tmp_path, "loading"))
    assert 3 <= listening_after < 15
    assert "Loading the model (NARWHAL_STANDIN_LOAD_S=3)" in log_of(tmp_path, "loading")


@pytest.mark.parametrize("value", ["soon", "-1", "3601"])
def test_a_bad_load_seconds_value_is_refused_by_name(tmp_path, value):
    _url, proc = engine_process(tmp_path, "badload", KEY, env={"NARWHAL_STANDIN_LOAD_S": value}, wait=False)
    try:
        assert proc.wait(30) == 1
    finally:
        proc.kill()
    assert "NARWHAL_STANDIN_LOAD_S=%r is not a number of seconds from 0 to 3600" % value in log_of(tmp_path, "badload")
