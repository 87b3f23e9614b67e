# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real vllm-router (requirements/router.txt) as a process of its own in front of stand-in engines
(test_support.standin.engine_process), started as the router role starts it: roles/router/files/narwhal_router.py
with the router.json and workers.json the role writes (_router/plan.py::router_config, workers_doc), the key from a
0600 file."""
import json
import os
import subprocess
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    fleet_workers,
    fronts,
    kv_prefill_policy,
    router_config,
    workers_doc,
)
from test_support.paths import REPO
from test_support.standin import free_port

ENTRY = REPO / "roles" / "router" / "files" / "narwhal_router.py"


def router_process(tmp_path, engines, key, health_interval_s=1, health_failures=2, tls=None, env=None, wait=True,
                   drain_timeout=120, site=None, edit_args=None):
    """-> {url, metrics_url, proc, log, key_file, config, workers} of a router whose fronts are on free loopback
    ports, once its /workers answers (every engine answered /health); `config` and `workers`: the paths of its
    router.json and workers.json. The caller terminates `proc`. `tls` ({cert, key, ca}: paths): the start script's
    fronts end TLS on 127.0.0.2, the URLs https and /workers asked with the CA. `env`: more environment
    (SSL_CERT_FILE, as the router container has it); `wait=False`: return at once (a router whose workers never
    become healthy does not serve). `site`: more site inputs (the policies, NARWHAL_DATA_PARALLEL_SIZE), planned as the
    router stage plans them (with a kv_aware prefill policy, workers.json maps the engines' kv_events). `edit_args`: a
    function that changes router.json's args list in place (flags the plan does not write)."""
    port, metrics = free_port(), free_port()
    site = dict({"NARWHAL_ROUTER_BIND": "127.0.0.1", "NARWHAL_ROUTER_PORT": port,
                 "NARWHAL_ROUTER_METRICS_PORT": metrics, "NARWHAL_ROUTER_POLICY": "round_robin",
                 "NARWHAL_ROUTER_READY_TIMEOUT": 60, "NARWHAL_TLS": "off",
                 "NARWHAL_ROUTER_DRAIN_TIMEOUT": drain_timeout}, **(site or {}))
    workers = fleet_workers(engines)
    config = router_config(site, workers)
    config["workers_file"] = str(tmp_path / "workers.json")
    (tmp_path / "workers.json").write_text(json.dumps(workers_doc(workers, kv_prefill_policy(site, workers))))
    host, scheme, cafile = "127.0.0.1", "http", None
    if tls:
        host, scheme, cafile = "127.0.0.2", "https", tls["ca"]
        config["fronts"] = fronts(host, port, metrics)
        config["tls"] = {"cert": tls["cert"], "key": tls["key"]}
    key_file = tmp_path / "router-api.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    config["api_key_file"] = str(key_file)
    args = config["args"]
    args[args.index("--health-check-interval-secs") + 1] = str(health_interval_s)
    args[args.index("--health-failure-threshold") + 1] = str(health_failures)
    if edit_args is not None:
        edit_args(args)
    (tmp_path / "router.json").write_text(json.dumps(config))
    log = tmp_path / "router.log"
    env = dict({k: v for k, v in os.environ.items() if "KEY" not in k}, **(env or {}))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ENTRY), str(tmp_path / "router.json")], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    url = "%s://%s:%d" % (scheme, host, port)
    deadline = time.time() + 60
    while wait and call(url + "/workers", key, timeout=2, cafile=cafile)[0] != 200:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError("the router did not serve: %s" % log.read_text(errors="replace")[-2000:])
        time.sleep(0.2)
    return {"url": url, "metrics_url": "%s://%s:%d/metrics" % (scheme, host, metrics), "proc": proc, "log": log,
            "key_file": str(key_file), "config": tmp_path / "router.json", "workers": tmp_path / "workers.json"}


def router_next(started, tmp_path, name="next", config=None):
    """-> {proc, log} of a second start script on the same fronts as `started` (router_process's): its router.json
    (or `config`, a path), as the hand-over's new container runs it next to the old one. It returns at once; the
    caller waits for its "narwhal_router: serving" line (wait_serving) and terminates `proc`."""
    log = tmp_path / ("router-%s.log" % name)
    env = {k: v for k, v in os.environ.items() if "KEY" not in k}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ENTRY), str(config or started["config"])], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    return {"proc": proc, "log": log}


def wait_serving(started, timeout=60):
    """Wait until a start script (router_process's or router_next's) prints that its fronts listen -> its log;
    AssertionError with the log when it ends first or does not in time."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = started["log"].read_text(errors="replace")
        if "narwhal_router: serving" in text:
            return text
        if started["proc"].poll() is not None:
            raise AssertionError("the router ended (%s) before it served: %s"
                                 % (started["proc"].returncode, text[-2000:]))
        time.sleep(0.1)
    raise AssertionError("the router did not serve within %d s: %s" % (timeout, text[-2000:]))
