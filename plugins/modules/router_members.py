#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_members
short_description: Change the workers vLLM's router routes to without closing its listening sockets
version_added: 0.2.0
description:
  - Sets the prefill and decode workers of the router on this router host (vllm-router in P/D mode behind the
    router stage's start script) - the complete set (O(workers)), or the set it holds now less some workers
    (O(remove)) or plus some (O(add)). The set the router holds is C(<dir>/workers.json); without that file, what
    the router reports.
  - When the router already reports the set and C(workers.json) holds it, nothing changes. When the set is what the
    router reports less some workers, each goes at once by vllm-router's C(POST /remove_worker) (every
    C(<url>@<rank>) entry of a data-parallel worker; no connection is dropped, the requests it is serving finish)
    and C(workers.json) is written.
  - Otherwise (a worker added - vllm-router 0.1.17 cannot add one at runtime in P/D mode) C(workers.json) is written
    and the container's main process gets SIGHUP (Docker Engine API) - a reload - which starts a new vllm-router
    with the set, sends every new connection to it once it serves and lets the previous one finish what it holds
    (at most C(NARWHAL_ROUTER_DRAIN_TIMEOUT) seconds). The module waits until the router's C(/workers) reports
    exactly the set, all healthy (at most O(timeout) seconds); a reload that does not come up leaves the previous
    router serving, and the failure quotes the start script's log lines.
  - A set without a prefill or without a decode worker is refused (vllm-router's P/D mode needs one of each).
options:
  url:
    description: The router's base URL as this host reaches it (the router plan's C(local_url)).
    type: str
    required: true
  api_key_file:
    description: The engines' API key file on the router host (mode 0600 or 0400, one line).
    type: path
    required: true
  ca_file:
    description:
      - The CA certificate (PEM) the router's https certificate is verified against (the router stage installs it as
        C(<NARWHAL_ROUTER_DIR>/tls/ca.crt)); unset, the system's CAs.
    type: path
  dir:
    description: The router directory (C(NARWHAL_ROUTER_DIR)), which holds C(workers.json).
    type: path
    required: true
  container:
    description: The router container's name (its main process gets SIGHUP for a reload).
    type: str
    default: narwhal-router
  workers:
    description:
      - The complete set the router is to route to - C(prefill) and C(decode), each a list of engine URLs.
      - Under a C(kv_aware) prefill policy the router stage adds C(kv_events), each prefill engine's KV events
        endpoints by URL; without it the map C(workers.json) holds is kept (so is it with O(remove) and O(add)).
      - Exactly one of O(workers), O(remove) and O(add).
    type: dict
  remove:
    description: Engine URLs to take out of the set the router holds now (a URL it does not hold is no change).
    type: list
    elements: str
  add:
    description: Workers to put into the set the router holds now, each C(role) (prefill or decode) and C(url).
    type: list
    elements: dict
  reload:
    description: Reload even when the set does not change (the router stage sets it when C(router.json) changed).
    type: bool
    default: false
  timeout:
    description: Seconds to wait for a reload to serve the new set (and per HTTP request).
    type: int
    default: 300
attributes:
  check_mode:
    description: Reports the method and the set it would apply, writes nothing and signals nothing.
    support: full
  diff_mode:
    description: Returns the before and after of C(workers.json).
    support: full
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.router_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Take an engine out of the router before it is replaced
  narwhal.deploy.router_members:
    url: http://10.0.0.21:30000
    api_key_file: /opt/narwhal-router/api.key
    dir: /opt/narwhal-router
    remove: [http://10.0.0.12:8000]
  become: true

- name: Put it back once it is proven
  narwhal.deploy.router_members:
    url: http://10.0.0.21:30000
    api_key_file: /opt/narwhal-router/api.key
    dir: /opt/narwhal-router
    add: [{role: decode, url: "http://10.0.0.12:8000"}]
  become: true

- name: Route to exactly these workers
  narwhal.deploy.router_members:
    url: http://10.0.0.21:30000
    api_key_file: /opt/narwhal-router/api.key
    dir: /opt/narwhal-router
    workers:
      prefill: [http://10.0.0.11:8000]
      decode: [http://10.0.0.12:8000, http://10.0.0.13:8000]
  become: true
"""

RETURN = r"""
method:
  description:
    - C(none) (the router holds the set; C(workers.json) may still be rewritten), C(remove) (vllm-router's
      C(/remove_worker), at once) or C(reload) (SIGHUP and a new vllm-router process).
  returned: always
  type: str
before:
  description: The set the router reported before the change - C(prefill) and C(decode), lists of URLs.
  returned: always
  type: dict
after:
  description: The set the router reports after the change (in check mode, the set it would hold).
  returned: always
  type: dict
seconds:
  description: Seconds the change took (a reload - from the signal until the router reported the set).
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import ROUTER_ACCESS_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._router.members import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            # how the router host reaches its router: router_workers' and router_traffic's options (no fleet here)
            **dict((k, v) for k, v in ROUTER_ACCESS_SPEC.items() if k != "engines"),
            dir=dict(type="path", required=True),
            container=dict(type="str", default="narwhal-router"),
            workers=dict(type="dict"),
            remove=dict(type="list", elements="str"),
            add=dict(type="list", elements="dict"),
            reload=dict(type="bool", default=False),
            timeout=dict(type="int", default=300),
        ),
        mutually_exclusive=[("workers", "remove", "add")],
        required_one_of=[("workers", "remove", "add")],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
