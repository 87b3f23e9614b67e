# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One step of the fleet load benchmark, run with vLLM's own load generator (`vllm bench serve`) in a short-lived
container on the benchmark host: bench_serve's work (the module file, plugins/modules/bench_serve.py, holds the
documentation, the argument spec and main(), as community.docker's plugins/modules/docker_container.py hands its module
to plugins/module_utils/_module_container/module.py). An I/O edge: the host's Docker daemon (_docker/engine_api.py)
and a temporary result directory; the steps are _bench/plan.py's, the figures kept _bench/report.py's."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import CA, KEY, OUT, ROLE_LABEL
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import counter_deltas, engine_counters, kept
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    EngineAPIError,
    NotFound,
    container_config,
)

__metaclass__ = type

# The key from the mounted file into the load generator's own environment (never the container's settings): its first
# line (during a rotation the file holds the previous key on a second line: _common/api_key.py)
WRAPPER = 'read -r OPENAI_API_KEY < %s; export OPENAI_API_KEY; exec vllm bench serve "$@"' % KEY


def _remove(api, ref):
    try:
        api.remove(ref, force=True)
    except NotFound:
        pass


# seconds one engine's /metrics may take to answer before and after a step
METRICS_TIMEOUT_S = 15


def read_counters(urls, cafile=None, timeout=METRICS_TIMEOUT_S):
    """{engine URL: engine_counters of its /metrics, or {"error": why}}: no key (the engines' key guard lets /metrics
    through), with TLS verified against `cafile` (_common/http.py::call)."""
    out = {}
    for url in urls:
        status, text = call(url.rstrip("/") + "/metrics", timeout=timeout, cafile=cafile)
        if status == 200 and isinstance(text, str):
            out[url] = engine_counters(text)
        else:
            why = "HTTP %s" % status if status else str(text)[:200]
            out[url] = {"error": "GET %s/metrics: %s" % (url.rstrip("/"), why)}
    return out


def step_counters(before, after):
    """{engine URL: what its counters grew by during the step (counter_deltas), or {"error": why} when a reading
    failed}."""
    out = {}
    for url in before:
        errors = [r["error"] for r in (before[url], after.get(url) or {"error": "not read after the step"})
                  if "error" in r]
        out[url] = {"error": "; ".join(errors)} if errors else counter_deltas(before[url], after[url])
    return out


def run_step(module, api):
    p = module.params
    for name in ("key_file", "model_path") + (("ca_file",) if p.get("ca_file") else ()):
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
    mounts = [{"type": "bind", "source": workdir, "target": OUT, "read_only": False},
              {"type": "bind", "source": p["key_file"], "target": KEY, "read_only": True},
              {"type": "bind", "source": p["model_path"], "target": p["model_path"], "read_only": True}]
    environment = None
    if p.get("ca_file"):  # https targets verified against the engine host's CA (_bench/plan.py CA)
        mounts.append({"type": "bind", "source": p["ca_file"], "target": CA, "read_only": True})
        environment = ["SSL_CERT_FILE=%s" % CA]
    body = container_config(p["image"], entrypoint=["/bin/sh", "-c", WRAPPER, "vllm-bench"], command=p["argv"],
                            environment=environment, labels={ROLE_LABEL: "bench"}, detach=True,
                            network_mode="host", mounts=mounts)
    urls = p.get("metrics_urls") or []
    before = read_counters(urls, p.get("ca_file")) if urls else None
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
    if result is not None and urls:
        result["counters"] = step_counters(before, read_counters(urls, p.get("ca_file")))
    out = dict(changed=False, command=command, seconds=seconds, exit_code=code, result=result or {},
               log_tail=tail if code != 0 or result is None else "")
    if code is None:
        module.fail_json(msg="the benchmark step %s ran past %d s (NARWHAL_BENCH_TIMEOUT) and was stopped"
                             % (p["name"], p["timeout"]), **out)
    if code != 0 or result is None:
        module.fail_json(msg="vllm bench serve exited %s without a result (%s): %s"
                             % (code, p["name"], tail[-600:] or "no output"), **out)
    module.exit_json(**out)


def run_module(module):
    """bench_serve: remove leftover benchmark containers (state=absent) or run one step (state=run; nothing in
    check mode) -> exit_json, or fail_json naming the step, the host's missing input or the daemon's refusal."""
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
