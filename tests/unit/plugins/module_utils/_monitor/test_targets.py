"""Prometheus file_sd targets of the fleet (plugins/module_utils/_monitor/targets.py): one group per engine and per
router, their labels, IPv6 in brackets, a fixed order, and the refusals that name the fleet entry."""
import json

import pytest

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import prometheus_targets
from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import (
    ENGINE_JOB,
    ROUTER_JOB,
    file_sd,
    fleet_name,
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
                                 "http://[10.0.0.1]:8000", "http://user@10.0.0.1:8000", "http://10.0.0.1:8000?x=1",
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
