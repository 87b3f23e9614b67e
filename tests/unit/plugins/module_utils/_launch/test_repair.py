"""What a status run that repairs reads from the status documents (plugins/module_utils/_launch/repair.py): Docker's
and the launcher's times, whether a container runs, may be started again as recorded, or runs a process that is not
the one its launch recorded (the signal that its decodes may hold its previous process's NIXL state)."""

import pytest
from test_support.status_docs import status_doc as doc

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.repair import engine_states, host_facts, instant

# ------------------------------------------------------------------ times and signals


@pytest.mark.parametrize("text, seconds", [
    ("2026-12-03T08:00:10Z", 1796284810.0),
    ("2026-12-03T08:00:10.5Z", 1796284810.5),
    ("2026-12-03T08:00:10.123456789Z", 1796284810.123456789),
    ("2026-12-03T09:00:10+01:00", 1796284810.0),
    ("0001-01-01T00:00:00Z", None),  # Docker's zero time: never started
    ("", None), (None, None), ("yesterday", None), ("2026-13-03T08:00:10Z", None),
])
def test_instant_reads_docker_and_launcher_times(text, seconds):
    assert instant(text) == pytest.approx(seconds) if seconds is not None else instant(text) is None


@pytest.mark.parametrize("changes, renewed", [
    ({}, None),                                                       # as launched
    ({"started": "2026-12-03T08:00:10.9Z"}, None),                    # the second it was recorded (whole seconds)
    ({"restarts": 2, "started": "2026-12-03T09:00:00Z"}, "Docker's restart policy started its container again (2"),
    ({"started": "2026-12-03T09:00:00.1Z"}, "its container started again at 2026-12-03T09:00:00.1Z, after its launch "
                                            "recorded it at 2026-12-03T08:00:10Z"),  # docker restart: count reset
    ({"cid": "c-other"}, "its container c-other is not the one its launch recorded (c-engine-1)"),
    ({"action": "replaced"}, "its container replaced an earlier one"),
    ({"deployment": False, "restarts": 3}, None),                     # never recorded: no evidence either way
])
def test_a_running_engine_is_renewed_only_on_evidence(changes, renewed):
    facts = host_facts(doc("engine-1", **changes))
    assert facts["state"] == "running"
    assert (facts["renewed"] is None) if renewed is None else facts["renewed"].startswith(renewed), facts["renewed"]


@pytest.mark.parametrize("changes, state, why, blocked", [
    ({"state": "exited"}, "down", "container narwhal-engine-2 is exited (code 137)", None),
    ({"state": "restarting", "restarts": 7}, "down", "is restarting after exiting (code 137, restarted 7 times)", None),
    ({"state": "created"}, "down", "container narwhal-engine-2 is created", None),
    # narwhal's stop removes the container (Docker never does): `stop -l engine-2` is not undone by a repair
    ({"state": None}, "left", "container narwhal-engine-2 does not exist: narwhal's stop removes it", None),
    ({"state": "exited", "running_plan": "sha256:" + "b" * 64}, "down", "is exited",
     "its container ran plan sha256:bbbbb, the installed run's is sha256:aaaaa: a new plan is launch's to apply"),
    ({"state": "exited", "deployment": False}, "down", "is exited", "has no deployment.json (its launch did not"),
    ({"state": "paused"}, "left", "container narwhal-engine-2 is paused: left as it is", None),
])
def test_a_container_that_does_not_run(changes, state, why, blocked):
    facts = host_facts(doc("engine-2", **changes))
    assert facts["state"] == state and why in facts["why"], facts
    assert (facts["blocked"] is None) if blocked is None else blocked in facts["blocked"], facts["blocked"]


def test_what_cannot_be_read_is_left_alone():
    assert host_facts({"engine": "engine-1", "serving": False, "as_recorded": False,
                       "problems": ["nothing is installed (no /opt/x); run prepare and launch"]})["why"] \
        == "nothing is installed (no /opt/x); run prepare and launch"
    broken = dict(doc("engine-1"), docker_error="connection refused", container=None)
    assert host_facts(broken)["state"] == "left" and "connection refused" in host_facts(broken)["why"]
    foreign = doc("engine-1")
    foreign["container"]["ours"] = False
    assert host_facts(foreign)["state"] == "left"


@pytest.mark.parametrize("state", ["running", None, "exited"])
def test_an_engine_a_launch_is_replacing_is_left_to_that_launch(state):
    """The launcher keeps the replaced container as <name>-previous until the new one serves: a launch is under way
    (or was interrupted); a repair neither starts it nor takes its new process for a restarted one."""
    busy = dict(doc("engine-1", state=state, cid="c-new", restarts=1),
                companions=[{"name": "narwhal-engine-1-previous", "id": "c-engine-1", "state": "exited",
                             "ours": True, "role": "previous"}])
    facts = host_facts(busy)
    assert facts["state"] == "left" and facts["renewed"] is None
    assert facts["why"] == ("a replace is under way or was interrupted (narwhal-engine-1-previous exists): launch "
                            "finishes it")
    # a container a failed replace left aside (<name>-failed) is history: the engine is judged as usual
    busy["companions"][0]["role"] = "failed"
    assert host_facts(busy)["state"] == {"running": "running", None: "left", "exited": "down"}[state]


def test_an_engine_across_hosts_is_down_when_one_of_its_hosts_is_and_is_repaired_from_its_head():
    docs = [doc("engine-1", host="gpu-a"), doc("engine-1", state="exited", member=1, host="gpu-b")]
    state = engine_states(docs)["engine-1"]
    assert state["state"] == "down" and state["host"] == "gpu-a" and state["blocked"] is None
    alone = engine_states([doc("engine-1", state="exited", member=1, host="gpu-b")])["engine-1"]
    assert alone["state"] == "left" and "its head host is not in this run" in alone["why"]
