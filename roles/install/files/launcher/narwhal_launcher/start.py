"""`start`: the image check (or a matching checked.json), then the container exactly as planned, kept when
its plan hash is unchanged; deployment.json records the application revision, launcher digest and container."""
import os
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils import _plan
from narwhal_launcher.common import (
    LaunchError,
    check_host,
    docker_client,
    launcher_sha256,
    prepare,
    read_api_key,
    run_dir,
    write_private,
)
from narwhal_launcher.image_check import checked_sha256, image_check

STOP_TIMEOUT = 30  # seconds vLLM gets to shut down (SIGTERM) before a replaced container is killed


def create_kwargs(docker, plan, digest, api_key, group_ids=None):
    """Keyword arguments of client.containers.create for a plan (the real key injected here only)."""
    environment = dict(plan["environment"])
    if _plan.API_KEY_ENV in environment:
        environment[_plan.API_KEY_ENV] = api_key
    labels = dict(plan["labels"])
    labels[_plan.PLAN_HASH_LABEL] = digest
    groups = [(group_ids or {}).get(g) for g in plan["group_add"]]
    return {
        "image": plan["image"],
        "command": plan["command"],
        "entrypoint": plan["entrypoint"],
        "name": plan["name"],
        "detach": True,
        "environment": ["%s=%s" % (k, environment[k]) for k in sorted(environment)],
        "network_mode": plan["network_mode"],
        "ipc_mode": plan["ipc_mode"],
        "devices": plan["devices"] or None,
        "device_requests": [docker.types.DeviceRequest(**r) for r in plan["device_requests"]] or None,
        "group_add": [g for g in groups if g] or None,
        "cap_add": plan["cap_add"] or None,
        "ulimits": [docker.types.Ulimit(**u) for u in plan["ulimits"]] or None,
        "security_opt": plan["security_opt"] or None,
        "mounts": [docker.types.Mount(target=m["target"], source=m["source"], type=m["type"],
                                      read_only=m["read_only"]) for m in plan["mounts"]],
        "labels": labels,
        "restart_policy": {"Name": plan["restart_policy"]["name"]},
    }


def start(role_env_path, force=False, out=None):
    prepared = prepare(role_env_path)
    role_env, record, plan, digest = prepared.role_env, prepared.record, prepared.plan, prepared.digest
    api_key = read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    check_host(plan)
    docker, client = docker_client()
    # the image check: refuses (nothing started) on failure; a checked.json of this plan hash, image ID and
    # launcher is reused unless --force. Its verdict goes to stderr, stdout keeps the one start line.
    checked, check_how = image_check(role_env, record, plan, digest, docker=docker, client=client,
                                     reuse=not force, out=sys.stderr)
    existing = None
    try:
        existing = client.containers.get(plan["name"])
    except docker.errors.NotFound:
        pass
    action, replaced = "started", None
    if existing is not None:
        labels = existing.attrs.get("Config", {}).get("Labels") or {}
        if existing.status == "running" and labels.get(_plan.PLAN_HASH_LABEL) == digest and not force:
            container, action = existing, "unchanged"
        else:
            replaced = existing.id
            if existing.status == "running":
                existing.stop(timeout=STOP_TIMEOUT)
            existing.remove(force=True)
            action = "replaced"
    if action != "unchanged":
        try:
            client.images.get(plan["image"])
        except docker.errors.ImageNotFound:
            raise LaunchError("launch record runtime.image_id %s is not on this host; load the recorded image "
                              "(%s) or rerun discovery" % (plan["image"], plan["image_ref"]))
        try:
            kwargs = create_kwargs(docker, plan, digest, api_key, prepared.group_ids)
            container = client.containers.create(**kwargs)
            container.start()
        except docker.errors.APIError as exc:
            raise LaunchError("docker refused container %s: %s"
                              % (plan["name"], str(exc).replace(api_key, _plan.REDACTED)))
        container.reload()
    deployment = {
        "engine": plan["engine"], "run_id": role_env.get("NARWHAL_RUN_ID", ""), "action": action,
        "app_revision": role_env.get("NARWHAL_APP_REVISION", ""),
        "container_id": container.id, "container_name": plan["name"], "plan_hash": digest,
        "image_id": plan["image"], "launcher_sha256": launcher_sha256(), "group_ids": prepared.group_ids,
        "started_at": container.attrs.get("State", {}).get("StartedAt", ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "replaced_container_id": replaced,
        "checked_sha256": checked_sha256(checked), "check": check_how,
        "vllm_api_version": checked["vllm_api_version"],
    }
    existing = os.path.join(run_dir(role_env), "deployment.json")
    if action != "unchanged" or not os.path.exists(existing):
        # An unchanged engine keeps the record of the deployment that is still running (idempotence).
        write_private(existing, deployment)
    print("unchanged" if action == "unchanged" else "%s %s %s" % (action, plan["name"], container.id),
          file=out or sys.stdout)
    return deployment
