"""`status`: what runs against what was installed, read only (nothing written, nothing started or stopped).

Facts: the container (state, restarts, labels: plan hash and run id), the installed plan (role env + record through
the planner), the run directory's checked.json, deployment.json, version-probe.json and rollback.json, GET /health,
/version and /metrics (NIXL counters) with short timeouts, the certificate the engine serves when it serves TLS
(verified against the installed CA, host name checked: its expiry, days left and sha256), and the LISTEN sockets of
/proc/net/tcp{,6} (the engine uses host networking, so its ports are the host's). derive_problems turns the facts
into one-line problems; the document is printed as JSON and the caller (the playbook) decides what to do about
them."""
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import metric_sum, nixl_counters
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.fields import role_port
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import (
    ENGINE_LABEL,
    PLAN_HASH_LABEL,
    RUN_ID_LABEL,
)
from narwhal_launcher.common import (
    PREVIOUS_SUFFIX,
    LaunchError,
    companions,
    container_labels,
    container_state,
    engine_api,
    installed,
    read_api_key,
    read_json_file,
    role,
)
from narwhal_launcher.health import http_get, probe_address, probe_url, tls_context
from narwhal_launcher.start import ROLLBACK_FILE

HTTP_TIMEOUT = 5.0  # seconds per HTTP call: status answers quickly even when the engine hangs
DOCKER_TIMEOUT = 10  # seconds per Docker API call
PROC_NET = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN = 10
RENEW_DAYS = 30  # a site certificate is issued again when fewer days are left (docs/inputs.md, NARWHAL_TLS_CERT_DAYS)


# ------------------------------------------------------------------------------------------ pure parts

def _proc_address(text, byteorder):
    """An address of /proc/net/tcp{,6}: 8 or 32 hex digits, each 32-bit word in the kernel's byte order."""
    raw = bytes.fromhex(text)
    if byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def listening_sockets(text, byteorder=sys.byteorder):
    """[(address, port)] of the LISTEN sockets in the text of /proc/net/tcp or /proc/net/tcp6 (header skipped,
    malformed lines ignored)."""
    found = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[0].endswith(":") or fields[3] != TCP_LISTEN:
            continue
        address, _sep, port = fields[1].partition(":")
        try:
            found.append((_proc_address(address, byteorder), int(port, 16)))
        except ValueError:
            continue
    return found


def port_facts(sockets, port):
    addresses = sorted({a for a, p in sockets if p == port})
    return {"port": port, "listening": bool(addresses), "addresses": addresses}


def _short(value):
    return (value or "?")[:12] if isinstance(value, str) else "?"


def certificate_facts(url, not_after, der, installed_sha256, now):
    """The served certificate's facts (pure): {url, not_after (ISO UTC), days_left, sha256, installed_sha256,
    error None}; `not_after` as getpeercert() writes it ("Jan  1 00:00:00 2027 GMT"), `der` its bytes."""
    seconds = ssl.cert_time_to_seconds(not_after)
    return {"url": url, "not_after": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)),
            "days_left": int((seconds - now) // 86400), "sha256": hashlib.sha256(der).hexdigest(),
            "installed_sha256": installed_sha256, "error": None}


def tls_problems(tls):
    """The problems of the served certificate (certificate_facts, or {url, error}; None: TLS off)."""
    if not tls:
        return []
    if tls.get("error"):
        return ["the certificate served at %s fails: %s; an expired certificate or one the installed CA did not "
                "sign is refused: prepare again (it issues or checks the certificates), then launch"
                % (tls["url"], tls["error"])]
    if tls.get("days_left") is not None and tls["days_left"] < 0:
        return ["the certificate served at %s expired on %s; prepare again, then launch"
                % (tls["url"], tls["not_after"])]
    if tls.get("installed_sha256") and tls.get("sha256") != tls["installed_sha256"]:
        return ["the certificate served at %s (sha256 %s) is not the installed one (%s); run launch to serve it"
                % (tls["url"], _short(tls.get("sha256")), _short(tls["installed_sha256"]))]
    return []


def derive_problems(doc):
    """One line per difference between what runs and what the installed run recorded (pure)."""
    problems = []
    name, container = doc["container_name"], doc.get("container")
    if doc.get("docker_error"):
        problems.append("cannot ask Docker about container %s: %s" % (name, doc["docker_error"]))
    elif container is None:
        problems.append("container %s does not exist: %s is not started (run launch)" % (name, doc["engine"]))
    elif not container.get("ours"):
        problems.append("container %s is not narwhal's container of %s (label %s=%s)"
                        % (name, doc["engine"], ENGINE_LABEL, container.get("engine_label") or "(none)"))
    else:
        state, code, restarts = container.get("state"), container.get("exit_code"), container.get("restart_count")
        if state == "restarting":
            problems.append("container %s is restarting after exiting (code %s, restarted %s times)"
                            % (name, code, restarts))
        elif state in ("exited", "dead"):
            problems.append("container %s is %s (code %s)" % (name, state, code))
        elif state != "running":
            problems.append("container %s is %s, not running" % (name, state))
        running, installed_hash = doc.get("plan_hash_running"), doc.get("plan_hash_installed")
        if not running:
            problems.append("container %s carries no %s label: it was not started by this launcher"
                            % (name, PLAN_HASH_LABEL))
        elif running != installed_hash:
            problems.append("running plan %s (run %s) differs from the installed run's %s (run %s); run launch to "
                            "apply the installed run" % (_short(running), doc.get("run_id_running") or "?",
                                                         _short(installed_hash), doc.get("run_id_installed") or "?"))
        if doc.get("image_id_running") != doc.get("image_id_planned"):
            problems.append("container %s runs image %s, the plan's is %s"
                            % (name, doc.get("image_id_running"), doc.get("image_id_planned")))
        deployment = doc.get("deployment")
        if deployment is None:
            problems.append("the installed run %s has no deployment.json (its launch did not complete)"
                            % doc.get("run_id_installed"))
        elif deployment.get("container_id") != container.get("id"):
            problems.append("container %s is %s, not %s that the installed run's deployment.json records"
                            % (name, _short(container.get("id")), _short(deployment.get("container_id"))))
    health, version = doc.get("health") or {}, doc.get("version") or {}
    if doc.get("headless"):  # a host after the head of an engine across hosts: no HTTP API (the head's serves it)
        health, version = {"ok": True}, {"expected": version.get("expected"), "served": version.get("expected")}
    if not health.get("ok"):
        problems.append("GET %s %s" % (health.get("url"), "answered HTTP %s" % health["status"]
                                       if health.get("status") else "failed: %s" % health.get("error")))
    if version.get("expected") is None:
        problems.append("checked.json is missing from the installed run directory: the image was never checked "
                        "for run %s (run launch)" % doc.get("run_id_installed"))
    elif version.get("served") is not None and version["served"] != version["expected"]:
        problems.append("GET %s answered version %s but checked.json vllm_api_version is %s"
                        % (version.get("url"), version["served"], version["expected"]))
    elif version.get("served") is None and health.get("ok"):
        problems.append("GET %s gave no version (%s)" % (version.get("url"), version.get("error")))
    ports = doc.get("ports") or {}
    if ports.get("error"):
        problems.append("cannot read the listening sockets: %s" % ports["error"])
    else:
        for key, what in (("http", "the engine's HTTP port, NARWHAL_HTTP_PORT"),
                          ("side_channel", "the NIXL side channel, VLLM_NIXL_SIDE_CHANNEL_PORT")):
            facts = ports.get(key) if not (doc.get("headless") and key == "http") else None
            if facts and not facts["listening"]:
                problems.append("nothing listens on TCP port %d (%s)" % (facts["port"], what))
    probe = doc.get("version_probe")
    if probe and probe.get("ok") is False:
        problems.append("the last version probe (%s s ago) found version %s, not the checked %s"
                        % (probe.get("age_s"), probe.get("version"), probe.get("expected")))
    rollback = doc.get("rollback")
    if rollback:
        problems.append("the installed run's start failed and rolled back (%s): %s; see %s"
                        % ("the previous container serves again" if rollback.get("restored_serving")
                           else "the engine was left down", rollback.get("cause"), ROLLBACK_FILE))
    return problems + tls_problems(None if doc.get("headless") else doc.get("tls"))


def verdict(doc):
    """The document with `problems`, `serving` (running, /health and /version ok) and `as_recorded` added."""
    doc = dict(doc)
    doc["problems"] = derive_problems(doc)
    container = doc.get("container") or {}
    doc["serving"] = bool(container.get("running") and (doc.get("headless") or (
        (doc.get("health") or {}).get("ok") and (doc.get("version") or {}).get("ok"))))
    doc["as_recorded"] = not doc["problems"]
    # a restart by the policy is worth seeing, but an engine serving its recorded plan again is as recorded
    doc["notes"] = ["container %s was restarted %s times by its restart policy (it exited; see docker logs)"
                    % (doc["container_name"], container["restart_count"])] \
        if container.get("running") and container.get("restart_count") else []
    tls = doc.get("tls") or {}
    if tls.get("days_left") is not None and 0 <= tls["days_left"] < RENEW_DAYS:
        doc["notes"].append("the certificate served at %s expires in %d days (%s); the next prepare issues a new one "
                            "(site mode) or refuses it (operator mode)"
                            % (tls["url"], tls["days_left"], tls["not_after"]))
    return doc


# ------------------------------------------------------------------------------------------ facts

def _get(url, context=None):
    """(status, body, error) of one bounded GET."""
    try:
        status, body = http_get(url, timeout=HTTP_TIMEOUT, context=context)
        return status, body, None
    except OSError as exc:
        return None, b"", str(getattr(exc, "reason", exc))


def served_certificate(address, port, context, timeout=HTTP_TIMEOUT):
    """(getpeercert(), the certificate's DER bytes) of the TLS server at address:port, verified by `context` against
    the server name `address` (an ssl.SSLError, an OSError, when it fails)."""
    with socket.create_connection((address, port), timeout=timeout) as sock:
        with context.wrap_socket(sock, server_hostname=address) as tls:
            return tls.getpeercert(), tls.getpeercert(binary_form=True)


def tls_facts(role_env, address=None, now=None):
    """The certificate the engine serves (certificate_facts), {url, error} when it cannot be verified or read;
    None when the engine serves plain HTTP."""
    url = probe_url(role_env, "", address)
    try:
        context = tls_context(role_env)
        if context is None:
            return None
        peer, der = served_certificate(probe_address(role_env, address), role_port(role_env, "NARWHAL_HTTP_PORT"),
                                       context)
        return certificate_facts(url, peer["notAfter"], der, role_env.get("NARWHAL_TLS_CERT_SHA256", ""),
                                 now or time.time())
    except (OSError, ValueError, KeyError, LaunchError) as exc:  # ssl.SSLError's str() names the failed check
        return {"url": url, "error": str(exc) or type(exc).__name__}


def http_facts(role_env, expected, address=None):
    health_url, version_url = probe_url(role_env, "/health", address), probe_url(role_env, "/version", address)
    metrics_url = probe_url(role_env, "/metrics", address)
    try:
        context = tls_context(role_env)
    except LaunchError:
        context = ssl.create_default_context()  # no installed CA: every request fails verification (tls_facts says)
    status, _body, error = _get(health_url, context)
    health = {"url": health_url, "ok": status == 200, "status": status, "error": error}
    status, body, error = _get(version_url, context)
    served = None
    if status == 200:
        try:
            served = json.loads(body.decode("utf-8")).get("version")
        except (ValueError, AttributeError, RecursionError) as exc:
            error = "not a version document (%s)" % exc
    elif status is not None:
        error = "HTTP %s" % status
    version = {"url": version_url, "served": served if isinstance(served, str) else None, "expected": expected,
               "ok": expected is not None and served == expected, "error": error}
    status, body, error = _get(metrics_url, context)
    nixl = {"url": metrics_url, "error": error if status is None else None if status == 200 else "HTTP %s" % status}
    text = body.decode("utf-8", "replace") if status == 200 else ""
    nixl.update(nixl_counters(text))
    nixl["failed_notifications"] = metric_sum(text, "vllm:nixl_num_failed_notifications_total")
    return health, version, nixl


def port_table(role_env, paths=PROC_NET, first_rank=0):
    sockets, errors = [], []
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                sockets += listening_sockets(fh.read())
        except OSError as exc:
            errors.append("%s: %s" % (path, exc.strerror or exc))
    if len(errors) == len(paths):
        return {"error": "; ".join(errors)}
    return {"http": port_facts(sockets, role_port(role_env, "NARWHAL_HTTP_PORT")),
            "side_channel": port_facts(sockets, role_port(role_env, "NARWHAL_SIDE_CHANNEL_PORT") + first_rank),
            "error": None}


def container_facts(container, engine):
    """The facts of an inspected container (None: there is none)."""
    if container is None:
        return None
    state = container.get("State") or {}
    labels = container_labels(container)
    status = container_state(container)
    return {"name": container["Name"].lstrip("/"), "id": container["Id"], "state": status,
            "running": status == "running", "restart_count": container.get("RestartCount") or 0,
            "started_at": state.get("StartedAt"), "exit_code": state.get("ExitCode"),
            "ours": labels.get(ENGINE_LABEL) == engine, "engine_label": labels.get(ENGINE_LABEL),
            "image_id": container.get("Image"),
            # its log driver and rotation (HostConfig.LogConfig: the record's runtime.log, or the daemon's default)
            "log": (container.get("HostConfig") or {}).get("LogConfig")}


def docker_facts(name, engine):
    """(the inspected container or None, [companion facts], docker error or None): one list of the container
    and its companions, then an inspect of the container when it exists."""
    try:
        api = engine_api(timeout=DOCKER_TIMEOUT)
        found = companions(api, name)
        main = api.container(found[name]["Id"]) if found[name] is not None else None
    except LaunchError as exc:  # no daemon
        return None, [], str(exc)
    except Exception as exc:  # noqa: BLE001 - API errors and timeouts: reported, the rest of the status stands
        return None, [], "%s: %s" % (type(exc).__name__, exc)
    found.pop(name)
    others = [{"name": each, "id": c["Id"], "state": container_state(c),
               "ours": container_labels(c).get(ENGINE_LABEL) == engine,
               "role": "previous" if each.endswith(PREVIOUS_SUFFIX) else "failed"}
              for each, c in found.items() if c is not None]
    return (main, others, None)


def probe_facts(directory, now=None):
    path = os.path.join(directory, "version-probe.json")
    document = read_json_file(path)
    if document is None:
        return None
    try:
        age = round((now or time.time()) - os.stat(path).st_mtime, 1)
    except OSError:
        age = None
    return {"age_s": age, "ok": document.get("ok"), "version": document.get("version"),
            "expected": document.get("expected"), "plan_hash": document.get("plan_hash"),
            "run_id": document.get("run_id")}


def collect(role_env_path, address=None):
    """The status document (facts + verdict) of the installed engine."""
    role_env, _record, plan, digest = installed(role_env_path)
    try:
        read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))  # only so that nothing below can print it
    except LaunchError:
        pass
    directory = role(role_env, "NARWHAL_RUN_DIR")
    name, engine = plan["name"], plan["engine"]
    container, companions, docker_error = docker_facts(name, engine)
    labels = container_labels(container) if container is not None else {}
    checked = read_json_file(os.path.join(directory, "checked.json")) or {}
    deployment = read_json_file(os.path.join(directory, "deployment.json"))
    # a host after the head of an engine across hosts has no HTTP API: its ranks are asked through the head's; its
    # first side channel is the base + its first global DP rank (vLLM 0.32.0 nixl/base_scheduler.py:77-80)
    quiet = "--headless" in plan["command"]
    first_rank = int(plan["command"][plan["command"].index("--data-parallel-start-rank") + 1]) if quiet else 0
    health, version, nixl = ({"skipped": "headless"}, {"skipped": "headless", "expected": checked.get(
        "vllm_api_version")}, {}) if quiet else http_facts(role_env, checked.get("vllm_api_version"), address)
    facts = container_facts(container, engine)
    doc = {
        "engine": engine, "container_name": name, "container": facts, "companions": companions,
        "docker_error": docker_error,
        "plan_hash_running": labels.get(PLAN_HASH_LABEL), "plan_hash_installed": digest,
        "run_id_running": labels.get(RUN_ID_LABEL), "run_id_installed": role_env.get("NARWHAL_RUN_ID", ""),
        "image_id_running": facts and facts["image_id"], "image_id_planned": plan["image"],
        "run_dir": directory,
        "deployment": deployment and {k: deployment.get(k)
                                      for k in ("container_id", "action", "run_id", "plan_hash", "recorded_at")},
        "checked_plan_hash": checked.get("plan_hash"),
        "health": health, "version": version, "nixl": nixl, "ports": port_table(role_env, first_rank=first_rank),
        "version_probe": probe_facts(directory), "rollback": read_json_file(os.path.join(directory, ROLLBACK_FILE)),
        "tls": None if quiet else tls_facts(role_env, address),
    }
    if quiet:
        doc["headless"] = True
    return verdict(doc)


def redact_strings(value):
    """Every string in a JSON-like value redacted (before dumping: redacting the dumped text could cut a quote)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_strings(v) for v in value]
    return value


def status(role_env_path, address=None, out=None):
    doc = redact_strings(collect(role_env_path, address))
    text = json.dumps(doc, indent=2, sort_keys=True)
    print(text, file=out or sys.stdout)
    return doc
