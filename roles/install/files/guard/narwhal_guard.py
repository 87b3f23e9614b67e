# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy's key guard of a vLLM engine: no request reaches the engine without its API key, on any path.

Why: vLLM's own key check guards only the paths that start with GUARDED_PREFIX = ("/v1", "/v2", "/inference",
"/cohere") (vLLM 0.32.0 entrypoints/serve/middleware/authenticate.py); /invocations, /tokenize, /detokenize,
/pooling, /score, /rerank, and /pause, /resume, /abort_requests where enabled, answer without it. KeyGuard refuses
every HTTP and websocket request without `Authorization: Bearer <VLLM_API_KEY>`, except GET and HEAD of exactly
/health, /ping, /version and /metrics (the probes and Prometheus); the refusal is vLLM's own: HTTP 401 with
{"error": "Unauthorized"} (a websocket is closed with 1008, policy violation, before it is accepted: the server
answers the handshake with HTTP 403, as the ASGI specification says). The key is the one vLLM reads (the
environment variable VLLM_API_KEY, read once when the app is built) and is compared as vLLM compares it: the
sha256 digests of the presented and the expected key, with secrets.compare_digest. Without a key in the
environment every request but the open ones is refused (fail closed). Other scopes (lifespan) pass through.

Why a middleware loaded by vLLM's own `--middleware narwhal_guard.KeyGuard` and not a proxy in front of the engine:
vLLM imports the class and adds it with app.add_middleware (entrypoints/serve/middleware/register.py, the loop over
args.middleware after its own middlewares); Starlette's add_middleware inserts at the front of user_middleware
(starlette 1.10 applications.py:107), so the guard is the outermost user middleware and runs before vLLM's CORS,
key, request-id and scaling middlewares and before any route. A front proxy would add a hop and a second TLS
termination per request and sit in every streamed response; the middleware adds neither: a refused request ends
here, an accepted one continues in the same process and its response (streams included) is not touched. Its cost
per request: for an open path a tuple lookup; otherwise one sha256 of the presented key and one compare_digest
(microseconds, the same work vLLM's own check does on /v1).

Pure ASGI on the Python standard library (Python 3.8 and later, no Starlette import): the same file runs in any
vLLM image and in the test harness's stand-in engine. narwhal.deploy mounts it read-only at /narwhal/guard and
puts that directory first on PYTHONPATH (plugins/module_utils/_plan/container.py).
"""

import hashlib
import json
import os
import secrets

KEY_ENV = "VLLM_API_KEY"

# what answers without the key: the engine's liveness, version and metrics, for GET and HEAD only
OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")
OPEN_METHODS = ("GET", "HEAD")

REFUSAL = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode("utf-8")  # as JSONResponse renders it
POLICY_VIOLATION = 1008  # RFC 6455 section 7.4.1


def _digest(text):
    return hashlib.sha256(text.encode("utf-8")).digest()


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


class KeyGuard:
    """The ASGI middleware (see the module's docstring): KeyGuard(app), the key read from VLLM_API_KEY now."""

    def __init__(self, app):
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        self.expected = _digest(key) if key else None

    def is_open(self, scope):
        return scope["type"] == "http" and scope.get("method") in OPEN_METHODS and _path(scope) in OPEN_PATHS

    def authorized(self, scope):
        """The Authorization header is `Bearer <the key>` (vLLM's verify_token: scheme case-insensitive)."""
        if self.expected is None:
            return False
        value = _header(scope, b"authorization")
        if not value:
            return False
        scheme, _sep, token = value.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(_digest(token), self.expected)

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
