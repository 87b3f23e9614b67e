#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_traffic
short_description: Prove that client traffic is served through vLLM's router in prefill/decode mode
version_added: 0.2.0
description:
  - Sends the router completions and chat completions, streamed and not, for a prompt shorter than one KV block and
    one of one and a half blocks (one round is 8 requests; more rounds until every engine could have served one), each
    prompt starting with a fresh ID so that no prefix cache holds it.
  - A request passes when the router answered 200 with text or tokens and no C(error) finish reason, when KV moved
    for it (the decode answer's C(usage.prompt_tokens_details.cached_tokens), else the growth of a decode engine's
    NIXL transfer count, with no failed transfer), and when, with greedy sampling, its answer equals what every
    decode engine answers when asked the same prompt directly (with a fresh C(cache_salt), so computed from the
    prompt).
  - Every request asks for C(return_token_ids), and answers are compared as token IDs where both sides carry them
    (C(compared_as) in each result), else as text - a token that does not finish a UTF-8 character decodes to no
    text in a stream.
  - Every prefill and every decode engine of the fleet must have finished at least one of these requests (their own
    C(vllm:request_success) counters), and the router must refuse a client without the key and one with a wrong key
    (HTTP 401).
  - Read-only for the fleet; fails naming every request and engine that did not pass.
options:
  model:
    description: The served model name.
    type: str
    required: true
  block_size:
    description: The engines' KV block size in tokens (the long prompt is one and a half blocks of words).
    type: int
    default: 16
  max_tokens:
    description: Tokens each request generates.
    type: int
    default: 8
  timeout:
    description: Seconds per HTTP request.
    type: int
    default: 120
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
- name: Traffic through the router
  narwhal.deploy.router_traffic:
    url: http://127.0.0.1:30000
    engines: "{{ lookup('narwhal.deploy.fleet', 'config/fleet.json', env_file='.env', deployment_env='config/deployment.env') }}"
    model: llama-3.1-8b
    api_key_file: /opt/narwhal-router/api.key
  become: true
"""

RETURN = r"""
requests:
  description:
    - One entry per request - C(endpoint) (completions or chat), C(stream), C(prompt) (short or long),
      C(prompt_tokens), C(cached_tokens), C(status), C(text), C(token_ids), C(ttft_s) (streams), C(kv) (the
      evidence), C(decode_engines) (whose NIXL transfers grew), C(served_by) (engines whose finished requests
      grew), C(direct) and C(direct_token_ids) (each decode engine's own answer), C(equal), C(compared_as)
      (token ids or text), C(ok) and C(problems); a stream without text also C(events_tail), its last events.
  returned: always
  type: list
  elements: dict
served:
  description: Requests each fleet engine finished through the router.
  returned: always
  type: dict
auth:
  description: The router's HTTP status for a request without a key (C(none)), with a wrong key (C(wrong)) and with
    the key (C(key)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import ROUTER_ACCESS_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._router.proof import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **ROUTER_ACCESS_SPEC,
            model=dict(type="str", required=True),
            block_size=dict(type="int", default=16),
            max_tokens=dict(type="int", default=8, no_log=False),
            timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
