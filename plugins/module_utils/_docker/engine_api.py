# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small Docker Engine API client on the standard library alone: JSON over http.client, to the daemon's unix
socket (DOCKER_HOST unix://, the default) or a TCP address (tcp://, with TLS when DOCKER_TLS_VERIFY or
DOCKER_CERT_PATH ask for it, as docker.from_env reads them).

Why it exists: speed. The launcher's `start` and discovery's image read run on every engine host; importing the
Docker SDK (requests, urllib3) costs them about 0.26 s of CPU, and the SDK's models add calls of their own (a
/version to negotiate, a ping, an inspect after every create, a reload). This client makes exactly the calls its
caller asks for, over one kept-alive connection, each with a timeout. Only what narwhal needs is here.

API version: the paths are unversioned, so the daemon answers in its own current API version, the one the SDK
negotiates with a GET /version first (from_env's default, version="auto") - without that extra call.

plan_body() turns an engine's plan (_plan/container.py::container_spec) into the create body directly, the one
translation after the plan; container_config() turns docker-py's `containers.create(...)` keyword arguments
(the short-lived check and version containers) into the body the SDK sends. Both give, field for field, the body
the SDK sends for the same container, so a container made through this client is the one the SDK made.

Errors: EngineAPIError carries the HTTP status and the daemon's `message`; NotFound (404), Conflict (409);
DaemonUnreachable (no status) when nothing answers at the address; Timeout (a DaemonUnreachable) when a call
gets no answer within its timeout; StreamError when a streamed answer (a pull, a load) ends with an error
message. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import shlex
import socket
import ssl
import struct
from urllib.parse import quote, urlencode, urlsplit

__metaclass__ = type

DEFAULT_HOST = "unix:///var/run/docker.sock"

DEFAULT_TIMEOUT = 60  # seconds per call, the SDK's default


class EngineAPIError(Exception):
    """The daemon refused a call: `status` (HTTP) and `message` (the daemon's own words)."""

    def __init__(self, message, status=None, explanation=None):
        super().__init__(message)
        self.status, self.explanation = status, explanation


class NotFound(EngineAPIError):  # noqa: N818 - the SDK's name
    pass


class Conflict(EngineAPIError):  # noqa: N818
    pass


class DaemonUnreachable(EngineAPIError):  # noqa: N818
    """Nothing answers at the address (no socket, refused, no permission, a broken connection)."""


class Timeout(DaemonUnreachable):  # noqa: N818
    """The daemon did not answer a call within its timeout."""


class StreamError(EngineAPIError):
    """A streamed answer (a pull's or a load's progress) ended with an "error"/"errorDetail" message: `message` is
    the daemon's (or the registry's) words."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def tls_context(cert_path, verify):
    """An SSLContext as docker.from_env builds it from DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem) and
    DOCKER_TLS_VERIFY; a missing file is an EngineAPIError naming it."""
    files = {name: os.path.join(cert_path, name) for name in ("ca.pem", "cert.pem", "key.pem")}
    for name in ("cert.pem", "key.pem") + (("ca.pem",) if verify else ()):
        if not os.path.isfile(files[name]):
            raise EngineAPIError("TLS for the Docker daemon (DOCKER_TLS_VERIFY/DOCKER_CERT_PATH): %s is missing"
                                 % files[name])
    if verify:
        context = ssl.create_default_context(cafile=files["ca.pem"])
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(files["cert.pem"], files["key.pem"])
    return context


def parse_host(base_url, tls=False):
    """('unix', path) or ('tcp', host, port) of a DOCKER_HOST; EngineAPIError for what this client cannot use."""
    url = urlsplit(base_url if "://" in base_url else "tcp://" + base_url)
    if url.scheme in ("unix", "http+unix"):
        return ("unix", url.path or "/var/run/docker.sock")
    if url.scheme == "https" and not tls:
        raise EngineAPIError("DOCKER_HOST %s: TLS needs DOCKER_TLS_VERIFY/DOCKER_CERT_PATH (the client certificate)"
                             % base_url)
    if url.scheme in ("tcp", "http", "https") and url.hostname:
        return ("tcp", url.hostname, url.port or (2376 if tls else 2375))
    raise EngineAPIError("DOCKER_HOST %s: only unix:// and tcp:// addresses are supported here" % base_url)


def demultiplex(data):
    """The payload of a non-TTY container's log stream: 8-byte frame headers (stream, 0, 0, 0, big-endian size)
    removed, frames kept in order."""
    out, index = [], 0
    while index + 8 <= len(data):
        size = struct.unpack(">I", data[index + 4:index + 8])[0]
        out.append(data[index + 8:index + 8 + size])
        index += 8 + size
    return b"".join(out)


class Client:
    """One daemon, one kept-alive connection (reopened when the daemon closed it), `timeout` seconds per call."""

    def __init__(self, base_url=None, timeout=DEFAULT_TIMEOUT, tls=None, proxies=None):
        self.base_url = base_url or DEFAULT_HOST
        self.timeout = timeout
        self.tls = tls
        self.proxies = proxies or {}
        self.target = parse_host(self.base_url, tls is not None)
        self.conn = None

    @classmethod
    def from_env(cls, timeout=DEFAULT_TIMEOUT, environ=None):
        """The client docker.from_env() makes: DOCKER_HOST, DOCKER_TLS_VERIFY ('' is off, any other value on),
        DOCKER_CERT_PATH (default ~/.docker when TLS is on), and the proxies of the docker client's config.json
        (injected into created containers' environment, as the SDK does)."""
        environ = os.environ if environ is None else environ
        host = environ.get("DOCKER_HOST") or None
        cert_path = environ.get("DOCKER_CERT_PATH") or None
        verify = environ.get("DOCKER_TLS_VERIFY")
        verify = verify is not None and verify != ""
        tls = None
        if cert_path or verify:
            tls = tls_context(cert_path or os.path.join(os.path.expanduser("~"), ".docker"), verify)
        return cls(host, timeout=timeout, tls=tls, proxies=config_proxies(host, environ))

    def __repr__(self):
        return "Client(%s)" % self.base_url

    # ---------------------------------------------------------------------------------------- transport

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _connection(self, timeout):
        conn = self.conn
        if conn is not None and conn.sock is not None:
            readable = select.select([conn.sock], [], [], 0)[0]
            if readable:  # an idle kept-alive connection that is readable was closed by the daemon
                conn.close()
        if conn is None:
            if self.target[0] == "unix":
                conn = _UnixConnection(self.target[1], timeout)
            elif self.tls is not None:
                conn = http.client.HTTPSConnection(self.target[1], self.target[2], timeout=timeout, context=self.tls)
            else:
                conn = http.client.HTTPConnection(self.target[1], self.target[2], timeout=timeout)
            self.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def call(self, method, path, query=None, body=None, timeout=None):
        """(status, body bytes) of one call; EngineAPIError (NotFound, Conflict) for an answer >= 400,
        DaemonUnreachable / Timeout when none comes."""
        data, headers = None, {}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        return self._exchange(method, path, query, headers, data, timeout, lambda answer: answer.read())

    def _exchange(self, method, path, query, headers, data, timeout, read):
        """(status, read(answer)) of one request; `data` bytes, a file (sent in 1 MiB blocks) or None; the errors
        of call()."""
        timeout = self.timeout if timeout is None else timeout
        url = path + ("?" + urlencode(query) if query else "")
        headers = dict(headers, **{"User-Agent": "narwhal-engineapi"})
        try:
            conn = self._connection(timeout)
            if hasattr(data, "read"):
                conn.blocksize = 1 << 20
            conn.request(method, url, body=data, headers=headers)
            answer = conn.getresponse()
            status = answer.status
            raw = answer.read() if status >= 400 else read(answer)
        except socket.timeout:  # noqa: UP041 - not TimeoutError before Python 3.10
            self.close()
            raise Timeout("%s %s: the Docker daemon at %s did not answer within %s s"
                          % (method, path, self.base_url, timeout))
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise DaemonUnreachable("the Docker daemon does not answer at %s (%s)"
                                    % (self.base_url, str(exc) or type(exc).__name__))
        if status >= 400:
            try:
                message = json.loads(raw.decode("utf-8")).get("message")
            except (ValueError, AttributeError):
                message = None
            message = message or raw.decode("utf-8", "replace").strip() or http.client.responses.get(status, "")
            kind = NotFound if status == 404 else Conflict if status == 409 else EngineAPIError
            reason = http.client.responses.get(status, "error")
            raise kind("%d %s (%s %s): %s" % (status, reason, method, path, message), status, message)
        return status, raw

    def stream(self, method, path, query=None, headers=None, data=None, timeout=None):
        """The JSON messages of a streamed answer (one object a line: a pull's or a load's progress), read as they
        come; `timeout` is how long the daemon may stay silent. StreamError for a message with "error" or
        "errorDetail" (the daemon answers 200 and then fails in the stream), the errors of call() otherwise."""

        def messages(answer):
            out = []
            for line in iter(answer.readline, b""):
                line = line.strip()
                if not line:
                    continue
                try:
                    message = json.loads(line.decode("utf-8"))
                except ValueError:
                    message = {"stream": line.decode("utf-8", "replace")}
                out.append(message)
            return out

        found = self._exchange(method, path, query, headers or {}, data, timeout, messages)[1]
        for message in found:
            if isinstance(message, dict) and (message.get("error") or message.get("errorDetail")):
                detail = message.get("errorDetail") or {}
                text = message.get("error") or (detail.get("message") if isinstance(detail, dict) else None)
                raise StreamError("%s %s: %s" % (method, path, text or detail), None, text or str(detail))
        return found

    def json(self, method, path, query=None, body=None, timeout=None):
        raw = self.call(method, path, query, body, timeout)[1]
        return json.loads(raw.decode("utf-8")) if raw else None

    # ---------------------------------------------------------------------------------------- calls

    def ping(self):
        return self.call("GET", "/_ping")[1] == b"OK"

    def version(self):
        return self.json("GET", "/version")

    def image(self, ref):
        """GET /images/<ref>/json: the image's inspect document (NotFound when the daemon has no such image)."""
        return self.json("GET", "/images/%s/json" % quote(ref, safe="/:"))

    def images(self):
        """GET /images/json: the summaries (Id, RepoTags, RepoDigests ...) of the images the daemon holds."""
        return self.json("GET", "/images/json")

    def pull(self, name, tag, auth=None, timeout=None):
        """POST /images/create?fromImage=<name>&tag=<tag or digest> (what `docker pull <name>:<tag>` or
        `<name>@<digest>` sends): the progress messages once the pull ends; `auth`: the X-Registry-Auth value (never
        logged; _deliver/images.py::registry_auth). StreamError when the registry refuses (in the stream), the
        errors of call() otherwise."""
        headers = {"X-Registry-Auth": auth} if auth else {}
        return self.stream("POST", "/images/create", {"fromImage": name, "tag": tag}, headers, None, timeout)

    def tag(self, ref, repo, tag):
        """POST /images/<ref>/tag?repo=<repo>&tag=<tag>: `docker tag <ref> <repo>:<tag>` (moves the tag)."""
        self.call("POST", "/images/%s/tag" % quote(ref, safe="/:"), {"repo": repo, "tag": tag})

    def load(self, archive, size, timeout=None):
        """POST /images/load?quiet=1 with `archive` (an open file of a docker save archive, `size` bytes) streamed
        in 1 MiB blocks: the daemon's messages ("Loaded image: ..."); StreamError when it refuses the archive."""
        headers = {"Content-Type": "application/x-tar", "Content-Length": str(size)}
        return self.stream("POST", "/images/load", {"quiet": 1}, headers, archive, timeout)

    def container(self, ref):
        """GET /containers/<ref>/json: the container's inspect document (by name or ID)."""
        return self.json("GET", "/containers/%s/json" % quote(ref, safe="/:"))

    def containers(self, filters=None, all=True):  # noqa: A002 - the API's own word
        """GET /containers/json: summaries (Id, Names with a leading /, Image, State as a word, Labels ...);
        filters as the API takes them, e.g. {"label": ["k=v"]} or {"name": ["part"]}."""
        query = {"all": 1} if all else {}
        if filters:
            query["filters"] = json.dumps({k: list(v) if isinstance(v, (list, tuple)) else [v]
                                           for k, v in filters.items()})
        return self.json("GET", "/containers/json", query)

    def create(self, name, body):
        """POST /containers/create; `body` from plan_body or container_config. -> {"Id": ..., "Warnings": [...]}."""
        return self.json("POST", "/containers/create", {"name": name} if name else None, body)

    def start(self, ref):
        self.call("POST", "/containers/%s/start" % quote(ref))

    def stop(self, ref, timeout=10):
        """SIGTERM, then SIGKILL after `timeout` s; the call may take that long (a stopped container: no-op)."""
        self.call("POST", "/containers/%s/stop" % quote(ref), {"t": timeout}, timeout=self.timeout + timeout)

    def kill(self, ref, signal=None):
        """POST /containers/<ref>/kill: SIGKILL, or `signal` (e.g. "HUP") to the container's main process."""
        self.call("POST", "/containers/%s/kill" % quote(ref), {"signal": signal} if signal else None)

    def rename(self, ref, name):
        self.call("POST", "/containers/%s/rename" % quote(ref), {"name": name})

    def remove(self, ref, force=False):
        self.call("DELETE", "/containers/%s" % quote(ref), {"force": 1} if force else None)

    def wait(self, ref, timeout=None):
        """POST /containers/<ref>/wait: {"StatusCode": ...} once it exits; Timeout after `timeout` s."""
        return self.json("POST", "/containers/%s/wait" % quote(ref), timeout=timeout)

    def logs(self, ref, stdout=True, stderr=True, tail="all", tty=False):
        """The container's log as bytes (stdout and/or stderr in their order); `tty`: the container has a TTY
        (its log is then one raw stream; narwhal's containers have none)."""
        raw = self.call("GET", "/containers/%s/logs" % quote(ref),
                        {"stdout": int(stdout), "stderr": int(stderr), "tail": tail})[1]
        return raw if tty else demultiplex(raw)

    def config(self, image, **kwargs):
        """container_config() with this client's proxy environment (the SDK's use_config_proxy)."""
        return container_config(image, proxy_env=proxy_environment(self.proxies), **kwargs)

    def plan_config(self, plan, labels, group_ids=None):
        """plan_body() with this client's proxy environment (the SDK's use_config_proxy)."""
        return plan_body(plan, labels, group_ids, proxy_env=proxy_environment(self.proxies))


# ---------------------------------------------------------------------------------------- the create body

def config_proxies(base_url, environ=None):
    """The `proxies` entry of the docker client's config.json ($DOCKER_CONFIG/config.json, else
    ~/.docker/config.json) for this DOCKER_HOST, else its `default`; {} when there is none."""
    environ = os.environ if environ is None else environ
    paths = [os.path.join(environ["DOCKER_CONFIG"], "config.json")] if environ.get("DOCKER_CONFIG") else []
    paths.append(os.path.join(os.path.expanduser("~"), ".docker", "config.json"))
    for path in paths:
        if os.path.exists(path):
            try:
                with open(path) as handle:
                    proxies = json.load(handle).get("proxies") or {}
            except (OSError, ValueError, AttributeError):
                return {}
            return (proxies.get(base_url) if base_url in proxies else proxies.get("default")) or {}
    return {}


def proxy_environment(proxies):
    """["http_proxy=...", "HTTP_PROXY=...", ...] of a config.json proxies entry, in the SDK's order."""
    env = []
    for key, name in (("httpProxy", "http_proxy"), ("httpsProxy", "https_proxy"), ("ftpProxy", "ftp_proxy"),
                      ("noProxy", "no_proxy")):
        if proxies.get(key):
            env += ["%s=%s" % (name, proxies[key]), "%s=%s" % (name.upper(), proxies[key])]
    return env


def _environment(environment):
    if isinstance(environment, dict):
        return ["%s=%s" % (k, v) if v is not None else k for k, v in environment.items()]
    return environment


def _device(spec):
    """'host[:container[:perms]]' -> the API's device mapping."""
    if isinstance(spec, dict):
        return spec
    parts = spec.split(":")
    return {"PathOnHost": parts[0], "PathInContainer": parts[1] if len(parts) > 1 else parts[0],
            "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm"}


def _pick(entry, snake, camel, default):
    value = entry.get(snake, entry.get(camel))
    return default if value is None else value


def _bytes(value):
    """A size as docker-py's parse_bytes reads it: an int, or digits with an optional b/k/m/g unit (1024-based)."""
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    units = {"b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def container_config(image, command=None, entrypoint=None, environment=None, labels=None, detach=False,
                     network_mode=None, ipc_mode=None, privileged=False, restart_policy=None, devices=None,
                     device_requests=None, group_add=None, cap_add=None, ulimits=None, security_opt=None,
                     mounts=None, shm_size=None, proxy_env=None, log_config=None):
    """The body of POST /containers/create that docker-py 7 sends for `client.containers.create(image,
    command, ...)` with these keyword arguments (types.DeviceRequest/Ulimit/Mount given as dicts with the SDK's
    snake_case or the API's CamelCase keys): ContainerConfig's fields with None left out, HostConfig's only when
    set, exactly as docker/types/containers.py and docker/api/container.py write them."""
    environment = _environment(environment)
    if proxy_env:
        environment = list(proxy_env) + list(environment or [])
    host = {}
    if shm_size is not None:
        host["ShmSize"] = _bytes(shm_size)
    if ipc_mode:
        host["IpcMode"] = ipc_mode
    if privileged:
        host["Privileged"] = privileged
    host["NetworkMode"] = network_mode or "default"
    if restart_policy:
        host["RestartPolicy"] = restart_policy
    if log_config is not None:  # types.LogConfig as a dict: {type|Type, config|Config}
        host["LogConfig"] = {"Type": _pick(log_config, "type", "Type", None),
                             "Config": dict(_pick(log_config, "config", "Config", None) or {})}
    if cap_add:
        host["CapAdd"] = cap_add
    if devices:
        host["Devices"] = [_device(d) for d in devices]
    if group_add:
        host["GroupAdd"] = [str(g) for g in group_add]
    if security_opt is not None:
        host["SecurityOpt"] = security_opt
    if ulimits is not None:
        host["Ulimits"] = [{"Name": _pick(u, "name", "Name", None), "Soft": _pick(u, "soft", "Soft", None),
                            "Hard": _pick(u, "hard", "Hard", None)} for u in ulimits]
    if mounts is not None:
        host["Mounts"] = []
        for m in mounts:
            kind = _pick(m, "type", "Type", "volume")
            if kind not in ("bind", "volume", "tmpfs", "npipe"):
                raise ValueError('Unsupported mount type: "%s"' % kind)
            host["Mounts"].append({"Target": _pick(m, "target", "Target", None),
                                   "Source": _pick(m, "source", "Source", None), "Type": kind,
                                   "ReadOnly": _pick(m, "read_only", "ReadOnly", False)})
    if device_requests is not None:
        host["DeviceRequests"] = [{"Driver": _pick(r, "driver", "Driver", ""), "Count": _pick(r, "count", "Count", 0),
                                   "DeviceIDs": _pick(r, "device_ids", "DeviceIDs", []),
                                   "Capabilities": _pick(r, "capabilities", "Capabilities", []),
                                   "Options": _pick(r, "options", "Options", {})} for r in device_requests]
    body = {"Tty": False, "OpenStdin": False, "StdinOnce": False, "AttachStdin": False,
            "AttachStdout": not detach, "AttachStderr": not detach, "Env": environment,
            "Cmd": shlex.split(command) if isinstance(command, str) else command, "Image": image,
            "NetworkDisabled": False, "HostConfig": host, "Labels": labels,
            "Entrypoint": shlex.split(entrypoint) if isinstance(entrypoint, str) else entrypoint}
    return {k: v for k, v in body.items() if v is not None}


def plan_body(plan, labels, group_ids=None, proxy_env=None):
    """The create body of an engine's container straight from its plan (_plan/container.py::container_spec), the
    one translation after the plan: the body docker-py 7 sends for the same container (container_config() of
    the equivalent containers.create(...) arguments; a unit test compares the two and the SDK's own). `labels`:
    the create labels (_plan/labels.py::create_labels); `group_ids`: the plan's group names -> the host's
    numeric IDs (a name the host lacks is left out). No secret is added: the engine's key guard reads the key from
    its mounted file (_plan/container.py), so `docker inspect` shows no key."""
    environment = dict(plan["environment"])
    env = ["%s=%s" % (k, environment[k]) for k in sorted(environment)]
    if proxy_env:
        env = list(proxy_env) + env
    host = {}
    if plan["ipc_mode"]:
        host["IpcMode"] = plan["ipc_mode"]
    host["NetworkMode"] = plan["network_mode"] or "default"
    host["RestartPolicy"] = {"Name": plan["restart_policy"]["name"]}
    if plan.get("log_config"):  # a plan of a record with runtime.log (_plan/container.py::log_config)
        host["LogConfig"] = {"Type": plan["log_config"]["Type"], "Config": dict(plan["log_config"]["Config"])}
    if plan["cap_add"]:
        host["CapAdd"] = list(plan["cap_add"])
    if plan["devices"]:
        host["Devices"] = [_device(d) for d in plan["devices"]]
    groups = [gid for gid in ((group_ids or {}).get(g) for g in plan["group_add"]) if gid]
    if groups:
        host["GroupAdd"] = [str(g) for g in groups]
    if plan["security_opt"]:
        host["SecurityOpt"] = list(plan["security_opt"])
    if plan["ulimits"]:
        host["Ulimits"] = [{"Name": u["name"], "Soft": u["soft"], "Hard": u["hard"]} for u in plan["ulimits"]]
    host["Mounts"] = []
    for m in plan["mounts"]:
        if m["type"] not in ("bind", "volume", "tmpfs", "npipe"):
            raise ValueError('Unsupported mount type: "%s"' % m["type"])
        host["Mounts"].append({"Target": m["target"], "Source": m["source"], "Type": m["type"],
                               "ReadOnly": m["read_only"]})
    if plan["device_requests"]:
        host["DeviceRequests"] = [{"Driver": r.get("driver", ""), "Count": r.get("count", 0),
                                   "DeviceIDs": r.get("device_ids", []), "Capabilities": r.get("capabilities", []),
                                   "Options": r.get("options", {})} for r in plan["device_requests"]]
    body = {"Tty": False, "OpenStdin": False, "StdinOnce": False, "AttachStdin": False, "AttachStdout": False,
            "AttachStderr": False, "Env": env, "Cmd": list(plan["command"]), "Image": plan["image"],
            "NetworkDisabled": False, "HostConfig": host, "Labels": labels, "Entrypoint": list(plan["entrypoint"])}
    return {k: v for k, v in body.items() if v is not None}
