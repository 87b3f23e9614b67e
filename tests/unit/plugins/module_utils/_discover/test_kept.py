# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine whose host is unreachable in this run (issue 36, item 3): discovery keeps its last record
(plugins/module_utils/_discover/kept.py, collect_records and discovery_outputs of _discover/outputs.py, build_fleet of
_discover/fleet.py) rather than writing a fleet without it, or refuses by name when it has none to keep. The
discovery_outputs step is run as its action plugin runs it, over a 2 prefill + 2 decode site of four hosts."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest
from test_support.records import BASE, host, iface, model, nvidia, snapshot

from ansible_collections.narwhal.deploy.plugins.module_utils._discover import outputs as _discovery_outputs
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.kept import KEPT_NOTE
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    FLEET_SCHEMA,
    LAUNCH_CONFIG_SCHEMA,
    validation_errors,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import shared_hosts

ENGINES = ("engine-1", "engine-2", "engine-3", "engine-4")
# engine-1 and engine-3 prefill, engine-2 and engine-4 decode, each on a host of its own
SITE = dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_CONFIG_DIR="config", NARWHAL_FLEET="config/fleet.json",
            NARWHAL_LAUNCH_CONFIG="config/engine-launch.local.json", NARWHAL_NODE_3_ROLE="prefill",
            NARWHAL_NODE_4_ROLE="decode")
# what hostvars give the action plugin for a host the opening play could not reach: no facts
NO_FACTS = {"gpus": None, "rdma": None, "image": None, "model": None}
MIXTRAL = "aiconf__mistralai--Mixtral-8x7B-v0.1"
# engine-1: DP 4 / EP over two hosts (engine-1 the head, gpu-a18 its narwhal_rank 1)
SPREAD = {"NARWHAL_NODE_1_HOSTS": "2", "NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "4",
          "NARWHAL_NODE_1_ENABLE_EXPERT_PARALLEL": "true"}


@pytest.fixture
def run_module(step_runner):
    return lambda args: step_runner("discovery_outputs", args)


def site_args(root, facts, extra=None, lost=(), moved=None):
    """discovery_outputs' arguments for the 2P2D site; `lost`: the engine hosts unreachable (no facts, as hostvars
    give them), `moved`: {engine: another address}."""
    inputs = load_inputs(dict(SITE, **(extra or {})))
    addresses = dict(("engine-%d" % n, "10.0.0.%d" % (10 + n)) for n in range(1, 5))
    addresses.update(moved or {})
    args = {"site": {"site": inputs["site"], "nodes": {str(k): v for k, v in inputs["nodes"].items()}},
            "engines": list(ENGINES), "root": str(root),
            "interfaces": dict((e, iface(addresses[e], "box-%s" % e[-1])) for e in ENGINES),
            "hosts": dict((e, facts) for e in ENGINES), "lost": list(lost)}
    for engine in lost:
        args["interfaces"][engine], args["hosts"][engine] = None, dict(NO_FACTS)
    return args


def env_lines(root, n):
    text = (root / "config" / "deployment.env").read_text()
    return [line for line in text.splitlines() if line.startswith("NARWHAL_NODE_%d_" % n)]


def fleet_entry(root, engine):
    return [e for e in json.loads((root / "config" / "fleet.json").read_text()) if e["engine"] == engine]


def record_text(root, engine):
    """The record of `engine` as the launch config's text holds it (indented as written)."""
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    return json.dumps({"version": 1, "engines": {engine: launch["engines"][engine]}}, indent=2)


@pytest.fixture
def first(tmp_path, dev, run_module):
    """A discovery of the whole site: (root, facts, snapshot)."""
    root = tmp_path / "checkout"
    root.mkdir()
    facts = host(nvidia(tmp_path / "dev"), tmp_path)
    status, result = run_module(site_args(root, facts))
    assert status == "exit" and result["kept"] == [], result
    return root, facts, snapshot(root)


def test_a_lost_engine_keeps_its_outputs_byte_for_byte_and_the_rest_is_rediscovered(first, run_module):
    root, facts, before = first
    kept = {"env": env_lines(root, 3), "fleet": fleet_entry(root, "engine-3"), "record": record_text(root, "engine-3")}
    # engine-3's host is unreachable; engine-1 came back with another address
    status, result = run_module(site_args(root, facts, lost=["engine-3"], moved={"engine-1": "10.0.0.21"}))
    assert status == "exit", result
    assert result["changed"] is True and result["kept"] == ["engine-3"]
    assert [row.get("note") for row in result["table"]] == [None, None, KEPT_NOTE, None]
    assert any("engine-3 is unreachable in this run" in w and "kept its last record" in w
               for w in result["warnings"])
    after = snapshot(root)
    # engine-3: its lines, its fleet entry, its record and its extract as they were (the extract not even rewritten)
    assert env_lines(root, 3) == kept["env"] and fleet_entry(root, "engine-3") == kept["fleet"]
    assert record_text(root, "engine-3") == kept["record"]
    extract = "config/engine-launch.engine-3.inspection.json"
    assert after[extract] == before[extract]
    # the others are discovered: engine-1's new address in deployment.env, its record and its extract
    assert "NARWHAL_NODE_1_IP=10.0.0.21" in env_lines(root, 1)
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert launch["engines"]["engine-1"]["node"]["address"] == "10.0.0.21"
    assert after["config/engine-launch.engine-1.inspection.json"][0] != \
        before["config/engine-launch.engine-1.inspection.json"][0]
    assert list(launch["engines"]) == list(ENGINES)
    # still one consistent set: the schemas pass and the index holds every extract's and the launch config's sha256
    assert validation_errors(launch, LAUNCH_CONFIG_SCHEMA) == []
    assert validation_errors(json.loads((root / "config" / "fleet.json").read_text()), FLEET_SCHEMA) == []
    index = json.loads((root / "config" / "engine-launch.sources.json").read_text())
    for name, digest in index["files"].items():
        assert hashlib.sha256((root / "config" / name).read_bytes()).hexdigest() == digest
    assert index["launch_config_sha256"] == hashlib.sha256(
        (root / "config" / "engine-launch.local.json").read_bytes()).hexdigest()
    # engine-3 back: discovered again, the same facts give the same record
    status, result = run_module(site_args(root, facts, moved={"engine-1": "10.0.0.21"}))
    assert status == "exit" and result["kept"] == [] and record_text(root, "engine-3") == kept["record"]


def refusal(root, run_module, args, key, words):
    snap = snapshot(root)
    status, result = run_module(args)
    assert status == "fail" and result["input"] == key, result
    assert result["msg"].startswith("discovery refused its inputs, nothing was written")
    for text in words:
        assert text in result["msg"], result["msg"]
    assert snapshot(root) == snap
    return result["msg"]


def test_a_lost_engine_without_earlier_outputs_is_refused_and_nothing_is_written(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    facts = host(nvidia(tmp_path / "dev"), tmp_path)
    args = dict(site_args(root, facts, lost=["gpu-c3"]), lost_engines={"engine-3": ["gpu-c3"]})
    refusal(root, run_module, args, "gpu-c3",
            ["the host gpu-c3 of engine-3 is unreachable in this run and discovery has no earlier record of engine-3",
             "so it would write a fleet without it", "bring gpu-c3 back", "ansible gpu-c3 -m ansible.builtin.ping",
             "rerun discovery (ansible-playbook narwhal.deploy.discover)", "take engine-3 out of the fleet",
             "remove gpu-c3 from the inventory and the NARWHAL_NODE_3_* inputs from .env"])
    assert not list(snapshot(root))


@pytest.mark.parametrize("change, extra, key, words", [
    # its extract is not the one discovery wrote
    ("extract", None, "engine-3", ["its inspection extract engine-launch.engine-3.inspection.json is not the one "
                                   "the sources index records"]),
    # its record is gone from the launch config (and the index, rewritten to match)
    ("record", None, "engine-3", ["the launch config has no record of it"]),
    ("env", None, "engine-3", ["has no NARWHAL_NODE_3_URL"]),
    # a site input its record comes from changed since: keeping it would write a stale record
    (None, {"NARWHAL_BLOCK_SIZE": "32"}, "NARWHAL_BLOCK_SIZE",
     ["so discovery would keep its last record, but that record was discovered from other inputs: "
      "NARWHAL_BLOCK_SIZE was 16, .env has 32", "undo the change until engine-3 is back"]),
    (None, {"NARWHAL_NODE_3_ENGINE_PORT": "8100"}, "NARWHAL_NODE_3_ENGINE_PORT", ["was unset, .env has 8100"]),
])
def test_a_lost_engine_whose_outputs_cannot_be_kept_is_refused(first, run_module, change, extra, key, words):
    root, facts, _before = first
    config = root / "config"
    if change == "extract":
        path = config / "engine-launch.engine-3.inspection.json"
        path.write_text(path.read_text().replace("10.0.0.13", "10.0.0.99"))
    elif change == "record":
        launch = json.loads((config / "engine-launch.local.json").read_text())
        del launch["engines"]["engine-3"]
        text = json.dumps(launch, indent=2) + "\n"
        (config / "engine-launch.local.json").write_text(text)
        index = json.loads((config / "engine-launch.sources.json").read_text())
        index["launch_config_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        (config / "engine-launch.sources.json").write_text(json.dumps(index, indent=2) + "\n")
    elif change == "env":
        text = (config / "deployment.env").read_text()
        (config / "deployment.env").write_text("".join(line for line in text.splitlines(True)
                                                       if not line.startswith("NARWHAL_NODE_3_URL=")))
    refusal(root, run_module, site_args(root, facts, extra, lost=["engine-3"]), key,
            ["the host engine-3 of engine-3 is unreachable in this run", "bring engine-3 back"] + words)


def test_another_engines_input_may_change_while_an_engine_is_kept(first, run_module):
    """The other engines' own inputs are theirs: engine-1's port changes, engine-3 (lost) keeps its record."""
    root, facts, _before = first
    kept = record_text(root, "engine-3")
    status, result = run_module(site_args(root, facts, {"NARWHAL_NODE_1_ENGINE_PORT": "8100"}, lost=["engine-3"]))
    assert status == "exit" and result["kept"] == ["engine-3"], result
    assert record_text(root, "engine-3") == kept and "NARWHAL_NODE_1_ENGINE_PORT=8100" in env_lines(root, 1)


def test_an_engine_across_two_hosts_with_one_lost_is_kept_whole(tmp_path, dev, run_module):
    """engine-1 spans its head (reachable, its facts changed since) and gpu-a18 (lost): its record with its members and
    both inspection extracts are kept as they were; engine-2 is discovered again."""
    root = tmp_path / "checkout"
    root.mkdir()
    facts = host(nvidia(tmp_path / "dev"), tmp_path, mdl=model(tmp_path, MIXTRAL))
    args = site_args(root, facts, SPREAD)
    args["members"] = {"engine-1": [{"host": "gpu-a18", "interface": iface("10.0.0.31", "box-1b"),
                                     "inspection": facts}]}
    status, result = run_module(copy.deepcopy(args))
    assert status == "exit", result
    before = snapshot(root)
    kept = record_text(root, "engine-1")
    assert json.loads(kept)["engines"]["engine-1"]["members"][0]["host"] == "gpu-a18"
    # gpu-a18 unreachable: no facts of it; the head answers with another interface speed, engine-2 moved
    args["members"]["engine-1"][0].update(interface=None, inspection=dict(NO_FACTS))
    args["interfaces"]["engine-1"]["speed"] = {"mbps": 100000, "virtual": False, "why": None}
    args["interfaces"]["engine-2"] = iface("10.0.0.22", "box-2")
    args["lost"] = ["gpu-a18"]
    status, result = run_module(args)
    assert status == "exit" and result["kept"] == ["engine-1"], result
    after = snapshot(root)
    assert record_text(root, "engine-1") == kept
    for name in ("engine-launch.engine-1.inspection.json", "engine-launch.engine-1.member-1.inspection.json"):
        assert after["config/" + name] == before["config/" + name], name
    assert "NARWHAL_NODE_2_IP=10.0.0.22" in env_lines(root, 2)


def test_a_discovered_engine_takes_no_gpu_or_side_channel_port_of_a_kept_one(tmp_path, dev):
    """engine-1 (discovered) shares box-a with engine-2, whose kept record holds GPUs 0-3 and side-channel port 5600:
    engine-1, first in fleet order, takes GPUs 4-7 and the next port, not what engine-2 holds."""
    facts = host(nvidia(tmp_path / "dev"), tmp_path)
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_NODE_2_ENGINE_PORT="8001",
                              NARWHAL_NODE_2_ATTEST_PORT="8011"))
    ifs = {"engine-1": iface("10.0.0.11", "box-a"), "engine-2": iface("10.0.0.11", "box-a")}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], ifs)
    document, _extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts, "engine-2": facts})
    assert document["engines"]["engine-1"]["gpu_host_indices"] == [0, 1, 2, 3]
    held = copy.deepcopy(document["engines"]["engine-2"])
    held.update(gpu_host_indices=[0, 1, 2, 3], gpu_ids=document["engines"]["engine-1"]["gpu_ids"])
    held["node"].update(side_channel_port=5600, side_channel_ports=[5600, 5600])
    env = dict((k[len("NARWHAL_NODE_2_"):], v) for k, v in plan["deployment_env"] if k.startswith("NARWHAL_NODE_2_"))
    kept = {"engine-2": {"record": held, "extracts": {"engine-launch.engine-2.inspection.json": "{}\n"},
                         "address": "10.0.0.11", "host_id": "box-a", "env": env, "hosts": ["engine-2"]}}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], {"engine-1": ifs["engine-1"]}, kept)
    document, extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts}, kept=kept)
    one = document["engines"]["engine-1"]
    assert one["gpu_host_indices"] == [4, 5, 6, 7] and one["node"]["side_channel_ports"] == [5601, 5601]
    assert document["engines"]["engine-2"] is held and extracts["engine-launch.engine-2.inspection.json"] == "{}\n"
    assert [e["gpu_count"] for e in plan["fleet"]] == [4, 4]


def test_a_discovered_engine_takes_no_kv_events_port_of_a_kept_one(tmp_path, dev):
    """With KV events on, engine-2's kept record holds KV events port 5557 on box-a: engine-1, discovered first in
    fleet order on the same machine, publishes past it, and the fleet lists the kept engine's endpoints as recorded."""
    facts = host(nvidia(tmp_path / "dev"), tmp_path)
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_NODE_2_ENGINE_PORT="8001",
                              NARWHAL_NODE_2_ATTEST_PORT="8011", NARWHAL_KV_EVENTS="on"))
    ifs = {"engine-1": iface("10.0.0.11", "box-a"), "engine-2": iface("10.0.0.11", "box-a")}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], ifs)
    document, _extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts, "engine-2": facts})
    assert [document["engines"][e]["kv_events"]["port"] for e in ("engine-1", "engine-2")] == [5557, 5558]
    held = copy.deepcopy(document["engines"]["engine-2"])
    held.update(gpu_host_indices=[0, 1, 2, 3], gpu_ids=document["engines"]["engine-1"]["gpu_ids"])
    held["node"].update(side_channel_port=5600, side_channel_ports=[5600, 5600])
    held["kv_events"].update(port=5557, endpoint="tcp://*:5557")
    env = dict((k[len("NARWHAL_NODE_2_"):], v) for k, v in plan["deployment_env"] if k.startswith("NARWHAL_NODE_2_"))
    kept = {"engine-2": {"record": held, "extracts": {"engine-launch.engine-2.inspection.json": "{}\n"},
                         "address": "10.0.0.11", "host_id": "box-a", "env": env, "hosts": ["engine-2"]}}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], {"engine-1": ifs["engine-1"]}, kept)
    document, _extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts}, kept=kept)
    assert document["engines"]["engine-1"]["kv_events"]["port"] == 5558
    assert [e["kv_events"] for e in plan["fleet"]] == [["tcp://10.0.0.11:5558"], ["tcp://10.0.0.11:5557"]]
    shared_hosts(document["engines"])


def test_without_launch_records_the_kept_engine_keeps_its_deployment_env_lines(tmp_path, dev, run_module):
    """hosts: null plans deployment.env and the fleet only: a lost engine keeps its lines, and lines that today's
    .env would give otherwise are refused by name."""
    root = tmp_path / "checkout"
    root.mkdir()
    facts = host(nvidia(tmp_path / "dev"), tmp_path)
    assert run_module(dict(site_args(root, facts), hosts=None))[0] == "exit"
    lines = env_lines(root, 4)
    status, result = run_module(dict(site_args(root, facts, lost=["engine-4"], moved={"engine-4": "10.0.0.44"}),
                                     hosts=None))
    assert status == "exit" and result["kept"] == ["engine-4"] and env_lines(root, 4) == lines
    assert sorted(os.listdir(root / "config")) == ["deployment.env", "fleet.json"]
    args = dict(site_args(root, facts, {"NARWHAL_NODE_4_ATTEST_PORT": "8110"}, lost=["engine-4"]), hosts=None)
    refusal(root, run_module, args, "NARWHAL_NODE_4_ATTEST_PORT",
            ["whose deployment.env has NARWHAL_NODE_4_ATTEST_PORT=8010, but .env gives 8110 now"])
