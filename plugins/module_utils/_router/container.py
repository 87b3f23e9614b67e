# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's image and container on a router host: router_container's work (the module file,
plugins/modules/router_container.py, holds the documentation, the argument spec and main(), as community.docker's
plugins/modules/docker_container.py hands its module to plugins/module_utils/_module_container/module.py). An I/O
edge: it talks to the host's Docker daemon over its Engine API (_docker/engine_api.py); the container it runs is the
router plan's (_router/plan.py), recognised by the plan's hash label."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    EngineAPIError,
    NotFound,
    container_config,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import PLAN_HASH_LABEL

__metaclass__ = type

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


def started(module, api, plan):
    existing = _inspect(api, plan["name"])
    running = bool(existing and (existing.get("State") or {}).get("Running"))
    same = bool(existing and ((existing.get("Config") or {}).get("Labels") or {}).get(PLAN_HASH_LABEL) == plan["hash"])
    if same and running:
        action = "restarted" if module.params["restart"] else "kept"
    elif same:
        action = "started"
    else:
        action = "replaced" if existing else "created"
    if module.check_mode or action == "kept":
        return action, existing
    # docker stop drains: SIGTERM makes narwhal_router.py stop listening and its vllm-router finish what it holds
    # (the plan's drain_timeout, then SIGKILL); stop_timeout gives it that and a margin
    stop_timeout = int(plan.get("stop_timeout") or 10)
    if action == "restarted":
        api.stop(existing["Id"], timeout=stop_timeout)
        api.start(existing["Id"])
    elif action == "started":
        api.start(existing["Id"])
    else:
        if existing:
            api.stop(existing["Id"], timeout=stop_timeout)
            api.remove(existing["Id"], force=True)
        # no proxy environment of the client's config.json (the SDK would inject it): the router must reach the
        # engines directly; the plan's env is SSL_CERT_FILE with TLS (no secret: _router/plan.py::tls_container)
        body = container_config(plan["image"], entrypoint=plan["entrypoint"], command=plan["command"],
                                environment=plan.get("env") or None,
                                labels=plan["labels"], detach=True, network_mode="host",
                                restart_policy={"Name": "unless-stopped", "MaximumRetryCount": 0},
                                mounts=[{"type": "bind", "source": plan["dir"], "target": "/narwhal",
                                         "read_only": True}])
        if plan.get("log"):  # bounded logs: NARWHAL_LOG_DRIVER, _MAX_SIZE, _MAX_FILE (_router/plan.py::log_config)
            body["HostConfig"]["LogConfig"] = plan["log"]
        body["StopTimeout"] = stop_timeout  # an operator's docker stop drains as the role's does
        api.start(api.create(plan["name"], body)["Id"])
    return action, _inspect(api, plan["name"])


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
        action, container = started(module, api, p["plan"])
        module.exit_json(changed=action != "kept", action=action, container=_brief(container))
    except EngineAPIError as exc:
        module.fail_json(msg="the Docker daemon of router host refused: %s" % exc)
