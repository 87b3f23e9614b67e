"""The filters launch_peers, peer_facts and probe_pairs (plugins/filter/narwhal.py) over the variables the launch
role sets on each host: what follows a launch, from hostvars as a playbook hands them over."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

FLEET = [{"engine": "engine-1", "role": "prefill"}, {"engine": "engine-2", "role": "decode"}]


def record(vllm, nixl):
    return {"runtime": {"vllm_version": vllm, "nixl_distribution": "nixl",
                        "expected_packages": {"vllm": vllm, "nixl": nixl}, "kv_buffer_device": "cpu"}}


def host(engine, action, started_at=None, rec=None):
    hv = {"inventory_hostname": engine, "launch_action": action, "launch_started_at": started_at}
    if rec is not None:
        hv["launch_peer"] = filters.peer_facts(rec)
    return hv


def test_the_standin_fleet_replaces_its_prefill_and_probes_its_pairs_again():
    """The molecule fleet (stand-in vLLM 0.33.0, NIXL 1.5.1): no decode restart, both pairs probed again."""
    good = record("0.33.0", "1.5.1")
    plan = filters.launch_peers([host("engine-1", "replace", "2026-12-03T08:00:05Z", good),
                                 host("engine-2", "unchanged", None, good)], FLEET)
    assert plan["restart"] == [] and plan["refusal"] is None
    assert plan["lines"] == [
        "engine-2: no restart - it talked to engine-1, replaced by this launch; NIXL 1.5.1 >= 1.5.0 and vLLM "
        "0.33.0 >= 0.31.0 with NixlConnector: the decode releases the replaced peer itself (NIXL PR #1987, vLLM "
        "PR #50047)",
        "probe again: engine-1 -> engine-2, engine-2 -> engine-1"]


def test_an_old_decode_outside_the_play_is_refused_from_the_launch_config():
    """launch -l engine-1: engine-2 was not previewed, its versions come from the launch config's record."""
    plan = filters.launch_peers([host("engine-1", "replace", "2026-12-03T08:00:05Z", record("0.30.0", "1.5.1"))],
                                FLEET, {"engine-2": record("0.30.0", "1.4.0")})
    assert plan["restart"] == ["engine-2"]
    assert "its NIXL 1.4.0 is older than 1.5.0" in plan["why"]["engine-2"]
    assert "outside this play (--limit)" in plan["refusal"]
    plan = filters.launch_peers([host("engine-1", "replace", "2026-12-03T08:00:05Z"),
                                 host("engine-2", "unchanged", None, record("0.30.0", "1.5.1"))], FLEET,
                                mode="tell", check=True)
    assert plan["lines"][0].startswith("engine-2: would restart - it talked to engine-1, replaced by this launch; "
                                       "its vLLM 0.30.0 is older than 0.31.0")
    assert "(narwhal_decode_restart=tell)" in plan["refusal"]


def test_an_unchanged_fleet_has_nothing_to_say():
    good = record("0.33.0", "1.5.1")
    plan = filters.launch_peers([host("engine-1", "unchanged", None, good), host("engine-2", "unchanged", None, good)],
                                FLEET)
    assert (plan["restart"], plan["pairs"], plan["lines"], plan["refusal"]) == ([], [], [], None)


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(AnsibleFilterError, match="narwhal_decode_restart='always': use one of auto, tell"):
        filters.launch_peers([], FLEET, mode="always")


def test_probe_pairs_filter():
    assert filters.probe_pairs(FLEET) == [["engine-1", "engine-2"], ["engine-2", "engine-1"]]
    assert filters.FilterModule().filters()["probe_pairs"] is filters.probe_pairs
