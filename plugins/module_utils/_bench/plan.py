# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet load benchmark's plan (docs/fleet-benchmark.md): which targets the load generator drives, at which loads,
and the exact `vllm bench serve` command line of every step. Pure: the role passes the site inputs, the resolved fleet
(the `fleet` lookup), the router's record and the model; nothing here runs anything.

Three targets at every load, side by side in one run:
- `pd`: the fleet through its router (vllm-router in P/D mode: prefill engine, KV over NIXL, decode engine);
- `direct`: the fleet's first decode engine asked directly (aggregated serving: one engine does prefill and decode);
- `router`: the same decode engine behind a second vllm-router in its regular mode (--worker-urls), so that
  `router` minus `direct` at equal load is the router's own overhead.

Loads: one step per request rate of NARWHAL_BENCH_RATES (Poisson arrivals, open loop), then one closed-loop step of
NARWHAL_BENCH_CONCURRENCY (every request sent at once, at most that many in flight). Every step has its own random
seed, so no step's prompts are in an engine's prefix cache from an earlier step (the decode engine keeps the blocks
the P/D steps transferred to it).
"""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url, with_port
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import ENTRY as ROUTER_ENTRY
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import KEY as ROUTER_KEY
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    MOUNT,
    PLAN_HASH_LABEL,
    STARTUP_CHECK_S,
    STARTUP_TIMEOUT_S,
    TLS_FILES,
    VERSION_LABEL,
    fronts,
    local_url,
    plan_hash,
    router_bind,
    tls_container,
    tls_on,
)

__metaclass__ = type

TARGETS = (
    ("pd", "P/D through the router"),
    ("direct", "one decode engine alone (aggregated)"),
    ("router", "router over that engine (overhead)"),
)
# vllm bench serve's own metric names (vllm/benchmarks/serve.py: --percentile-metrics, --goodput VALID_NAMES)
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
SLO_INPUTS = (("ttft", "NARWHAL_BENCH_SLO_TTFT_MS"), ("tpot", "NARWHAL_BENCH_SLO_TPOT_MS"),
              ("e2el", "NARWHAL_BENCH_SLO_E2EL_MS"))
# Where the bench container sees its result directory and the key file (bind mounts of the bench host).
OUT = "/narwhal-bench/out"
KEY = "/narwhal-bench/api.key"
# With TLS, the engine host's CA (bench_serve's ca_file), named by SSL_CERT_FILE: vllm bench serve asks an https
# target with aiohttp's ssl=True (vLLM 0.32.0 benchmarks/serve.py:2069-2076; its request functions'
# TCPConnector(ssl=...) at serve.py:824-835), whose context is ssl.create_default_context() (aiohttp 3.14
# connector.py:901-921, _make_ssl_context), and OpenSSL's default verify paths read SSL_CERT_FILE.
CA = "/narwhal-bench/ca.crt"
CONTAINER_PREFIX = "narwhal-bench-"
ROLE_LABEL = "org.narwhal.role"
STAMP = re.compile(r"^[0-9]{8}T[0-9]{6}Z$")
BENCH_ROUTER_NAME = "narwhal-router-bench"
BENCH_ROUTER_CONFIG = MOUNT + "/bench-router.json"
# seconds the load generator waits for its target to answer a first request (vllm bench serve
# --ready-check-timeout-sec): the second router serves once its worker answered /health
READY_CHECK_S = 120


def loads(site):
    """The sweep's loads in order: one per request rate, then the closed-loop step."""
    out = [{"kind": "rate", "rate": rate, "label": "rate-%s" % rate} for rate in site["NARWHAL_BENCH_RATES"]]
    concurrency = int(site["NARWHAL_BENCH_CONCURRENCY"])
    out.append({"kind": "concurrency", "rate": "inf", "concurrency": concurrency,
                "label": "concurrency-%d" % concurrency})
    return out


def slo(site):
    """{metric: ms} of the SLOs the operator set (goodput counts a request meeting all of them)."""
    return dict((name, site[key]) for name, key in SLO_INPUTS if site.get(key) is not None)


def check_lengths(site, max_model_len):
    """Refuse lengths the engines cannot serve (vLLM answers 400 to each such request: a sweep of failures)."""
    total = int(site["NARWHAL_BENCH_INPUT_LEN"]) + int(site["NARWHAL_BENCH_OUTPUT_LEN"])
    if max_model_len and total > int(max_model_len):
        raise PlanError("NARWHAL_BENCH_INPUT_LEN + NARWHAL_BENCH_OUTPUT_LEN = %d tokens, more than the engines' "
                        "--max-model-len %d: lower them (or raise --max-model-len in NARWHAL_EXTRA_ARGS, or in "
                        "NARWHAL_NODE_<n>_EXTRA_ARGS for one engine, then rerun discovery, prepare and launch)"
                        % (total, int(max_model_len)), "NARWHAL_BENCH_INPUT_LEN")


def bench_argv(site, url, model, tokenizer, step_id, seed, load, trust_remote_code=False):
    """The `vllm bench serve` arguments of one step (after `vllm bench serve`). No secret: the key reaches the
    load generator as OPENAI_API_KEY, read from a mounted file inside the container
    (vllm/benchmarks/lib/endpoint_request_func.py sends it as the Bearer token)."""
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random",
            "--random-input-len", str(int(site["NARWHAL_BENCH_INPUT_LEN"])),
            "--random-output-len", str(int(site["NARWHAL_BENCH_OUTPUT_LEN"])),
            "--num-prompts", str(int(site["NARWHAL_BENCH_PROMPTS"])),
            "--seed", str(seed),
            "--request-rate", str(load["rate"])]
    if load["kind"] == "concurrency":
        argv += ["--max-concurrency", str(load["concurrency"])]
    argv += ["--ignore-eos", "--temperature", "0",
             "--percentile-metrics", ",".join(METRICS),
             "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
             "--ready-check-timeout-sec", str(READY_CHECK_S)]
    goals = slo(site)
    if goals:
        argv += ["--goodput"] + ["%s:%s" % (name, goals[name]) for name, _key in SLO_INPUTS if name in goals]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--label", step_id, "--save-result", "--save-detailed", "--result-dir", OUT,
             "--result-filename", "%s.json" % step_id, "--disable-tqdm"]
    return argv


def from_record(record):
    """(trust_remote_code, max_model_len) of the benchmark host's engine record: the tokenizer's need for remote code,
    and the last --max-model-len of its extra arguments (vLLM's parser takes the last), None when unset."""
    runtime = (record or {}).get("runtime") or {}
    words = [str(w) for w in runtime.get("extra_args") or []]
    limit = None
    for i, word in enumerate(words):
        if word == "--max-model-len" and i + 1 < len(words):
            limit = words[i + 1]
        elif word.startswith("--max-model-len="):
            limit = word.split("=", 1)[1]
    try:
        limit = int(limit) if limit is not None else None
    except ValueError:
        limit = None  # vLLM's own forms (1k, -1): not checked here
    return bool(runtime.get("trust_remote_code")), limit


def decode_target(workers):
    """The decode engine the `direct` and `router` targets use: the fleet's first."""
    return workers["decode"][0]


def bench_router_args(site, worker):
    """The second router's command line: vllm-router's regular mode over one engine. The start script adds where it
    listens (loopback, free ports: narwhal_router.py) and its front binds where the fleet's router binds, on ports of
    its own (bench_router_plan: the fleet router's pattern, _router/plan.py::fronts); its Prometheus port has no
    front (nothing scrapes it)."""
    ports = [("NARWHAL_BENCH_ROUTER_PORT", int(site["NARWHAL_BENCH_ROUTER_PORT"])),
             ("NARWHAL_BENCH_ROUTER_METRICS_PORT", int(site["NARWHAL_BENCH_ROUTER_METRICS_PORT"]))]
    taken = {int(site["NARWHAL_ROUTER_PORT"]): "NARWHAL_ROUTER_PORT",
             int(site["NARWHAL_ROUTER_METRICS_PORT"]): "NARWHAL_ROUTER_METRICS_PORT"}
    for key, port in ports:
        if port in taken:
            raise PlanError("%s: %d is %s too; the benchmark's second router runs beside the fleet's router on the "
                            "same host: pick another port" % (key, port, taken[port]), key)
        taken[port] = key
    return ["--worker-urls", worker["url"],
            "--policy", "round_robin",
            "--worker-startup-timeout-secs", str(STARTUP_TIMEOUT_S),
            "--worker-startup-check-interval", str(STARTUP_CHECK_S)]


def bench_router_plan(record, site, workers):
    """The second router's plan from the fleet router's record (runs/routers/<router>.json: the same image and
    vllm-router version, and with TLS the same certificate) and the router stage's start script, key file and TLS
    files in NARWHAL_ROUTER_DIR: router_container state=started runs it, state=absent removes it. It binds where the
    fleet's router binds (_router/plan.py::router_bind of the record URL's host, the router_address)."""
    for key in ("url", "image", "vllm_router_version"):
        if not record.get(key):
            raise PlanError("the router's record has no %s; rerun the router stage" % key, "runs/routers")
    parsed = split_url(record["url"])
    if parsed is None:
        raise PlanError("the router's record has url %r, not http(s)://host:port; rerun the router stage"
                        % record["url"], "runs/routers")
    secure = tls_on(site)
    if (parsed[0] == "https") != secure:
        raise PlanError("the router's record has url %s, but NARWHAL_TLS is %s: rerun the router stage"
                        % (record["url"], site.get("NARWHAL_TLS", "site")), "runs/routers")
    env, cert_sha256 = tls_container(site, record.get("tls"))
    bind = router_bind(site, parsed[1])
    worker = decode_target(workers)
    port = int(site["NARWHAL_BENCH_ROUTER_PORT"])
    config = {"args": bench_router_args(site, worker), "api_key_file": ROUTER_KEY,
              "api_key_validation_urls": [worker["url"] + "/v1/models"], "fronts": fronts(bind, port)}
    if secure:
        config["tls"] = TLS_FILES
    url = with_port(record["url"], port)  # the router host as clients reach it, on the second router's port
    plan = {"name": BENCH_ROUTER_NAME, "image": record["image"], "image_ref": record.get("image_ref"),
            "version": record["vllm_router_version"], "dir": site["NARWHAL_ROUTER_DIR"],
            "entrypoint": ["python3"], "command": [ROUTER_ENTRY, BENCH_ROUTER_CONFIG], "config": config,
            "port": port, "url": url, "tls": secure,
            "local_url": local_url(bind, port, secure),
            "workers": {"prefill": [], "decode": [worker]}}
    if secure:
        plan.update(env=env, tls_sha256=cert_sha256)
    plan["hash"] = plan_hash(plan, ("image", "entrypoint", "command", "config", "dir", "env", "tls_sha256"))
    plan["labels"] = {ROLE_LABEL: "router-bench", PLAN_HASH_LABEL: plan["hash"], VERSION_LABEL: plan["version"]}
    return plan


def bench_plan(site, workers, router_url, bench_router_url, model, tokenizer, stamp, trust_remote_code=False,
               max_model_len=None):
    """Every step of one benchmark run, in order: for each load, the three targets."""
    if not STAMP.match(str(stamp)):
        raise PlanError("the benchmark stamp %r is not a UTC stamp like 20261202T201500Z" % (stamp,), "stamp")
    check_lengths(site, max_model_len)
    urls = {"pd": router_url.rstrip("/"), "direct": decode_target(workers)["url"],
            "router": bench_router_url.rstrip("/")}
    steps = []
    for load in loads(site):
        for target, title in TARGETS:
            step_id = "%02d-%s-%s" % (len(steps) + 1, target, load["label"])
            steps.append({"id": step_id, "target": target, "title": title, "url": urls[target], "load": load,
                          "container": "%s%s-%s" % (CONTAINER_PREFIX, stamp.lower(), step_id),
                          "argv": bench_argv(site, urls[target], model, tokenizer, step_id, len(steps) + 1, load,
                                             trust_remote_code)})
    return {"stamp": stamp, "steps": steps, "slo": slo(site),
            "targets": [{"target": t, "title": title, "url": urls[t]} for t, title in TARGETS],
            "decode_engine": decode_target(workers)["engine"],
            "shape": {"input_len": int(site["NARWHAL_BENCH_INPUT_LEN"]),
                      "output_len": int(site["NARWHAL_BENCH_OUTPUT_LEN"]),
                      "prompts": int(site["NARWHAL_BENCH_PROMPTS"])}}
