"""`start`: the image check (or a matching checked.json), then the container exactly as planned, kept when
its plan hash is unchanged (and then probed: /health, and /version equal to checked.json's, as `probe-version`
does); deployment.json records the application revision, launcher digest and container.

A replacement is rolling: the running container is stopped and renamed <name>-previous, the new one is created
and must become ready (/health, then /version equal to checked.json's) within the ready timeout. Ready: the
previous container is removed. Not ready: the new container is stopped and kept as <name>-failed (its logs
stay readable), the previous one gets its name back and is started again, rollback.json says what happened,
and start exits 2 with one message."""
import os
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import EngineAPIError, NotFound
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import TLS_TARGET
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import (
    PLAN_HASH_LABEL,
    RUN_ID_LABEL,
    create_labels,
    plan_hash,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import stop_grace
from narwhal_launcher.common import (
    FAILED_SUFFIX,
    PREVIOUS_SUFFIX,
    LaunchError,
    check_host,
    companions,
    container_labels,
    container_state,
    engine_api,
    launcher_sha256,
    our_container,
    prepare,
    read_api_key,
    refuse_foreign,
    run_dir,
    write_private,
)
from narwhal_launcher.health import (
    NotReadyError,
    container_exit,
    container_logs,
    exited,
    probe_url,
    tls_context,
    wait_health,
    wait_ready,
)
from narwhal_launcher.image_check import checked_sha256, image_check

STOP_TIMEOUT = 30  # seconds a container started without --shutdown-timeout gets after SIGTERM (container_grace)
DEFAULT_READY_TIMEOUT = 300.0  # seconds a new container gets to become ready when run by hand without --ready-timeout
LOG_LINES = 20  # the failed container's last log lines in the rollback message and rollback.json
ROLLBACK_FILE = "rollback.json"


def ready_timeout_from(role_env, given=None):
    """The seconds a new container gets to become ready: --ready-timeout, else DEFAULT_READY_TIMEOUT. The role
    environment carries no timeout (_plan/role_env.py::ROLE_ENV_KEYS): the launch stage passes the site's
    NARWHAL_ENGINE_READY_TIMEOUT as --ready-timeout (roles/launch/tasks/main.yml)."""
    if given is None:
        return DEFAULT_READY_TIMEOUT
    where, value = "--ready-timeout", given
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= 86400:
        raise LaunchError("%s=%r must be a number of seconds between 1 and 86400" % (where, value))
    return seconds


# ------------------------------------------------------------------------------------------ pure parts

def _flag_value(command, flag):
    """The value of `flag` in a command (`--flag value` or `--flag=value`), else None."""
    for index, token in enumerate(command):
        if token == flag and index + 1 < len(command):
            return str(command[index + 1])
        if isinstance(token, str) and token.startswith(flag + "="):
            return token[len(flag) + 1:]
    return None


def served_port(attrs, default):
    """The HTTP port a container's `vllm serve` command listens on (its Config.Cmd `--port`), else `default`."""
    value = _flag_value(list((attrs.get("Config") or {}).get("Cmd") or []), "--port")
    return int(value) if value is not None and value.isdigit() else default


def served_role_env(attrs, role_env):
    """The role environment as the container `attrs` serves (a previous container, started from another run): its
    own port (--port) and bind address (--host: none, a container that bound every interface) and, when it serves
    TLS (--ssl-certfile), the TLS directory it mounts (the CA its probe verifies against)."""
    command = list((attrs.get("Config") or {}).get("Cmd") or [])
    tls_dir = ""
    if _flag_value(command, "--ssl-certfile") is not None:
        tls_dir = next((m.get("Source") for m in attrs.get("Mounts") or [] if m.get("Destination") == TLS_TARGET),
                       None) or role_env.get("NARWHAL_TLS_DIR", "")
    return dict(role_env, NARWHAL_HTTP_PORT=str(served_port(attrs, int(role_env.get("NARWHAL_HTTP_PORT") or 0))),
                NARWHAL_BIND_ADDRESS=_flag_value(command, "--host") or "", NARWHAL_TLS_DIR=tls_dir)


def container_grace(attrs):
    """The seconds between SIGTERM and SIGKILL when this container is stopped: from its own command line and
    environment (its --shutdown-timeout N + VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS + a margin, _plan/lifecycle.py::
    stop_grace), so a container keeps the drain it was started with whatever plan is installed now; STOP_TIMEOUT for
    one started without the flag (read at call time)."""
    config = attrs.get("Config") or {}
    command = list(config.get("Cmd") or [])
    environment = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    if "--shutdown-timeout" not in command and not any(str(w).startswith("--shutdown-timeout=") for w in command):
        return STOP_TIMEOUT
    return stop_grace(command, environment)


def plan_grace(plan):
    """The grace of a container created from `plan` (container_grace of what it will run)."""
    return container_grace({"Config": {"Cmd": plan["command"],
                                       "Env": ["%s=%s" % kv for kv in plan["environment"].items()]}})


def log_excerpt(tail, lines=LOG_LINES, limit=2000):
    """The last `lines` non-empty log lines on one line (' | ' between them), at most `limit` characters."""
    kept = []
    for line in (tail or "").splitlines():
        line = " ".join(line.split())
        # blank lines and Python's traceback markers (^^^^) say nothing; a crash loop repeats its last line
        if line.strip(" \t^~") and (not kept or kept[-1] != line):
            kept.append(line)
    text = " | ".join(kept[-lines:])
    return ("..." + text[-limit:]) if len(text) > limit else text


def rollback_message(engine, failed, cause, restored, tail):
    """The one message of a start that rolled back. `failed`: {plan_hash, run_id, name} of the new container;
    `restored`: None (there was no previous container) or {id, plan_hash, run_id, serving, error, started}."""
    head = "%s: the new container (plan %s, run %s) failed: %s; " % (
        engine, (failed["plan_hash"] or "?")[:12], failed["run_id"] or "?", cause)
    if restored is None:
        body = "there was no previous container to roll back to, so %s is down" % engine
    else:
        which = "the previous container %s (plan %s, run %s)" % (
            restored["id"][:12], (restored["plan_hash"] or "?")[:12], restored["run_id"] or "?")
        if restored["serving"] is None:
            body = "restored %s under its name, left stopped: the engine's hosts are started again in order" % which
        elif restored["serving"]:
            body = "rolled back to %s which is serving again" % which
        elif not restored["started"]:
            body = "restored %s under its name; it was not running before this start and is left stopped, so %s " \
                   "is down" % (which, engine)
        else:
            body = "rolled back to %s but it is not serving (%s), so %s is down" % (which, restored["error"], engine)
    kept = "; the failed container is kept as %s (docker logs %s)" % (failed["name"], failed["name"]) \
        if failed.get("kept") else ""
    logs = log_excerpt(tail)
    return head + body + kept + ("; its last log lines: %s" % logs if logs else "; it left no log lines")


# ------------------------------------------------------------------------------------------ docker steps

class Previous:
    """The container being replaced: its id, labels and whether it was running (to start it again)."""

    def __init__(self, attrs, was_running):
        labels = container_labels(attrs)
        self.id, self.was_running = attrs["Id"], was_running
        self.plan_hash = labels.get(PLAN_HASH_LABEL, "")
        self.run_id = labels.get(RUN_ID_LABEL, "")


def _remove(api, ref, name, note=None):
    try:
        api.remove(ref, force=True)
    except (EngineAPIError, LaunchError) as exc:
        if note is not None:
            note.append("could not remove %s: %s" % (name, exc))


def set_aside(api, found, plan):
    """Stop the current container and rename it <name>-previous (an older -previous removed first); a leftover
    -previous with no current container (an interrupted replace) is adopted as the one to roll back to. `found`:
    companions() of the plan's name."""
    name, engine = plan["name"], plan["engine"]
    existing, older = found[name], found[name + PREVIOUS_SUFFIX]
    if older is not None:
        refuse_foreign(older, name + PREVIOUS_SUFFIX, engine)
    if existing is None:
        return Previous(older, True) if older is not None else None
    if older is not None:
        _remove(api, older["Id"], name + PREVIOUS_SUFFIX)
    previous = Previous(existing, container_state(existing) in ("running", "restarting"))
    api.stop(existing["Id"], timeout=container_grace(api.container(existing["Id"])))  # stopped: a no-op (304)
    api.rename(existing["Id"], name + PREVIOUS_SUFFIX)
    return previous


def roll_back(api, plan, role_env, new_id, previous, cause, tail, timeout, interval, secret, wait=True):
    """Keep the failed container as <name>-failed (stopped), give the previous one its name back and start it,
    wait for its /health (`wait`; not for a host of an engine across hosts, which serves only once its other hosts
    are back: the launch stage rolls them back and then probes the head); write rollback.json and raise the one
    message."""
    name, engine = plan["name"], plan["engine"]
    notes = []
    failed = {"name": name + FAILED_SUFFIX, "plan_hash": plan_hash(plan),
              "run_id": role_env.get("NARWHAL_RUN_ID", ""), "id": new_id, "kept": False}
    if new_id is not None:
        try:
            api.stop(new_id, timeout=plan_grace(plan))
            older = our_container(api, failed["name"], engine)
            if older is not None:
                _remove(api, older["Id"], failed["name"], notes)
            api.rename(new_id, failed["name"])
            failed["kept"] = True
        except (EngineAPIError, LaunchError) as exc:
            notes.append("could not set the failed container aside: %s" % exc)
    restored = None
    if previous is not None:
        restored = {"id": previous.id, "plan_hash": previous.plan_hash, "run_id": previous.run_id,
                    "serving": False, "started": False, "error": None}
        try:
            attrs = api.container(previous.id)
            if attrs["Name"].lstrip("/") != name:
                api.rename(previous.id, name)
            if previous.was_running and not wait:
                restored["serving"] = None  # left stopped: the launch stage starts the engine's hosts in order
            elif previous.was_running:
                api.start(previous.id)
                restored["started"] = True
                served = served_role_env(attrs, role_env)
                wait_health(probe_url(served, "/health"), previous.id, timeout, interval, api, secret,
                            context=tls_context(served))
                restored["serving"] = True
        except NotReadyError as exc:
            restored["error"] = exc.cause
        except (EngineAPIError, LaunchError) as exc:
            restored["error"] = redact_text(str(exc))
    document = {
        "engine": engine, "run_id": failed["run_id"], "cause": cause, "failed_container_id": failed["id"],
        "failed_container_name": failed["name"] if failed["kept"] else None, "failed_plan_hash": failed["plan_hash"],
        "failed_log_tail": log_excerpt(tail).split(" | ") if tail else [],
        "restored_container_id": restored and restored["id"], "restored_plan_hash": restored and restored["plan_hash"],
        "restored_run_id": restored and restored["run_id"], "restored_serving": bool(restored and restored["serving"]),
        "restored_error": restored and restored["error"], "notes": notes,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_private(os.path.join(run_dir(role_env), ROLLBACK_FILE), document)
    message = rollback_message(engine, failed, cause, restored, tail)
    raise LaunchError(message + ("; also: %s" % "; ".join(notes) if notes else ""))


def refused(plan, exc, api_key, created):
    """The NotReadyError of a create or start Docker refused (`created`: the create had succeeded)."""
    if isinstance(exc, NotFound) and not created:  # the image went away since the image check
        message = ("launch record runtime.image_id %s is not on this host; load the recorded image (%s) or rerun "
                   "discovery" % (plan["image"], plan["image_ref"]))
        return NotReadyError(message, message)
    return NotReadyError("docker refused container %s: %s" % (plan["name"], exc),
                         "docker refused to start it: %s" % redact_text(str(exc), (api_key,)))


HEADLESS_SETTLE = 3.0  # seconds a headless host's new container must keep running to count as started


def headless(plan):
    """The plan is a host after the head of an engine across hosts: engine cores only (vllm serve --headless), no
    HTTP API; it counts as started while its container runs (the head's /health proves the engine)."""
    return "--headless" in plan["command"]


def across_hosts(plan):
    """The plan is one host of an engine across hosts (the head or another): its DP ranks meet at an address."""
    return "--data-parallel-address" in plan["command"]


def wait_running(api, name, settle, secret=None, seen=None):
    """A headless host's readiness: its container is still running `settle` seconds after its start (a command
    vLLM refuses, or an image without the model, ends it at once). NotReadyError (cause, log tail) otherwise."""
    began = time.time()
    while True:
        dead = container_exit(api, name, secret, seen=seen)
        if dead:
            raise exited(dead, name, "within %d s of its start" % settle)
        if time.time() - began >= settle:
            return round(time.time() - began, 3)
        time.sleep(0.25)


def _wait_started(api, prepared, container_id, checked, settle, timeout, directory, interval, api_key, seen):
    """Wait until the container serves: a headless host's keeps running `settle` seconds (wait_running), any other
    answers /health and then /version equal to checked.json's within `timeout` (wait_ready). NotReadyError
    otherwise."""
    if headless(prepared.plan):
        wait_running(api, container_id, settle, api_key, seen)
    else:
        wait_ready(prepared.role_env, container_id, checked, prepared.digest, timeout, directory, interval=interval,
                   api=api, secret=api_key, seen=seen)


def _probe_unchanged(api, prepared, container_id, checked, timeout, directory, interval, api_key, seen):
    """The running container of this plan is kept: it must still serve this run's checked version (what
    `probe-version` does); nothing was changed, so a failure is only reported (exit 2), never rolled back."""
    plan = prepared.plan
    try:
        _wait_started(api, prepared, container_id, checked, 0, timeout, directory, interval, api_key, seen)
    except NotReadyError as exc:
        raise LaunchError("%s: the running container of this plan (%s) does not serve: %s"
                          % (plan["engine"], plan["name"], exc))


def _create_and_wait(api, prepared, found, checked, timeout, directory, interval, api_key, seen):
    """Set the current container aside, create and start the planned one and wait until it serves; whatever stops
    it, the previous one comes back (roll_back raises the one message). Returns (container id, Previous or None)."""
    plan, role_env, digest = prepared.plan, prepared.role_env, prepared.digest
    run_id = role_env.get("NARWHAL_RUN_ID", "")
    previous = set_aside(api, found, plan)
    container_id = None
    try:
        try:
            body = api.plan_config(plan, create_labels(plan, run_id, digest), prepared.group_ids)
            container_id = api.create(plan["name"], body)["Id"]
            api.start(container_id)
        except EngineAPIError as exc:
            raise refused(plan, exc, api_key, container_id is not None)
        _wait_started(api, prepared, container_id, checked, min(HEADLESS_SETTLE, timeout), timeout, directory,
                      interval, api_key, seen)
    except Exception as exc:  # noqa: BLE001 - whatever stopped the new container, the previous one comes back
        if isinstance(exc, NotReadyError):
            cause, tail = exc.cause, exc.tail
        else:
            cause = redact_text(" ".join(str(exc).split()) or type(exc).__name__, (api_key,))
            tail = container_logs(api, container_id, api_key, LOG_LINES) if container_id else None
        roll_back(api, plan, role_env, container_id, previous, cause, tail, timeout, interval, api_key,
                  wait=not across_hosts(plan))
    return container_id, previous


def _drop_previous(api, previous, plan):
    """Remove the replaced container (<name>-previous); a failure is a warning on stderr (the next start removes
    it)."""
    notes = []
    _remove(api, previous.id, plan["name"] + PREVIOUS_SUFFIX, notes)
    for note in notes:
        print("launch_engine: warning: %s; it is removed by the next start" % note, file=sys.stderr)


def _deployment(prepared, action, container_id, seen, previous, checked, check_how):
    """deployment.json's document: the application revision, launcher digest and container of this start."""
    plan, role_env, digest = prepared.plan, prepared.role_env, prepared.digest
    return {
        "engine": plan["engine"], "run_id": role_env.get("NARWHAL_RUN_ID", ""), "action": action,
        "app_revision": role_env.get("NARWHAL_APP_REVISION", ""),
        "collection": role_env.get("NARWHAL_COLLECTION", ""),
        "container_id": container_id, "container_name": plan["name"], "plan_hash": digest,
        "image_id": plan["image"], "launcher_sha256": launcher_sha256(), "group_ids": prepared.group_ids,
        "started_at": (seen.get("State") or {}).get("StartedAt", ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "replaced_container_id": previous.id if previous else None,
        "previous_container_id": previous.id if previous else None,
        "previous_plan_hash": previous.plan_hash if previous else None,
        "previous_run_id": previous.run_id if previous else None,
        "checked_sha256": checked_sha256(checked), "check": check_how,
        "vllm_api_version": checked["vllm_api_version"],
    }


def start(role_env_path, force=False, out=None, ready_timeout=None, interval=1.0, hold_previous=False):
    """Start (or keep) the engine as planned; see the module's docstring. `hold_previous`: a host after the head of
    an engine across hosts keeps its replaced container as <name>-previous (stopped) until `finish` says whether
    the head came up (drop it) or not (roll back to it)."""
    prepared = prepare(role_env_path)
    role_env, record, plan, digest = prepared.role_env, prepared.record, prepared.plan, prepared.digest
    timeout = ready_timeout_from(role_env, ready_timeout)
    api_key = read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    check_host(plan)
    api = engine_api()
    # the image check: refuses (nothing started) on failure; a checked.json of this plan hash, image ID and
    # launcher is reused unless --force. Its verdict goes to stderr, stdout keeps the one start line.
    checked, check_how = image_check(role_env, record, plan, digest, api=api, reuse=not force, out=sys.stderr)
    directory = run_dir(role_env)
    found = companions(api, plan["name"])
    existing = found[plan["name"]]
    if existing is not None:
        refuse_foreign(existing, plan["name"], plan["engine"])
    previous, seen = None, {}
    if existing is not None and container_state(existing) == "running" \
            and container_labels(existing).get(PLAN_HASH_LABEL) == digest and not force:
        container_id, action = existing["Id"], "unchanged"
        _probe_unchanged(api, prepared, container_id, checked, timeout, directory, interval, api_key, seen)
    else:
        action = "started" if existing is None else "replaced"
        container_id, previous = _create_and_wait(api, prepared, found, checked, timeout, directory, interval,
                                                  api_key, seen)
        if previous is not None and not hold_previous:
            _drop_previous(api, previous, plan)
    path = os.path.join(directory, "deployment.json")
    write = action != "unchanged" or not os.path.exists(path)
    if write and not seen.get("Id") == container_id:  # the health wait inspected it after start, or nobody did
        seen = api.container(container_id)
    deployment = _deployment(prepared, action, container_id, seen, previous, checked, check_how)
    if write:
        # An unchanged engine keeps the record of the deployment that is still running (idempotence).
        write_private(path, deployment)
    stale = os.path.join(directory, ROLLBACK_FILE)
    if os.path.exists(stale):  # the container of this plan serves now: an earlier rollback is history
        os.unlink(stale)
    print("unchanged" if action == "unchanged" else "%s %s %s" % (action, plan["name"], container_id),
          file=out or sys.stdout)
    return deployment


def finish(role_env_path, rollback=False, out=None, stop_only=False):
    """After the head of an engine across hosts came up, on each of its other hosts: drop the container `start
    --hold-previous` kept as <name>-previous (`kept <name>`).

    With `rollback` (the head did not come up, or one of the hosts did not start): a container of the installed plan
    with a kept <name>-previous is set aside as <name>-failed and the previous one gets its name back; then the
    container of that name is started fresh (stopped first when it runs): `rolled back <name> <id>` / `restarted
    <name> <id>`. With `stop_only` it is left stopped (`stopped <name> <id>`). The launch stage runs it in vLLM's
    order (vLLM 0.32.0 v1/engine/utils.py wait_for_engine_startup; the stand-in's rendezvous.py says where): every
    other host `stop_only` first (a headless engine core still alive would greet the fresh head, and the one that
    replaces it would then never be answered), then the head, then the other hosts, which greet it."""
    prepared = prepare(role_env_path)
    plan, digest = prepared.plan, prepared.digest
    api = engine_api()
    found = companions(api, plan["name"])
    current, previous = found[plan["name"]], found[plan["name"] + PREVIOUS_SUFFIX]
    for attrs, name in ((current, plan["name"]), (previous, plan["name"] + PREVIOUS_SUFFIX)):
        if attrs is not None:
            refuse_foreign(attrs, name, plan["engine"])
    print_to = out or sys.stdout
    if not rollback:
        notes = []
        if previous is not None:
            _remove(api, previous["Id"], plan["name"] + PREVIOUS_SUFFIX, notes)
        for note in notes:
            print("launch_engine: warning: %s; it is removed by the next start" % note, file=sys.stderr)
        print("kept %s" % plan["name"], file=print_to)
        return
    action = "restarted"
    if current is not None:
        api.stop(current["Id"], timeout=container_grace(api.container(current["Id"])))  # stopped: a no-op
    new = current is not None and container_labels(current).get(PLAN_HASH_LABEL) == digest
    if previous is not None and (current is None or new):
        if current is not None:
            older = found[plan["name"] + FAILED_SUFFIX]
            if older is not None:
                refuse_foreign(older, plan["name"] + FAILED_SUFFIX, plan["engine"])
                _remove(api, older["Id"], plan["name"] + FAILED_SUFFIX)
            api.rename(current["Id"], plan["name"] + FAILED_SUFFIX)
        api.rename(previous["Id"], plan["name"])
        current, action = previous, "rolled back"
    if current is None:
        print("nothing to roll back: %s has no container" % plan["name"], file=print_to)
        return
    if new and previous is None:  # a first start: there is nothing to go back to, so the new container stays down
        older = found[plan["name"] + FAILED_SUFFIX]
        if older is not None:
            refuse_foreign(older, plan["name"] + FAILED_SUFFIX, plan["engine"])
            _remove(api, older["Id"], plan["name"] + FAILED_SUFFIX)
        api.rename(current["Id"], plan["name"] + FAILED_SUFFIX)
        print("nothing to roll back: %s kept stopped as %s (there was no previous container)"
              % (plan["name"], plan["name"] + FAILED_SUFFIX), file=print_to)
        return
    if stop_only:
        print("stopped %s %s" % (plan["name"], current["Id"]), file=print_to)
        return
    api.start(current["Id"])
    print("%s %s %s" % (action, plan["name"], current["Id"]), file=print_to)
