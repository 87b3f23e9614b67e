# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's image and container on a router host: router_container's work (the module file,
plugins/modules/router_container.py, holds the documentation, the argument spec and main(), as community.docker's
plugins/modules/docker_container.py hands its module to plugins/module_utils/_module_container/module.py). An I/O
edge: it talks to the host's Docker daemon over its Engine API (_docker/engine_api.py); the container it runs is the
router plan's (_router/plan.py), recognised by the plan's hash label.

A running router is replaced or restarted by a hand-over that refuses no connection (hand_over): the new container
starts next to it as `<name>-next` (same plan; the start script binds the same ports with SO_REUSEPORT and listens
only once it serves, then takes every new connection: roles/router/files/narwhal_router.py), then the old one is
stopped (it drains) and removed, and the new one renamed. A container started before the hand-over existed (no
HANDOVER_LABEL: its fronts hold the ports without SO_REUSEPORT, so a second router cannot bind them) is stopped first,
as before, and the result says why."""

from __future__ import annotations

import time

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    EngineAPIError,
    NotFound,
    container_config,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import PLAN_HASH_LABEL

__metaclass__ = type

# On every router container this module creates: its start script binds the fronts with SO_REUSEPORT, so the next
# container can start next to it (the plan's labels and hash are unchanged by it).
HANDOVER_LABEL = "org.narwhal.router.handover"
HANDOVER_VALUE = "reuseport"
NEXT_SUFFIX = "-next"
# The line narwhal_router.py prints once its fronts listen (its SERVING; a unit test compares the two), how often the
# new container's state and log are read, and how many of its last log lines a failure quotes (the start script and
# vllm-router log no secret: the key reaches them through a file and a pipe).
SERVING = "narwhal_router: serving"
POLL_S = 0.5
LOG_LINES = 6

VERSION_CODE = ("import importlib.metadata as m\ntry:\n    print(m.version('vllm-router'))\n"
                "except m.PackageNotFoundError:\n    print('')\n")


def _inspect(api, name):
    try:
        return api.container(name)
    except NotFound:
        return None


def _brief(container):
    if not container:
        return None
    return {"Id": container.get("Id"), "State": container.get("State"), "RestartCount": container.get("RestartCount"),
            "Config": {"Labels": (container.get("Config") or {}).get("Labels") or {},
                       "Image": (container.get("Config") or {}).get("Image")}, "Image": container.get("Image")}


def read_image(api, image, timeout):
    try:
        found = api.image(image)
    except NotFound:
        return {"image_id": None, "version": None, "error": "no such image"}
    image_id = found["Id"]
    body = container_config(image_id, entrypoint=["python3"], command=["-c", VERSION_CODE], network_mode="none",
                            labels={"org.narwhal.role": "router-version"})
    created = api.create(None, body)["Id"]
    try:
        api.start(created)
        status = api.wait(created, timeout=timeout).get("StatusCode")
        out = api.logs(created).decode("utf-8", "replace").strip()
    finally:
        try:
            api.remove(created, force=True)
        except EngineAPIError:
            pass
    if status != 0:
        return {"image_id": image_id, "version": None, "error": "python3 -c exited %s: %s" % (status, out[-300:])}
    return {"image_id": image_id, "version": out.splitlines()[-1] if out else None,
            "error": None if out else "no vllm-router distribution in the image's python3"}


def create_body(plan, stop_timeout):
    """The router container's create body from its plan: host network, unless-stopped, the router directory mounted
    read-only at /narwhal, the plan's labels and HANDOVER_LABEL, its log limits, StopTimeout."""
    # no proxy environment of the client's config.json (the SDK would inject it): the router must reach the
    # engines directly; the plan's env is SSL_CERT_FILE with TLS (no secret: _router/plan.py::tls_container)
    labels = dict(plan["labels"])
    labels[HANDOVER_LABEL] = HANDOVER_VALUE
    body = container_config(plan["image"], entrypoint=plan["entrypoint"], command=plan["command"],
                            environment=plan.get("env") or None,
                            labels=labels, detach=True, network_mode="host",
                            restart_policy={"Name": "unless-stopped", "MaximumRetryCount": 0},
                            mounts=[{"type": "bind", "source": plan["dir"], "target": "/narwhal",
                                     "read_only": True}])
    if plan.get("log"):  # bounded logs: NARWHAL_LOG_DRIVER, _MAX_SIZE, _MAX_FILE (_router/plan.py::log_config)
        body["HostConfig"]["LogConfig"] = plan["log"]
    body["StopTimeout"] = stop_timeout  # an operator's docker stop drains as the role's does
    return body


def _running(container):
    return bool(container and (container.get("State") or {}).get("Running"))


def _last_lines(api, ref):
    try:
        text = api.logs(ref, tail=str(LOG_LINES)).decode("utf-8", "replace")
    except EngineAPIError as exc:
        return "(its log: %s)" % exc
    lines = [line.strip()[:300] for line in text.splitlines() if line.strip()]
    return " | ".join(lines) if lines else "(its log is empty)"


def serving(api, ref):
    """Whether container `ref`'s start script has printed that its fronts listen."""
    return SERVING in api.logs(ref).decode("utf-8", "replace")


def wait_serving(api, ref, timeout):
    """None once container `ref` serves (its SERVING line), else why not: it ended or restarted, or `timeout`
    seconds passed; with its last log lines."""
    deadline = time.monotonic() + timeout
    while True:
        found = api.container(ref)
        state = found.get("State") or {}
        if not state.get("Running") or state.get("Restarting") or found.get("RestartCount"):
            return "ended (exit status %s) before it served: %s" % (state.get("ExitCode"), _last_lines(api, ref))
        if serving(api, ref):
            return None
        if time.monotonic() > deadline:
            return "did not serve within %s s: %s" % (timeout, _last_lines(api, ref))
        time.sleep(POLL_S)


def _discard(api, ref, stop_timeout):
    try:
        api.stop(ref, timeout=stop_timeout)  # drains what it may hold
        api.remove(ref, force=True)
    except NotFound:
        pass


class HandoverFailed(Exception):  # noqa: N818 - what happened
    """The new container did not serve in time: removed; the old one serves on."""


def hand_over(api, plan, old, stop_timeout, ready_timeout):
    """Replace the running container `old` by a new one of `plan` without refusing a connection: create and start
    `<name>-next`, wait until it serves, stop (drain) and remove `old`, rename the new one -> {used, seconds}; or,
    for an old container without HANDOVER_LABEL, {used: False, why} and nothing done (the caller stops it first).
    HandoverFailed when the new one does not serve: it is removed, `old` untouched."""
    labels = (old.get("Config") or {}).get("Labels") or {}
    if labels.get(HANDOVER_LABEL) != HANDOVER_VALUE:
        return {"used": False, "why": "the running container has no label %s=%s: it was started before the hand-over "
                "existed, its fronts hold the ports without SO_REUSEPORT, so no second router can bind them while "
                "it listens; it was stopped first (clients refused until the new one serves)"
                % (HANDOVER_LABEL, HANDOVER_VALUE)}
    began = time.monotonic()
    new = api.create(plan["name"] + NEXT_SUFFIX, create_body(plan, stop_timeout))["Id"]
    api.start(new)
    why = wait_serving(api, new, ready_timeout)
    if why:
        _discard(api, new, stop_timeout)
        raise HandoverFailed("the new router container %s%s %s; it was removed and %s (%s) serves on"
                             % (plan["name"], NEXT_SUFFIX, why, plan["name"], old["Id"][:12]))
    api.stop(old["Id"], timeout=stop_timeout)  # its fronts take what reached them, close, and it drains
    api.remove(old["Id"], force=True)
    api.rename(new, plan["name"])
    return {"used": True, "seconds": round(time.monotonic() - began, 1)}


def leftover(api, plan, stop_timeout):
    """An interrupted hand-over's `<name>-next`: when it runs and serves (it holds every new connection) or `<name>`
    is gone, it takes the place of `<name>` (the old one stopped and removed); else it is stopped and removed ->
    what was done, or None when there is none."""
    name = plan["name"] + NEXT_SUFFIX
    found = _inspect(api, name)
    if not found:
        return None
    current = _inspect(api, plan["name"])
    if _running(found) and (current is None or serving(api, found["Id"])):
        if current:
            _discard(api, current["Id"], stop_timeout)
        api.rename(found["Id"], plan["name"])
        return "%s, left by an interrupted hand-over, serves: it took the place of %s" % (name, plan["name"])
    _discard(api, found["Id"], stop_timeout)
    return "%s, left by an interrupted hand-over, was removed" % name


def started(module, api, plan):
    """-> (action, container, handover): `handover` {used, why, seconds, leftover} as far as known, else {}."""
    # docker stop drains: SIGTERM makes narwhal_router.py stop listening and its vllm-router finish what it holds
    # (the plan's drain_timeout, then SIGKILL); stop_timeout gives it that and a margin
    stop_timeout, report = int(plan.get("stop_timeout") or 10), {}
    if not module.check_mode:
        note = leftover(api, plan, stop_timeout)
        if note:
            report["leftover"] = note
    existing = _inspect(api, plan["name"])
    running = _running(existing)
    same = bool(existing and ((existing.get("Config") or {}).get("Labels") or {}).get(PLAN_HASH_LABEL) == plan["hash"])
    if same and running:
        action = "restarted" if module.params["restart"] else "kept"
    elif same:
        action = "started"
    else:
        action = "replaced" if existing else "created"
    if module.check_mode or action == "kept":
        return action, existing, report
    if running:  # replaced or restarted
        report.update(hand_over(api, plan, existing, stop_timeout, module.params["ready_timeout"]))
        if report["used"]:
            return action, _inspect(api, plan["name"]), report
    if action == "restarted":
        api.stop(existing["Id"], timeout=stop_timeout)
        api.start(existing["Id"])
    elif action == "started":
        api.start(existing["Id"])
    else:
        if existing:
            api.stop(existing["Id"], timeout=stop_timeout)
            api.remove(existing["Id"], force=True)
        api.start(api.create(plan["name"], create_body(plan, stop_timeout))["Id"])
    return action, _inspect(api, plan["name"]), report


def run_module(module):
    """router_container: the `state` asked, on the router host's Docker daemon -> exit_json, or fail_json naming
    the daemon's refusal."""
    p = module.params
    api = Client.from_env(timeout=p["timeout"])
    try:
        if p["state"] == "image":
            module.exit_json(changed=False, **read_image(api, p["image"], p["timeout"]))
        if p["state"] == "inspected":
            module.exit_json(changed=False, container=_brief(_inspect(api, p["name"])))
        if p["state"] == "absent":
            existing = _inspect(api, p["name"])
            if existing and not module.check_mode:
                api.stop(existing["Id"], timeout=p["stop_timeout"])  # drains (a stopped container: no-op)
                api.remove(existing["Id"], force=True)
            module.exit_json(changed=bool(existing), action="removed" if existing else "absent")
        action, container, handover = started(module, api, p["plan"])
        module.exit_json(changed=action != "kept" or bool(handover.get("leftover")), action=action,
                         container=_brief(container), **({"handover": handover} if handover else {}))
    except HandoverFailed as exc:
        module.fail_json(msg="the router's hand-over failed: %s" % exc)
    except EngineAPIError as exc:
        module.fail_json(msg="the Docker daemon of router host refused: %s" % exc)
