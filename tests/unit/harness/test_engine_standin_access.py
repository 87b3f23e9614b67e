"""Who gets into the stand-in engine (tests/harness/images/engine-standin/site/vllm/standin/server.py), as into vLLM:
--middleware classes imported from PYTHONPATH and run per request before its own handling (the collection's key
guard, roles/install/files/guard/narwhal_guard.py), an import error ending the start, TLS from --ssl-certfile and
--ssl-keyfile, and --host bound exactly. Each engine is a process of its own (test_support.standin.engine_process)."""
import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request

import pytest
from test_support import engine_tls
from test_support.standin import KEY, engine_key_file, engine_log, engine_process, write_key_file

OLD = "sk-narwhal-previous-key-9876543210"


def ask(url, path, method="GET", key=None, body=None, context=None):
    """(status, body text) of one request."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def engines():
    started = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_the_key_guard_refuses_every_path_but_the_open_ones(tmp_path, engines):
    """engine_process starts the stand-in as the launcher does: the guard (--middleware, first on PYTHONPATH) with
    the key in its file, VLLM_API_KEY empty (vLLM's own check off)."""
    url, proc = engine_process(tmp_path, "guarded", KEY)
    engines.append(proc)
    unauthorized = (401, '{"error":"Unauthorized"}')
    for path in ("/health", "/version", "/metrics"):
        assert ask(url, path)[0] == 200, path
    assert ask(url, "/v1/models") == unauthorized
    for path in ("/tokenize", "/invocations", "/pooling", "/score", "/rerank", "/pause", "/v1/completions"):
        assert ask(url, path, "POST", body={}) == unauthorized, path
        assert ask(url, path, "POST", key="wrong", body={}) == unauthorized, path
    assert ask(url, "/v1/models", "OPTIONS") == unauthorized  # a preflight too
    assert ask(url, "/health", "HEAD")[0] == 405  # through the guard: the route takes GET only, as FastAPI's
    assert ask(url, "/pooling", "POST", key=KEY, body={}) == (404, '{"detail":"Not Found"}')
    assert ask(url, "/pooling", "PUT", key=KEY) == (404, '{"detail":"Not Found"}')
    assert ask(url, "/tokenize", "POST", key=KEY, body={})[0] == 400  # the route: a request without a prompt
    assert ask(url, "/tokenize", "PUT", key=KEY) == (405, '{"detail":"Method Not Allowed"}')
    assert ask(url, "/v1/models", "DELETE", key=KEY) == (405, '{"detail":"Method Not Allowed"}')
    status, text = ask(url, "/v1/completions", "POST", key=KEY, body={"prompt": "a b", "max_tokens": 2})
    assert status == 200 and json.loads(text)["choices"][0]["text"], text


def test_a_key_rotation_reaches_the_running_engine(tmp_path, engines):
    """The engine's key file rewritten (install's rename) while it serves: the new key and the previous one both
    accepted, then the new one alone - the same process throughout, no restart."""
    url, proc = engine_process(tmp_path, "rotated", OLD)
    engines.append(proc)
    models = ("/v1/models", "GET")
    assert ask(url, *models, key=OLD)[0] == 200 and ask(url, *models, key=KEY)[0] == 401
    write_key_file(engine_key_file(tmp_path, "rotated"), "%s\n%s\n" % (KEY, OLD))
    assert _eventually(lambda: ask(url, *models, key=KEY)[0]) == 200  # within the guard's second
    assert ask(url, *models, key=OLD)[0] == 200 and ask(url, *models, key="another")[0] == 401
    write_key_file(engine_key_file(tmp_path, "rotated"), KEY + "\n")
    assert _eventually(lambda: ask(url, *models, key=OLD)[0], 401) == 401
    assert ask(url, *models, key=KEY)[0] == 200 and proc.poll() is None
    log = engine_log(tmp_path, "rotated")
    assert log.count("narwhal_guard: ") == 3 and "narwhal_guard: 2 key(s) of the key file" in log
    assert KEY not in log and OLD not in log


def _eventually(probe, want=200, timeout=5):
    import time

    deadline = time.time() + timeout
    while True:
        found = probe()
        if found == want or time.time() > deadline:
            return found
        time.sleep(0.1)


def test_without_the_guard_vllms_own_check_guards_v1_only(tmp_path, engines):
    """What the guard closes: vLLM's --api-key / VLLM_API_KEY check guards GUARD_PREFIX paths only (/v1 here)."""
    url, proc = engine_process(tmp_path, "plain", KEY, guard=False)
    engines.append(proc)
    assert ask(url, "/v1/models")[0] == 401
    assert ask(url, "/pooling", "POST", body={}) == (404, '{"detail":"Not Found"}')  # reached the routes
    status, text = ask(url, "/tokenize", "POST", body={})
    assert status == 400 and "Field required" in text  # /tokenize itself: no key needed (not /v1)


def test_a_middleware_that_does_not_import_ends_the_start_with_its_traceback(tmp_path, engines):
    url, proc = engine_process(tmp_path, "broken", KEY, "--middleware", "narwhal_guard.KeyGuard", wait=False,
                               guard=False)  # not on PYTHONPATH
    engines.append(proc)
    assert proc.wait(timeout=30) == 1
    log = engine_log(tmp_path, "broken")
    assert "Traceback (most recent call last)" in log and "ModuleNotFoundError: No module named 'narwhal_guard'" in log
    assert "Uvicorn running" not in log


def test_tls_from_the_ssl_flags_and_the_host_bound_exactly(tmp_path, engines):
    ca = engine_tls.make_ca()
    folder = engine_tls.write_tls_dir(tmp_path / "tls", ca[1], engine_tls.make_leaf(ca))
    url, proc = engine_process(tmp_path, "tls", KEY, "--ssl-certfile", str(folder / "server.crt"),
                               "--ssl-keyfile", str(folder / "server.key"))
    engines.append(proc)
    https = "https" + url[len("http"):]
    context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    assert ask(https, "/health", context=context)[0] == 200
    assert ask(https, "/v1/models", context=context)[0] == 401
    assert ask(https, "/v1/models", key=KEY, context=context)[0] == 200
    with pytest.raises(urllib.error.URLError, match="certificate verify failed"):
        ask(https, "/health", context=ssl.create_default_context())  # not the engine's CA
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        ask(url, "/health")  # plain HTTP to a TLS port
    assert "Uvicorn running on https://127.0.0.1:" in engine_log(tmp_path, "tls")
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", port), timeout=2):
        pass  # --host 127.0.0.1: nothing listens on another address of the host


def test_a_certificate_that_does_not_load_ends_the_start(tmp_path, engines):
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "server.crt").write_text("not a certificate\n")
    url, proc = engine_process(tmp_path, "badcert", KEY, "--ssl-certfile", str(tmp_path / "tls" / "server.crt"),
                               "--ssl-keyfile", str(tmp_path / "tls" / "server.crt"), wait=False)
    engines.append(proc)
    assert proc.wait(timeout=30) == 1
    log = engine_log(tmp_path, "badcert")
    assert "Traceback (most recent call last)" in log and "SSLError" in log and "Uvicorn running" not in log
