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
  - O(state=inspected) reports the container (read-only); O(state=absent) stops it (SIGTERM - the router stops
    listening and drains what it holds - and SIGKILL after O(stop_timeout)) and removes it. The plan's C(log) is the
    container's C(HostConfig.LogConfig).
  - A running container that is replaced or restarted is handed over without refusing a connection - the new
    container starts next to it as C(<name>-next) (its start script binds the same ports with C(SO_REUSEPORT) and
    listens once its vllm-router serves and every worker answers C(/health), then takes every new connection), and
    once its log holds the start script's C(serving) line the old one is stopped (it drains, the plan's
    C(stop_timeout)) and removed, and the new one renamed (a restart therefore gives a new container ID). A new
    container that does not serve within O(ready_timeout) is removed and the module fails quoting its last log lines;
    the old one serves on.
  - Every container it creates carries the label C(org.narwhal.router.handover=reuseport). A running container
    without it (started before the hand-over existed, its ports held without C(SO_REUSEPORT)) is stopped first and
    then replaced or restarted as before (clients are refused until the new one serves); RV(handover) says so.
  - A C(<name>-next) container left by an interrupted run is dealt with first - it takes the place of C(<name>) when
    it serves (or C(<name>) is gone), else it is removed; RV(handover) says which (its C(leftover)).
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
    description: The router plan (C(name), C(image), C(entrypoint), C(command), C(dir), C(labels), C(hash), C(log),
      C(stop_timeout), and C(env), the container's environment, with TLS) for O(state=started).
    type: dict
  name:
    description: The container name (O(state=inspected) and O(state=absent)).
    type: str
    default: narwhal-router
  restart:
    description: Restart a kept container (O(state=started)).
    type: bool
    default: false
  ready_timeout:
    description: Seconds a hand-over waits for the new container to serve (O(state=started)); the router role gives
      C(NARWHAL_ROUTER_READY_TIMEOUT).
    type: int
    default: 300
  stop_timeout:
    description: Seconds C(docker stop) waits for the container to end before SIGKILL (O(state=absent)); the router
      role gives the router's drain (C(NARWHAL_ROUTER_DRAIN_TIMEOUT)) and a margin.
    type: int
    default: 10
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
handover:
  description: How a running container was replaced or restarted - C(used) (true - handed over, C(seconds) from the
    new container's creation to the rename; false - stopped first, C(why)) - and C(leftover), what was done with a
    C(<name>-next) container left by an interrupted run.
  returned: when state is started and a running container was replaced or restarted, or a leftover was found
  type: dict
  sample: {"used": true, "seconds": 4.2}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._router.container import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["image", "started", "inspected", "absent"]),
            image=dict(type="str"),
            plan=dict(type="dict"),
            name=dict(type="str", default="narwhal-router"),
            restart=dict(type="bool", default=False),
            ready_timeout=dict(type="int", default=300),
            stop_timeout=dict(type="int", default=10),
            timeout=dict(type="int", default=60),
        ),
        required_if=[("state", "image", ("image",)), ("state", "started", ("plan",))],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
