# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy's key guard of a vLLM engine: no request reaches the engine without its API key, on any path.

Why: vLLM's own key check guards only the paths that start with GUARDED_PREFIX = ("/v1", "/v2", "/inference",
"/cohere"), and not OPTIONS (vLLM 0.32.0 entrypoints/serve/middleware/authenticate.py); /invocations, /tokenize,
/detokenize, /pooling, /score, /rerank, and /pause, /resume, /abort_requests where enabled, answer without it.
KeyGuard refuses every HTTP and websocket request without `Authorization: Bearer <key>`, except GET and HEAD of
exactly /health, /ping, /version and /metrics (the probes and Prometheus; none of them starts with GUARDED_PREFIX,
so every request vLLM's check would refuse the guard refuses too, OPTIONS included); the refusal is vLLM's own: HTTP
401 with {"error": "Unauthorized"} (a websocket is closed with 1008, policy violation, before it is accepted: the
server answers the handshake with HTTP 403, as the ASGI specification says). Other scopes (lifespan) pass through.

The guard is the engine's only key check: narwhal.deploy starts vLLM with VLLM_API_KEY empty and no --api-key, so
vLLM adds no check of its own (entrypoints/serve/middleware/register.py: `tokens := [key for key in (args.api_key
or [envs.VLLM_API_KEY]) if key]`, an empty key is none). The keys are not in the container's environment (so not in
`docker inspect`): the guard reads them from the file NARWHAL_GUARD_KEY_FILE names, the engine host's key file in a
directory of its own mounted read-only (plugins/module_utils/_plan/container.py: a directory, so that a file
replaced by rename is seen). The file holds the key on its first line and, during a rotation, the previous key on
a second line; the guard accepts either (docs/security.md, "Rotating the key"). Its rule is
plugins/module_utils/_common/api_key.py's (at most two lines, the first non-empty, each printable ASCII without
spaces, the two different, blank lines at the end ignored), which prepare and the launcher apply to the same file; a
unit test holds the two to the same answers. The file is read when the app is built and again when it changes: the
guard stats it at most once every RECHECK_S seconds (one os.stat costs microseconds, as much as the rest of the
guard: bench/guard_cost.py) and reads it when its identity, size or times differ, so a new key file (install's
rename) is in force within a second, without a restart. The keys are compared as vLLM compares them: the sha256
digests of the presented and the expected keys, with secrets.compare_digest against each key (no early exit).
Fail closed: without NARWHAL_GUARD_KEY_FILE, or when the file cannot be read or breaks the rule, every request but
the open ones is refused (one line on stderr says why, naming the file, never a key) until the file is right.

Why a middleware loaded by vLLM's own `--middleware narwhal_guard.KeyGuard` and not a proxy in front of the engine:
vLLM imports the class and adds it with app.add_middleware (entrypoints/serve/middleware/register.py, the loop over
args.middleware after its own middlewares); Starlette's add_middleware inserts at the front of user_middleware
(starlette 1.10 applications.py:107), so the guard is the outermost user middleware and runs before vLLM's CORS,
request-id and scaling middlewares and before any route. A front proxy would add a hop and a second TLS
termination per request and sit in every streamed response; the middleware adds neither: a refused request ends
here, an accepted one continues in the same process and its response (streams included) is not touched. Its cost
per request: for an open path a tuple lookup; otherwise one sha256 of the presented key and one compare_digest per
key, and a clock read (a stat once a second): a few microseconds (bench/guard_cost.py).

Pure ASGI on the Python standard library (Python 3.8 and later, no Starlette import): the same file runs in any
vLLM image and in the test harness's stand-in engine. narwhal.deploy mounts it read-only at /narwhal/guard and
puts that directory first on PYTHONPATH (plugins/module_utils/_plan/container.py).
"""

import hashlib
import json
import os
import secrets
import sys
import time

KEY_FILE_ENV = "NARWHAL_GUARD_KEY_FILE"
RECHECK_S = 1.0  # how often the key file is looked at (os.stat), at most
MAX_KEYS = 2  # the key and, during a rotation, the previous one (_common/api_key.py MAX_KEYS)
MAX_BYTES = 65536  # _common/api_key.py API_KEY_MAX_BYTES

# what answers without the key: the engine's liveness, version and metrics, for GET and HEAD only
OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")
OPEN_METHODS = ("GET", "HEAD")

REFUSAL = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode("utf-8")  # as JSONResponse renders it
POLICY_VIOLATION = 1008  # RFC 6455 section 7.4.1


def _digest(text):
    return hashlib.sha256(text.encode("utf-8")).digest()


def keys_of(raw):
    """The keys of a key file's bytes by _common/api_key.py's rule (api_keys_from, without the mode, which the
    launcher checks on the host): [key] or [key, previous]. ValueError saying what is wrong, never a key."""
    if len(raw) > MAX_BYTES or b"\x00" in raw:
        raise ValueError("holds NUL bytes or over %d bytes" % MAX_BYTES)
    try:
        lines = [line.strip() for line in raw.decode("utf-8").split("\n")]
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text")
    while lines and not lines[-1]:
        lines.pop()
    if not lines or not lines[0]:
        raise ValueError("is empty" if not lines else "has an empty first line")
    if len(lines) > MAX_KEYS or not all(lines):
        raise ValueError("holds %d lines; it holds the key and, during a rotation, the previous key" % len(lines))
    if any(not "!" <= ch <= "~" for key in lines for ch in key):
        raise ValueError("holds a key with a space, control or non-ASCII character")
    if len(lines) == MAX_KEYS and lines[0] == lines[1]:
        raise ValueError("holds the same key on both lines")
    return lines


def _header(scope, name):
    """The first value of header `name` (lower case) in an ASGI scope, decoded as Starlette's Headers decodes it."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _path(scope):
    """The request path without the app's root_path, as vLLM's middleware reads it (path.removeprefix(root_path))."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _stamp(st):
    """What changes when the file is replaced (install's rename: a new inode) or rewritten in place."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeyGuard:
    """The ASGI middleware (see the module's docstring): KeyGuard(app), the keys read now from the file
    NARWHAL_GUARD_KEY_FILE names and again when it changes."""

    def __init__(self, app):
        self.app = app
        self.path = os.environ.get(KEY_FILE_ENV, "")
        self.expected = ()  # the sha256 digests of the accepted keys; none: every keyed request is refused
        self.stamp = None  # _stamp of the file the keys were read from, or the reason it could not be read
        self.checked = None  # time.monotonic() of the last look at the file
        self.refresh()

    def refresh(self):
        """Read the key file again when it changed since the last read (its _stamp); fail closed when it cannot be
        read or breaks the rule, saying so on stderr once per change."""
        self.checked = time.monotonic()
        if not self.path:
            self._fail("no-path", "%s is not set" % KEY_FILE_ENV)
            return
        try:
            if self.stamp is not None and _stamp(os.stat(self.path)) == self.stamp:
                return
            with open(self.path, "rb") as handle:
                stamp = _stamp(os.fstat(handle.fileno()))  # what was read, even if the file is replaced meanwhile
                raw = handle.read(MAX_BYTES + 1)
        except OSError as exc:
            self._fail(("error", exc.errno), "the key file %s cannot be read (%s)" % (self.path, exc.strerror or exc))
            return
        try:
            keys = keys_of(raw)
        except ValueError as exc:
            self._fail(stamp, "the key file %s %s" % (self.path, exc))
            return
        sys.stderr.write("narwhal_guard: %d key(s) of the key file %s accepted\n" % (len(keys), self.path))
        self.expected, self.stamp = tuple(_digest(key) for key in keys), stamp

    def _fail(self, stamp, why):
        if stamp != self.stamp:
            sys.stderr.write("narwhal_guard: %s; every request but GET/HEAD of %s is refused until it is right "
                             "(rerun install)\n" % (why, ", ".join(OPEN_PATHS)))
        self.expected, self.stamp = (), stamp

    def is_open(self, scope):
        return scope["type"] == "http" and scope.get("method") in OPEN_METHODS and _path(scope) in OPEN_PATHS

    def authorized(self, scope):
        """The Authorization header is `Bearer <a key of the file>` (vLLM's verify_token: scheme case-insensitive,
        every key compared)."""
        if time.monotonic() - self.checked >= RECHECK_S:
            self.refresh()
        if not self.expected:
            return False
        value = _header(scope, b"authorization")
        if not value:
            return False
        scheme, _sep, token = value.partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented, match = _digest(token), False
        for expected in self.expected:
            match |= secrets.compare_digest(presented, expected)
        return match

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket") or self.is_open(scope) or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-length", str(len(REFUSAL)).encode("ascii")),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": REFUSAL})
