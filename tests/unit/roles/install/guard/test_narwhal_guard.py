"""The engines' key guard (roles/install/files/guard/narwhal_guard.py), driven as vLLM's app drives it: an ASGI
callable wrapping the app, called per request with asyncio (no Starlette). Every path but GET/HEAD of /health,
/ping, /version and /metrics needs a key of the file NARWHAL_GUARD_KEY_FILE names (the key, and during a rotation the
previous one); the refusal is vLLM's own 401 {"error": "Unauthorized"}."""
import ast
import asyncio
import json
import os

import pytest
from test_support.paths import GUARD, load_file

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import api_keys_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError

KEY = "sk-guard-test-0123456789abcdef"
OLD = "sk-guard-old-fedcba9876543210"
GUARDED = ["/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/pause", "/resume",
           "/abort_requests", "/v1/completions", "/v1/chat/completions", "/v1/models", "/v2/x", "/classify",
           "/docs", "/openapi.json", "/is_sleeping", "/load", "/server_info", "/healthz", "/health/", "//health",
           "/metrics/x", "/metricsx", "/", ""]
OPEN = ["/health", "/ping", "/version", "/metrics"]


def write_keys(path, text):
    """The key file as install writes it: a new file renamed over the old one (a new inode), mode 0600."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    new.chmod(0o600)
    os.replace(new, path)


@pytest.fixture()
def key_file(tmp_path, monkeypatch):
    path = tmp_path / "secrets" / "engine-api.key"
    path.parent.mkdir()
    write_keys(path, KEY + "\n")
    monkeypatch.setenv("NARWHAL_GUARD_KEY_FILE", str(path))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return path


@pytest.fixture()
def guard_module(key_file):
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


def accepts(guard, key):
    """Whether `guard` lets a POST /v1/completions with `key` through (and refuses it without a key)."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    sent = []

    async def send(message):
        sent.append(message)

    guard.app = app
    asyncio.run(guard(http("/v1/completions", "POST", key=key), None, send))
    return sent[0]["status"] == 200


def fresh(guard):
    """Let the next request look at the key file again (as RECHECK_S seconds after the last look)."""
    guard.checked = float("-inf")
    return guard


@pytest.mark.parametrize("content", [None, "", "\n", "\n" + KEY + "\n", "%s\n%s\nthird\n" % (KEY, OLD),
                                     "%s\n\n%s\n" % (KEY, OLD), "%s\n%s\n" % (KEY, KEY), "key with space\n",
                                     "k\x00" + KEY, "unset"])
def test_fail_closed_without_a_readable_key_file_that_keeps_the_rule(
        guard_module, key_file, monkeypatch, capsys, content):
    """No NARWHAL_GUARD_KEY_FILE, no file, an empty one, an empty first line, three lines, an empty line between the
    two, a duplicate, a bad key: everything but the open paths is refused (no key of the file is accepted), and one
    line on stderr names the file and what is wrong, never a key."""
    if content == "unset":
        monkeypatch.delenv("NARWHAL_GUARD_KEY_FILE")
    elif content is None:
        key_file.unlink()
    else:
        write_keys(key_file, content)
    guard = guard_module.KeyGuard(App())
    for key in (None, "", KEY, OLD, "key", "None", "Bearer"):
        assert refused(run(lambda app: guard, http("/v1/completions", "POST", key=key))[0]), key
    assert run(lambda app: guard, http("/health"))[0][0]["status"] == 200
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "narwhal_guard: " in err and "is refused until it is right" in err
    assert (str(key_file) if content != "unset" else "NARWHAL_GUARD_KEY_FILE is not set") in err
    assert KEY not in err and OLD not in err


def test_an_unreadable_key_file_fails_closed(guard_module, key_file, monkeypatch, capsys):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(guard_module, "open", denied, raising=False)
    guard = guard_module.KeyGuard(App())
    assert not accepts(guard, KEY)
    assert "the key file %s cannot be read (Permission denied)" % key_file in capsys.readouterr().err


def test_vllms_variable_is_not_the_guards_key(guard_module, key_file, monkeypatch):
    """The guard reads its file only: VLLM_API_KEY (which the plan sets empty) is no key of the guard."""
    monkeypatch.setenv("VLLM_API_KEY", "from-the-environment")
    guard = guard_module.KeyGuard(App())
    assert accepts(guard, KEY) and not accepts(guard, "from-the-environment")


def test_during_a_rotation_both_keys_are_accepted_and_then_only_the_new_one(guard_module, key_file, capsys):
    """The rotation as the engine sees it, in one process (no restart): the old key alone; the new key first and
    the old one second (both accepted); the new key alone (the old one refused)."""
    write_keys(key_file, OLD + "\n")
    guard = guard_module.KeyGuard(App())
    assert accepts(guard, OLD) and not accepts(guard, KEY)
    write_keys(key_file, "%s\n%s\n" % (KEY, OLD))
    assert accepts(fresh(guard), KEY) and accepts(guard, OLD) and not accepts(guard, "another")
    write_keys(key_file, KEY + "\n")
    assert accepts(fresh(guard), KEY) and not accepts(guard, OLD)
    err = capsys.readouterr().err
    assert err.splitlines() == ["narwhal_guard: %d key(s) of the key file %s accepted" % (n, key_file)
                                for n in (1, 2, 1)]
    assert KEY not in err and OLD not in err


def test_a_file_rewritten_in_place_is_seen_too(guard_module, key_file):
    guard = guard_module.KeyGuard(App())
    with open(key_file, "w") as handle:  # the same inode: the size and times change
        handle.write("%s\n%s\n" % (KEY, OLD))
    assert accepts(fresh(guard), OLD)


def test_a_key_file_that_goes_bad_fails_closed_and_comes_back_when_fixed(guard_module, key_file):
    guard = guard_module.KeyGuard(App())
    write_keys(key_file, "%s\n%s\nthird\n" % (KEY, OLD))
    assert not accepts(fresh(guard), KEY)
    key_file.unlink()
    assert not accepts(fresh(guard), KEY)
    write_keys(key_file, KEY + "\n")
    assert accepts(fresh(guard), KEY)


def test_the_file_is_looked_at_once_a_second_at_most(guard_module, key_file, monkeypatch):
    """Within RECHECK_S of the last look the file is not even stat'ed (requests pay a clock read); after it, one
    stat, and a read only when the file changed."""
    clock = [1000.0]
    monkeypatch.setattr(guard_module.time, "monotonic", lambda: clock[0])
    stats, real_stat = [], os.stat

    def stat(path, *args, **kwargs):
        if str(path) == str(key_file):
            stats.append(str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(guard_module.os, "stat", stat)
    guard = guard_module.KeyGuard(App())
    assert guard_module.RECHECK_S == 1.0 and stats == []  # the first read opens the file (fstat): no stat
    write_keys(key_file, OLD + "\n")
    clock[0] += 0.99
    assert accepts(guard, KEY) and not accepts(guard, OLD) and stats == []
    clock[0] += 0.01
    assert accepts(guard, OLD) and not accepts(guard, KEY) and stats == [str(key_file)]
    clock[0] += 1
    assert accepts(guard, OLD) and len(stats) == 2 and guard.stamp is not None  # unchanged: stat'ed, not read


RULE_CASES = [b"k1\n", b"k1", b"k1\r\n", b"  k1  \n", b"k1\nk0\n", b"k1\nk0", b"k1\nk0\n\n\n", b"k1\n\n",
              b"", b"\n", b"\n\n", b"\nk1\n", b"k1\nk0\nk2\n", b"k1\n\nk0\n", b"k1\nk1\n", b"k 1\n", b"k1\nk\t0\n",
              b"k\xc3\xa91\n", b"k\xff1\n", b"k1\x00\n", b"k" * 65537, b"k" * 65536, b"k1\n" + b" " * 65534]


@pytest.mark.parametrize("raw", RULE_CASES, ids=range(len(RULE_CASES)))
def test_the_guard_keeps_the_key_files_one_rule(guard_module, raw):
    """The guard and _common/api_key.py (prepare, the launcher, the probes) answer alike for each content: the same
    keys, or both refuse."""
    try:
        expected = api_keys_from(raw, 0o100600, "/k")
    except PlanError:
        expected = None
    try:
        found = guard_module.keys_of(raw)
    except ValueError:
        found = None
    assert found == expected


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
    monkeypatch.delenv("NARWHAL_GUARD_KEY_FILE")
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
    assert imported == {"hashlib", "json", "os", "secrets", "sys", "time"}
    # str.removeprefix is Python 3.9: the guard strips the root path itself
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "removeprefix"]
