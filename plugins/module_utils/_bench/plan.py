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

The workload (NARWHAL_BENCH_WORKLOAD): random prompts, or prompts that share prefixes (vllm bench serve's
prefix_repetition dataset). With NARWHAL_BENCH_POLICIES the targets are instead one router per prefill policy, each
in P/D mode over the whole fleet (`pd-<policy>`, planned by the router stage's own planner with the policy put in
NARWHAL_ROUTER_PREFILL_POLICY): every policy at every load, each step with its own seed, so that no policy finds
another's prefixes in the engines' caches.
"""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url, with_port
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import KV_AWARE, ROUTER_BLOCK_SIZE
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import ENTRY as ROUTER_ENTRY
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import KEY as ROUTER_KEY
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    MOUNT,
    PLAN_HASH_LABEL,
    STARTUP_CHECK_S,
    STARTUP_TIMEOUT_S,
    TLS_FILES,
    VERSION_LABEL,
    config_text,
    fleet_workers,
    fronts,
    kv_prefill_policy,
    local_url,
    plan_hash,
    router_bind,
    router_config,
    tls_container,
    tls_on,
    workers_doc,
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
# vllm bench serve's prefix-sharing dataset (vLLM 0.32.0 benchmarks/datasets/datasets.py: PrefixRepetitionRandomDataset
# and its --prefix-repetition-* options): num_prefixes random prefixes, each followed by num_prompts // num_prefixes
# random suffixes, shuffled; the seed (--seed) draws them, so another seed gives other prefixes
PREFIX_DATASET = "prefix_repetition"


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


def workload(site):
    """NARWHAL_BENCH_WORKLOAD: random (the default) or prefix."""
    return site.get("NARWHAL_BENCH_WORKLOAD") or "random"


def policies(site):
    """NARWHAL_BENCH_POLICIES: the prefill policies to compare, in order ([] when unset: today's three targets)."""
    return list(site.get("NARWHAL_BENCH_POLICIES") or [])


def check_prefixes(site):
    """The prefix workload shares each prefix among NARWHAL_BENCH_PROMPTS / NARWHAL_BENCH_PREFIXES requests: vLLM's
    dataset raises for fewer requests than prefixes and sends only prefixes * (prompts // prefixes) requests
    (no oversampling), so the prompts must be a multiple of the prefixes."""
    prompts, prefixes = int(site["NARWHAL_BENCH_PROMPTS"]), int(site["NARWHAL_BENCH_PREFIXES"])
    if prompts % prefixes:
        raise PlanError("NARWHAL_BENCH_PREFIXES: %d prefixes do not divide NARWHAL_BENCH_PROMPTS %d (each prefix is "
                        "shared by the same number of requests; vllm bench serve's prefix_repetition dataset would "
                        "send %d): make NARWHAL_BENCH_PROMPTS a multiple of NARWHAL_BENCH_PREFIXES"
                        % (prefixes, prompts, prompts // prefixes * prefixes), "NARWHAL_BENCH_PREFIXES")


def request_len(site):
    """(tokens of the longest request: prompt plus output, the inputs that add up to it, the key to name)."""
    if workload(site) == "prefix":
        keys = ("NARWHAL_BENCH_PREFIX_LEN", "NARWHAL_BENCH_SUFFIX_LEN", "NARWHAL_BENCH_OUTPUT_LEN")
    else:
        keys = ("NARWHAL_BENCH_INPUT_LEN", "NARWHAL_BENCH_OUTPUT_LEN")
    return sum(int(site[k]) for k in keys), " + ".join(keys), keys[0]


def reached(target, workers):
    """The engines a step of `target` reaches: through a router in P/D mode every prefill and decode engine of the
    fleet (the router picks among them), else (direct, router) the fleet's first decode engine."""
    if target == "pd" or target.startswith("pd-"):
        return [dict(w, role=role) for role in ("prefill", "decode") for w in workers[role]]
    return [dict(decode_target(workers), role="decode")]


def check_lengths(site, targets, workers, lengths):
    """Refuse lengths an engine a step reaches cannot serve (vLLM answers 400 to each such request: a sweep of
    failures). `lengths`: the probe_engines lookup's {"max_model_len": {engine: int or None}, "max_model_len_from":
    {engine: where it was read, or why it is unknown}}: the record's --max-model-len, else the checkpoint's own bound
    (_probe/fabric.py::max_model_len). Every engine is named with its limit, and an engine whose limit is unknown
    too."""
    total, named, key = request_len(site)
    limits = (lengths or {}).get("max_model_len") or {}
    sources = (lengths or {}).get("max_model_len_from") or {}
    engines, longer, unknown = {}, [], []
    for target in targets:
        for worker in reached(target, workers):
            engines.setdefault(worker["engine"], (worker["role"], []))[1].append(target)
    for engine, (role, via) in engines.items():
        limit, where = limits.get(engine), sources.get(engine) or "not in the launch config"
        steps = "the %s steps reach it" % "/".join(via)
        if not limit:
            unknown.append("the longest sequence %s (%s; %s) serves is not known (%s)" % (engine, role, steps, where))
        elif total > int(limit):
            longer.append("%s (%s; %s) serves at most %d tokens (%s)" % (engine, role, steps, int(limit), where))
    fixes = (["lower them (or raise --max-model-len in NARWHAL_EXTRA_ARGS, or in NARWHAL_NODE_<n>_EXTRA_ARGS for one "
              "engine, then rerun discovery, prepare and launch)"] if longer else []) + (
        ["rerun discovery (its extracts hold the checkpoint's own bound), or set --max-model-len in NARWHAL_EXTRA_ARGS "
         "(or NARWHAL_NODE_<n>_EXTRA_ARGS) and rerun discovery, prepare and launch"] if unknown else [])
    if fixes:
        found = "; ".join(longer + unknown)
        raise PlanError("%s = %d tokens per request, and %s: %s" % (named, total, found, "; ".join(fixes)), key)


def dataset_argv(site):
    """The dataset arguments of every step: random prompts of fixed length, or the prefix-sharing dataset."""
    if workload(site) == "prefix":
        return ["--dataset-name", PREFIX_DATASET,
                "--prefix-repetition-prefix-len", str(int(site["NARWHAL_BENCH_PREFIX_LEN"])),
                "--prefix-repetition-suffix-len", str(int(site["NARWHAL_BENCH_SUFFIX_LEN"])),
                "--prefix-repetition-num-prefixes", str(int(site["NARWHAL_BENCH_PREFIXES"])),
                "--prefix-repetition-output-len", str(int(site["NARWHAL_BENCH_OUTPUT_LEN"]))]
    return ["--dataset-name", "random",
            "--random-input-len", str(int(site["NARWHAL_BENCH_INPUT_LEN"])),
            "--random-output-len", str(int(site["NARWHAL_BENCH_OUTPUT_LEN"]))]


def bench_argv(site, url, model, tokenizer, step_id, seed, load, trust_remote_code=False):
    """The `vllm bench serve` arguments of one step (after `vllm bench serve`). No secret: the key reaches the
    load generator as OPENAI_API_KEY, read from a mounted file inside the container
    (vllm/benchmarks/lib/endpoint_request_func.py sends it as the Bearer token)."""
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer] + dataset_argv(site)
    argv += ["--num-prompts", str(int(site["NARWHAL_BENCH_PROMPTS"])),
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


def _from_router_record(record, site):
    """(its URL split, TLS on, the container's TLS environment, the certificate's sha256) from the fleet router's
    record, refused when it lacks what a benchmark router is made of or was made with another TLS setting."""
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
    return parsed, secure, env, cert_sha256


def bench_router_plan(record, site, workers):
    """The second router's plan from the fleet router's record (runs/routers/<router>.json: the same image and
    vllm-router version, and with TLS the same certificate) and the router stage's start script, key file and TLS
    files in NARWHAL_ROUTER_DIR: router_container state=started runs it, state=absent removes it. It binds where the
    fleet's router binds (_router/plan.py::router_bind of the record URL's host, the router_address)."""
    parsed, secure, env, cert_sha256 = _from_router_record(record, site)
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


def check_kv_events(site, fleet, records=None):
    """A kv_aware router routes by the prefill engines' own KV events: refused, naming the engines, when a prefill
    engine of the fleet publishes none (the fleet file's `kv_events`, written only while NARWHAL_KV_EVENTS is on), or
    when its launch record (`records`: the launch config's engines) has KV blocks of another size than the 16 tokens
    vllm-router 0.1.17 hashes its static event sources by (--pd-kv-events: "Block size is 16"). Discovery refuses the
    latter only under the site's own kv_aware prefill policy (_discover/records.py), not for the benchmark's."""
    if KV_AWARE not in policies(site):
        return
    prefill = [entry for entry in fleet if isinstance(entry, dict) and entry.get("role") == "prefill"]
    silent = [entry.get("engine") for entry in prefill if not entry.get("kv_events")]
    if silent:
        raise PlanError("NARWHAL_BENCH_POLICIES: kv_aware routes by the prefill engines' KV events, and %s publish%s "
                        "none (no kv_events in the fleet file): set NARWHAL_KV_EVENTS=on (or auto with "
                        "NARWHAL_ROUTER_PREFILL_POLICY=kv_aware), rerun discovery, prepare and launch, or leave "
                        "kv_aware out of NARWHAL_BENCH_POLICIES" % (", ".join(silent), "" if len(silent) > 1 else "es"),
                        "NARWHAL_BENCH_POLICIES")
    blocks = []
    for entry in prefill:
        plan = (((records or {}).get(entry.get("engine")) or {}).get("runtime") or {}).get("cache_plan") or {}
        if plan.get("block_size") not in (None, ROUTER_BLOCK_SIZE):
            blocks.append("%s %s" % (entry.get("engine"), plan["block_size"]))
    if blocks:
        raise PlanError("NARWHAL_BENCH_POLICIES: kv_aware reads the prefill engines' KV events as %d-token blocks "
                        "(vllm-router 0.1.17, --pd-kv-events), and the blocks of %s tokens (runtime.cache_plan."
                        "block_size of their launch records) would match no prefix: set NARWHAL_BLOCK_SIZE=%d and "
                        "rerun discovery, prepare and launch (a CPU image takes only multiples of 32: no CPU prefill "
                        "engine serves kv_aware), or leave kv_aware out of NARWHAL_BENCH_POLICIES"
                        % (ROUTER_BLOCK_SIZE, ", ".join(blocks), ROUTER_BLOCK_SIZE), "NARWHAL_BENCH_POLICIES")


def policy_port(site, index, policy):
    """The port of the router of the index-th policy: NARWHAL_BENCH_ROUTER_PORT + index, refused by name when it is
    one of the router host's other ports (the fleet's router's, the second router's metrics) or beyond 65535."""
    base = int(site["NARWHAL_BENCH_ROUTER_PORT"])
    port = base + index
    taken = {int(site["NARWHAL_ROUTER_PORT"]): "NARWHAL_ROUTER_PORT",
             int(site["NARWHAL_ROUTER_METRICS_PORT"]): "NARWHAL_ROUTER_METRICS_PORT",
             int(site["NARWHAL_BENCH_ROUTER_METRICS_PORT"]): "NARWHAL_BENCH_ROUTER_METRICS_PORT"}
    if port in taken or port > 65535:
        raise PlanError("NARWHAL_BENCH_ROUTER_PORT: the router of pd-%s listens on NARWHAL_BENCH_ROUTER_PORT + %d = "
                        "%d, %s; the routers of NARWHAL_BENCH_POLICIES take NARWHAL_BENCH_ROUTER_PORT to "
                        "NARWHAL_BENCH_ROUTER_PORT + %d on the first router host: pick a NARWHAL_BENCH_ROUTER_PORT "
                        "with that many free ports" % (policy, index, port, "which is %s too" % taken[port]
                                                       if port in taken else "beyond 65535",
                                                       len(policies(site)) - 1), "NARWHAL_BENCH_ROUTER_PORT")
    return port


def policy_router_plan(record, site, fleet, policy, index, engines=None):
    """The router of one prefill policy, `pd-<policy>`: the router stage's own command line, configuration and worker
    set (_router/plan.py::router_config, workers_doc) for the whole fleet with NARWHAL_ROUTER_PREFILL_POLICY set to
    `policy`, the image, version and TLS of the fleet router's record, on a port of its own (policy_port), its worker
    set in a file of its own; no metrics front (nothing scrapes it). `engines`: narwhal_site.engines, for per-node
    data-parallel sizes."""
    parsed, secure, env, cert_sha256 = _from_router_record(record, site)
    workers = fleet_workers(fleet)
    port = policy_port(site, index, policy)
    bind = router_bind(site, parsed[1])
    # the router stage's rules (issue 38): NARWHAL_ROUTER_PREFILL_POLICY is --prefill-policy (router_args), and a
    # kv_aware one puts the prefill engines' KV event endpoints in the worker set (kv_prefill_policy, workers_doc),
    # which narwhal_router.py gives vllm-router as --pd-kv-events
    mine = dict(site, NARWHAL_ROUTER_PREFILL_POLICY=policy)
    config_file, workers_file = "bench-router-%s.json" % policy, "bench-workers-%s.json" % policy
    config = router_config(mine, workers, engines, parsed[1])
    config.update(fronts=fronts(bind, port), workers_file="%s/%s" % (MOUNT, workers_file))
    doc = workers_doc(workers, kv_prefill_policy(mine, workers))
    plan = {"name": "%s-%s" % (BENCH_ROUTER_NAME, policy), "target": "pd-%s" % policy, "policy": policy,
            "image": record["image"], "image_ref": record.get("image_ref"), "version": record["vllm_router_version"],
            "dir": site["NARWHAL_ROUTER_DIR"], "entrypoint": ["python3"],
            "command": [ROUTER_ENTRY, "%s/%s" % (MOUNT, config_file)], "config": config, "workers_doc": doc,
            "port": port, "url": with_port(record["url"], port), "tls": secure,
            "local_url": local_url(bind, port, secure), "workers": workers,
            "files": [{"name": config_file, "content": config_text(config)},
                      {"name": workers_file, "content": config_text(doc)}]}
    if secure:
        plan.update(env=env, tls_sha256=cert_sha256)
    plan["hash"] = plan_hash(plan, ("image", "entrypoint", "command", "config", "workers_doc", "dir", "env",
                                    "tls_sha256"))
    plan["labels"] = {ROLE_LABEL: "router-bench", PLAN_HASH_LABEL: plan["hash"], VERSION_LABEL: plan["version"]}
    return plan


def bench_routers(record, site, fleet, engines=None, records=None):
    """The routers the benchmark runs beside the fleet's router, each plan with the `files` (name, content) the role
    writes in NARWHAL_ROUTER_DIR: the second router over the first decode engine (target `router`), or with
    NARWHAL_BENCH_POLICIES one P/D router per policy (policy_router_plan). Refuses, before anything runs, a kv_aware
    policy over engines without KV events or of other blocks (check_kv_events; `records`: the launch config's
    engines) and ports that collide."""
    chosen = policies(site)
    if not chosen:
        plan = bench_router_plan(record, site, fleet_workers(fleet))
        plan.update(target="router", files=[{"name": BENCH_ROUTER_CONFIG.rsplit("/", 1)[1],
                                             "content": config_text(plan["config"])}])
        return [plan]
    check_kv_events(site, fleet, records)
    return [policy_router_plan(record, site, fleet, policy, i, engines) for i, policy in enumerate(chosen)]


def _targets(site, workers, router_url, bench_router_url, routers):
    """[(target, title)] and {target: URL}: the default three, or one `pd-<policy>` per policy (its router's URL
    from `routers`, bench_routers' plans)."""
    chosen = policies(site)
    if not chosen:
        return list(TARGETS), {"pd": router_url.rstrip("/"), "direct": decode_target(workers)["url"],
                               "router": bench_router_url.rstrip("/")}
    urls = dict((r.get("target"), str(r.get("url") or "").rstrip("/")) for r in routers or [] if isinstance(r, dict))
    targets = [("pd-%s" % p, "P/D, prefill policy %s" % p) for p in chosen]
    missing = [t for t, _title in targets if not urls.get(t)]
    if missing:
        raise PlanError("NARWHAL_BENCH_POLICIES: no router planned for %s (the narwhal.deploy.bench_routers filter "
                        "plans one per policy); rerun the benchmark" % ", ".join(missing), "NARWHAL_BENCH_POLICIES")
    return targets, urls


def bench_plan(site, workers, router_url, bench_router_url, model, tokenizer, stamp, trust_remote_code=False,
               lengths=None, routers=None):
    """Every step of one benchmark run, in order: for each load, every target (the three, or one per policy).
    `lengths`: every engine's max_model_len (check_lengths); `routers`: the policies' routers (bench_routers)."""
    if not STAMP.match(str(stamp)):
        raise PlanError("the benchmark stamp %r is not a UTC stamp like 20261202T201500Z" % (stamp,), "stamp")
    prefix = workload(site) == "prefix"
    if prefix:
        check_prefixes(site)
    targets, urls = _targets(site, workers, router_url, bench_router_url, routers)
    check_lengths(site, [t for t, _title in targets], workers, lengths)
    steps = []
    for load in loads(site):
        for target, title in targets:
            step_id = "%02d-%s-%s" % (len(steps) + 1, target, load["label"])
            steps.append({"id": step_id, "target": target, "title": title, "url": urls[target], "load": load,
                          "container": "%s%s-%s" % (CONTAINER_PREFIX, stamp.lower(), step_id),
                          "argv": bench_argv(site, urls[target], model, tokenizer, step_id, len(steps) + 1, load,
                                             trust_remote_code)})
    plan = {"stamp": stamp, "steps": steps, "slo": slo(site),
            "targets": [{"target": t, "title": title, "url": urls[t]} for t, title in targets],
            "decode_engine": decode_target(workers)["engine"],
            "shape": {"input_len": request_len(site)[0] - int(site["NARWHAL_BENCH_OUTPUT_LEN"]),
                      "output_len": int(site["NARWHAL_BENCH_OUTPUT_LEN"]),
                      "prompts": int(site["NARWHAL_BENCH_PROMPTS"])}}
    if prefix:
        plan["shape"].update(prefix_len=int(site["NARWHAL_BENCH_PREFIX_LEN"]),
                             suffix_len=int(site["NARWHAL_BENCH_SUFFIX_LEN"]),
                             prefixes=int(site["NARWHAL_BENCH_PREFIXES"]))
    if prefix or policies(site):
        plan.update(workload=workload(site), policies=policies(site))
    return plan
