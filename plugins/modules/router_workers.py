#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_workers
short_description: Compare the workers vLLM's router reports with the fleet
version_added: 0.2.0
description:
  - Asks the router's C(GET /workers) (vllm-router) with the engines' API key and compares the answer with the
    fleet's prefill and decode URLs; every fleet engine must be listed with its role and healthy, and the router
    must route to nothing outside the fleet.
  - Every fleet engine's own C(/health) must answer too (asked from this host), because the router notices a lost worker
    only after its health checks, and ready means the whole fleet answers now. A router that does not answer yet
    waits for its workers (it serves only once every worker answered C(/health)).
  - Fails naming every difference (use it with C(until) to wait); read-only.
options:
  timeout:
    description: Seconds per HTTP request.
    type: int
    default: 10
attributes:
  idempotent:
    description: Never changes anything.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.router_host
  - narwhal.deploy.router_access
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Wait until the router reports every engine of the fleet
  narwhal.deploy.router_workers:
    url: http://127.0.0.1:30000
    engines: "{{ lookup('narwhal.deploy.fleet', 'config/fleet.json', env_file='.env', deployment_env='config/deployment.env') }}"
    api_key_file: /opt/narwhal-router/api.key
  become: true
  register: __workers
  until: __workers is succeeded
  retries: 60
  delay: 5
"""

RETURN = r"""
answered:
  description: Whether the router answered C(/workers).
  returned: always
  type: bool
report:
  description:
    - C(seen) (engines listed), C(missing), C(unhealthy), C(wrong_role) (each C(engine (role URL))), C(extra) (URLs
      outside the fleet) and C(ok).
  returned: always
  type: dict
workers:
  description: The router's own list (url, worker_type, is_healthy), as it answered.
  returned: always
  type: list
  elements: dict
certificate:
  description:
    - With an https O(url), the certificate the router serves, verified against O(ca_file) - C(not_after) (ISO UTC)
      and C(days_left), or C(error) when the handshake fails (e.g. C(certificate verify failed) for an expired
      certificate or one of another CA); null for http.
  returned: always
  type: dict
not_answering:
  description:
    - Fleet engines whose own C(/health) did not answer, each C(engine (role URL)) followed by why - an HTTP status,
      or why nothing answered, e.g. C(certificate verify failed).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import ROUTER_ACCESS_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import (
    check_ca,
    read_key,
    served_certificate,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    fleet_workers,
    report_problems,
    worker_label,
    worker_report,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **ROUTER_ACCESS_SPEC,
            timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        workers = fleet_workers(p["engines"])
        key = read_key(p["api_key_file"])
        ca = check_ca(p["ca_file"])
    except PlanError as exc:
        module.fail_json(msg=str(exc), input=exc.key)
    url = p["url"].rstrip("/")
    # every fleet engine's own /health first: the router notices a lost worker only after its health checks
    # (_router/plan.py HEALTH_INTERVAL_S x HEALTH_FAILURES, about 2 s), and ready means the whole fleet answers now
    down = []
    for role in ("prefill", "decode"):
        for worker in workers[role]:
            code, body = call(worker["url"] + "/health", timeout=p["timeout"], cafile=ca)
            if code != 200:
                # nothing answered: why (e.g. "certificate verify failed" for an engine whose certificate the CA did
                # not sign or that has expired)
                why = ("HTTP %s" % code) if code else str(body)[:160]
                down.append("%s: %s" % (worker_label(role, worker), why))
    status, answer = call(url + "/workers", key, timeout=p["timeout"], cafile=ca)
    result = dict(changed=False, answered=status == 200, workers=[], not_answering=down,
                  certificate=served_certificate(url, ca, p["timeout"]))
    if status != 200:
        result["report"] = worker_report({}, workers)
        why = ("nothing answered: %s; a router waits for its workers before it serves" % str(answer)[:200]
               if status == 0 else "HTTP %s: %s" % (status, str(answer)[:200]))
        module.fail_json(msg="the router at %s does not answer /workers (%s)%s"
                         % (url, why, "; not answering /health: %s" % ", ".join(down) if down else ""), **result)
    result["workers"] = [dict((k, w.get(k)) for k in ("url", "worker_type", "is_healthy"))
                         for w in (answer.get("workers") or []) if isinstance(w, dict)]
    result["report"] = worker_report(answer, workers)
    problems = (["not answering /health: %s" % ", ".join(down)] if down else []) + report_problems(result["report"])
    if problems:
        module.fail_json(msg="router at %s: %s" % (url, "; ".join(problems)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
