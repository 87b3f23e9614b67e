#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_container
short_description: The router's image and container on a router host
version_added: 0.2.0
description:
  - Talks to the router host's Docker daemon over its Engine API with the standard library (as the engine hosts'
    modules and the launcher do; no Docker SDK on the host).
  - O(state=image) reads the router image (O(image)) - its ID and the C(vllm-router) version its C(python3) reports
    (a short-lived container without network); read-only.
  - O(state=started) runs the container of O(plan) (the C(narwhal.deploy.router_plan) filter) - kept when a
    container of that name already runs with the plan's hash label, started when it is stopped, replaced when its
    hash differs, created when there is none; O(restart) restarts a kept one (a new key file is read at start).
  - O(state=inspected) reports the container (read-only); O(state=absent) removes it.
options:
  state:
    description: What to do.
    type: str
    choices: [image, started, inspected, absent]
    required: true
  image:
    description: The router image reference or ID (O(state=image)).
    type: str
  plan:
    description: The router plan (C(name), C(image), C(entrypoint), C(command), C(dir), C(labels), C(hash)) for
      O(state=started).
    type: dict
  name:
    description: The container name (O(state=inspected) and O(state=absent)).
    type: str
    default: narwhal-router
  restart:
    description: Restart a kept container (O(state=started)).
    type: bool
    default: false
  timeout:
    description: Seconds per Docker API call.
    type: int
    default: 60
attributes:
  check_mode:
    description: Reports what O(state=started) and O(state=absent) would change and changes nothing.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.router_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the router image
  narwhal.deploy.router_container:
    state: image
    image: narwhal/vllm-router:0.1.17
  become: true
  register: __image

- name: Run the router
  narwhal.deploy.router_container:
    state: started
    plan: "{{ narwhal_site | narwhal.deploy.router_plan(fleet, __image.image_id, __image.version, checksum) }}"
  become: true
"""

RETURN = r"""
image_id:
  description: The image's ID (O(state=image)).
  returned: when state is image
  type: str
version:
  description: The vllm-router version in the image, or null when its python3 has none (O(state=image)).
  returned: when state is image
  type: str
error:
  description: Why the version could not be read (O(state=image)).
  returned: when state is image
  type: str
action:
  description: What O(state=started) or O(state=absent) did - created, replaced, started, restarted, kept, removed,
    absent.
  returned: when state is started or absent
  type: str
container:
  description: The container's inspection (C(Id), C(State), C(Config.Labels), C(RestartCount)), or null.
  returned: when state is started or inspected
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    EngineAPIError,
    NotFound,
    container_config,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import PLAN_HASH_LABEL

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
    if action == "restarted":
        api.stop(existing["Id"])
        api.start(existing["Id"])
    elif action == "started":
        api.start(existing["Id"])
    else:
        if existing:
            api.remove(existing["Id"], force=True)
        # no proxy environment of the client's config.json (the SDK would inject it): the router must reach the
        # engines directly
        body = container_config(plan["image"], entrypoint=plan["entrypoint"], command=plan["command"],
                                labels=plan["labels"], detach=True, network_mode="host",
                                restart_policy={"Name": "unless-stopped", "MaximumRetryCount": 0},
                                mounts=[{"type": "bind", "source": plan["dir"], "target": "/narwhal",
                                         "read_only": True}])
        api.start(api.create(plan["name"], body)["Id"])
    return action, _inspect(api, plan["name"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["image", "started", "inspected", "absent"]),
            image=dict(type="str"),
            plan=dict(type="dict"),
            name=dict(type="str", default="narwhal-router"),
            restart=dict(type="bool", default=False),
            timeout=dict(type="int", default=60),
        ),
        required_if=[("state", "image", ("image",)), ("state", "started", ("plan",))],
        supports_check_mode=True,
    )
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
                api.remove(existing["Id"], force=True)
            module.exit_json(changed=bool(existing), action="removed" if existing else "absent")
        action, container = started(module, api, p["plan"])
        module.exit_json(changed=action != "kept", action=action, container=_brief(container))
    except EngineAPIError as exc:
        module.fail_json(msg="the Docker daemon of router host refused: %s" % exc)


if __name__ == "__main__":
    main()
