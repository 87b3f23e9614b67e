"""The engines' key guard (roles/install/files/guard/narwhal_guard.py), driven as vLLM's app drives it: an ASGI
callable wrapping the app, called per request with asyncio (no Starlette). Every path but GET/HEAD of /health,
/ping, /version and /metrics needs the key; the refusal is vLLM's own 401 {"error": "Unauthorized"}."""
import ast
import asyncio
import hashlib
import json

import pytest
from test_support.paths import GUARD, load_file

KEY = "sk-guard-test-0123456789abcdef"
GUARDED = ["/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/pause", "/resume",
           "/abort_requests", "/v1/completions", "/v1/chat/completions", "/v1/models", "/v2/x", "/classify",
           "/docs", "/openapi.json", "/is_sleeping", "/load", "/server_info", "/healthz", "/health/", "//health",
           "/metrics/x", "/metricsx", "/", ""]
OPEN = ["/health", "/ping", "/version", "/metrics"]


@pytest.fixture()
def guard_module(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return load_file("narwhal_guard", GUARD)


class App:
    """The wrapped app: records what reached it and answers 200 (http) or accepts (websocket)."""

    def __init__(self):
        self.seen = []

    async def __call__(self, scope, receive, send):
        self.seen.append(scope)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"served"})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.accept"})


def run(guard_class, scope, env_key=None):
    """(messages the guard and app sent, scopes the app saw) of one request."""
    app, sent = App(), []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(guard_class(app)(scope, receive, send))
    return sent, app.seen


def http(path, method="GET", key=None, scheme="Bearer", root_path="", headers=()):
    found = list(headers)
    if key is not None:
        found.append((b"authorization", ("%s %s" % (scheme, key)).encode("latin-1")))
    return {"type": "http", "method": method, "path": path, "root_path": root_path, "headers": found}


def refused(sent):
    start, body = sent
    return (start["status"] == 401 and dict(start["headers"])[b"content-type"] == b"application/json"
            and json.loads(body["body"]) == {"error": "Unauthorized"}
            and int(dict(start["headers"])[b"content-length"]) == len(body["body"]))


@pytest.mark.parametrize("path", GUARDED)
@pytest.mark.parametrize("method", ["GET", "POST", "HEAD", "OPTIONS", "DELETE"])
def test_every_path_but_the_open_ones_needs_the_key(guard_module, path, method):
    sent, seen = run(guard_module.KeyGuard, http(path, method))
    assert refused(sent) and seen == []
    sent, seen = run(guard_module.KeyGuard, http(path, method, key=KEY))
    assert sent[0]["status"] == 200 and len(seen) == 1


@pytest.mark.parametrize("path", OPEN)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_health_ping_version_and_metrics_answer_without_the_key(guard_module, path, method):
    sent, seen = run(guard_module.KeyGuard, http(path, method))
    assert sent[0]["status"] == 200 and seen[0]["path"] == path


@pytest.mark.parametrize("path", OPEN)
@pytest.mark.parametrize("method", ["POST", "PUT", "OPTIONS", "DELETE"])
def test_other_methods_of_the_open_paths_need_the_key(guard_module, path, method):
    """POST /ping (SageMaker's), an OPTIONS preflight: refused without the key like every other request."""
    sent, seen = run(guard_module.KeyGuard, http(path, method))
    assert refused(sent) and seen == []


@pytest.mark.parametrize("header", [
    ("Bearer", "wrong-key"), ("Bearer", KEY + " "), ("Bearer", KEY[:-1]), ("Basic", KEY), ("Token", KEY),
    ("Bearer", ""), ("", KEY)])
def test_a_wrong_key_or_scheme_is_refused(guard_module, header):
    scheme, key = header
    sent, seen = run(guard_module.KeyGuard, http("/tokenize", "POST", key=key, scheme=scheme))
    assert refused(sent) and seen == []


def test_the_scheme_is_case_insensitive_and_the_first_header_counts(guard_module):
    """As vLLM's verify_token (scheme.lower() == "bearer") and Starlette's Headers.get (the first value)."""
    sent, _seen = run(guard_module.KeyGuard, http("/score", "POST", key=KEY, scheme="bEaReR"))
    assert sent[0]["status"] == 200
    first_wrong = http("/score", "POST", headers=[(b"authorization", b"Bearer nope"),
                                                  (b"authorization", ("Bearer " + KEY).encode())])
    assert refused(run(guard_module.KeyGuard, first_wrong)[0])


def test_root_path_is_stripped_as_vllm_strips_it(guard_module):
    """vLLM's middleware reads scope["path"].removeprefix(root_path): /api/health is open under root_path /api."""
    assert run(guard_module.KeyGuard, http("/api/health", root_path="/api"))[0][0]["status"] == 200
    assert refused(run(guard_module.KeyGuard, http("/api/health", root_path="/other"))[0])
    assert refused(run(guard_module.KeyGuard, http("/api/invocations", "POST", root_path="/api"))[0])


def test_without_a_key_in_the_environment_everything_but_the_open_paths_is_refused(monkeypatch):
    """Fail closed: an engine started without VLLM_API_KEY serves nothing (an empty key is no key)."""
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("VLLM_API_KEY", raising=False)
        else:
            monkeypatch.setenv("VLLM_API_KEY", value)
        module = load_file("narwhal_guard_nokey", GUARD)
        for key in (None, "", "None", "Bearer"):
            assert refused(run(module.KeyGuard, http("/v1/completions", "POST", key=key))[0])
        assert run(module.KeyGuard, http("/health"))[0][0]["status"] == 200


def test_the_key_is_read_when_the_app_is_built(guard_module, monkeypatch):
    guard = guard_module.KeyGuard(App())
    monkeypatch.setenv("VLLM_API_KEY", "another")
    assert guard.expected == hashlib.sha256(KEY.encode()).digest()
    assert guard.authorized(http("/x", key=KEY)) and not guard.authorized(http("/x", key="another"))


def test_websockets_need_the_key_and_are_closed_with_policy_violation(guard_module):
    scope = {"type": "websocket", "path": "/v1/realtime", "root_path": "", "headers": []}
    sent, seen = run(guard_module.KeyGuard, scope)
    assert sent == [{"type": "websocket.close", "code": 1008}] and seen == []
    scope["path"] = "/health"  # a websocket is never open, whatever its path
    assert run(guard_module.KeyGuard, scope)[0] == [{"type": "websocket.close", "code": 1008}]
    scope["headers"] = [(b"authorization", ("Bearer " + KEY).encode())]
    sent, seen = run(guard_module.KeyGuard, scope)
    assert sent == [{"type": "websocket.accept"}] and len(seen) == 1


def test_lifespan_passes_through(guard_module, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY")
    sent, seen = run(load_file("narwhal_guard_lifespan", GUARD).KeyGuard, {"type": "lifespan"})
    assert sent == [] and seen == [{"type": "lifespan"}]


def test_the_guard_is_python_38_and_standard_library_only():
    """It runs in any vLLM image and in the stand-in: no Starlette, nothing outside the standard library, no syntax
    after Python 3.8 (ast parses it with feature_version 3.8)."""
    tree = ast.parse(GUARD.read_text(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported == {"hashlib", "json", "os", "secrets"}
    # str.removeprefix is Python 3.9: the guard strips the root path itself
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "removeprefix"]
