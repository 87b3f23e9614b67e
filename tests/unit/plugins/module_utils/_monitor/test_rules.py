"""The alert rules of the fleet (plugins/module_utils/_monitor/rules.py): every alert for a fleet with routers, the
rules generated per engine, router and router worker (absent() of what the fleet names), the alert inputs in every
rule, a fixed order, and the refusals that name the input or the fleet entry. test_rules_promtool.py proves with
promtool that each alert fires after its `for` and not before; tests/unit/roles/monitoring/test_prometheus.py fires
the engine-down and worker-unhealthy alerts in a real Prometheus."""
import json
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter.monitoring import prometheus_rules
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.rules import alert_settings, quote, rules

# the resolved fleet (the fleet lookup's answer), out of order on purpose; an IPv6 URL and a trailing '/'
FLEET = [
    {"engine": "engine-10", "role": "decode", "url": "http://[fd00:6e77:f1::1a]:8000", "iid": "x"},
    {"engine": "engine-2", "role": "decode", "url": "http://172.31.241.12:8000/"},
    {"engine": "engine-1", "role": "prefill", "url": "https://gpu-1.example:8443"},
]
ROUTERS = [
    {"host": "router-2", "url": "http://10.0.0.22:30000", "metrics_url": "http://[fd00::22]:29000/metrics"},
    {"host": "router-1", "url": "http://10.0.0.21:30000", "metrics_url": "http://10.0.0.21:29000/metrics"},
]
# the router's worker URL of each engine: the fleet's URL without a trailing '/' (_router/plan.py::fleet_workers)
URLS = {"engine-1": "https://gpu-1.example:8443", "engine-2": "http://172.31.241.12:8000",
        "engine-10": "http://[fd00:6e77:f1::1a]:8000"}
ALERTS = {"NarwhalEngineDown", "NarwhalEngineMissing", "NarwhalRouterDown", "NarwhalRouterMissing",
          "NarwhalRouterWorkerUnhealthy", "NarwhalRouterWorkerMissing", "NarwhalNixlTransfersFailed",
          "NarwhalKvLeasesExpired", "NarwhalKvReadAfterExpiry", "NarwhalKvCacheNearlyFull",
          "NarwhalTtftP99OverObjective", "NarwhalWaitingRequestsGrowing"}


def _rules(fleet=None, routers=None, name="fleet.lab", site=None):
    (group,) = rules(FLEET if fleet is None else fleet, ROUTERS if routers is None else routers, name, site)["groups"]
    assert group["name"] == "narwhal-%s" % name
    return group["rules"]


def _named(found, alert):
    return [r for r in found if r["alert"] == alert]


def test_every_alert_for_a_fleet_with_routers_with_a_severity_summary_and_description():
    found = _rules()
    assert {r["alert"] for r in found} == ALERTS
    for rule in found:
        assert list(rule) == ["alert", "expr", "for", "labels", "annotations"]
        assert rule["for"] == "2m"  # NARWHAL_ALERT_FOR's default
        assert rule["labels"]["severity"] in ("page", "ticket")
        assert set(rule["annotations"]) == {"summary", "description"}
        # the fleet it watches: its label in the selector, so two fleets' rules in one Prometheus stay apart
        assert 'fleet="fleet.lab"' in rule["expr"], rule["expr"]
    pages = {r["alert"] for r in found if r["labels"]["severity"] == "page"}
    assert pages == ALERTS - {"NarwhalEngineMissing", "NarwhalRouterMissing", "NarwhalKvCacheNearlyFull",
                              "NarwhalWaitingRequestsGrowing"}


def test_one_absent_rule_per_engine_of_the_fleet_in_natural_order_with_its_role():
    missing = _named(_rules(), "NarwhalEngineMissing")
    assert [(r["expr"], r["labels"]) for r in missing] == [
        ('absent(up{job="narwhal-engine", fleet="fleet.lab", engine="%s"})' % engine,
         {"severity": "ticket", "fleet": "fleet.lab", "engine": engine, "role": role})
        for engine, role in (("engine-1", "prefill"), ("engine-2", "decode"), ("engine-10", "decode"))]
    assert "engine-2 (decode)" in missing[1]["annotations"]["summary"]
    (down,) = _named(_rules(), "NarwhalEngineDown")
    assert down["expr"] == 'up{job="narwhal-engine", fleet="fleet.lab"} == 0'


def test_router_rules_per_router_and_per_worker_url_as_the_router_names_it():
    found = _rules()
    assert [r["expr"] for r in _named(found, "NarwhalRouterMissing")] == [
        'absent(up{job="narwhal-router", fleet="fleet.lab", router="router-%d"})' % n for n in (1, 2)]
    unhealthy = _named(found, "NarwhalRouterWorkerUnhealthy")
    assert [(r["expr"], r["labels"]["engine"], r["labels"]["role"]) for r in unhealthy] == [
        ('vllm_router_worker_health{job="narwhal-router", fleet="fleet.lab", worker="%s"} == 0' % URLS[engine],
         engine, role) for engine, role in (("engine-1", "prefill"), ("engine-2", "decode"), ("engine-10", "decode"))]
    missing = _named(found, "NarwhalRouterWorkerMissing")
    assert len(missing) == 2 * 3  # each router holds every engine of the fleet
    for rule in missing:
        router = re.search(r'router="(router-\d)"', rule["expr"]).group(1)
        engine = rule["labels"]["engine"]
        assert rule["expr"] == (
            'absent(vllm_router_worker_health{job="narwhal-router", fleet="fleet.lab", router="%s", worker="%s"}) '
            'and on () (up{job="narwhal-router", fleet="fleet.lab", router="%s"} == 1)'
            % (router, URLS[engine], router))
        assert router in rule["annotations"]["summary"] and engine in rule["annotations"]["summary"]


def test_a_site_without_routers_has_no_router_rules():
    names = {r["alert"] for r in _rules(routers=[])}
    assert names == ALERTS - {"NarwhalRouterDown", "NarwhalRouterMissing", "NarwhalRouterWorkerUnhealthy",
                              "NarwhalRouterWorkerMissing"}


def test_the_engine_rules_read_vllms_families_per_engine_of_the_fleet():
    found = {r["alert"]: r["expr"] for r in _rules()}
    where = 'job="narwhal-engine", fleet="fleet.lab"'
    assert found["NarwhalNixlTransfersFailed"] == (
        "sum by (fleet, engine, role) (increase(vllm:nixl_num_failed_transfers_total{%s}[5m])) > 0 or "
        "sum by (fleet, engine, role) (increase(vllm:nixl_num_failed_notifications_total{%s}[5m])) > 0"
        % (where, where))
    assert found["NarwhalKvLeasesExpired"] == (
        "sum by (fleet, engine, role) (increase(vllm:nixl_num_kv_expired_reqs_total{%s}[5m])) > 0" % where)
    assert found["NarwhalKvReadAfterExpiry"] == (
        "sum by (fleet, engine, role) (increase(vllm:nixl_num_notifications_after_expiry_total{%s}[5m])) > 0" % where)
    assert found["NarwhalKvCacheNearlyFull"] == (
        "max by (fleet, engine, role) (vllm:kv_cache_usage_perc{%s}) > 0.95" % where)
    assert found["NarwhalTtftP99OverObjective"] == (
        "histogram_quantile(0.99, sum by (le, fleet, role) (rate(vllm:time_to_first_token_seconds_bucket{%s}[5m]))) "
        "> 2" % where)
    assert found["NarwhalWaitingRequestsGrowing"] == (
        "max by (fleet, engine, role) (min_over_time(vllm:num_requests_waiting{%s}[5m]) > 0 and "
        "deriv(vllm:num_requests_waiting{%s}[5m]) > 0)" % (where, where))


def test_the_alert_inputs_reach_every_rule():
    site = {"NARWHAL_ALERT_FOR": "5s", "NARWHAL_ALERT_TTFT_P99_MS": 1500, "NARWHAL_ALERT_KV_USAGE": 0.9}
    found = _rules(site=site)
    assert {r["for"] for r in found} == {"5s"}
    by_name = {r["alert"]: r for r in found}
    assert by_name["NarwhalTtftP99OverObjective"]["expr"].endswith(" > 1.5")
    assert "1500 ms" in by_name["NarwhalTtftP99OverObjective"]["annotations"]["summary"]
    assert by_name["NarwhalKvCacheNearlyFull"]["expr"].endswith(" > 0.9")
    assert "over 90% full" in by_name["NarwhalKvCacheNearlyFull"]["annotations"]["summary"]
    assert "for 5s" in by_name["NarwhalEngineDown"]["annotations"]["description"]
    # the values the inputs stage gives (strings from .env in a filter's hands are read the same)
    assert alert_settings({"NARWHAL_ALERT_TTFT_P99_MS": "2500", "NARWHAL_ALERT_KV_USAGE": "1"}) == {
        "for": "2m", "ttft_p99_ms": 2500, "ttft_p99_s": 2.5, "kv_usage": 1.0}


def test_the_order_and_bytes_do_not_depend_on_the_fleet_order():
    one = json.dumps(rules(FLEET, ROUTERS, "fleet"), sort_keys=True)
    assert json.dumps(rules(FLEET[::-1], ROUTERS[::-1], "fleet"), sort_keys=True) == one


def test_a_label_value_is_quoted_as_promql_reads_it():
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    found = _rules(name='odd"fleet\\name')
    assert all('fleet="odd\\"fleet\\\\name"' in r["expr"] for r in found)


@pytest.mark.parametrize("site, key, words", [
    ({"NARWHAL_ALERT_FOR": "2 minutes"}, "NARWHAL_ALERT_FOR", "is not a Prometheus duration above zero"),
    ({"NARWHAL_ALERT_FOR": "0s"}, "NARWHAL_ALERT_FOR", "is zero"),
    ({"NARWHAL_ALERT_FOR": "1m2h"}, "NARWHAL_ALERT_FOR", "largest first"),
    ({"NARWHAL_ALERT_TTFT_P99_MS": "-5"}, "NARWHAL_ALERT_TTFT_P99_MS", "not a positive number of milliseconds"),
    ({"NARWHAL_ALERT_TTFT_P99_MS": True}, "NARWHAL_ALERT_TTFT_P99_MS", "not a positive number"),
    ({"NARWHAL_ALERT_KV_USAGE": 1.5}, "NARWHAL_ALERT_KV_USAGE", "not a share above 0 and at most 1"),
    ({"NARWHAL_ALERT_KV_USAGE": "95%"}, "NARWHAL_ALERT_KV_USAGE", "not a share"),
])
def test_a_bad_alert_input_is_refused_naming_it(site, key, words):
    with pytest.raises(InputError) as err:
        rules(FLEET, ROUTERS, "fleet", site)
    assert err.value.key == key and words in str(err.value)
    assert "rerun the monitoring stage" in str(err.value)


@pytest.mark.parametrize("fleet, routers, words", [
    ([dict(FLEET[0], role="both")], [], "engine-10 has role 'both', not prefill or decode"),
    ([dict(FLEET[0], url="ftp://x:1")], [], "engine-10 has URL 'ftp://x:1'"),
    (FLEET, [{"metrics_url": "http://10.0.0.21:29000/metrics"}], "record 0 names no router"),
    # a router fronts both roles: a fleet without a decode engine has no router to watch (the router stage refused it)
    ([FLEET[2]], ROUTERS, "the fleet has no decode engine"),
])
def test_what_the_targets_and_the_router_refuse_is_refused_naming_it(fleet, routers, words):
    with pytest.raises(PlanError) as err:
        rules(fleet, routers, "fleet")
    assert words in str(err.value)


def test_the_filter_takes_the_fleet_files_name_and_says_what_it_refuses():
    doc = prometheus_rules(FLEET, ROUTERS, "/srv/site/config/fleet.lab.json", {"NARWHAL_ALERT_FOR": "30s"})
    assert doc == rules(FLEET, ROUTERS, "fleet.lab", {"NARWHAL_ALERT_FOR": "30s"})
    with pytest.raises(AnsibleFilterError, match="NARWHAL_ALERT_FOR: '30' is not a Prometheus duration"):
        prometheus_rules(FLEET, ROUTERS, "config/fleet.json", {"NARWHAL_ALERT_FOR": "30"})
    with pytest.raises(AnsibleFilterError, match="takes the fleet file's path"):
        prometheus_rules(FLEET, ROUTERS, None)


def test_the_document_survives_yaml_as_the_role_writes_it():
    doc = rules(FLEET, ROUTERS, "fleet")
    assert yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)) == doc
