# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters that carry the hosts a run lost into the stages (plugins/filter/narwhal.py): lost_hosts (the opening's
fact), without_lost (what the routers serve and the probes pair), lost_status (status names them) and summary_entry
(the closing table names them)."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

SITE = {"site": {"NARWHAL_MAX_LOST_HOSTS": "10%"},
        "engines": {"engine-%d" % i: {"role": role} for i, role in enumerate(["prefill", "decode"] * 2, 1)}}
FLEET = [{"engine": "engine-%d" % i, "role": role, "url": "http://10.0.0.%d:8000" % i}
         for i, role in enumerate(["prefill", "decode"] * 2, 1)]
ENGINES = dict(("engine-%d" % i, "engine-%d" % i) for i in range(1, 5))
MEMBERS = dict(("engine-%d" % i, ["engine-%d" % i]) for i in range(1, 5))


def lost_of(*gone):
    play = sorted(ENGINES) + ["router-1"]
    return filters.lost_hosts(play, [h for h in play if h not in gone], ENGINES, MEMBERS, ["router-1"], SITE)


def host(n, **facts):
    return dict({"inventory_hostname": "engine-%d" % n, "narwhal_engine": "engine-%d" % n, "narwhal_site": SITE},
                **facts)


def test_the_opening_fact_takes_the_roles_and_the_bound_from_the_site():
    lost = lost_of("engine-3")
    assert lost["engines"] == ["engine-3"] and lost["refused"] is None
    assert lost["lines"][0] == "engine-3 did not answer: this run goes on without it"
    assert lost_of("engine-1", "engine-3")["refused"].startswith("2 of the play's 5 hosts did not answer")
    with pytest.raises(AnsibleFilterError, match="lost_hosts takes narwhal_site"):
        filters.lost_hosts([], [], {}, {}, [], None)


def test_the_routers_and_the_probes_leave_the_lost_engines_out():
    served = [e["engine"] for e in filters.without_lost(FLEET, lost_of("engine-3"))]
    assert served == ["engine-1", "engine-2", "engine-4"]
    assert filters.without_lost(FLEET, {}) == FLEET and filters.without_lost(FLEET, None) == FLEET
    with pytest.raises(AnsibleFilterError, match="without_lost takes the resolved fleet"):
        filters.without_lost({"engine-1": {}}, {})


def test_status_names_a_lost_host_as_not_serving_and_keeps_every_other_document():
    served = {"engine": "engine-1", "as_recorded": True, "container": {"state": "running"}}
    docs = filters.lost_status([host(1, status_engine=served), host(3), {"inventory_hostname": "router-1"}],
                               lost_of("engine-3"))
    assert docs[0] is served and len(docs) == 2
    assert docs[1]["engine"] == "engine-3" and docs[1]["as_recorded"] is False and docs[1]["role"] == "prefill"
    assert filters.status_row(docs[1]).split()[3] == "lost"
    assert filters.status_problems(docs[1]).startswith("engine-3: the host did not answer (unreachable)")
    # a host without a status that the run did not lose (a router host, an engine host of another play) is no row
    assert filters.lost_status([host(3)], {}) == []


def test_the_closing_table_names_a_lost_host_and_a_left_out_one():
    lost = {"hosts": ["engine-3"], "left_out": ["engine-4"]}
    rows = [filters.summary_entry(host(n, launch_summary={"action": "unchanged"}), {}, lost) for n in (1, 3, 4)]
    assert [r["action"] for r in rows] == ["unchanged", "unreachable", "left out"]
    assert filters.summary_entry(host(1, launch_summary={"action": "replaced"}))["action"] == "replaced"
