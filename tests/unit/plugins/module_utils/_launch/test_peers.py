"""After a launch (plugins/module_utils/_launch/peers.py): the decode-restart rule from the pinned versions, the
pairs probed again, and the refusal that hands the restarts to the operator."""

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import (
    PEER_RESTART_RULE,
    after_launch,
    decode_restart,
    peer_facts,
    restart_refusal,
)
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
