# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hosts a run lost (_common/reach.py): the bound, the engines a lost host takes with it, a role left empty."""
import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.reach import allowed, describe, lost_hosts

# a 2 prefill + 2 decode fleet, one host each, and a router host
ENGINES = {"engine-1": "engine-1", "engine-2": "engine-2", "engine-3": "engine-3", "engine-4": "engine-4"}
MEMBERS = {"engine-1": ["engine-1"], "engine-2": ["engine-2"], "engine-3": ["engine-3"], "engine-4": ["engine-4"]}
ROLES = {"engine-1": "prefill", "engine-2": "decode", "engine-3": "prefill", "engine-4": "decode"}
PLAY = ["engine-1", "engine-2", "engine-3", "engine-4", "router-1"]


def lose(*gone, bound="10%", engines=None, members=None, play=None):
    play, engines, members = play or PLAY, engines or ENGINES, members or MEMBERS
    return lost_hosts(play, [h for h in play if h not in gone], engines, members, ["router-1"], ROLES, bound)


@pytest.mark.parametrize("bound, hosts, expected", [
    ("10%", 4, 1), ("10%", 30, 3), ("10%", 31, 4), ("0%", 9, 0), ("100%", 5, 5), ("0", 40, 0), ("2", 3, 2),
    ("25%", 8, 2),
])
def test_the_bound_is_a_count_or_a_percentage_of_the_play_rounded_up(bound, hosts, expected):
    assert allowed(bound, hosts) == expected


def test_nothing_lost_is_nothing_to_say():
    report = lose()
    assert report == {"hosts": [], "engines": [], "routers": [], "left_out": [], "refused": None, "empty_role": None}
    assert describe(report) == []


def test_one_lost_engine_host_within_the_bound_goes_on_without_it():
    report = lose("engine-3")
    assert report["hosts"] == ["engine-3"] and report["engines"] == ["engine-3"] and report["refused"] is None
    assert report["routers"] == [] and report["left_out"] == []
    assert describe(report)[0] == "engine-3 did not answer: this run goes on without it"


def test_more_lost_hosts_than_the_bound_stop_the_run_naming_them_and_the_ways_out():
    report = lose("engine-3", "engine-4")  # 2 of 5 hosts; 10% of 5 rounds up to 1
    assert report["refused"].startswith("2 of the play's 5 hosts did not answer (engine-3, engine-4), more than "
                                        "NARWHAL_MAX_LOST_HOSTS=10% allows (1). Nothing was changed.")
    assert "--limit 'all:!engine-3:!engine-4'" in report["refused"]
    assert lose("engine-3", "engine-4", bound="2")["refused"] is None


def test_a_bound_of_zero_keeps_the_old_rule_every_host_answers():
    assert "more than NARWHAL_MAX_LOST_HOSTS=0 allows (0)" in lose("router-1", bound="0")["refused"]


def test_a_role_left_without_an_engine_stops_the_run():
    report = lose("engine-1", "engine-3", bound="50%")
    assert report["refused"] is None
    assert report["empty_role"].startswith("every prefill engine of the play is on a host that did not answer "
                                           "(engine-1 on engine-1, engine-3 on engine-3)")


def test_a_lost_router_host_is_named_as_a_router():
    report = lose("router-1")
    assert report["routers"] == ["router-1"] and report["engines"] == [] and report["refused"] is None


def test_an_engine_across_hosts_is_lost_with_any_of_its_hosts_and_its_other_hosts_are_left_out():
    engines = dict(ENGINES, **{"spare-1": "engine-1"})
    members = dict(MEMBERS, **{"engine-1": ["engine-1", "spare-1"]})
    play = PLAY + ["spare-1"]
    report = lose("spare-1", bound="1", engines=engines, members=members, play=play)
    assert report["hosts"] == ["spare-1"] and report["engines"] == ["engine-1"]
    assert report["left_out"] == ["engine-1"]
    assert describe(report)[-1] == "engine-1 answered, but serves only a lost engine: left out of this run too"


def test_a_play_limited_to_some_engines_checks_only_its_roles():
    # -l engine-2: the play holds one decode; losing it leaves the play's decodes empty
    report = lost_hosts(["engine-2"], [], ENGINES, MEMBERS, [], ROLES, "100%")
    assert report["empty_role"].startswith("every decode engine of the play is on a host that did not answer")
