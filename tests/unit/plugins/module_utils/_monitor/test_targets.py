"""Prometheus file_sd targets of the fleet (plugins/module_utils/_monitor/targets.py): one group per engine and per
router, their labels, IPv6 in brackets, a fixed order, and the refusals that name the fleet entry."""
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import prometheus_scrape, prometheus_targets
from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import (
    ENGINE_JOB,
    ROUTER_JOB,
    SCRAPE_JOB,
    file_sd,
    fleet_name,
    scrape_config,
)

# the resolved fleet (the fleet lookup's answer), out of order on purpose
FLEET = [
    {"engine": "engine-10", "role": "decode", "url": "http://[fd00:6e77:f1::1a]:8000", "iid": "x"},
    {"engine": "engine-2", "role": "decode", "url": "http://172.31.241.12:8000/"},
    {"engine": "engine-1", "role": "prefill", "url": "https://gpu-1.example:8443"},
]
ROUTERS = [
    {"host": "router-2", "url": "http://10.0.0.22:30000", "metrics_url": "http://[fd00::22]:29000/metrics"},
    {"host": "router-1", "url": "http://10.0.0.21:30000", "metrics_url": "http://10.0.0.21:29000/metrics"},
]


def test_one_group_per_engine_and_router_with_the_fleet_labels():
    doc = file_sd(FLEET, ROUTERS, "fleet.lab")
    assert doc == [
        {"targets": ["gpu-1.example:8443"],
         "labels": {"job": ENGINE_JOB, "engine": "engine-1", "role": "prefill", "host": "gpu-1.example",
                    "fleet": "fleet.lab", "__scheme__": "https", "__metrics_path__": "/metrics"}},
        {"targets": ["172.31.241.12:8000"],
         "labels": {"job": ENGINE_JOB, "engine": "engine-2", "role": "decode", "host": "172.31.241.12",
                    "fleet": "fleet.lab", "__scheme__": "http", "__metrics_path__": "/metrics"}},
        {"targets": ["[fd00:6e77:f1::1a]:8000"],
         "labels": {"job": ENGINE_JOB, "engine": "engine-10", "role": "decode", "host": "fd00:6e77:f1::1a",
                    "fleet": "fleet.lab", "__scheme__": "http", "__metrics_path__": "/metrics"}},
        {"targets": ["10.0.0.21:29000"],
         "labels": {"job": ROUTER_JOB, "router": "router-1", "role": "router", "host": "10.0.0.21",
                    "fleet": "fleet.lab", "__scheme__": "http", "__metrics_path__": "/metrics"}},
        {"targets": ["[fd00::22]:29000"],
         "labels": {"job": ROUTER_JOB, "router": "router-2", "role": "router", "host": "fd00::22",
                    "fleet": "fleet.lab", "__scheme__": "http", "__metrics_path__": "/metrics"}},
    ]


def test_the_order_and_bytes_do_not_depend_on_the_fleet_order():
    one = json.dumps(file_sd(FLEET, ROUTERS, "fleet"), sort_keys=True)
    assert json.dumps(file_sd(FLEET[::-1], ROUTERS[::-1], "fleet"), sort_keys=True) == one


def test_a_site_without_routers_has_engine_targets_only():
    assert [g["labels"]["job"] for g in file_sd(FLEET, [], "fleet")] == [ENGINE_JOB] * 3


def test_a_url_path_prefixes_the_metrics_path():
    fleet = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.1:8000/vllm/"}]
    assert file_sd(fleet, [], "fleet")[0]["labels"]["__metrics_path__"] == "/vllm/metrics"


@pytest.mark.parametrize("path, name", [("config/fleet.json", "fleet"),
                                        ("/srv/site/config/fleet.lab.json", "fleet.lab"), ("fleets/a", "a")])
def test_the_fleet_label_is_the_fleet_files_name(path, name):
    assert fleet_name(path) == name


@pytest.mark.parametrize("url", ["ftp://10.0.0.1:21", "http://10.0.0.1", "http://:8000", "10.0.0.1:8000",
                                 "http://10.0.0.1:0", "http://10.0.0.1:70000", "http://fd00::1:8000",
                                 "http://[10.0.0.1]:8000", "http://10.0.0.1:8000?x=1",
                                 "${NARWHAL_NODE_2_URL}", None, 8000])
def test_a_url_that_is_no_target_is_refused_naming_the_engine(url):
    assert split_url(url) is None
    fleet = [FLEET[2], {"engine": "engine-2", "role": "decode", "url": url}]
    with pytest.raises(PlanError) as err:
        file_sd(fleet, [], "fleet")
    assert "NARWHAL_FLEET: engine-2 has URL %r" % url in str(err.value)
    assert "http or https URL with a host and a port" in str(err.value)


@pytest.mark.parametrize("fleet, words", [
    ({"engines": FLEET}, "not a list"),
    ([FLEET[0], "engine-2"], "entry 1 is not an object"),
    ([{"role": "decode", "url": "http://10.0.0.1:8000"}], "entry 0 has no engine name"),
    ([{"engine": "engine-3", "role": "router", "url": "http://10.0.0.1:8000"}], "engine-3 has role 'router'"),
    ([FLEET[1], {"engine": "engine-4", "role": "decode", "url": "http://172.31.241.12:8000"}],
     "engine-2 and engine-4 have the same metrics endpoint"),
])
def test_a_fleet_prometheus_cannot_scrape_is_refused_by_name(fleet, words):
    with pytest.raises(PlanError) as err:
        file_sd(fleet, [], "fleet")
    assert words in str(err.value)


def test_a_router_record_without_its_metrics_url_is_refused_by_name():
    with pytest.raises(PlanError) as err:
        file_sd(FLEET, [{"host": "router-1", "url": "http://10.0.0.21:30000"}], "fleet")
    assert "runs/routers/router-1.json: router router-1 has URL None" in str(err.value)
    assert "rerun the router stage" in str(err.value)


def test_the_filter_names_the_fleet_from_its_file():
    doc = prometheus_targets(FLEET, ROUTERS, "/srv/site/config/fleet.lab.json")
    assert {g["labels"]["fleet"] for g in doc} == {"fleet.lab"}


SECRET = "Zq7yK3pW9mXv2LtR"  # shaped like no token redact_text knows


@pytest.mark.parametrize("url", ["https://narwhal:%s@10.0.0.12:8000" % SECRET, "https://%s@10.0.0.12:8000" % SECRET,
                                 "http://u:%s/x@10.0.0.12:8000" % SECRET])
def test_an_engine_url_with_credentials_is_refused_by_the_one_rule_and_never_shown(url):
    fleet = [FLEET[2], {"engine": "engine-2", "role": "decode", "url": url}]
    with pytest.raises(PlanError) as err:
        file_sd(fleet, [], "fleet")
    assert str(err.value).startswith("NARWHAL_FLEET: engine-2, field url: the URL http")
    assert "carries user information" in str(err.value) and "<redacted>@" in str(err.value)
    assert SECRET not in str(err.value) and err.value.key == "NARWHAL_FLEET"
    with pytest.raises(AnsibleFilterError) as err:
        prometheus_targets(fleet, [], "config/fleet.json")
    assert "engine-2, field url" in str(err.value) and SECRET not in str(err.value)


def test_a_router_metrics_url_with_credentials_is_refused_naming_its_record():
    routers = [dict(ROUTERS[1], metrics_url="https://prom:%s@10.0.0.21:29000/metrics" % SECRET)]
    with pytest.raises(PlanError) as err:
        file_sd(FLEET, routers, "fleet")
    assert str(err.value).startswith("runs/routers/router-1.json: router router-1, field metrics_url: the URL "
                                     "https://<redacted>@10.0.0.21:29000/metrics carries user information")
    assert str(err.value).endswith("rerun the router stage (narwhal.deploy.router) to record it again")
    assert SECRET not in str(err.value)


def test_with_tls_the_targets_carry_the_https_scheme_of_the_fleet():
    fleet = [{"engine": "engine-1", "role": "prefill", "url": "https://10.0.0.11:8000"},
             {"engine": "engine-2", "role": "decode", "url": "https://[fd00::12]:8000"}]
    routers = [{"host": "router-1", "metrics_url": "https://10.0.0.21:29000/metrics"}]
    assert [g["labels"]["__scheme__"] for g in file_sd(fleet, routers, "fleet")] == ["https"] * 3


def test_the_scrape_fragment_reads_the_targets_and_with_tls_verifies_against_the_ca():
    targets, ca = "/srv/site/config/prometheus/narwhal-targets.json", "/srv/site/config/tls/ca.crt"
    assert scrape_config(targets, ca) == {"scrape_configs": [{
        "job_name": SCRAPE_JOB, "file_sd_configs": [{"files": [targets]}], "tls_config": {"ca_file": ca}}]}
    # NARWHAL_TLS=off: no tls_config (Prometheus refuses a configuration whose ca_file it cannot read)
    assert scrape_config(targets) == {"scrape_configs": [{"job_name": "narwhal",
                                                          "file_sd_configs": [{"files": [targets]}]}]}
    assert prometheus_scrape(targets, "") == scrape_config(targets) and prometheus_scrape(targets, ca) == \
        scrape_config(targets, ca)


@pytest.mark.parametrize("targets, ca, words", [
    ("config/prometheus/narwhal-targets.json", None, "the targets file 'config/prometheus/narwhal-targets.json'"),
    ("/srv/t.json", "config/tls/ca.crt", "the CA certificate 'config/tls/ca.crt'"),
    (None, None, "the targets file None")])
def test_the_scrape_fragment_takes_absolute_paths_only(targets, ca, words):
    with pytest.raises(PlanError) as err:
        scrape_config(targets, ca)
    assert words in str(err.value) and "is not an absolute path" in str(err.value)
    with pytest.raises(AnsibleFilterError, match="not an absolute path"):
        prometheus_scrape(targets, ca)
