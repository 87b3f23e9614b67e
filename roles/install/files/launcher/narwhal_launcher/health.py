"""`probe-version`: wait for /health (showing the container's end if it dies), GET /version and compare it
with checked.json's vllm_api_version; writes version-probe.json.

The engine is asked where it listens: its bind address (NARWHAL_BIND_ADDRESS), or its advertised address when it
binds every interface; over https when it serves TLS (NARWHAL_TLS_DIR), verifying its certificate against the CA
installed beside it (<NARWHAL_TLS_DIR>/ca.crt) with the host name checked, so an expired certificate or one of
another CA is refused by name ("certificate verify failed") at once instead of being waited on."""
import json
import os
import ssl
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import http_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import REDACTED, redact_text
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import EngineAPIError
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import WILDCARDS, container_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.fields import role_port
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import plan_hash
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import TLS_FILES
from narwhal_launcher.common import (
    LaunchError,
    container_state,
    engine_api,
    load_record,
    read_api_key,
    read_json_file,
    read_role_env,
    role,
    run_dir,
    write_private,
)


def http_get(url, timeout, context=None):
    """(status, body) of GET `url`; `context`: the SSL context of an https URL (tls_context)."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe_address(role_env, address=None):
    """Where the engine answers: `address` when given, else its bind address, or its advertised address when it
    binds every interface (0.0.0.0, ::); 127.0.0.1 when the role environment names neither."""
    bind = role_env.get("NARWHAL_BIND_ADDRESS", "").strip("[]")
    if not address and bind and bind not in WILDCARDS:
        address = bind
    return (address or role_env.get("NARWHAL_ADVERTISED_ADDRESS", "")).strip("[]") or "127.0.0.1"


def probe_url(role_env, path, address=None):
    """The URL of `path` on the engine (probe_address), https when it serves TLS (NARWHAL_TLS_DIR)."""
    url = http_url(probe_address(role_env, address), role_port(role_env, "NARWHAL_HTTP_PORT"), path)
    return "https://" + url[len("http://"):] if role_env.get("NARWHAL_TLS_DIR") else url


def tls_context(role_env):
    """The SSL context of the engine's probes: its certificate verified against <NARWHAL_TLS_DIR>/ca.crt, the host
    name checked (ssl.create_default_context); None when it serves plain HTTP."""
    directory = role_env.get("NARWHAL_TLS_DIR", "")
    if not directory:
        return None
    cafile = os.path.join(directory, TLS_FILES["ca"])
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: not a PEM certificate
        raise LaunchError("the CA certificate %s of the engine's probes (NARWHAL_TLS_DIR) cannot be used (%s); rerun "
                          "prepare, which installs it" % (cafile, getattr(exc, "strerror", None) or exc))


def verify_failure(exc):
    """The certificate verification error inside an OSError of urllib (its `reason`) or ssl, else None."""
    for found in (exc, getattr(exc, "reason", None)):
        if isinstance(found, ssl.SSLCertVerificationError):
            return found
    return None


def _redact(text, secret):
    text = text.replace(secret, REDACTED) if secret else text
    return redact_text(text)


def container_logs(api, name, secret=None, lines=25):
    """The last `lines` log lines of container `name` (id or name), secrets redacted; None when Docker cannot be
    asked."""
    if api is None:
        return None
    try:
        tail = api.logs(name, tail=lines).decode("utf-8", "replace")
    except (EngineAPIError, LaunchError) as exc:
        return "(logs unavailable: %s)" % exc
    return _redact(tail, secret).rstrip()


def container_exit(api, name, secret=None, lines=25, seen=None):
    """(how it ended, last log lines) when the container `name` (id or name) has stopped or is being restarted by
    its restart policy (it exited at least once: `restarting`, or running again with a restart count); None while
    it runs, or when Docker cannot be asked (`api` None: the health wait then runs to its timeout). `secret` is
    redacted. `seen` (a dict) receives the container's inspect document."""
    if api is None:
        return None
    try:
        attrs = api.container(name)
    except (EngineAPIError, LaunchError):  # NotFound included: only a stopped container is definite
        return None
    if seen is not None:
        seen.clear()
        seen.update(attrs)
    restarts = attrs.get("RestartCount") or 0
    status = container_state(attrs)
    if status not in ("exited", "dead", "restarting") and not restarts:
        return None
    code = (attrs.get("State") or {}).get("ExitCode")
    if status in ("exited", "dead"):
        how = "exited (code %s)" % code
    else:
        how = "exited (code %s; its restart policy restarted it %d times)" % (code, max(restarts, 1))
    try:
        tail = api.logs(name, tail=lines).decode("utf-8", "replace")
    except (EngineAPIError, LaunchError) as exc:
        tail = "(logs unavailable: %s)" % exc
    return how, _redact(tail, secret).rstrip()


class NotReadyError(LaunchError):
    """The engine did not become ready: `cause` is one short line, `tail` its container's last log lines or None."""

    def __init__(self, message, cause, tail=None):
        super().__init__(message)
        self.cause, self.tail = cause, tail


def exited(dead, name, when):
    """The NotReadyError of a container that ended (`dead`: container_exit's (how, log tail)) `when` (a phrase)."""
    return NotReadyError("engine container %s %s %s; its last log lines:\n%s" % (name, dead[0], when, dead[1]),
                         "the container %s %s" % (dead[0], when), dead[1])


def installed_checked(directory, digest):
    """checked.json of the installed run, refused when missing or for another plan."""
    checked = read_json_file(os.path.join(directory, "checked.json"))
    if not checked or not checked.get("vllm_api_version"):
        raise LaunchError("%s/checked.json is missing or unreadable; run `launch_engine.pyz check` (or start) first"
                          % directory)
    if checked.get("plan_hash") != digest:
        raise LaunchError("%s/checked.json is for plan %s, the current plan is %s; run start (or check) again"
                          % (directory, checked.get("plan_hash"), digest))
    return checked


def fetch_version(url, timeout=10, context=None):
    """(HTTP status, served version or None) of GET /version; LaunchError when it cannot be read."""
    try:
        status, body = http_get(url, timeout=timeout, context=context)
        served = json.loads(body.decode("utf-8")).get("version") if status == 200 else None
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise LaunchError("GET %s failed (%s); the engine is not a vLLM OpenAI server" % (url, exc))
    return status, served


FAST_POLL, FAST_POLLS_FOR = 0.05, 2.0  # /health every 0.05 s during the first 2 s, then every `interval`


def wait_health(health, name, timeout, interval=1.0, api=None, secret=None, seen=None, context=None):
    """Wait until GET `health` answers 200, stopping at once when the container `name` (id or name) exits or
    answers with a certificate that fails verification (`context`: tls_context); -> seconds waited. Polls every
    0.05 s during the first 2 s (an engine that is up in a moment is seen at once), then every `interval`. Raises
    NotReadyError (cause, log tail)."""
    began = time.time()
    last = "no answer"
    while True:
        try:
            status, _body = http_get(health, timeout=min(10.0, max(1.0, timeout)), context=context)
            if status == 200:
                return round(time.time() - began, 3)
            last = "HTTP %d" % status
        except OSError as exc:
            last = str(getattr(exc, "reason", exc))
            if verify_failure(exc) is not None:
                cause = "%s serves a certificate that fails verification (%s)" % (health, last)
                raise NotReadyError("%s against the CA the engine's TLS files hold: an expired certificate or one "
                                    "of another CA; prepare again (it issues or checks the certificates) and launch"
                                    % cause, cause, container_logs(api, name, secret))
        dead = container_exit(api, name, secret, seen=seen)
        if dead:
            raise exited(dead, name, "before %s answered" % health)
        if time.time() - began >= timeout:
            raise NotReadyError("%s did not answer 200 within %d s (last: %s); see the engine container's logs "
                                "(docker logs %s)" % (health, timeout, last, name),
                                "%s did not answer 200 within %d s (last: %s)" % (health, timeout, last),
                                container_logs(api, name, secret))
        time.sleep(min(FAST_POLL, interval) if time.time() - began < FAST_POLLS_FOR else interval)


def wait_ready(role_env, name, checked, digest, timeout, directory, interval=1.0, address=None, api=None,
               secret=None, seen=None):
    """Wait for /health (200) of the engine, stopping at once when its container `name` (id or name) exits; then
    GET /version and compare it with checked.json's vllm_api_version; write version-probe.json. Returns the
    probe result; raises NotReadyError (cause, log tail) otherwise."""
    health, version_url = probe_url(role_env, "/health", address), probe_url(role_env, "/version", address)
    context = tls_context(role_env)
    waited = wait_health(health, name, timeout, interval, api, secret, seen, context)
    try:
        status, served = fetch_version(version_url, context=context)
    except LaunchError as exc:
        raise NotReadyError(str(exc), str(exc), container_logs(api, name, secret))
    if status != 200 or not isinstance(served, str):
        message = "GET %s answered HTTP %s without a version; the engine is not a vLLM OpenAI server" \
            % (version_url, status)
        raise NotReadyError(message, message, container_logs(api, name, secret))
    expected = checked["vllm_api_version"]
    result = {"engine": role_env.get("NARWHAL_ENGINE", ""), "run_id": role_env.get("NARWHAL_RUN_ID", ""),
              "url": version_url, "version": served, "expected": expected, "ok": served == expected,
              "plan_hash": digest, "image_id": checked.get("image_id")}
    # No timestamps in the file: an unchanged engine probed again leaves it byte-for-byte the same.
    write_private(os.path.join(directory, "version-probe.json"), result)
    result["health_wait_s"] = waited
    if not result["ok"]:
        raise NotReadyError("GET %s answered version %s but checked.json vllm_api_version is %s; the running engine "
                            "is not the checked image: stop it and run start again" % (version_url, served, expected),
                            "GET %s answered version %s, checked.json says %s" % (version_url, served, expected),
                            container_logs(api, name, secret))
    return result


def optional_docker():
    """The Engine API client, or None when DOCKER_HOST cannot be used (a daemon that does not answer is seen by
    the health wait's inspect: it then waits to its timeout)."""
    try:
        return engine_api()
    except LaunchError:
        return None


def optional_key(role_env):
    try:
        return read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    except LaunchError:
        return None


def probe_version(role_env_path, timeout=300.0, interval=1.0, address=None, out=None, health_only=False):
    """Wait for /health (200), GET /version, compare with checked.json's vllm_api_version. The engine is
    reached at `address` (default: probe_address, its bind or advertised address). `health_only`: the
    /health wait alone, for a container of another run than the installed one (an engine rolled back to its
    previous containers: the installed run's checked.json is not its)."""
    role_env = read_role_env(role_env_path)
    record = load_record(role(role_env, "NARWHAL_RECORD"))
    plan = container_spec(record, role_env)
    if health_only:
        url = probe_url(role_env, "/health", address)
        try:
            waited = wait_health(url, plan["name"], timeout, interval, optional_docker(), optional_key(role_env),
                                 context=tls_context(role_env))
        except NotReadyError as exc:
            raise LaunchError(str(exc))
        print("health ok: %s after %s s" % (url, waited), file=out or sys.stdout)
        return {"url": url, "health_wait_s": waited}
    digest = plan_hash(plan)
    directory = run_dir(role_env)
    checked = installed_checked(directory, digest)
    result = wait_ready(role_env, plan["name"], checked, digest, timeout, directory, interval=interval,
                        address=address, api=optional_docker(), secret=optional_key(role_env))
    print("version ok: %s %s = checked %s" % (result["url"], result["version"], result["expected"]),
          file=out or sys.stdout)
    return result
