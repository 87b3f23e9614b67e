"""The router's worker set (plugins/module_utils/_router/members.py), its pure part: the set asked (workers, or
workers.json less remove plus add), the method (none, remove at once, reload) and what the router's /workers
reports (each DP rank counted for its worker)."""
import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._router.members import (
    desired,
    method_for,
    normal,
    reported_set,
)

HELD = {"prefill": ["http://p1:8000", "http://p2:8000"], "decode": ["http://d1:8000", "http://d2:8000"]}


def test_the_set_is_workers_json_less_remove_plus_add():
    expected = {"prefill": HELD["prefill"], "decode": ["http://d2:8000"]}
    assert desired({"remove": ["http://d1:8000/"]}, HELD, None) == expected
    assert desired({"remove": ["http://elsewhere:1"]}, HELD, None) == HELD  # not held: no change
    back = desired({"add": [{"role": "decode", "url": "http://d3:8000"}]}, HELD, None)
    assert back["decode"] == ["http://d1:8000", "http://d2:8000", "http://d3:8000"]
    assert desired({"add": [{"role": "decode", "url": "http://d1:8000"}]}, HELD, None) == HELD
    # without workers.json: what the router reports
    assert desired({"remove": ["http://p2:8000"]}, None, HELD)["prefill"] == ["http://p1:8000"]
    assert desired({"workers": {"prefill": ["http://p9:1/"], "decode": ["http://d9:1"]}}, HELD, HELD) == {
        "prefill": ["http://p9:1"], "decode": ["http://d9:1"]}


@pytest.mark.parametrize("params, words", [
    ({"remove": ["http://d1:8000", "http://d2:8000"]}, "no decode worker"),
    ({"workers": {"prefill": [], "decode": ["http://d1:8000"]}}, "no prefill worker"),
    ({"add": [{"role": "prefill", "url": "http://d1:8000"}]}, "http://d1:8000 is in the router as decode"),
    ({"add": [{"role": "both", "url": "http://x:1"}]}, "needs role prefill or decode"),
    ({"remove": ["d1:8000"]}, "'d1:8000' is not an engine URL"),
    ({"workers": {"prefill": ["http://a:1"], "decode": ["http://a:1"]}}, "listed as prefill and as decode"),
    ({"workers": {"prefill": ["http://a:1"], "spare": []}}, "must be {prefill"),
])
def test_a_set_vllm_router_cannot_serve_is_refused_by_name(params, words):
    with pytest.raises(PlanError) as err:
        desired(params, HELD, HELD)
    assert words in str(err.value)


def test_removal_is_at_once_and_anything_else_a_reload():
    less = {"prefill": HELD["prefill"], "decode": ["http://d2:8000"]}
    assert method_for(HELD, HELD) == "none"
    assert method_for({"prefill": HELD["prefill"][::-1], "decode": HELD["decode"]}, HELD) == "none"  # order: same
    assert method_for(less, HELD) == "remove"
    assert method_for(HELD, less) == "reload"  # vllm-router 0.1.17 cannot add a P/D worker at runtime
    moved = {"prefill": HELD["prefill"] + ["http://d1:8000"], "decode": ["http://d2:8000"]}
    assert method_for(moved, HELD) == "reload"
    assert method_for(HELD, HELD, force=True) == "reload"


def test_the_router_report_counts_each_dp_rank_for_its_worker():
    answer = {"workers": [{"url": "http://p1:8000@0", "worker_type": "prefill", "is_healthy": True},
                          {"url": "http://p1:8000@1", "worker_type": "prefill", "is_healthy": True},
                          {"url": "http://d1:8000", "worker_type": "decode", "is_healthy": False}, "junk"]}
    workers, entries, healthy = reported_set(answer)
    assert workers == {"prefill": ["http://p1:8000"], "decode": ["http://d1:8000"]}
    assert entries["http://p1:8000"] == ["http://p1:8000@0", "http://p1:8000@1"] and healthy is False
    assert reported_set("All servers healthy") == ({"prefill": [], "decode": []}, {}, True)
    assert normal({"decode": ["http://d:1/"]}, "workers") == {"prefill": [], "decode": ["http://d:1"]}


KV = {"http://p1:8000": ["tcp://p1:5557"], "http://p2:8000": ["tcp://p2:5557", "tcp://p2:5558"]}


def test_the_kv_events_map_outlives_a_roll():
    """workers.json's kv_events (a kv_aware prefill policy, _router/plan.py::workers_doc) maps every prefill engine
    of the fleet: a worker moved out keeps its entry, so moved back in (add) it is subscribed to again; a complete set
    without a map (launch's roll by sets) keeps the held one; the router stage's set (with its map) replaces it."""
    held = dict(HELD, kv_events=KV)
    out = desired({"remove": ["http://p2:8000"]}, held, None)
    assert out == {"prefill": ["http://p1:8000"], "decode": HELD["decode"], "kv_events": KV}
    back = desired({"add": [{"role": "prefill", "url": "http://p2:8000"}]}, out, None)
    assert back == dict(held, prefill=["http://p1:8000", "http://p2:8000"])
    assert desired({"workers": {"prefill": ["http://p1:8000"], "decode": ["http://d1:8000"]}}, held, HELD)[
        "kv_events"] == KV
    fresh = {"http://p1:8000": ["tcp://p1:6000"]}
    assert desired({"workers": dict(HELD, kv_events=fresh)}, held, HELD)["kv_events"] == fresh
    assert "kv_events" not in desired({"remove": ["http://p2:8000"]}, HELD, None)
    assert method_for(back, held) == "none"  # the map is no worker: nothing to move


@pytest.mark.parametrize("kv", [["tcp://p1:5557"], {"http://p1:8000": "tcp://p1:5557"}, {"http://p1:8000": []},
                                {"p1:8000": ["tcp://p1:5557"]}])
def test_a_kv_events_map_that_is_not_one_is_refused(kv):
    with pytest.raises(PlanError) as err:
        normal(dict(HELD, kv_events=kv), "workers.json")
    assert str(err.value).startswith("workers.json: ")
