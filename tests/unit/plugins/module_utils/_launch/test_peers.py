"""After a launch (plugins/module_utils/_launch/peers.py): the decode-restart rule from the pinned versions, the
pairs probed again, and the refusal that hands the restarts to the operator; after a crash (after_restart, a status
run that repairs): the engines started again, the decodes a restarted prefill leaves stale, and lost engines never
named."""

import pytest
from test_support.status_docs import FLEET as REPAIR_FLEET
from test_support.status_docs import fleet_docs

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import (
    PEER_RESTART_RULE,
    after_launch,
    after_restart,
    decode_restart,
    describe_restart,
    peer_facts,
    restart_refusal,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.repair import engine_states
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.pairs import probe_pairs

GOOD = {"vllm": "0.32.0+cpu", "nixl": "1.5.1", "connector": "NixlConnector"}
OLD_NIXL = dict(GOOD, nixl="1.4.1")
FLEET = [{"engine": "engine-1", "role": "prefill"}, {"engine": "engine-2", "role": "decode"},
         {"engine": "engine-3", "role": "decode"}]


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("vllm, nixl, connector, restart, said", [
    # the project's image: vLLM 0.32.0, NIXL 1.5.1, NixlConnector (= NixlPullConnector)
    ("0.32.0+cpu", "1.5.1", "NixlConnector", False,
     "NIXL 1.5.1 >= 1.5.0 and vLLM 0.32.0+cpu >= 0.31.0 with NixlConnector"),
    ("0.31.0", "1.5.0", "NixlPullConnector", False, "NIXL 1.5.0 >= 1.5.0 and vLLM 0.31.0 >= 0.31.0"),
    ("0.33.0", "2.0.0", "NixlConnector", False, "NixlConnector"),
    # NIXL before the loadRemoteMD race fix (nixl PR #1987 is not in 1.4.0 or 1.4.1)
    ("0.32.0", "1.4.1", "NixlConnector", True, "its NIXL 1.4.1 is older than 1.5.0"),
    ("0.25.1", "1.3.1", "NixlConnector", True, "ai-dynamo/nixl PR #1987"),
    # vLLM before the replaced-peer release (vLLM PR #50047 landed in 0.31.0)
    ("0.30.0", "1.5.1", "NixlConnector", True, "its vLLM 0.30.0 is older than 0.31.0"),
    ("0.31.0rc1", "1.5.1", "NixlConnector", False, "vLLM 0.31.0rc1 >= 0.31.0"),
    # push mode is not released by the pull worker
    ("0.32.0", "1.5.1", "NixlPushConnector", True, "NixlPushConnector is not a pull connector"),
    # unknown versions never pass
    ("0.32.0", None, "NixlConnector", True, "version of its NIXL is not recorded"),
    (None, "1.5.1", "NixlConnector", True, "version of its vLLM is not recorded"),
])
def test_decode_restart_rule(vllm, nixl, connector, restart, said):
    needed, why = decode_restart(vllm, nixl, connector)
    assert needed is restart and said in why, why


def test_the_rule_cites_its_sources():
    text = repr(PEER_RESTART_RULE)
    for source in ("nixl PR #1987", "issue #1986", "vLLM PR #50047", "issue #49238"):
        assert source in text
    assert [(row[0], row[1]) for row in PEER_RESTART_RULE] == [("nixl", (1, 5, 0)), ("vllm", (0, 31, 0))]


def record(vllm="0.32.0+cpu", nixl_dist="nixl", nixl="1.5.1"):
    return {"runtime": {"vllm_version": vllm, "nixl_distribution": nixl_dist,
                        "expected_packages": {"vllm": vllm, nixl_dist: nixl}, "kv_buffer_device": "cpu"}}


@pytest.mark.parametrize("rec, facts", [
    (record(), {"vllm": "0.32.0+cpu", "nixl_distribution": "nixl", "nixl": "1.5.1", "connector": "NixlConnector"}),
    (record("0.33.0", "nixl-rocm", "1.4.0"),
     {"vllm": "0.33.0", "nixl_distribution": "nixl-rocm", "nixl": "1.4.0", "connector": "NixlConnector"}),
    ({}, {"vllm": None, "nixl_distribution": None, "nixl": None, "connector": None}),
])
def test_peer_facts_come_from_the_record_and_the_planner(rec, facts):
    """The NIXL version is the one the record pins for its NIXL distribution (the image check confirms it), the
    connector the one the planner writes."""
    assert peer_facts(rec) == facts


# ------------------------------------------------------------------ the pairs


def launched(**actions):
    """engine_1="replace@10" -> {"engine-1": {"action": "replace", "started_at": "...10Z"}}"""
    out = {}
    for name, text in actions.items():
        action, _at, at = text.partition("@")
        out[name.replace("_", "-")] = {"action": action, "started_at": "2026-12-03T08:00:%sZ" % at if at else None}
    return out


PEERS_GOOD = {"engine-1": GOOD, "engine-2": GOOD, "engine-3": GOOD}


def test_an_unchanged_fleet_restarts_and_probes_nothing():
    plan = after_launch(FLEET, launched(engine_1="unchanged", engine_2="unchanged", engine_3="unchanged"), PEERS_GOOD)
    assert plan == {"replaced_prefill": [], "restart": [], "why": {}, "kept": {}, "pairs": []}


def test_a_fleet_started_from_nothing_is_left_to_the_probe_stage():
    plan = after_launch(FLEET, launched(engine_1="start@01", engine_2="start@02", engine_3="start@03"), PEERS_GOOD)
    assert plan["restart"] == [] and plan["pairs"] == [] and plan["kept"] == {}


def test_a_replaced_prefill_on_good_versions_reprobes_its_pairs_only():
    plan = after_launch(FLEET, launched(engine_1="replace@05", engine_2="unchanged", engine_3="unchanged"),
                        PEERS_GOOD)
    assert plan["restart"] == [] and sorted(plan["kept"]) == ["engine-2", "engine-3"]
    assert plan["kept"]["engine-2"].startswith("it talked to engine-1, replaced by this launch; NIXL 1.5.1 >= 1.5.0")
    assert plan["pairs"] == probe_pairs(FLEET, ["engine-1"])


def test_a_replaced_prefill_on_old_nixl_restarts_the_decodes_that_talked_to_it():
    peers = dict(PEERS_GOOD, **{"engine-3": OLD_NIXL})
    plan = after_launch(FLEET, launched(engine_1="replace@05", engine_2="unchanged", engine_3="unchanged"), peers)
    assert plan["restart"] == ["engine-3"] and list(plan["kept"]) == ["engine-2"]
    assert "its NIXL 1.4.1 is older than 1.5.0" in plan["why"]["engine-3"]
    # the restarted decode's pairs are probed again too (here they are the prefill's anyway)
    assert plan["pairs"] == probe_pairs(FLEET, ["engine-1", "engine-3"])


def test_a_prefill_started_again_while_its_decodes_kept_running():
    """A prefill that was stopped (its container removed) and is started again: the decodes still hold the old one."""
    peers = dict((e, OLD_NIXL) for e in PEERS_GOOD)
    plan = after_launch(FLEET, launched(engine_1="start@05", engine_2="unchanged"), peers)
    assert plan["restart"] == ["engine-2", "engine-3"]  # engine-3 is outside the play: it kept running
    assert plan["pairs"] == probe_pairs(FLEET, ["engine-1", "engine-2", "engine-3"])


@pytest.mark.parametrize("decode, restart", [
    ("replace@03", True),   # replaced before the prefill: it may have talked to the old prefill
    ("replace@09", False),  # replaced after it: it only ever saw the new one
    ("replace", True),      # no time (check mode): counted as before
    ("start@03", True),
])
def test_a_decode_replaced_in_the_same_launch(decode, restart):
    peers = dict((e, OLD_NIXL) for e in PEERS_GOOD)
    plan = after_launch(FLEET, launched(engine_1="replace@05", engine_2=decode, engine_3="replace@09"), peers)
    assert ("engine-2" in plan["restart"]) is restart and "engine-3" not in plan["restart"]


def test_a_replaced_decode_reprobes_its_pairs_and_restarts_nothing():
    peers = dict((e, OLD_NIXL) for e in PEERS_GOOD)
    plan = after_launch(FLEET, launched(engine_1="unchanged", engine_2="replace@05", engine_3="unchanged"), peers)
    assert plan["restart"] == [] and plan["pairs"] == [["engine-1", "engine-2"], ["engine-2", "engine-1"]]


def test_a_started_decode_is_probed_with_the_engines_that_kept_running():
    plan = after_launch(FLEET, launched(engine_1="unchanged", engine_2="unchanged", engine_3="start@05"), PEERS_GOOD)
    assert plan["restart"] == [] and plan["pairs"] == [["engine-1", "engine-3"], ["engine-3", "engine-1"]]


# ------------------------------------------------------------------ auto or tell


def test_refusal_tells_which_decodes_to_restart_and_how():
    peers = dict((e, OLD_NIXL) for e in PEERS_GOOD)
    plan = after_launch(FLEET, launched(engine_1="replace@05", engine_2="unchanged", engine_3="unchanged"), peers)
    everyone = ["engine-1", "engine-2", "engine-3"]
    assert restart_refusal(plan, "auto", everyone) is None
    msg = restart_refusal(plan, "tell", everyone)
    assert msg.startswith("launch replaced prefill engine-1, and decode engine-2, engine-3 must be restarted before "
                          "it serves again (narwhal_decode_restart=tell). engine-2: it talked to engine-1")
    assert "its NIXL 1.4.1 is older than 1.5.0" in msg
    assert msg.endswith("ansible-playbook narwhal.deploy.launch -e narwhal_launch_restart=engine-2,engine-3")
    msg = restart_refusal(plan, "auto", ["engine-1", "engine-2"])  # launch -l engine-1,engine-2
    assert "decode engine-3 must be restarted" in msg and "outside this play (--limit)" in msg
    assert msg.endswith("narwhal_launch_restart=engine-3")
    assert restart_refusal(after_launch(FLEET, {}, peers), "tell", everyone) is None


# ------------------------------------------------------------------ after a crash (a status run that repairs)


def plan_of(docs, peers=None, lost=()):
    """after_restart over the status documents (_launch/repair.py::engine_states), GOOD versions unless `peers`."""
    return after_restart(REPAIR_FLEET, engine_states(docs),
                         peers if peers is not None else dict((e["engine"], GOOD) for e in REPAIR_FLEET), lost)


def old_nixl_everywhere():
    return dict((e["engine"], OLD_NIXL) for e in REPAIR_FLEET)


def test_a_fleet_serving_as_launched_repairs_nothing():
    plan = plan_of(fleet_docs())
    assert plan == {"start": [], "restart": [], "order": [], "why": {}, "kept": {}, "left": {}, "out": [],
                    "back": ["engine-1", "engine-2", "engine-3", "engine-4"], "proof": {}}
    assert describe_restart(plan) == ["nothing to start or restart"]


def test_a_prefill_restarted_by_docker_on_old_nixl_restarts_its_decodes():
    """The NIXL < 1.5 image: a decode may segfault at its first handshake with the prefill's new process."""
    docs = fleet_docs(engine_1={"restarts": 1, "started": "2026-12-03T09:00:00Z"})
    plan = plan_of(docs, old_nixl_everywhere())
    assert plan["start"] == [] and plan["restart"] == ["engine-2", "engine-4"] and plan["kept"] == {}
    assert plan["why"]["engine-2"].startswith(
        "it runs since before the process of engine-1 (engine-1: Docker's restart policy started its container again")
    assert "its NIXL 1.4.1 is older than 1.5.0" in plan["why"]["engine-2"]
    assert plan["out"] == [] and plan["back"] == ["engine-1", "engine-3"]
    # each decode is proven with both prefills (they serve); not with the other decode still to be restarted
    assert plan["proof"]["engine-2"] == probe_pairs(REPAIR_FLEET, ["engine-2"])
    assert describe_restart(plan, check=True)[0].startswith("engine-2: would restart - it runs since before")


def test_a_prefill_restarted_by_docker_on_nixl_1_5_and_vllm_0_32_restarts_nothing():
    docs = fleet_docs(engine_1={"restarts": 1, "started": "2026-12-03T09:00:00Z"})
    plan = plan_of(docs)
    assert plan["order"] == [] and sorted(plan["kept"]) == ["engine-2", "engine-4"]
    assert "NIXL 1.5.1 >= 1.5.0 and vLLM 0.32.0+cpu >= 0.31.0 with NixlConnector" in plan["kept"]["engine-2"]
    assert describe_restart(plan)[-1] == "nothing to start or restart"


def test_a_decode_that_started_after_the_prefill_never_saw_its_previous_process():
    """The decode restarted itself (Docker) after the prefill did, or a repair restarted it: nothing to do again."""
    docs = fleet_docs(engine_1={"restarts": 1, "started": "2026-12-03T09:00:00Z"},
                      engine_2={"restarts": 1, "started": "2026-12-03T09:00:30Z"},
                      engine_4={"cid": "c-new", "action": "replaced", "started": "2026-12-03T09:05:00Z"})
    plan = plan_of(docs, old_nixl_everywhere())
    assert plan["restart"] == [] and plan["kept"] == {}


def test_a_launch_that_replaced_a_prefill_and_left_its_decodes_is_finished():
    """narwhal_decode_restart=tell, a --limit, or an interrupted launch: the decodes are restarted by the repair."""
    docs = fleet_docs(engine_3={"action": "replaced", "started": "2026-12-03T08:00:09Z"})
    docs[1]["container"]["started_at"] = "2026-12-03T07:00:00Z"
    plan = plan_of(docs, old_nixl_everywhere())
    assert plan["restart"] == ["engine-2", "engine-4"]
    assert "engine-3: its container replaced an earlier one" in plan["why"]["engine-2"]


def test_a_stopped_prefill_is_started_first_then_its_decodes_restarted():
    docs = fleet_docs(engine_1={"state": "exited"})
    plan = plan_of(docs, old_nixl_everywhere())
    assert plan["start"] == ["engine-1"] and plan["restart"] == ["engine-2", "engine-4"]
    assert plan["order"] == ["engine-1", "engine-2", "engine-4"]
    assert plan["why"]["engine-1"] == "container narwhal-engine-1 is exited (code 137): started again as recorded"
    assert "(engine-1: it is started again by this repair)" in plan["why"]["engine-2"]
    assert plan["out"] == ["engine-1"] and plan["back"] == ["engine-3"]
    # the prefill is proven with no decode that is still to be restarted (none here: it goes in unproven by pairs),
    # each decode then with both prefills
    assert plan["proof"]["engine-1"] == []
    assert plan["proof"]["engine-2"] == probe_pairs(REPAIR_FLEET, ["engine-2"])


def test_a_stopped_decode_is_started_and_proven_with_the_prefills():
    plan = plan_of(fleet_docs(engine_4={"state": "restarting", "restarts": 9}))
    assert plan["order"] == ["engine-4"] and plan["out"] == ["engine-4"]
    assert plan["why"]["engine-4"].startswith("container narwhal-engine-4 is restarting after exiting (code 137, "
                                              "restarted 9 times): started again as recorded")
    assert plan["proof"]["engine-4"] == probe_pairs(REPAIR_FLEET, ["engine-4"])
    assert plan["back"] == ["engine-1", "engine-2", "engine-3"]


def test_an_engine_stopped_by_narwhal_stop_stays_stopped():
    """stop -l engine-2 removes its container (and took it out of the routers): a repair does not undo it."""
    plan = plan_of(fleet_docs(engine_2={"state": None}), old_nixl_everywhere())
    assert plan["order"] == [] and plan["out"] == [] and list(plan["left"]) == ["engine-2"]
    assert plan["back"] == ["engine-1", "engine-3", "engine-4"]


def test_an_engine_whose_plan_changed_is_left_to_launch_but_leaves_the_routers():
    plan = plan_of(fleet_docs(engine_2={"state": "exited", "running_plan": "sha256:" + "b" * 64}))
    assert plan["order"] == [] and list(plan["left"]) == ["engine-2"] and plan["out"] == ["engine-2"]
    assert "a new plan is launch's to apply" in plan["left"]["engine-2"]
    assert describe_restart(plan)[0].startswith("engine-2: left alone - container narwhal-engine-2 is exited")


def test_a_lost_engine_is_never_named_started_restarted_proven_with_or_put_back():
    """narwhal_lost.engines: engine-1's host is unreachable; engine-3 (prefill) restarted; old NIXL everywhere."""
    docs = fleet_docs(engine_3={"restarts": 1, "started": "2026-12-03T09:00:00Z"}, engine_2={"state": "exited"})
    docs = [d for d in docs if d["engine"] != "engine-1"]
    peers = old_nixl_everywhere()
    plan = plan_of(docs, peers, lost=["engine-1", "engine-4"])
    named = set(plan["order"]) | set(plan["why"]) | set(plan["kept"]) | set(plan["left"]) | set(plan["back"])
    assert not named & {"engine-1", "engine-4"}
    assert plan["order"] == ["engine-2"] and plan["back"] == ["engine-3"]
    assert all("engine-1" not in pair and "engine-4" not in pair for pairs in plan["proof"].values() for pair in pairs)
    # it leaves the routers with the engines that are down (no reload may wait for it)
    assert plan["out"] == ["engine-1", "engine-2", "engine-4"]
    # a lost prefill's status (a document from before it was lost) renews nothing either
    plan = plan_of(fleet_docs(engine_1={"state": "exited"}), peers, lost=["engine-1"])
    assert plan["order"] == [] and plan["restart"] == []
    assert describe_restart(plan, ["engine-1"])[0].startswith("engine-1: left alone - a host of it is lost")
