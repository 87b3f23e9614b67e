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
