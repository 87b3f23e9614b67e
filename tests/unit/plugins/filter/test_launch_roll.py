"""The filters launch_roll_records, launch_roll, router_access and router_moves (plugins/filter/narwhal.py) over the
variables the launch role sets on each host and the files a playbook reads: the roll of a launch, as the launch
playbook asks for it."""

import copy
import json

import pytest
from ansible.errors import AnsibleFilterError
from test_support.prepare import HAND_LAUNCH, compatible

from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

BASE = compatible(copy.deepcopy(HAND_LAUNCH))["engines"]["engine-1"]
FLEET = [{"engine": "engine-%d" % i, "role": role, "url": "http://10.0.0.%d:8000/" % i}
         for i, role in enumerate(["prefill", "prefill", "decode", "decode"], 1)]
RUNS = "/p/runs"


def rec(engine, role, vllm):
    record = copy.deepcopy(BASE)
    record.update(engine=engine, role=role)
    record["runtime"]["vllm_version"] = vllm
    return json.dumps(record)


def hosts(action, running="run-old", installed="run-new"):
    return [{"inventory_hostname": "host-%d" % i, "narwhal_engine": "engine-%d" % i, "launch_action": action,
             "launch_runs": {"running": running, "installed": installed}} for i in range(1, 5)]


def texts(old, new):
    out = {}
    for entry in FLEET:
        engine = entry["engine"]
        out["%s/run-old/%s/engine-launch.%s.json" % (RUNS, engine, engine)] = rec(engine, entry["role"], old)
        out["%s/run-new/%s/engine-launch.%s.json" % (RUNS, engine, engine)] = rec(engine, entry["role"], new)
    return out


def test_the_records_read_are_the_installed_and_for_a_replace_the_running_ones():
    assert filters.launch_roll_records(hosts("replace")[:1], RUNS) == [
        "/p/runs/run-new/engine-1/engine-launch.engine-1.json", "/p/runs/run-old/engine-1/engine-launch.engine-1.json"]
    assert filters.launch_roll_records(hosts("start")[:1], RUNS) == [
        "/p/runs/run-new/engine-1/engine-launch.engine-1.json"]


def test_an_upgrade_of_the_2p2d_fleet_rolls_by_sets_on_the_inventory_hosts():
    plan = filters.launch_roll(hosts("replace"), FLEET, RUNS, texts("0.33.0", "0.33.1"))
    assert plan["kind"] == "sets"
    assert plan["phase_hosts"] == [["host-1", "host-3"], ["host-2", "host-4"]]
    assert plan["phases"][0]["serving_before"] == {"prefill": ["http://10.0.0.2:8000"],
                                                   "decode": ["http://10.0.0.4:8000"]}
    assert plan["phase_pairs"][0] == [["engine-1", "engine-3"], ["engine-3", "engine-1"]]
    assert len(plan["proven"]) == 8  # every pair of the fleet, each once
    assert plan["engine_pairs"]["engine-3"] == plan["phase_pairs"][0]
    assert plan["lines"][0].startswith("roll: sets - the NIXL compatibility changes fleet-wide")


def test_an_unchanged_fleet_reads_nothing_and_rolls_nothing():
    plan = filters.launch_roll(hosts("unchanged"), FLEET, RUNS, texts("0.33.0", "0.33.0"))
    assert plan["kind"] == "none" and plan["phases"] == [] and plan["proven"] == []
    assert filters.launch_roll_records(hosts("unchanged")[:1], RUNS) == [
        "/p/runs/run-new/engine-1/engine-launch.engine-1.json"]


def test_narwhal_roll_outage_takes_accept_or_nothing():
    with pytest.raises(AnsibleFilterError, match="narwhal_roll_outage='yes'"):
        filters.launch_roll(hosts("replace"), FLEET, RUNS, texts("0.33.0", "0.33.1"), outage="yes")


SITE = {"site": {"NARWHAL_ROUTER_DIR": "/opt/narwhal-router/"}}


def test_a_router_is_reached_at_its_recorded_bind_and_port_with_the_files_of_its_directory():
    record = {"host": "router-1", "url": "https://router.example:8443", "bind": "10.0.1.1",
              "workers": {"prefill": [{"engine": "engine-1", "url": "http://10.0.0.1:8000"}], "decode": []}}
    plain = dict(record, url="http://10.0.1.1:8080", bind="0.0.0.0")
    assert filters.router_access([record, plain], SITE) == [
        {"host": "router-1", "url": "https://10.0.1.1:8443", "dir": "/opt/narwhal-router",
         "api_key_file": "/opt/narwhal-router/api.key", "ca_file": "/opt/narwhal-router/tls/ca.crt",
         "workers": {"prefill": ["http://10.0.0.1:8000"], "decode": []}},
        {"host": "router-1", "url": "http://127.0.0.1:8080", "dir": "/opt/narwhal-router",
         "api_key_file": "/opt/narwhal-router/api.key", "ca_file": "",
         "workers": {"prefill": ["http://10.0.0.1:8000"], "decode": []}}]


def test_router_moves_names_its_direction():
    with pytest.raises(AnsibleFilterError, match="direction 'up'"):
        filters.router_moves([], "up")
