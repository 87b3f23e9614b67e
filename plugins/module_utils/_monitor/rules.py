# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus alert rules of the fleet (docs/monitoring.md, "Alert rules"): the rules file the monitoring stage writes
as config/prometheus/narwhal-rules.yml beside the targets, generated from the same resolved fleet and router records
as the targets (targets.py), so that an engine, a router or a router's worker the fleet names and Prometheus does not
see alerts too (absent() per engine, per router and per router worker: rules a fleet-wide expression cannot give).

Pure: takes the resolved fleet, the router records, the fleet's name (the `fleet` label of the targets) and the site
inputs (NARWHAL_ALERT_FOR, NARWHAL_ALERT_TTFT_P99_MS, NARWHAL_ALERT_KV_USAGE); returns {"groups": [...]} in a fixed
order, so an unchanged fleet writes the same bytes.

The series they read:
- `up` of every target (Prometheus), with the targets' labels job, engine/router, role, host, fleet (targets.py);
- vLLM 0.32.0's engine metrics (v1/metrics/loggers.py; distributed/kv_transfer/kv_connector/v1/nixl/stats.py), which
  the stand-in engine serves too (tests/harness/images/engine-standin/site/vllm/standin/metrics.py):
  vllm:nixl_num_failed_transfers_total (transfer, handshake and notification failures),
  vllm:nixl_num_failed_notifications_total (notification failures again, "retained for compatibility"),
  vllm:nixl_num_kv_expired_reqs_total and vllm:nixl_num_notifications_after_expiry_total (counted on the prefill),
  vllm:kv_cache_usage_perc, vllm:time_to_first_token_seconds_bucket, vllm:num_requests_waiting;
- vllm-router 0.1.17's vllm_router_worker_health{worker="<the worker's URL as workers.json gives it>"}: 1 healthy,
  0 after its failed health checks (tests/unit/roles/monitoring/test_prometheus.py fires the worker alert from the
  real router). The router keeps the gauge of a worker taken out with POST /remove_worker at its last value, so a
  worker removed from a running router shows only in status's routers table; one missing since the router started
  is absent here and alerts.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import NUMBER, prometheus_duration
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import (
    ENGINE_JOB,
    ROUTER_JOB,
    engine_targets,
    router_targets,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

__metaclass__ = type

PAGE, TICKET = "page", "ticket"
# The range of every rate, increase, deriv and min_over_time: 5 minutes hold 20 scrapes at Prometheus' usual 15 s
# interval (a rate needs at least two), and a single failure stays visible for 5 minutes.
WINDOW = "5m"
DEFAULTS = {"NARWHAL_ALERT_FOR": "2m", "NARWHAL_ALERT_TTFT_P99_MS": 2000, "NARWHAL_ALERT_KV_USAGE": 0.95}
# Where an operator reads what to do (cited by page and heading: tests/unit/test_doc_citations.py checks them)
CRASHES = 'docs/day-two.md, "Crashes"'
LOST_HOST = 'docs/day-two.md, "A lost host"'
POINTING = 'docs/monitoring.md, "Pointing Prometheus at it"'
ROUTER_STATUS = 'docs/router.md, "Status and stop"'
PROBE = 'docs/troubleshooting.md, "Probe"'


def alert_settings(site):
    """{"for", "ttft_p99_s", "ttft_p99_ms", "kv_usage"} of the site inputs (their defaults when unset), each
    refused naming its key when it is not what the catalogue says (the inputs stage checked them already; the
    filter may be given anything)."""
    site = site or {}

    def value(key):
        raw = site.get(key)
        return DEFAULTS[key] if raw is None or raw == "" else raw
    text, _ms = prometheus_duration("NARWHAL_ALERT_FOR", value("NARWHAL_ALERT_FOR"))
    ttft, usage = value("NARWHAL_ALERT_TTFT_P99_MS"), value("NARWHAL_ALERT_KV_USAGE")
    if isinstance(ttft, bool) or not NUMBER.match(str(ttft)) or float(ttft) <= 0:
        raise InputError("NARWHAL_ALERT_TTFT_P99_MS", "%r is not a positive number of milliseconds like 2000; correct "
                                                      "it in .env, then rerun the monitoring stage" % (ttft,))
    if isinstance(usage, bool) or not NUMBER.match(str(usage)) or not 0 < float(usage) <= 1:
        raise InputError("NARWHAL_ALERT_KV_USAGE", "%r is not a share above 0 and at most 1 like 0.95; correct it in "
                                                   ".env, then rerun the monitoring stage" % (usage,))
    ms = float(ttft)
    return {"for": text, "ttft_p99_ms": int(ms) if ms.is_integer() else ms, "ttft_p99_s": ms / 1000.0,
            "kv_usage": float(usage)}


def quote(value):
    """A PromQL string literal (double quotes; backslash, quote and line breaks escaped as Go's strconv reads them)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"%s"' % text


def selector(metric, *pairs):
    """metric{k="v", ...} of (label, value) pairs, in the given order."""
    return "%s{%s}" % (metric, ", ".join("%s=%s" % (k, quote(v)) for k, v in pairs))


def _number(value):
    """A threshold as PromQL reads it: 2 not 2.0, 0.95 as written."""
    return ("%d" % value) if float(value).is_integer() else repr(float(value))


def _alert(name, expr, severity, settings, summary, description, labels=()):
    return {"alert": name, "expr": expr, "for": settings["for"],
            "labels": dict([("severity", severity)] + list(labels)),
            "annotations": {"summary": summary, "description": description}}


def engine_rules(engines, name, settings):
    """An engine target down (one rule over the fleet's engines) and, per engine the fleet names, its `up` absent."""
    held = settings["for"]
    out = [_alert(
        "NarwhalEngineDown", "%s == 0" % selector("up", ("job", ENGINE_JOB), ("fleet", name)), PAGE, settings,
        "Engine {{ $labels.engine }} ({{ $labels.role }}, fleet {{ $labels.fleet }}) is down",
        "Prometheus has failed to scrape {{ $labels.engine }}'s /metrics at {{ $labels.instance }} for %s: its "
        "container is stopped or exited, its host or network is gone, or vLLM no longer answers; the routers take it "
        "out of their workers. ansible-playbook narwhal.deploy.status shows it, and with -e narwhal_repair=true "
        "starts it again as recorded (%s); a host that is gone: %s." % (held, CRASHES, LOST_HOST))]
    for group in engines:
        engine, role = group["labels"]["engine"], group["labels"]["role"]
        series = selector("up", ("job", ENGINE_JOB), ("fleet", name), ("engine", engine))
        out.append(_alert(
            "NarwhalEngineMissing", "absent(%s)" % series, TICKET, settings,
            "Engine %s (%s) of fleet %s is not scraped" % (engine, role, name),
            "The fleet names %s (%s) but Prometheus has held no `up` series of it for %s: Prometheus does not read "
            "the targets file, or reads one older than the fleet, so nothing would show this engine down. Rerun "
            "the monitoring stage (ansible-playbook narwhal.deploy.monitoring), check the scrape job that reads "
            "narwhal-targets.json (%s) and reload Prometheus for the rules it rewrote."
            % (engine, role, held, POINTING),
            [("fleet", name), ("engine", engine), ("role", role)]))
    return out


def router_rules(routers, workers, name, settings):
    """A router target down (one rule) and, per router, its `up` absent; per fleet engine, a router holding it
    unhealthy; per router and engine, a router that serves without it (no health series of its URL)."""
    held = settings["for"]
    out = [_alert(
        "NarwhalRouterDown", "%s == 0" % selector("up", ("job", ROUTER_JOB), ("fleet", name)), PAGE, settings,
        "Router {{ $labels.router }} (fleet {{ $labels.fleet }}) is down",
        "Prometheus has failed to scrape the metrics of router {{ $labels.router }} at {{ $labels.instance }} for "
        "%s: its container is stopped or its host is gone, and the clients that use it get no answer. "
        "ansible-playbook narwhal.deploy.status shows it (the routers' table); the router stage starts it again "
        "(ansible-playbook narwhal.deploy.router; %s)." % (held, ROUTER_STATUS))]
    for group in routers:
        router = group["labels"]["router"]
        out.append(_alert(
            "NarwhalRouterMissing", "absent(%s)" % selector("up", ("job", ROUTER_JOB), ("fleet", name),
                                                            ("router", router)), TICKET, settings,
            "Router %s of fleet %s is not scraped" % (router, name),
            "The inventory's routers group holds %s but Prometheus has held no `up` series of it for %s. Rerun the "
            "monitoring stage (ansible-playbook narwhal.deploy.monitoring), check the scrape job (%s) and reload "
            "Prometheus for the rules it rewrote." % (router, held, POINTING),
            [("fleet", name), ("router", router)]))
    for worker in workers:
        engine, role, url = worker["engine"], worker["role"], worker["url"]
        health = selector("vllm_router_worker_health", ("job", ROUTER_JOB), ("fleet", name), ("worker", url))
        out.append(_alert(
            "NarwhalRouterWorkerUnhealthy", "%s == 0" % health, PAGE, settings,
            "Router {{ $labels.router }} holds engine %s (%s) as unhealthy" % (engine, role),
            "vllm-router's health checks of %s at %s have failed for %s (vllm_router_worker_health 0): the router "
            "sends it no requests. With NarwhalEngineDown for %s too, the engine is down: repair it (%s); with the "
            "engine up, the router cannot reach it (its network, TLS: the routers' table of ansible-playbook "
            "narwhal.deploy.status)." % (engine, url, held, engine, CRASHES), [("engine", engine), ("role", role)]))
        for group in routers:
            router = group["labels"]["router"]
            series = selector("vllm_router_worker_health", ("job", ROUTER_JOB), ("fleet", name), ("router", router),
                              ("worker", url))
            up = selector("up", ("job", ROUTER_JOB), ("fleet", name), ("router", router))
            out.append(_alert(
                "NarwhalRouterWorkerMissing", "absent(%s) and on () (%s == 1)" % (series, up), PAGE, settings,
                "Router %s serves without engine %s (%s)" % (router, engine, role),
                "Router %s answers but has reported no worker %s (%s's URL) for %s: it was started without it (a "
                "launch or a repair that did not put it back) and sends it no requests. ansible-playbook "
                "narwhal.deploy.status -e narwhal_repair=true puts back an engine a router no longer holds (%s); "
                "the router stage gives the routers the whole fleet again." % (router, url, engine, held, CRASHES),
                [("engine", engine), ("role", role)]))
    return out


def _per_engine(expr):
    return "sum by (fleet, engine, role) (%s)" % expr


def transfer_rules(name, settings):
    """NIXL failures and expired KV leases: a counter of an engine that grew within WINDOW, for `for`."""
    held, where = settings["for"], (("job", ENGINE_JOB), ("fleet", name))

    def grew(metric):
        return "%s > 0" % _per_engine("increase(%s[%s])" % (selector(metric, *where), WINDOW))
    return [
        _alert("NarwhalNixlTransfersFailed",
               "%s or %s" % (grew("vllm:nixl_num_failed_transfers_total"),
                             grew("vllm:nixl_num_failed_notifications_total")),
               PAGE, settings,
               "Engine {{ $labels.engine }} ({{ $labels.role }}) failed NIXL KV transfers",
               "vllm:nixl_num_failed_transfers (failed transfers, handshakes and notifications) or "
               "vllm:nixl_num_failed_notifications of {{ $labels.engine }} grew within %s, for %s: requests whose KV "
               "did not arrive failed (NARWHAL_KV_LOAD_FAILURE_POLICY=fail) or were computed again. Probe the pairs "
               "(ansible-playbook narwhal.deploy.probe) and read the engine's log (%s)." % (WINDOW, held, PROBE)),
        _alert("NarwhalKvLeasesExpired", grew("vllm:nixl_num_kv_expired_reqs_total"), PAGE, settings,
               "Engine {{ $labels.engine }} ({{ $labels.role }}) let KV leases expire",
               "vllm:nixl_num_kv_expired_reqs of {{ $labels.engine }} grew within %s, for %s: a decode did not read "
               "a request's KV within its lease (NARWHAL_KV_LEASE_SECONDS) and the prefill released the blocks; the "
               "decodes are slow, queued or gone. Raise the lease or find what delays the decodes (%s)."
               % (WINDOW, held, PROBE)),
        _alert("NarwhalKvReadAfterExpiry", grew("vllm:nixl_num_notifications_after_expiry_total"), PAGE, settings,
               "A decode read KV blocks engine {{ $labels.engine }} had released",
               "vllm:nixl_num_notifications_after_expiry of {{ $labels.engine }} grew within %s, for %s: a decode "
               "finished reading blocks whose lease had expired and that may have been reused, so its answer may be "
               "wrong although it was HTTP 200 (vLLM issues 25562 and 52234). Raise the lease or find what delays "
               "the decodes (%s)." % (WINDOW, held, PROBE)),
    ]


def load_rules(name, settings):
    """KV cache nearly full, TTFT p99 over the objective (by role), a waiting queue that keeps growing."""
    held, where = settings["for"], (("job", ENGINE_JOB), ("fleet", name))
    usage, ttft_ms = settings["kv_usage"], settings["ttft_p99_ms"]
    buckets = "rate(%s[%s])" % (selector("vllm:time_to_first_token_seconds_bucket", *where), WINDOW)
    waiting = selector("vllm:num_requests_waiting", *where)
    return [
        _alert("NarwhalKvCacheNearlyFull", "max by (fleet, engine, role) (%s) > %s"
               % (selector("vllm:kv_cache_usage_perc", *where), _number(usage)), TICKET, settings,
               "Engine {{ $labels.engine }} ({{ $labels.role }}): KV cache over %s%% full"
               % _number(round(usage * 100, 6)),
               "vllm:kv_cache_usage_perc of {{ $labels.engine }} has stayed above %s (NARWHAL_ALERT_KV_USAGE) for "
               "%s: new requests wait for blocks and a decode preempts running ones. Add engines of this role, "
               "give the KV cache more memory (--gpu-memory-utilization or --kv-cache-memory-bytes in "
               "NARWHAL_EXTRA_ARGS), or admit less load at the router." % (_number(usage), held)),
        _alert("NarwhalTtftP99OverObjective", "histogram_quantile(0.99, sum by (le, fleet, role) (%s)) > %s"
               % (buckets, _number(settings["ttft_p99_s"])), PAGE, settings,
               "{{ $labels.role }} engines of fleet {{ $labels.fleet }}: time to first token p99 over %s ms"
               % _number(ttft_ms),
               "The p99 of vllm:time_to_first_token_seconds over the {{ $labels.role }} engines in the last %s has "
               "stayed above the objective, %s ms (NARWHAL_ALERT_TTFT_P99_MS), for %s. A decode counts from the "
               "request's arrival at the decode (the KV transfer included), a prefill its prefill; a client waits "
               "for both. Waiting requests or a full KV cache on the dashboard mean too few engines of that role "
               "for the load." % (WINDOW, _number(ttft_ms), held)),
        _alert("NarwhalWaitingRequestsGrowing", "max by (fleet, engine, role) (min_over_time(%s[%s]) > 0 and "
               "deriv(%s[%s]) > 0)" % (waiting, WINDOW, waiting, WINDOW), TICKET, settings,
               "Engine {{ $labels.engine }} ({{ $labels.role }}): its waiting queue keeps growing",
               "vllm:num_requests_waiting of {{ $labels.engine }} has not been empty for %s and has grown over it "
               "(deriv above 0), for %s: the engine takes requests slower than they come. A burst that drains does "
               "not fire this. Add engines of its role or admit less load at the router." % (WINDOW, held)),
    ]


def rules(fleet, routers, name, site=None):
    """The rules document of the fleet: one group, narwhal-<fleet>; the engines' and routers' rules, then the
    transfers' and the load's. Refuses what the targets refuse (targets.py), naming the entry or the record, and an
    alert input that is not what the catalogue says, naming it."""
    settings = alert_settings(site)
    engines = engine_targets(fleet, name)
    router_groups = router_targets(routers or [], name)
    workers = []
    if router_groups:  # every router of the fleet fronts every engine (_router/plan.py::fleet_workers)
        split = fleet_workers(fleet)
        workers = [dict(w, role=role) for role in ("prefill", "decode") for w in split[role]]
        order = [g["labels"]["engine"] for g in engines]
        workers.sort(key=lambda w: order.index(w["engine"]))
    return {"groups": [{"name": "narwhal-%s" % name,
                        "rules": (engine_rules(engines, name, settings)
                                  + (router_rules(router_groups, workers, name, settings) if router_groups else [])
                                  + transfer_rules(name, settings) + load_rules(name, settings))}]}
