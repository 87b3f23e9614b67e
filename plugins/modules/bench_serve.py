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
  result_file:
    description: The result file's name in the container's result directory (C(--result-filename)).
    type: str
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
    key_file: /opt/narwhal/config/engine-api.key
    model_path: /models/tiny
    result_file: 01-pd-rate-1.json
  become: true
"""

RETURN = r"""
result:
  description: The step's figures (vllm bench serve's own keys - completed, failed, request_throughput,
    request_goodput, output_throughput, mean/median/std/p50/p90/p99 of ttft, tpot, itl and e2el in ms) and C(errors).
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

import json
import os
import shlex
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import KEY, OUT, ROLE_LABEL
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import kept
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    EngineAPIError,
    NotFound,
    container_config,
)

# The key from the mounted file into the load generator's own environment (never the container's settings).
WRAPPER = 'OPENAI_API_KEY="$(cat %s)"; export OPENAI_API_KEY; exec vllm bench serve "$@"' % KEY


def _remove(api, ref):
    try:
        api.remove(ref, force=True)
    except NotFound:
        pass


def run_step(module, api):
    p = module.params
    for name in ("key_file", "model_path"):
        if not os.path.exists(p[name]):
            module.fail_json(msg="%s %s is not on this host; the benchmark host must be an engine host with the "
                                 "engines' key and the model (rerun install there, or pick another host for the "
                                 "inventory group benchmark)" % (name, p[name]))
    try:
        api.image(p["image"])
    except NotFound:
        module.fail_json(msg="the load generator's image %s is not on this host; set NARWHAL_BENCH_IMAGE to an image "
                             "with vLLM that is here, or load it" % p["image"])
    workdir = tempfile.mkdtemp(prefix="narwhal-bench-")
    os.chmod(workdir, 0o700)
    command = "vllm bench serve %s" % " ".join(shlex.quote(a) for a in p["argv"])
    body = container_config(p["image"], entrypoint=["/bin/sh", "-c", WRAPPER, "vllm-bench"], command=p["argv"],
                            labels={ROLE_LABEL: "bench"}, detach=True, network_mode="host",
                            mounts=[{"type": "bind", "source": workdir, "target": OUT, "read_only": False},
                                    {"type": "bind", "source": p["key_file"], "target": KEY, "read_only": True},
                                    {"type": "bind", "source": p["model_path"], "target": p["model_path"],
                                     "read_only": True}])
    started = time.time()
    code, tail, result = None, "", None
    try:
        _remove(api, p["name"])
        created = api.create(p["name"], body)["Id"]
        api.start(created)
        try:
            code = api.wait(created, timeout=p["timeout"]).get("StatusCode")
        except EngineAPIError:
            code = None  # past the timeout: stopped below, reported as failed
        logs = api.logs(created, tail="40").decode("utf-8", "replace")
        tail = "\n".join(logs.strip().splitlines()[-40:])
        path = os.path.join(workdir, p["result_file"])
        if os.path.isfile(path):
            with open(path) as handle:
                try:
                    result = kept(json.load(handle))
                except ValueError:
                    result = None
    finally:
        try:
            _remove(api, p["name"])
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    seconds = round(time.time() - started, 2)
    out = dict(changed=False, command=command, seconds=seconds, exit_code=code, result=result or {},
               log_tail=tail if code != 0 or result is None else "")
    if code is None:
        module.fail_json(msg="the benchmark step %s ran past %d s (NARWHAL_BENCH_TIMEOUT) and was stopped"
                             % (p["name"], p["timeout"]), **out)
    if code != 0 or result is None:
        module.fail_json(msg="vllm bench serve exited %s without a result (%s): %s"
                             % (code, p["name"], tail[-600:] or "no output"), **out)
    module.exit_json(**out)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="run", choices=["run", "absent"]),
            image=dict(type="str"),
            argv=dict(type="list", elements="str"),
            name=dict(type="str"),
            key_file=dict(type="path", no_log=False),
            model_path=dict(type="path"),
            result_file=dict(type="str"),
            timeout=dict(type="int", default=1800),
        ),
        required_if=[("state", "run", ("image", "argv", "name", "key_file", "model_path", "result_file"))],
        supports_check_mode=True,
    )
    api = Client.from_env(timeout=60)
    try:
        if module.params["state"] == "absent":
            left = [c["Id"] for c in api.containers(filters={"label": ["%s=bench" % ROLE_LABEL]})]
            if not module.check_mode:
                for ref in left:
                    _remove(api, ref)
            module.exit_json(changed=bool(left), removed=left)
        if module.check_mode:
            module.exit_json(changed=False, skipped=True, msg="check mode: the benchmark step does not run",
                             result={}, command="", seconds=0.0, exit_code=None, log_tail="")
        run_step(module, api)
    except EngineAPIError as exc:
        module.fail_json(msg="Docker daemon on this host: %s" % exc)


if __name__ == "__main__":
    main()
