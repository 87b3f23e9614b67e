# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's plan (docs/vllm-requirements.md, "The router"): vLLM's own P/D router (the `vllm-router` distribution)
in front of the fleet, its workers taken from the one resolved fleet (nothing typed twice), its container described
completely before anything runs, and a hash that changes with everything only a new container applies (the command
line in router.json and the worker set in workers.json are applied by a reload: narwhal_router.py, router_members).

Pure: the role passes the resolved fleet (the `fleet` lookup: complete-value substitution, _plan/subst.py) and the
site inputs; the readiness and status checks compare what the router reports (its /workers answer) with the same
fleet (worker_report).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import http_url, refuse_fleet_userinfo
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import KV_AWARE, role_policy

__metaclass__ = type

CONTAINER_NAME = "narwhal-router"
ROLE_LABEL = "org.narwhal.role"
PLAN_HASH_LABEL = "org.narwhal.router.plan-hash"
VERSION_LABEL = "org.narwhal.router.version"
# Where the router host's NARWHAL_ROUTER_DIR is mounted (read-only) in the container.
MOUNT = "/narwhal"
ENTRY = MOUNT + "/narwhal_router.py"
CONFIG = MOUNT + "/router.json"
KEY = MOUNT + "/api.key"
# The worker set (workers_doc), written by the router role and the router_members module; a reload
# (SIGHUP to the container) makes vllm-router serve it.
WORKERS = MOUNT + "/workers.json"
# The router's TLS material in NARWHAL_ROUTER_DIR/tls/ (the role copies it from the controller's NARWHAL_TLS_DIR,
# made or checked by tls_material): the front's certificate and key, and the CA vllm-router verifies the engines with.
TLS_DIR = MOUNT + "/tls"
TLS_CERT = TLS_DIR + "/server.crt"
TLS_KEY = TLS_DIR + "/server.key"
TLS_CA = TLS_DIR + "/ca.crt"
TLS_FILES = {"cert": TLS_CERT, "key": TLS_KEY}
# vllm-router binds loopback (on free ports of its own, narwhal_router.py) and the start script's front the router's
# address; with TLS the front ends TLS: vllm-router 0.1.17 has no TLS listener (vllm_router/router_args.py:
# RouterArgs and its parser have --host and --port, no certificate or key option; the only "https" in it is the
# --cors-allowed-origins help).
UPSTREAM = "127.0.0.1"

# How often the router asks each worker's /health (--health-check-interval-secs, upstream 60 s), after how many
# failures it stops routing to it (--health-failure-threshold, upstream 3), after how many answers it routes to it
# again (--health-success-threshold, upstream 2), and how long one check waits (--health-check-timeout-secs,
# upstream 5 s). vllm-router 0.1.17 in --vllm-pd-disaggregation mode neither retries a request whose worker refused
# the connection on another worker nor opens a circuit breaker for it (--retry-max-retries and --cb-failure-threshold
# were tried: every request routed to a killed decode failed), so these checks are the only thing that takes a
# crashed engine out: requests routed to it fail for at most about 2 s (measured: 1.6 s), and once its restarted
# container answers /health it is routed to again within 2 s (docs/day-two.md). A stopped engine leaves the
# router's healthy set within about 2 s, which status and the readiness check read.
HEALTH_INTERVAL_S = 1
HEALTH_FAILURES = 2
HEALTH_SUCCESSES = 2
HEALTH_TIMEOUT_S = 2
# --worker-startup-check-interval (upstream 30 s): how often a starting router looks for its workers; and how long
# it looks (--worker-startup-timeout-secs, upstream 600 s) before it exits (and Docker's restart policy starts it
# again). Not the stage's wait (NARWHAL_ROUTER_READY_TIMEOUT): a shorter wait must not restart the router.
STARTUP_CHECK_S = 2
STARTUP_TIMEOUT_S = 600
# NARWHAL_ROUTER_DRAIN_TIMEOUT's default, and what docker stop gives the container beyond it (the start script
# SIGKILLs a vllm-router that outlives the drain; the margin lets it do so and exit 0 before Docker's SIGKILL).
DRAIN_TIMEOUT_S = 120
STOP_MARGIN_S = 15


def fleet_workers(fleet, where="NARWHAL_FLEET"):
    """{"prefill": [{engine, url}], "decode": [...]} of the resolved fleet, in its order; refuses a fleet the router
    cannot serve (no prefill or no decode engine, an entry without role or URL, a URL twice)."""
    if not isinstance(fleet, list):
        raise PlanError("%s: the fleet is not a list of engines; rerun discovery" % where, where)
    refuse_fleet_userinfo(fleet, where)  # a credential in a URL would reach the router's command line and router.json
    workers, seen = {"prefill": [], "decode": []}, {}
    for i, entry in enumerate(fleet):
        if not isinstance(entry, dict):
            raise PlanError("%s: entry %d is not an object; rerun discovery" % (where, i), where)
        engine, role, url = entry.get("engine"), entry.get("role"), entry.get("url")
        if role not in workers:
            raise PlanError("%s: %s has role %r, not prefill or decode; set NARWHAL_NODE_<n>_ROLE and rerun discovery"
                            % (where, engine or "entry %d" % i, role), where)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise PlanError("%s: %s has no engine URL (%r); rerun discovery" % (where, engine or "entry %d" % i, url),
                            where)
        url = url.rstrip("/")
        if url in seen:
            raise PlanError("%s: %s and %s have the same URL %s; the router would count one worker"
                            % (where, seen[url], engine, url), where)
        seen[url] = engine
        workers[role].append(dict({"engine": engine, "url": url}, **_kv_endpoints(entry, where, engine or i)))
    for role in ("prefill", "decode"):
        if not workers[role]:
            raise PlanError("%s: the fleet has no %s engine; a P/D router needs at least one of each (set "
                            "NARWHAL_NODE_<n>_ROLE=%s on an engine and rerun discovery)" % (where, role, role), where)
    return workers


KV_ENDPOINT = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):[0-9]{1,5}\Z")


def _kv_endpoints(entry, where, who):
    """{"kv_events": [endpoint, ...]} of a fleet entry that has them (discovery writes them while KV events are on:
    _common/kv_events.py::subscriber_endpoints), else {}; anything but a list of tcp://host:port is refused."""
    if "kv_events" not in entry:
        return {}
    eps = entry["kv_events"]
    if not isinstance(eps, list) or not eps or not all(isinstance(e, str) and KV_ENDPOINT.match(e) for e in eps):
        raise PlanError("%s: %s has kv_events %r, not a list of tcp://host:port endpoints; rerun discovery"
                        % (where, who, eps), where)
    return {"kv_events": list(eps)}


def kv_prefill_policy(site, workers):
    """Whether the prefill policy is kv_aware; then every prefill worker must have its KV events endpoints in the fleet
    (discovery writes them while NARWHAL_KV_EVENTS is on, or auto with this policy), which the router subscribes to
    (workers_doc: narwhal_router.py gives vllm-router --pd-kv-events per prefill worker)."""
    policy, key = role_policy(site, "prefill")
    if policy != KV_AWARE:
        return False
    lacking = [w["engine"] for w in workers["prefill"] if not w.get("kv_events")]
    if lacking:
        raise PlanError("%s is kv_aware, but the fleet's prefill engine(s) %s publish no KV events (no kv_events in "
                        "the fleet file): the records were discovered with KV events off; rerun discovery (with "
                        "NARWHAL_KV_EVENTS auto or on), prepare and launch, then the router stage"
                        % (key, ", ".join(lacking)), key)
    return True


def data_parallel_size(site, workers, engines=None):
    """The engines' one data-parallel size for vllm-router's --intra-node-data-parallel-size: each engine's
    `data_parallel_size` setting from `engines` (narwhal_site.engines: the per-node overrides applied) when given,
    else NARWHAL_DATA_PARALLEL_SIZE. vllm-router 0.1.17 takes one size for every worker (router_args.py:374-379:
    "Intra-node data parallel size for DP-aware routing (automatically enabled when > 1)"; it then routes to
    <worker URL>@<rank> for ranks 0..size-1 and names the rank in the X-data-parallel-rank header, which vLLM's
    OpenAI server hands to its DP load balancer: vLLM 0.32.0 entrypoints/generate/base/serving.py:220-232,
    v1/engine/core_client.py:1648), so a fleet whose engines differ in DP size is refused by name."""
    default = site.get("NARWHAL_DATA_PARALLEL_SIZE") or 1
    sizes = {}
    for worker in workers["prefill"] + workers["decode"]:
        settings = (engines or {}).get(worker["engine"]) or {}
        sizes[worker["engine"]] = settings.get("data_parallel_size") or default
    if len(set(sizes.values())) > 1:
        shown = ", ".join("%s %d" % (e, n) for e, n in sorted(sizes.items()))
        raise PlanError("NARWHAL_DATA_PARALLEL_SIZE: the engines differ in data-parallel size (%s), but vllm-router "
                        "routes to every worker with one --intra-node-data-parallel-size; give every engine of the "
                        "fleet one size (NARWHAL_DATA_PARALLEL_SIZE, NARWHAL_NODE_<n>_DATA_PARALLEL_SIZE), then rerun "
                        "discovery and the router stage" % shown, "NARWHAL_DATA_PARALLEL_SIZE")
    return sizes.popitem()[1] if sizes else default


def tls_on(site):
    """Whether the router serves TLS and reaches the engines over it (NARWHAL_TLS site or operator; the catalogue's
    default is site)."""
    return site.get("NARWHAL_TLS", "site") != "off"


def url(tls, host, port, path=""):
    """https://host:port (http:// without TLS) followed by `path`; an IPv6 host in brackets (_common/endpoints.py)."""
    return http_url(host, port, path, scheme="https" if tls else "http")


def router_bind(site, address=None):
    """The address both router ports bind: NARWHAL_ROUTER_BIND, or when it is empty (the default) the router host's
    `address` (the role's router_address), which must then be an IP address. With TLS the TLS front binds it and
    vllm-router binds 127.0.0.1 on the same port numbers, so a wildcard or loopback address is refused."""
    bind = str(site.get("NARWHAL_ROUTER_BIND") or "").strip()
    if not bind:
        try:
            bind = str(ipaddress.ip_address(str(address or "").strip()))
        except ValueError:
            raise PlanError("NARWHAL_ROUTER_BIND is empty, so the router binds its host's router_address, and that is "
                            "%r, not an IP address: set router_address (or ansible_host) of the router host to the IP "
                            "address clients reach it at, or NARWHAL_ROUTER_BIND to an address of the router host, "
                            "then rerun the router stage" % (address,), "NARWHAL_ROUTER_BIND")
    parsed = ipaddress.ip_address(bind)
    if tls_on(site) and (parsed.is_unspecified or parsed.is_loopback):
        raise PlanError("NARWHAL_ROUTER_BIND: %s is %s, but with NARWHAL_TLS=%s the router's TLS front binds the "
                        "router's address and vllm-router itself %s on the same ports: leave NARWHAL_ROUTER_BIND empty "
                        "(the router host's router_address) or set it to one address of the router host (or set "
                        "NARWHAL_TLS=off), then rerun the router stage"
                        % (bind, "a wildcard" if parsed.is_unspecified else "a loopback address",
                           site.get("NARWHAL_TLS", "site"), UPSTREAM), "NARWHAL_ROUTER_BIND")
    return bind


def tls_names(site, address):
    """The names the router host's certificate carries (tls_material's `names`): the address clients reach it at,
    and the bound address when that differs (the router host's own clients reach the router there: local_url)."""
    bind = router_bind(site, address)
    return [address] if bind == address else [address, bind]


def router_args(site, workers, engines=None, address=None):
    """The vllm-router command line of router.json (its own parser reads it in the container: an option it does not
    know is refused there, at start), without the worker set and the listening addresses: the start script
    (narwhal_router.py) adds --host/--port/--prometheus-host/--prometheus-port (loopback, free ports per vllm-router
    process) and one --prefill/--decode per URL of workers.json, so a new worker set is a reload, not a new
    container. No secret is in it: the key reaches the router from a file. Data-parallel engines add
    --intra-node-data-parallel-size (data_parallel_size); DP 1 adds nothing. `address`: the router host's
    router_address (the bind is checked here as well)."""
    router_bind(site, address)
    kv_prefill_policy(site, workers)
    port, metrics = int(site["NARWHAL_ROUTER_PORT"]), int(site["NARWHAL_ROUTER_METRICS_PORT"])
    if port == metrics:
        raise PlanError("NARWHAL_ROUTER_METRICS_PORT: %d is NARWHAL_ROUTER_PORT too; the router serves clients and "
                        "Prometheus on two ports: pick another, then rerun the router stage" % metrics,
                        "NARWHAL_ROUTER_METRICS_PORT")
    args = ["--vllm-pd-disaggregation", "--kv-connector", "nixl",
            "--prefill-policy", role_policy(site, "prefill")[0], "--decode-policy", role_policy(site, "decode")[0],
            "--worker-startup-timeout-secs", str(STARTUP_TIMEOUT_S),
            "--worker-startup-check-interval", str(STARTUP_CHECK_S),
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--health-success-threshold", str(HEALTH_SUCCESSES),
            "--health-check-timeout-secs", str(HEALTH_TIMEOUT_S)]
    args += flow_control_args(site, workers, engines)
    dp = data_parallel_size(site, workers, engines)
    if dp > 1:
        args += ["--intra-node-data-parallel-size", str(dp)]
    return args


# Flow control at the front door (docs/router.md, "Flow control at the front door"; measured with the real vllm-router
# 0.1.17 by bench/router_overload.py and tests/unit/roles/router/test_flow_control.py). Its admission is a token bucket
# counting requests, not LLM tokens: --max-concurrent-requests tokens, refilled at --rate-limit-tokens-per-second (0 or
# unset refill 1 per second too, measured in P/D mode, not the cap per second its help text says), each finished request
# giving its token back. A request that finds no token is refused at once with 429, Retry-After: 1 and an empty body
# when --queue-size is 0; otherwise it waits at most about (1 - tokens) / rate seconds (the bucket's own wait; whichever
# of that and --queue-timeout-secs is shorter) for a token a finishing request gives back, then gets 408 with an empty
# body; --queue-size bounds nothing in practice (the queue's task hands every waiter to a task of its own: 50 waiters
# behind --queue-size 1 got 49 408 and one 429). So: no queue (refusal in milliseconds, not after a second), and the
# slowest refill vllm-router has, 1 per second (in-flight requests exceed the cap by one more per second of overload; a
# refill of the cap per second lets a whole cap more in every second). A streamed request gives its token back when the
# decode engine starts its answer, and vLLM starts a stream's answer at once, so a streamed request holds its token
# through its prefill only; it is refused only while other requests hold every token. vllm-router counts no refusal in
# its metrics (vllm_router_pd_requests_total counts the admitted ones). The retry (--retry-*) and circuit breaker
# (--cb-*) options change nothing in --vllm-pd-disaggregation mode (a decode that refuses the connection: 500
# "Transparent proxy request failed: Network error: Decode request failed"; one that answers 500 or 503: its answer
# passed on; each request sent to that worker once, with --retry-max-retries 3 and --cb-failure-threshold 2 as with the
# defaults), so the plan sets none of them: the health checks above take a failed worker out.
# Unset NARWHAL_ROUTER_MAX_CONCURRENT: this many per decode engine data-parallel rank, the largest max_num_seqs vLLM
# 0.32 takes by default for online serving (engine/arg_utils.py: 1024 on GPUs of 70 GiB and more, 256 on smaller ones,
# 128 per CPU socket), so the cap never refuses what the decode engines could batch by default.
MAX_CONCURRENT_PER_DECODE_RANK = 1024


def max_concurrent(site, workers, engines=None):
    """NARWHAL_ROUTER_MAX_CONCURRENT, or when it is unset MAX_CONCURRENT_PER_DECODE_RANK per decode engine DP rank."""
    if site.get("NARWHAL_ROUTER_MAX_CONCURRENT"):
        return int(site["NARWHAL_ROUTER_MAX_CONCURRENT"])
    return MAX_CONCURRENT_PER_DECODE_RANK * len(workers["decode"]) * data_parallel_size(site, workers, engines)


def flow_control_args(site, workers, engines=None):
    """vllm-router's admission options from NARWHAL_ROUTER_MAX_CONCURRENT, NARWHAL_ROUTER_QUEUE_SIZE,
    NARWHAL_ROUTER_QUEUE_TIMEOUT and NARWHAL_ROUTER_RATE_LIMIT (their catalogue defaults when the site lacks them:
    an older deployment.env). The input checks (_inputs/validate.py) bound every one."""
    return ["--max-concurrent-requests", str(max_concurrent(site, workers, engines)),
            "--queue-size", str(int(site.get("NARWHAL_ROUTER_QUEUE_SIZE") or 0)),
            "--queue-timeout-secs", str(int(site.get("NARWHAL_ROUTER_QUEUE_TIMEOUT") or 1)),
            "--rate-limit-tokens-per-second", str(int(site.get("NARWHAL_ROUTER_RATE_LIMIT") or 1))]


def fronts(bind, port, metrics_port=None):
    """router.json's `fronts` (narwhal_router.py listens on each; TLS when router.json has `tls`): the router's port
    to vllm-router's --port, and its metrics port to vllm-router's --prometheus-port."""
    listed = [{"listen": [bind, int(port)], "to": "port"}]
    if metrics_port is not None:
        listed.append({"listen": [bind, int(metrics_port)], "to": "prometheus_port"})
    return listed


def workers_doc(workers, kv=False):
    """NARWHAL_ROUTER_DIR/workers.json, the worker set the start script gives vllm-router:
    {"prefill": [url, ...], "decode": [url, ...]} in fleet order; with `kv` (a kv_aware prefill policy:
    kv_prefill_policy) also "kv_events": {prefill url: [endpoint by DP rank, ...]}, from which the start script adds
    --pd-kv-events for each prefill URL it gives (a worker set changed by router_members keeps the map)."""
    doc = {role: [w["url"] for w in workers[role]] for role in ("prefill", "decode")}
    if kv:
        doc["kv_events"] = dict((w["url"], w["kv_events"]) for w in workers["prefill"])
    return doc


def drain_timeout(site):
    """NARWHAL_ROUTER_DRAIN_TIMEOUT: seconds a replaced or stopped vllm-router process has for its in-flight
    requests."""
    return int(site.get("NARWHAL_ROUTER_DRAIN_TIMEOUT") or DRAIN_TIMEOUT_S)


def router_config(site, workers, engines=None, address=None):
    """The document the router host keeps as NARWHAL_ROUTER_DIR/router.json (no secret): the command line, the key
    file, the fronts of both ports (with TLS, the certificate and key), the worker set's file, the drain and ready
    timeouts of a reload. The engine URLs a client's key is checked against (vllm-router's api_key_validation_urls)
    are workers.json's (narwhal_router.py), so the fleet is in workers.json only: a new fleet is a reload."""
    bind = router_bind(site, address)
    config = {"args": router_args(site, workers, engines, address), "api_key_file": KEY,
              "fronts": fronts(bind, site["NARWHAL_ROUTER_PORT"], site["NARWHAL_ROUTER_METRICS_PORT"]),
              "workers_file": WORKERS, "drain_timeout": drain_timeout(site), "ready_timeout": STARTUP_TIMEOUT_S}
    if tls_on(site):
        config["tls"] = TLS_FILES
    return config


def config_text(config):
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def local_url(bind, port, tls=False):
    """Where the router host reaches its own router: loopback for a wildcard bind (plain HTTP only: TLS refuses a
    wildcard bind, router_bind), else the bound address."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)
    return url(tls, host, port)


def tls_container(site, tls):
    """(environment, the certificate's sha256) of a router container: with TLS, SSL_CERT_FILE names the CA in the
    router directory, so vllm-router's HTTP client (reqwest) verifies the engines' certificates against it (without
    it the https workers never become healthy); the certificate's sha256 joins the plan hash, so a new certificate
    restarts the router. `tls`: tls_material's entry of this router host ({cert, key, sha256, ...})."""
    if not tls_on(site):
        return [], None
    if not isinstance(tls, dict) or not tls.get("sha256"):
        raise PlanError("NARWHAL_TLS=%s, but the router host has no certificate from tls_material; rerun the router "
                        "stage, which makes or checks it" % site.get("NARWHAL_TLS", "site"), "NARWHAL_TLS")
    return ["SSL_CERT_FILE=" + TLS_CA], tls["sha256"]


def plan_hash(plan, keys):
    hashed = dict((k, plan[k]) for k in keys if k in plan)
    return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode("utf-8")).hexdigest()


def log_config(site):
    """HostConfig.LogConfig of the router container: NARWHAL_LOG_DRIVER (json-file or local, both rotate by max-size
    and max-file) with NARWHAL_LOG_MAX_SIZE and NARWHAL_LOG_MAX_FILE (Docker takes the options as strings)."""
    return {"Type": site.get("NARWHAL_LOG_DRIVER") or "json-file",
            "Config": {"max-size": str(site.get("NARWHAL_LOG_MAX_SIZE") or "100m"),
                       "max-file": str(site.get("NARWHAL_LOG_MAX_FILE") or 5)}}


# What the plan hash covers: what only a new container applies. router.json (args, timeouts) and workers.json are
# applied by a reload (narwhal_router.py on SIGHUP: router_members), so they are not in it.
HASHED = ("image", "entrypoint", "command", "entry_sha256", "dir", "env", "tls_sha256", "port", "metrics_port", "bind",
          "log")


def router_plan(site, fleet, image_id, version, entry_sha256, address=None, engines=None, tls=None):
    """The complete router plan: container, mounts, the config document, the worker set and the hash of what needs
    a new container (HASHED) (`engines`: narwhal_site.engines, for per-node data-parallel sizes; `tls`:
    tls_material's entry of this router host, needed when NARWHAL_TLS is not off)."""
    workers = fleet_workers(fleet)
    config = router_config(site, workers, engines, address)
    bind, secure = router_bind(site, address), tls_on(site)
    env, cert_sha256 = tls_container(site, tls)
    port, metrics = int(site["NARWHAL_ROUTER_PORT"]), int(site["NARWHAL_ROUTER_METRICS_PORT"])
    plan = {
        "name": CONTAINER_NAME,
        "image": image_id,
        "image_ref": site["NARWHAL_ROUTER_IMAGE"],
        "version": version,
        "dir": site["NARWHAL_ROUTER_DIR"],
        "entrypoint": ["python3"],
        "command": [ENTRY, CONFIG],
        "config": config,
        "workers_doc": workers_doc(workers, kv_prefill_policy(site, workers)),
        "entry_sha256": entry_sha256,
        "workers": workers,
        "port": port,
        "metrics_port": metrics,
        "bind": bind,
        "tls": secure,
        "log": log_config(site),
        "drain_timeout": config["drain_timeout"],
        "stop_timeout": config["drain_timeout"] + STOP_MARGIN_S,
        "local_url": local_url(bind, port, secure),
        "local_metrics_url": local_url(bind, metrics, secure),
    }
    if secure:
        plan.update(env=env, tls_sha256=cert_sha256)
    if address:
        plan["url"] = url(secure, address, port)
        plan["metrics_url"] = url(secure, address, metrics, "/metrics")
    plan["hash"] = plan_hash(plan, HASHED)
    plan["labels"] = {ROLE_LABEL: "router", PLAN_HASH_LABEL: plan["hash"], VERSION_LABEL: version}
    return plan


def worker_label(role, worker):
    """How every report names a fleet worker: engine (role URL)."""
    return "%s (%s %s)" % (worker["engine"], role, worker["url"])


RANKED_URL = re.compile(r"@[0-9]+$")


def worker_report(answer, workers):
    """What the router's GET /workers answer says against the fleet's workers: every fleet worker seen with its
    role and healthy, nothing the fleet lacks. -> {seen, missing, unhealthy, wrong_role, extra, ok}; each list
    names engines (or URLs for workers outside the fleet)."""
    listed = answer.get("workers") if isinstance(answer, dict) else None
    listed = [w for w in listed if isinstance(w, dict)] if isinstance(listed, list) else []
    # In DP-aware mode (--intra-node-data-parallel-size) vllm-router 0.1.17 lists each data-parallel rank of a worker
    # as <url>@<rank> (its dp_utils asks the engine how many engines it runs; seen against the stand-in's DP ranks):
    # every rank of the fleet's URL counts for that worker, and each must be healthy and of its role.
    by_url = {}
    for entry in listed:
        by_url.setdefault(RANKED_URL.sub("", str(entry.get("url", ""))).rstrip("/"), []).append(entry)
    report = {"seen": [], "missing": [], "unhealthy": [], "wrong_role": [], "extra": []}
    expected = {}
    for role in ("prefill", "decode"):
        for worker in workers[role]:
            expected[worker["url"]] = worker
            got = by_url.get(worker["url"])
            label = worker_label(role, worker)
            if not got:
                report["missing"].append(label)
                continue
            report["seen"].append(worker["engine"])
            roles = sorted(set(str(g.get("worker_type")) for g in got if g.get("worker_type") != role))
            if roles:
                report["wrong_role"].append("%s as %s" % (label, ", ".join(roles)))
            if any(g.get("is_healthy") is not True for g in got):
                report["unhealthy"].append(label)
    report["extra"] = sorted(u for u in by_url if u not in expected)
    report["ok"] = not (report["missing"] or report["unhealthy"] or report["wrong_role"] or report["extra"])
    return report


def report_problems(report):
    """One line per kind of difference (the readiness and status refusal)."""
    lines = []
    if report["missing"]:
        lines.append("the router lacks %s" % ", ".join(report["missing"]))
    if report["unhealthy"]:
        lines.append("the router holds as unhealthy %s" % ", ".join(report["unhealthy"]))
    if report["wrong_role"]:
        lines.append("the router has %s" % ", ".join(report["wrong_role"]))
    if report["extra"]:
        lines.append("the router routes to workers outside the fleet: %s" % ", ".join(report["extra"]))
    return lines
