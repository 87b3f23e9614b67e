"""The filters repair_records and repair_plan (plugins/filter/repair.py) over the status documents a status run keeps
(status_engine) and the launch records the controller holds: what a status run with narwhal_repair=true does."""

import json

import pytest
from ansible.errors import AnsibleFilterError
from test_support.status_docs import FLEET, fleet_docs

from ansible_collections.narwhal.deploy.plugins.filter import repair as filters

RUNS = "/site/runs"


def record(vllm, nixl):
    return {"runtime": {"vllm_version": vllm, "nixl_distribution": "nixl",
                        "expected_packages": {"vllm": vllm, "nixl": nixl}, "kv_buffer_device": "cpu"}}


def path(engine):
    return "%s/run-1/%s/engine-launch.%s.json" % (RUNS, engine, engine)


def test_the_records_read_are_each_engines_installed_record_once():
    docs = fleet_docs() + [{"engine": "engine-1", "serving": False}]  # a host where nothing is installed
    assert filters.repair_records(docs, RUNS + "/") == [path(e["engine"]) for e in FLEET]


def test_a_restarted_prefill_restarts_the_decodes_its_records_pin_old_nixl_for():
    """engine-2's installed record pins NIXL 1.4.1, engine-4 has none on the controller: the launch config's."""
    docs = fleet_docs(engine_1={"restarts": 1, "started": "2026-12-03T09:00:00Z"},
                      engine_2={"host": "gpu-b.dc1"})
    texts = {path("engine-2"): json.dumps(record("0.32.0", "1.4.1"))}
    plan = filters.repair_plan(docs, FLEET, RUNS, texts, {"engine-4": record("0.33.0", "1.5.1")}, [], False)
    assert plan["restart"] == ["engine-2"] and list(plan["kept"]) == ["engine-4"]
    assert plan["hosts"] == ["gpu-b.dc1"]
    assert plan["lines"][0].startswith("engine-2: restart - it runs since before the process of engine-1")
    assert plan["lines"][1].startswith("engine-4: no restart - ")
    plan = filters.repair_plan(docs, FLEET, RUNS, texts, {}, [], True)
    assert plan["lines"][0].startswith("engine-2: would restart - ")
    # a decode recorded nowhere is restarted: the rule cannot clear it (no connector, no versions)
    assert "its connector unknown is not a pull connector" in plan["why"]["engine-4"]


def test_a_lost_engine_is_named_only_as_lost():
    docs = [d for d in fleet_docs(engine_2={"state": "exited"}) if d["engine"] != "engine-3"]
    plan = filters.repair_plan(docs, FLEET, RUNS, {}, {}, ["engine-3"])
    assert plan["order"] == ["engine-2"] and plan["hosts"] == ["engine-2"] and plan["out"] == ["engine-2", "engine-3"]
    assert plan["lines"][-1] == ("engine-3: left alone - a host of it is lost (unreachable, narwhal_lost): out of the "
                                 "routers, not repaired")


def test_bad_inputs_are_named():
    with pytest.raises(AnsibleFilterError, match="repair_plan takes the resolved fleet"):
        filters.repair_plan(fleet_docs(), "engine-1,engine-2", RUNS)
    with pytest.raises(AnsibleFilterError, match="lost must be a list of engines"):
        filters.repair_plan(fleet_docs(), FLEET, RUNS, lost="engine-1")
    with pytest.raises(AnsibleFilterError, match="the launch record %s does not parse" % path("engine-1")):
        filters.repair_plan(fleet_docs(), FLEET, RUNS, {path("engine-1"): "{"})
