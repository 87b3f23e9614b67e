# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After a launch (pure): the NIXL peers of the engines it started or replaced (docs/vllm-requirements.md, "The NIXL
lifecycle of a replaced engine").

A replaced prefill comes back with a new NIXL agent (vLLM draws a new engine_id at every start; the planner never
pins one). Whether the decode engines that talked to the old one must be restarted is decided here, from the
versions their launch records pin (PEER_RESTART_RULE), and which prefill/decode pairs to probe again.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.transfer import kv_transfer_config
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.pairs import probe_pairs

__metaclass__ = type

# The connectors that pull KV (the decode reads from the prefill): vLLM's NixlConnector is NixlPullConnector
# (nixl/connector.py), and only the pull worker releases a replaced peer (nixl/base_worker.py: both
# _track_remote_engine_replacement and the cleanup return early unless the transfer mode is "pull").
PULL_CONNECTORS = ("NixlConnector", "NixlPullConnector")

# A prefill's replacement needs no restart of the decode engines that talked to it only when every row holds for
# the decode's image (the decode's process holds the old peer's state and would crash on it). Otherwise restart
# them. (package, first good release, what that release fixes, what happens before it)
PEER_RESTART_RULE = (
    ("nixl", (1, 5, 0),
     "the UCX backend checks the endpoint before it unpacks a remote key (ai-dynamo/nixl PR #1987, issue #1986; "
     "absent from NIXL 1.4.0 and 1.4.1)",
     "the decode may segfault in loadRemoteMD at its first handshake with the replacement (vLLM issue #49238)"),
    ("vllm", (0, 31, 0),
     "the decode releases a replaced pull-mode peer's NIXL state once it has shaken hands with the new one (vLLM "
     "PR #50047, issue #49238)",
     "the dead peer's NIXL agent, handles and UCX endpoints stay cached until engine_ttl (3600 s; never where the "
     "release has no engine_ttl)"),
)

LAUNCHED = ("start", "replace")


def _release(text):
    return ".".join(str(n) for n in text)


def decode_restart(vllm_version, nixl_version, connector):
    """-> (restart, why): whether a decode engine of this vLLM, NIXL and connector must be restarted after a prefill
    it talked to was replaced (PEER_RESTART_RULE), and why, in a sentence that cites the rule."""
    versions = {"vllm": vllm_version, "nixl": nixl_version}
    if connector not in PULL_CONNECTORS:
        return True, ("its connector %s is not a pull connector (%s): only the pull worker releases a replaced peer "
                      "(vLLM PR #50047)" % (connector or "unknown", ", ".join(PULL_CONNECTORS)))
    held = []
    for package, first, fixed, before in PEER_RESTART_RULE:
        name = "NIXL" if package == "nixl" else "vLLM"
        version = versions[package]
        if not version:
            return True, "the version of its %s is not recorded, so the rule cannot clear it" % name
        if release_tuple(version) < first:
            return True, "its %s %s is older than %s, where %s: before it, %s" % (
                name, version, _release(first), fixed, before)
        held.append("%s %s >= %s" % (name, version, _release(first)))
    return False, "%s with %s: the decode releases the replaced peer itself (NIXL PR #1987, vLLM PR #50047)" % (
        " and ".join(held), connector)


def peer_facts(record):
    """What the rule reads from an engine's launch record: runtime.vllm_version, the version of its NIXL
    distribution (runtime.expected_packages[runtime.nixl_distribution], what the image check confirms in the image)
    and the connector the planner writes into --kv-transfer-config (_plan/transfer.py::kv_transfer_config)."""
    runtime = (record or {}).get("runtime") or {}
    packages = runtime.get("expected_packages") or {}
    nixl = runtime.get("nixl_distribution")
    try:
        connector = kv_transfer_config(record or {})["kv_connector"]
    except PlanError:
        connector = None
    return {"vllm": runtime.get("vllm_version"), "nixl_distribution": nixl,
            "nixl": packages.get(nixl) if nixl else None, "connector": connector}


def _may_hold(decode, prefill, launched):
    """Whether `decode` may hold the NIXL state of `prefill`'s previous container: it kept running through the
    launch, or (both replaced) it started before the prefill's new container. An unknown time counts as before."""
    mine, theirs = launched.get(decode) or {}, launched.get(prefill) or {}
    if mine.get("action") not in LAUNCHED:
        return True
    if theirs.get("action") != "replace":
        return False  # a prefill that had no container when this launch began: a new decode never saw the old one
    first, second = mine.get("started_at"), theirs.get("started_at")
    return not (first and second and first > second)


def after_launch(fleet, launched, peers):
    """What follows a launch: the decodes to restart and the pairs to probe again.

    `fleet`: [{engine, role}] in fleet order; `launched`: {engine: {action (start, replace, unchanged), started_at
    (the container's start, ISO 8601 UTC, or None)}} of the engines this launch acted on (an engine absent kept
    running); `peers`: {engine: peer_facts}.
    -> {"replaced_prefill", "restart", "why", "kept", "pairs"}: the prefills started or replaced, the decodes to
    restart in fleet order with the rule's reason each (why) or the reason none is needed (kept), and the
    [producer, consumer] pairs to probe: every pair of a replaced or restarted engine, and every pair of a started
    engine with one that kept running (a fleet started from nothing is the probe stage's job, an unchanged one
    probes nothing)."""
    roles = dict((e["engine"], e.get("role")) for e in fleet)
    action = dict((engine, (launched.get(engine) or {}).get("action")) for engine in roles)
    prefills = [e for e in roles if roles[e] == "prefill" and action[e] in LAUNCHED]
    restart, why, kept = [], {}, {}
    for decode in [e for e in roles if roles[e] == "decode"]:
        talked = [p for p in prefills if _may_hold(decode, p, launched)]
        if not talked:
            continue
        facts = peers.get(decode) or {}
        needed, reason = decode_restart(facts.get("vllm"), facts.get("nixl"), facts.get("connector"))
        text = "it talked to %s, replaced by this launch; %s" % (", ".join(talked), reason)
        if needed:
            restart.append(decode)
            why[decode] = text
        else:
            kept[decode] = text
    fresh = set(e for e in roles if action[e] == "replace") | set(restart)
    started = set(e for e in roles if action[e] == "start")
    pairs = [pair for pair in probe_pairs(fleet)
             if fresh & set(pair) or (pair[0] in started) != (pair[1] in started)]
    return {"replaced_prefill": prefills, "restart": restart, "why": why, "kept": kept, "pairs": pairs}


def describe(plan, check=False):
    """The lines launch shows: each decode the rule looked at and why, then the pairs it probes again."""
    would = "would " if check else ""
    lines = ["%s: %srestart - %s" % (e, would, plan["why"][e]) for e in plan["restart"]]
    lines += ["%s: no restart - %s" % (e, plan["kept"][e]) for e in plan["kept"]]
    if plan["pairs"]:
        lines.append("%sprobe again: %s" % (would, ", ".join("%s -> %s" % tuple(p) for p in plan["pairs"])))
    return lines


def restart_refusal(plan, mode, play_hosts):
    """The message that ends the launch, or None: with mode `tell` the operator restarts the decodes the plan
    names; with `auto` only those outside this play (a --limit) are left to them."""
    left = list(plan["restart"]) if mode == "tell" else [e for e in plan["restart"] if e not in play_hosts]
    if not left:
        return None
    reasons = "; ".join("%s: %s" % (e, plan["why"][e]) for e in left)
    how = ("narwhal_decode_restart=tell" if mode == "tell" else
           "they are outside this play (--limit), so launch cannot restart them")
    return ("launch replaced prefill %s, and decode %s must be restarted before it serves again (%s). %s. Restart "
            "them one at a time: ansible-playbook narwhal.deploy.launch -e narwhal_launch_restart=%s"
            % (", ".join(plan["replaced_prefill"]), ", ".join(left), how, reasons, ",".join(left)))


# ------------------------------------------------------------------ after a crash (a status run that repairs)


def _renewed_prefills(roles, states, start):
    """{prefill: (since, why)}: the prefills whose process is not the one the decodes may have talked to - started
    again by this repair (since None: now), or running a process that is not the one its launch recorded (since: its
    last host's start, seconds)."""
    renewed = {}
    for engine, role in roles:
        state = states.get(engine)
        if role != "prefill" or state is None:
            continue
        if engine in start:
            renewed[engine] = (None, "it is started again by this repair")
        elif state["state"] == "running" and state.get("renewed"):
            renewed[engine] = (state.get("last_started_at"), state["renewed"])
    return renewed


def _stale_decodes(roles, states, start, peers):
    """(restart, why, kept): the running decodes whose process started before a renewed prefill's (an unknown time
    counts as before), restarted where the rule says so (decode_restart), with the reason each."""
    renewed = _renewed_prefills(roles, states, start)
    restart, why, kept = [], {}, {}
    for engine, role in roles:
        state = states.get(engine)
        if role != "decode" or state is None or state["state"] != "running" or engine in start:
            continue
        mine = state.get("started_at")
        talked = [p for p, (since, _w) in renewed.items() if since is None or mine is None or mine < since]
        if not talked:
            continue
        facts = peers.get(engine) or {}
        needed, reason = decode_restart(facts.get("vllm"), facts.get("nixl"), facts.get("connector"))
        text = "it runs since before the process of %s (%s); %s" % (
            ", ".join(talked), "; ".join("%s: %s" % (p, renewed[p][1]) for p in talked), reason)
        if needed:
            restart.append(engine)
            why[engine] = text
        else:
            kept[engine] = text
    return restart, why, kept


def after_restart(fleet, states, peers, lost=()):
    """What a repair run does after crashes (a status run with narwhal_repair=true; docs/day-two.md, "Crashes").

    `fleet`: [{engine, role}] in fleet order; `states`: {engine: state} of the engines the run saw
    (_launch/repair.py::engine_states: state running, down or left, why, blocked, started_at, last_started_at,
    renewed, serving, as_recorded); `peers`: {engine: peer_facts}; `lost`: the engines of a lost host
    (narwhal_lost.engines), never started, restarted, proven with or put back.
    -> {"start": the engines whose container does not run, started again exactly as recorded (fleet order);
        "restart": the running decodes a renewed prefill (restarted by Docker, or started now) leaves with its previous
        process's NIXL state, where the rule says so; "order": start then restart (the prefills come back before their
        decodes are restarted); "why" (each of order), "kept" (a decode the rule keeps, and why), "left" (an engine
        that is down but cannot be started as recorded, or that cannot be read: why, untouched); "out": the engines
        that leave the routers before anything is restarted (every one that is down, and the lost ones), so that no
        router reload waits for an engine that does not answer; "back": the engines that serve as recorded and are
        not restarted (put back into a router that lacks them); "proof": {engine: the [producer, consumer] pairs that
        prove it before it goes back in - with the engines serving then, none that is still to be restarted}}."""
    lost = set(lost or ())
    roles = [(e["engine"], e.get("role")) for e in fleet if e["engine"] not in lost]
    states = dict((e, states[e]) for e, _r in roles if e in (states or {}))
    start, why, left = [], {}, {}
    for engine, _role in roles:
        state = states.get(engine)
        if state is None:
            continue
        if state["state"] == "left":
            left[engine] = state["why"]
        elif state["state"] == "down" and state.get("blocked"):
            left[engine] = "%s; %s" % (state["why"], state["blocked"])
        elif state["state"] == "down":
            start.append(engine)
            why[engine] = "%s: started again as recorded" % state["why"]
    restart, stale, kept = _stale_decodes(roles, states, start, peers or {})
    why.update(stale)
    order = start + restart
    serving = set(e for e, s in states.items() if s["state"] == "running" and s["serving"] and e not in order)
    proof = {}
    for index, engine in enumerate(order):
        partners = serving | set(order[:index + 1])
        proof[engine] = [pair for pair in probe_pairs(fleet, [engine]) if set(pair) <= partners]
    down = [e for e, _r in roles if (states.get(e) or {}).get("state") == "down"]
    return {"start": start, "restart": restart, "order": order, "why": why, "kept": kept, "left": left,
            "out": [e["engine"] for e in fleet if e["engine"] in lost or e["engine"] in down],
            "back": [e for e, _r in roles if e in states and states[e]["state"] == "running"
                     and states[e]["as_recorded"] and e not in order],
            "proof": proof}


def describe_restart(plan, lost=(), check=False):
    """The lines a repair run shows: what it starts or restarts and why, the decodes the rule keeps, what it leaves
    alone, and "nothing to start or restart" when it starts and restarts nothing."""
    would = "would " if check else ""
    lines = ["%s: %sstart - %s" % (e, would, plan["why"][e]) for e in plan["start"]]
    lines += ["%s: %srestart - %s" % (e, would, plan["why"][e]) for e in plan["restart"]]
    lines += ["%s: no restart - %s" % (e, plan["kept"][e]) for e in plan["kept"]]
    lines += ["%s: left alone - %s" % (e, plan["left"][e]) for e in plan["left"]]
    lines += ["%s: left alone - a host of it is lost (unreachable, narwhal_lost): out of the routers, not repaired"
              % e for e in lost or ()]
    return lines + ([] if plan["order"] else ["nothing to start or restart"])
