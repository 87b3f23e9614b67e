#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_serve
short_description: Run one step of the fleet load benchmark with vLLM's own load generator
version_added: 0.2.0
description:
  - O(state=run) runs C(vllm bench serve) with O(argv) in a short-lived container of O(image) (an engine image,
    which carries vLLM's load generator) on the host network of the benchmark host, and returns its result JSON
    reduced to the figures (latency percentiles, throughput, goodput, failures and their distinct errors).
  - The engines' API key reaches the load generator as C(OPENAI_API_KEY), read inside the container from the
    mounted O(key_file); it is in no argument, in no container setting and in no result.
  - The model directory O(model_path) is mounted read-only for the tokenizer; the result directory is a temporary
    directory of the host, removed with the container whatever happens. A step that runs past O(timeout) is stopped
    and reported as failed.
  - O(state=absent) removes the containers an interrupted benchmark left (label C(org.narwhal.role=bench)).
options:
  state:
    description: Run one step, or remove leftover benchmark containers.
    type: str
    choices: [run, absent]
    default: run
  image:
    description: The image of the load generator (O(state=run)).
    type: str
  argv:
    description: The arguments after C(vllm bench serve) (the C(narwhal.deploy.bench_plan) filter's steps).
    type: list
    elements: str
  name:
    description: The container's name.
    type: str
  key_file:
    description: The engines' API key file on this host (one line, mode 0600).
    type: path
  model_path:
    description: The model directory on this host, mounted read-only at the same path (the tokenizer).
    type: path
  ca_file:
    description:
      - The CA certificate (PEM) on this host the targets' https certificates are verified against (with TLS, the
        engine host's C(<checkout>/tls/<engine>/ca.crt)). Mounted read-only in the container and named by C(SSL_CERT_FILE),
        since C(vllm bench serve) verifies https with aiohttp's default context, C(ssl.create_default_context()),
        which reads it. Unset, the image's own CAs.
    type: path
  result_file:
    description: The result file's name in the container's result directory (C(--result-filename)).
    type: str
  metrics_urls:
    description:
      - Engine URLs whose C(/metrics) are read just before the container starts and after it ends (no key; with
        O(ca_file) verified against it). The result's C(counters) hold, per URL, what each of vLLM's own counters
        grew by during the step - C(prefix_cache_queries) and C(prefix_cache_hits) (prompt tokens), C(kv_bytes) and
        C(kv_transfers) (NIXL reads), C(kv_failed_transfers) - or C(error) when an engine did not answer; a counter
        the engine lacks is null. Unset, nothing is read.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds the step may run.
    type: int
    default: 1800
attributes:
  check_mode:
    description: Runs nothing in check mode.
    support: full
  diff_mode:
    description: Returns no diff; nothing on the host changes.
    support: none
  idempotent:
    description: Leaves nothing behind; a run measures and changes nothing.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.engine_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Run one benchmark step
  narwhal.deploy.bench_serve:
    image: sha256:0123abcd
    argv: [--backend, openai, --base-url, "http://10.0.0.21:30000", --model, tiny, --num-prompts, "16"]
    name: narwhal-bench-20261202t201500z-01-pd-rate-1
    key_file: /opt/narwhal/secrets/engine-api.key
    model_path: /models/tiny
    result_file: 01-pd-rate-1.json
  become: true
"""

RETURN = r"""
result:
  description: The step's figures (vllm bench serve's own keys - completed, failed, request_throughput,
    request_goodput, output_throughput, mean/median/std/p50/p90/p99 of ttft, tpot, itl and e2el in ms), C(errors),
    and with O(metrics_urls) the engines' C(counters).
  returned: state=run
  type: dict
command:
  description: The command line the container ran (no secret).
  returned: state=run
  type: str
seconds:
  description: How long the container ran.
  returned: state=run
  type: float
exit_code:
  description: The load generator's exit code (null when it was stopped at the timeout).
  returned: state=run
  type: int
log_tail:
  description: The load generator's last output lines when it failed.
  returned: state=run
  type: str
removed:
  description: Leftover containers removed (O(state=absent)).
  returned: state=absent
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.serve import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="run", choices=["run", "absent"]),
            image=dict(type="str"),
            argv=dict(type="list", elements="str"),
            name=dict(type="str"),
            key_file=dict(type="path", no_log=False),
            model_path=dict(type="path"),
            ca_file=dict(type="path"),
            result_file=dict(type="str"),
            timeout=dict(type="int", default=1800),
            metrics_urls=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("state", "run", ("image", "argv", "name", "key_file", "model_path", "result_file"))],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
