# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How launch rolls its engines behind the routers (plugins/module_utils/_launch/roll.py): one at a time when every
engine keeps its NIXL compatibility, by sets when it changes fleet-wide (the order for 2P2D and 3P2D), refused with
the reason for a 1P1D fleet or one already mixed, and the stated outage narwhal_roll_outage=accept gives. The records
are the hand-shaped pair made compatible (test_support/prepare.py), one copy per engine."""

from __future__ import annotations

import copy

import pytest
from test_support.prepare import HAND_LAUNCH, compatible

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.roll import (
    describe,
    phase_pairs,
    roll_plan,
    router_moves,
)

BASE = compatible(copy.deepcopy(HAND_LAUNCH))["engines"]["engine-1"]


def rec(engine, role, vllm="0.33.0"):
    record = copy.deepcopy(BASE)
    record.update(engine=engine, role=role)
    record["runtime"].update(vllm_version=vllm, image="vllm/vllm-openai:v" + vllm)
    return record


def fleet(shape, action="replace", old="0.33.0", new="0.33.1", start=()):
    """Engines engine-1.. in fleet order, e.g. shape "PPDD"; each changes from `old` to `new` vLLM."""
    out = []
    for i, letter in enumerate(shape, 1):
        engine, role = "engine-%d" % i, "prefill" if letter == "P" else "decode"
        mine = "start" if engine in start else action
        out.append({"engine": engine, "role": role, "url": "http://10.0.0.%d:8000" % i, "action": mine,
                    "running": None if mine == "start" else rec(engine, role, old),
                    "new": rec(engine, role, new if mine != "unchanged" else old)})
    return out


def urls(*numbers):
    return ["http://10.0.0.%d:8000" % n for n in numbers]


def test_an_unchanged_fleet_rolls_nothing():
    plan = roll_plan(fleet("PD", action="unchanged"))
    assert plan == {"kind": "none", "reason": "no engine is started or replaced", "phases": [], "refused": None}


def test_a_compatible_replacement_rolls_one_engine_at_a_time_out_of_the_routers():
    engines = fleet("PPDD", new="0.33.0")
    engines[2]["action"] = "unchanged"  # engine-3 keeps its container
    plan = roll_plan(engines)
    assert plan["kind"] == "rolling" and plan["refused"] is None
    assert [p["engines"] for p in plan["phases"]] == [["engine-1"], ["engine-2"], ["engine-4"]]
    first = plan["phases"][0]
    assert first["serving_before"] == {"prefill": urls(2), "decode": urls(3, 4)}
    assert first["serving_after"] == {"prefill": urls(1, 2), "decode": urls(3, 4)}
    assert plan["phases"][2]["serving_before"] == {"prefill": urls(1, 2), "decode": urls(3)}
    # proven with the engines serving after it, both ways
    assert phase_pairs(engines, first) == [["engine-1", "engine-3"], ["engine-1", "engine-4"],
                                           ["engine-3", "engine-1"], ["engine-4", "engine-1"]]


def test_a_new_engine_is_in_no_router_before_its_phase():
    engines = fleet("PDD", new="0.33.0", start=("engine-3",))
    plan = roll_plan(engines)
    assert plan["kind"] == "rolling"
    assert plan["phases"][0]["serving_before"] == {"prefill": [], "decode": urls(2)}
    assert plan["phases"][0]["serving_after"] == {"prefill": urls(1), "decode": urls(2)}
    assert plan["phases"][2]["serving_before"] == {"prefill": urls(1), "decode": urls(2)}
    assert plan["phases"][2]["serving_after"] == {"prefill": urls(1), "decode": urls(2, 3)}


def test_a_2p2d_upgrade_rolls_by_sets_in_this_order():
    engines = fleet("PPDD")
    plan = roll_plan(engines)
    assert plan["kind"] == "sets" and plan["refused"] is None
    assert "vLLM version differs (0.33.0 on engine-1" in plan["reason"]
    one, two = plan["phases"]
    # routers := B (engine-2, engine-4); replace A; prove A x A; routers := A
    assert one == {"engines": ["engine-1", "engine-3"],
                   "serving_before": {"prefill": urls(2), "decode": urls(4)},
                   "serving_after": {"prefill": urls(1), "decode": urls(3)}}
    assert phase_pairs(engines, one) == [["engine-1", "engine-3"], ["engine-3", "engine-1"]]
    # replace B; prove every pair; routers := A + B
    assert two == {"engines": ["engine-2", "engine-4"],
                   "serving_before": {"prefill": urls(1), "decode": urls(3)},
                   "serving_after": {"prefill": urls(1, 2), "decode": urls(3, 4)}}
    assert len(phase_pairs(engines, two)) == 6  # every pair but engine-1 x engine-3, proven in phase 1
    assert describe(plan)[1:] == [
        "phase 1: routers serve prefill [%s] decode [%s]; replace and prove engine-1, engine-3; then routers serve "
        "prefill [%s] decode [%s]" % (urls(2)[0], urls(4)[0], urls(1)[0], urls(3)[0]),
        "phase 2: routers serve prefill [%s] decode [%s]; replace and prove engine-2, engine-4; then routers serve "
        "prefill [%s] decode [%s]" % (urls(1)[0], urls(3)[0], ", ".join(urls(1, 2)), ", ".join(urls(3, 4)))]


def test_a_3p2d_upgrade_takes_two_prefills_and_one_decode_first():
    engines = fleet("PDPPD")  # fleet order interleaves the roles
    plan = roll_plan(engines)
    assert plan["kind"] == "sets"
    one, two = plan["phases"]
    assert one["engines"] == ["engine-1", "engine-2", "engine-3"]  # ceil(3/2) prefills, ceil(2/2) decodes
    assert one["serving_before"] == {"prefill": urls(4), "decode": urls(5)}
    assert one["serving_after"] == {"prefill": urls(1, 3), "decode": urls(2)}
    assert two["engines"] == ["engine-4", "engine-5"]
    assert two["serving_before"] == one["serving_after"]
    assert two["serving_after"] == {"prefill": urls(1, 3, 4), "decode": urls(2, 5)}


def test_an_engine_new_to_the_fleet_serves_only_after_its_set():
    plan = roll_plan(fleet("PPPDD", start=("engine-3",)))
    assert plan["kind"] == "sets"
    assert plan["phases"][0]["engines"] == ["engine-1", "engine-2", "engine-4"]
    assert plan["phases"][0]["serving_before"] == {"prefill": [], "decode": urls(5)}  # engine-3 has no container yet
    assert plan["phases"][1]["serving_after"] == {"prefill": urls(1, 2, 3), "decode": urls(4, 5)}


def test_a_1p1d_upgrade_is_refused_with_the_reason():
    plan = roll_plan(fleet("PD"))
    assert plan["phases"] == [] and plan["kind"] == "outage"
    assert plan["refused"] == (
        "launch refuses to roll engine-1, engine-2: the NIXL compatibility changes (running engine-1 and new "
        "engine-2: vLLM version differs (0.33.0 on engine-1 (image vllm/vllm-openai:v0.33.0) vs 0.33.1 on engine-2 "
        "(image vllm/vllm-openai:v0.33.1))), and a roll by sets needs at least 2 prefill and 2 decode engines; the "
        "fleet has 1 prefill (engine-1) and 1 decode (engine-2). Nothing was changed. Fix the inputs, or accept a "
        "stated outage (the routers answer 503 until every engine is replaced and proven): rerun with "
        "-e narwhal_roll_outage=accept")
    assert describe(plan) == ["roll: outage - " + plan["refused"]]


def test_a_1p2d_upgrade_is_refused_too():
    plan = roll_plan(fleet("PDD"))
    assert "the fleet has 1 prefill (engine-1) and 2 decode (engine-2, engine-3)" in plan["refused"]


def test_the_outage_accepted_empties_the_routers_then_gives_them_all_back():
    plan = roll_plan(fleet("PD"), accept_outage=True)
    assert plan["kind"] == "outage" and plan["refused"] is None
    assert "narwhal_roll_outage=accept: the routers serve no request" in plan["reason"]
    assert plan["phases"] == [{"engines": ["engine-1", "engine-2"],
                               "serving_before": {"prefill": [], "decode": []},
                               "serving_after": {"prefill": urls(1), "decode": urls(2)}}]


def test_a_fleet_already_mixed_is_refused():
    # an earlier roll stopped half-way: engine-1 still serves 0.33.0, the others 0.33.1; launch would replace engine-1
    engines = fleet("PPDD", action="unchanged", old="0.33.1")
    engines[0].update(action="replace", running=rec("engine-1", "prefill", "0.33.0"))
    plan = roll_plan(engines)
    assert plan["phases"] == []
    assert plan["refused"].startswith(
        "launch refuses to roll engine-1: the running fleet is already mixed (two NIXL compatibility classes serve): "
        "running engine-1 and engine-3: vLLM version differs (0.33.0 on engine-1")
    assert plan["refused"].endswith("rerun with -e narwhal_roll_outage=accept")
    accepted = roll_plan(engines, accept_outage=True)
    assert accepted["kind"] == "outage" and accepted["phases"][0]["engines"] == ["engine-1"]


def test_a_replaced_engine_whose_running_record_is_missing_is_judged_unknown():
    engines = fleet("PD", new="0.33.0")
    engines[0]["running"] = None
    plan = roll_plan(engines)
    assert "the record of the run engine-1 runs is not on the controller" in plan["refused"]
    assert roll_plan(fleet("PPDD", new="0.33.0"))["kind"] == "rolling"


@pytest.mark.parametrize("factor, change", [
    ("block size", lambda r: r["runtime"]["cache_plan"].update(block_size=32)),
    ("KV cache dtype", lambda r: r["runtime"].update(kv_cache_dtype="fp8")),
])
def test_any_handshake_factor_that_changes_rolls_by_sets(factor, change):
    engines = fleet("PPDD", new="0.33.0")
    for e in engines:
        change(e["new"])
    plan = roll_plan(engines)
    assert plan["kind"] == "sets" and factor in plan["reason"]


ROUTERS = [{"host": "router-1", "url": "http://10.0.1.1:8080", "workers": {"prefill": urls(1, 2), "decode": urls(3)}},
           {"host": "router-2", "url": "http://10.0.1.2:8080", "workers": {"prefill": urls(1), "decode": urls(3)}}]


def test_an_engine_leaves_the_routers_that_hold_it_and_comes_back_there():
    two = {"engine": "engine-2", "role": "prefill", "url": urls(2)[0] + "/"}
    assert router_moves(ROUTERS, "out", [two]) == [{"host": "router-1", "url": "http://10.0.1.1:8080",
                                                   "remove": urls(2)}]
    assert router_moves(ROUTERS, "in", [two]) == [{"host": "router-1", "url": "http://10.0.1.1:8080",
                                                  "add": [{"role": "prefill", "url": urls(2)[0]}]}]
    # a new engine is in no router: nothing out, nothing in
    assert router_moves(ROUTERS, "out", [dict(two, url=urls(9)[0])]) == []


def test_the_last_engine_of_a_role_stays_in_its_router_but_comes_back_in():
    one = {"engine": "engine-1", "role": "prefill", "url": urls(1)[0]}
    assert [m["host"] for m in router_moves(ROUTERS, "out", [one])] == ["router-1"]  # router-2 would hold no prefill
    assert [m["host"] for m in router_moves(ROUTERS, "in", [one])] == ["router-1", "router-2"]


def test_a_set_is_given_whole_unless_a_role_is_empty():
    serving = {"prefill": urls(2), "decode": urls(4)}
    assert [m["workers"] for m in router_moves(ROUTERS, "set", serving=serving)] == [serving, serving]
    assert router_moves(ROUTERS, "set", serving={"prefill": [], "decode": []}) == []


def _weights(engines, running, new):
    """Each engine's running record on the `running` checkpoint manifest, its new one on `new` (None: no manifest)."""
    for e in engines:
        for side, digest in (("running", running), ("new", new)):
            if e[side] is not None and digest is not None:
                e[side]["runtime"]["model_manifest"] = "sha256:" + digest * 64
    return engines


def test_new_weights_roll_by_sets_and_a_1p1d_fleet_is_refused():
    # same vLLM, same geometry: only the checkpoint's manifest changes; an old prefill with a new decode would pair
    engines = _weights(fleet("PPDD", new="0.33.0"), "a", "b")
    plan = roll_plan(engines)
    assert plan["kind"] == "sets"
    assert "they serve different weights (runtime.model_manifest sha256:aaaa" in plan["reason"]
    refused = roll_plan(_weights(fleet("PD", new="0.33.0"), "a", "b"))
    assert refused["refused"] and "different weights" in refused["refused"]


def test_the_same_weights_or_a_record_without_a_manifest_roll_one_at_a_time():
    assert roll_plan(_weights(fleet("PPDD", new="0.33.0"), "a", "a"))["kind"] == "rolling"
    # a fleet discovered before its checkpoint was delivered: nothing says the weights changed
    assert roll_plan(_weights(fleet("PPDD", new="0.33.0"), None, "b"))["kind"] == "rolling"
