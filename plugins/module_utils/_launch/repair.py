# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a repair run reads from the status documents (pure): a status run with narwhal_repair=true
(playbooks/status.yml, docs/day-two.md "Crashes") decides from the launcher's `status` of each host
(roles/install/files/launcher/narwhal_launcher/status.py, as roles/status keeps it in status_engine) whether each
engine's container runs, whether one that does not may be started again exactly as recorded, and whether a running
engine's process is not the one its launch recorded: the signal that the decodes which talked to a prefill may hold
the NIXL state of its previous process (_launch/peers.py::after_restart).

The signals, each from what the launcher already reports, on the engine host's own clock:
- Docker's State.RestartCount > 0: the restart policy (unless-stopped) started the container again after it exited.
  The launcher's start fails when the container restarts before it serves (health.py::container_exit), so a count
  above 0 means a restart after the launch recorded it. Docker resets the count on a manual `docker start`/`restart`;
- so also State.StartedAt later than deployment.json's recorded_at (written once the container served): the
  container was started again after its launch (by hand, after a reboot, or the launcher's rollback);
- a container that is not the one deployment.json records, or deployment.json's action `replaced` (its container
  replaced an earlier one, which the decodes may have talked to): what after_launch acts on during a launch, seen
  again here when that launch did not restart the decodes (narwhal_decode_restart=tell, a --limit, an interrupted
  run). A decode whose own process started after the prefill's never saw the earlier one, so the signal is
  stateless: a repair run needs no record of its own and a second one finds nothing left to do.
"""

from __future__ import annotations

import calendar
import re
import time

__metaclass__ = type

# Container states a repair starts again (docker inspect State.Status): exited or dead for good (`docker stop`, an
# exit the restart policy does not follow), created and never started, restarting (crash-looping: Docker is between
# two attempts). A paused container is someone's doing, and an engine without a container was stopped by narwhal's
# stop (stop.py removes the container; Docker never does): both are left alone.
DOWN_STATES = ("exited", "dead", "restarting", "created")
# deployment.json's recorded_at is whole seconds (strftime %S): a container started in the second it was recorded
# is not "started again"
RECORDED_SLACK_S = 1.0
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)$")


def instant(text):
    """Seconds since the epoch of an RFC 3339 time as Docker (State.StartedAt, nanoseconds) and the launcher
    (deployment.json recorded_at) write them; None for none, a malformed one or Docker's zero time (never started:
    0001-01-01T00:00:00Z)."""
    found = _TIME.match(text) if isinstance(text, str) else None
    if not found:
        return None
    try:
        base = time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    if base.tm_year < 1970:
        return None
    zone, offset = found.group(3), 0
    if zone != "Z":
        digits = zone[1:].replace(":", "")
        offset = (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * (1 if zone[0] == "+" else -1)
    return calendar.timegm(base) - offset + float("0." + (found.group(2) or "0"))


def _short(value):
    return (value or "?")[:12] if isinstance(value, str) else "?"


def _down_why(doc):
    container, name = doc["container"], doc.get("container_name") or "its container"
    if container.get("state") == "restarting":
        return "container %s is restarting after exiting (code %s, restarted %s times)" % (
            name, container.get("exit_code"), container.get("restart_count") or 0)
    return "container %s is %s (code %s)" % (name, container.get("state"), container.get("exit_code"))


def _blocked(doc):
    """Why an engine whose container does not run cannot be started again exactly as recorded, or None."""
    plan, installed = doc.get("plan_hash_running"), doc.get("plan_hash_installed")
    if not plan or plan != installed:
        return ("its container ran plan %s, the installed run's is %s: a new plan is launch's to apply (it rolls "
                "behind the routers), not a repair's" % (_short(plan), _short(installed)))
    if doc.get("deployment") is None:
        return ("the installed run %s has no deployment.json (its launch did not complete): launch finishes it, not a "
                "repair" % (doc.get("run_id_installed") or "?"))
    return None


def _renewed(doc):
    """Why a running container's process is not the one its launch recorded, or None (see the module's docstring)."""
    container, deployment = doc.get("container") or {}, doc.get("deployment")
    if deployment is None:
        return None
    if deployment.get("container_id") and container.get("id") != deployment["container_id"]:
        return "its container %s is not the one its launch recorded (%s)" % (
            _short(container.get("id")), _short(deployment["container_id"]))
    if container.get("restart_count"):
        return "Docker's restart policy started its container again (%s times; last at %s)" % (
            container["restart_count"], container.get("started_at"))
    started, recorded = instant(container.get("started_at")), instant(deployment.get("recorded_at"))
    if started is not None and recorded is not None and started > recorded + RECORDED_SLACK_S:
        return "its container started again at %s, after its launch recorded it at %s" % (
            container.get("started_at"), deployment.get("recorded_at"))
    if deployment.get("action") == "replaced":
        return "its container replaced an earlier one (launch, recorded at %s)" % deployment.get("recorded_at")
    return None


def host_facts(doc):
    """One host's status document -> {engine, host (its inventory host), member, state (running, down or left),
    why (down: what is wrong; left: why it is left alone), blocked (down: why it cannot be started again as
    recorded, or None), started_at (seconds; running), renewed (running: why its process is not the one its launch
    recorded, or None), serving, as_recorded}."""
    engine = doc.get("engine")
    out = {"engine": engine, "host": doc.get("inventory_host") or engine, "member": int(doc.get("member") or 0),
           "state": "left", "why": None, "blocked": None, "started_at": None, "renewed": None,
           "serving": bool(doc.get("serving")), "as_recorded": bool(doc.get("as_recorded"))}
    container = doc.get("container")
    if "container_name" not in doc:  # the status role's stand-in for a host where nothing is installed
        out["why"] = "; ".join(doc.get("problems") or ["nothing is installed"])
    elif doc.get("docker_error"):
        out["why"] = "Docker cannot be asked about container %s: %s" % (doc["container_name"], doc["docker_error"])
    elif container is not None and not container.get("ours"):
        out["why"] = "container %s is not narwhal's container of %s" % (doc["container_name"], engine)
    elif [c for c in doc.get("companions") or [] if c.get("role") == "previous"]:
        # the launcher's start keeps the replaced container as <name>-previous until the new one serves (start.py
        # set_aside): a launch is replacing it now, or one was interrupted, and that launch is what finishes it
        out["why"] = ("a replace is under way or was interrupted (%s-previous exists): launch finishes it"
                      % doc["container_name"])
    elif container is None:
        out["why"] = ("container %s does not exist: narwhal's stop removes it (a crash does not), so launch is what "
                      "starts it again" % doc["container_name"])
    elif container.get("state") in DOWN_STATES:
        out.update(state="down", why=_down_why(doc), blocked=_blocked(doc))
    elif container.get("state") != "running":
        out["why"] = "container %s is %s: left as it is" % (doc["container_name"], container.get("state"))
    else:
        out.update(state="running", started_at=instant(container.get("started_at")), renewed=_renewed(doc))
    return out


def _merge(found):
    """One engine's state from its hosts' facts (the head first): left when a host is, down when a host is (and
    blocked when a down host is), else running since its first host started and renewed when a host is."""
    state = dict(found[0])
    if found[0]["member"] != 0:
        state.update(state="left", why="its head host is not in this run (--limit): an engine across hosts is "
                                       "repaired from its head")
        return state
    left = [f for f in found if f["state"] == "left"]
    down = [f for f in found if f["state"] == "down"]
    if left:
        state.update(state="left", why="; ".join("%s: %s" % (f["host"], f["why"]) for f in left))
    elif down:
        blocked = [f["blocked"] for f in down if f["blocked"]]
        state.update(state="down", why="; ".join(f["why"] for f in down), blocked="; ".join(blocked) or None)
    else:
        starts = [f["started_at"] for f in found]
        state.update(started_at=None if None in starts else min(starts),
                     last_started_at=None if None in starts else max(starts),
                     renewed="; ".join(f["renewed"] for f in found if f["renewed"]) or None)
    state["serving"] = all(f["serving"] for f in found)
    state["as_recorded"] = all(f["as_recorded"] for f in found)
    return state


def engine_states(docs):
    """{engine: state} of the status documents of the run's hosts (host_facts, merged per engine: an engine across
    hosts by its head, member 0). A running state carries started_at (its first host's start) and last_started_at
    (its last host's)."""
    hosts = {}
    for doc in docs or []:
        facts = host_facts(doc)
        hosts.setdefault(facts["engine"], []).append(facts)
    states = {}
    for engine, found in hosts.items():
        states[engine] = _merge(sorted(found, key=lambda f: f["member"]))
    return states
