# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How launch rolls the engines it starts or replaces behind the routers (pure): one at a time, by sets, or with a
stated outage, so that a router never pairs two engines whose NIXL handshake would refuse each other (the P/D
gate, _prepare/gate.py: factors and pair_problem).

Input, in fleet order: [{engine, role, url, action (start|replace|unchanged), running (the launch record of the run
the engine's container runs, or None: no container, or that run's record is not on the controller), new (the
installed record)}]. Output: {kind, reason, phases, refused}, each phase {engines, serving_before, serving_after}:
the routers' worker set ({prefill: [url], decode: [url]}) while the phase's engines are replaced, and after they
are proven.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.gate import factors, pair_problem
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.pairs import probe_pairs

__metaclass__ = type

ROLES = ("prefill", "decode")
CHANGING = ("start", "replace")
OUTAGE = "-e narwhal_roll_outage=accept"


def _facts(record):
    """gate.factors of a record, or None when it cannot be judged (an older record without the model geometry)."""
    try:
        return factors(record)
    except (InputError, KeyError, TypeError):
        return None


def _versions(entry):
    """[(label, record)] an engine may serve with during the roll: its running record and, when it changes, its new
    one; an unchanged engine keeps the new (installed) record, which its container runs."""
    if entry["action"] not in CHANGING:
        return [("", entry["new"])]
    out = [("new ", entry["new"])]
    if entry["action"] == "replace":
        out.insert(0, ("running ", entry["running"]))
    return out


def _problem(a, b):
    """(a, b): (label, record) of a prefill and a decode -> None or the sentence why vLLM's handshake would fail."""
    (la, ra), (lb, rb) = a, b
    fa, fb = _facts(ra), _facts(rb)
    if fa is None or fb is None:
        return "the %srecord of %s has no model geometry (an older discovery), so its compatibility is unknown" % (
            la if fa is None else lb, (ra if fa is None else rb)["engine"])
    found = pair_problem(ra, rb, fa, fb)
    if found is None:
        weights = (ra["runtime"].get("model_manifest"), rb["runtime"].get("model_manifest"))
        if None in weights or weights[0] == weights[1]:
            return None  # one weights (or a record from before the deliver stage: the same as far as is known)
        # not the handshake's: vLLM pairs them, and the decode continues KV the prefill computed with other
        # weights, answering wrongly with HTTP 200 (docs/delivery.md, "Checkpoints")
        found = ("model_manifest", "they serve different weights (runtime.model_manifest %s vs %s)" % weights)
    return "%s%s and %s%s: %s" % (la, ra["engine"], lb, rb["engine"], found[1])


def _unknown(entries):
    """The first replaced engine whose running record is missing, as a reason, or None."""
    for e in entries:
        if e["action"] == "replace" and e["running"] is None:
            return ("the record of the run %s runs is not on the controller (runs/<run>/%s/engine-launch.%s.json), so "
                    "whether its replacement changes its NIXL compatibility is unknown" % (e["engine"], e["engine"],
                                                                                           e["engine"]))
    return None


def _first_problem(prefills, decodes, versions):
    for p in prefills:
        for d in decodes:
            for a in versions(p):
                for b in versions(d):
                    problem = _problem(a, b)
                    if problem:
                        return problem
    return None


def _serving(entries):
    return dict((role, [e["url"] for e in entries if e["role"] == role]) for role in ROLES)


def _phase(engines, before, after):
    return {"engines": [e["engine"] for e in engines], "serving_before": _serving(before),
            "serving_after": _serving(after)}


def _rolling(entries, changing):
    """One phase per changing engine, in fleet order: out of the routers, replaced, proven, back in. An engine started
    for the first time is in no router before its phase."""
    phases, down = [], set(e["engine"] for e in changing if e["action"] == "start")
    for entry in changing:
        serving = [e for e in entries if e["engine"] not in down and e["engine"] != entry["engine"]]
        down.discard(entry["engine"])
        phases.append(_phase([entry], serving, [e for e in entries if e["engine"] not in down]))
    return phases


def _sets(entries):
    """A = the first ceil(n/2) prefills and decodes in fleet order, B = the rest: routers := B; replace A; prove A x A;
    routers := A; replace B; prove every pair; routers := A + B. An engine of B started for the first time is in no
    router before phase 2."""
    first, rest = [], []
    for role in ROLES:
        mine = [e for e in entries if e["role"] == role]
        half = (len(mine) + 1) // 2
        first += mine[:half]
        rest += mine[half:]
    order = dict((e["engine"], i) for i, e in enumerate(entries))
    first.sort(key=lambda e: order[e["engine"]])
    rest.sort(key=lambda e: order[e["engine"]])
    waiting = [e for e in rest if e["action"] != "start"]  # an engine started for the first time serves after B
    return [_phase(first, waiting, first), _phase(rest, first, entries)]


def _names(entries, role):
    mine = [e["engine"] for e in entries if e["role"] == role]
    return "%d %s (%s)" % (len(mine), role, ", ".join(mine) or "none")


def _refuse_or_outage(entries, changing, reason, accept):
    """Refused with the reason, or with narwhal_roll_outage=accept one phase: the routers lose every engine (they
    answer 503 meanwhile), every changing engine is replaced and proven, then the routers get all of them back."""
    if accept:
        return {"kind": "outage", "reason": reason + "; narwhal_roll_outage=accept: the routers serve no request "
                "until every engine is replaced and proven (bounded by NARWHAL_ENGINE_READY_TIMEOUT per engine)",
                "phases": [_phase(changing, [], entries)], "refused": None}
    return {"kind": "outage", "reason": reason, "phases": [], "refused": (
        "launch refuses to roll %s: %s. Nothing was changed. Fix the inputs, or accept a stated outage (the routers "
        "answer 503 until every engine is replaced and proven): rerun with %s"
        % (", ".join(e["engine"] for e in changing), reason, OUTAGE))}


def roll_plan(entries, accept_outage=False):
    """The roll of a launch (module docstring): rolling when every engine may serve beside every other whether old or
    new; sets when the compatibility changes fleet-wide and each role has two engines or more; else refused (or an
    outage with accept_outage). A running fleet already mixed is refused (or an outage) too."""
    changing = [e for e in entries if e["action"] in CHANGING]
    if not changing:
        return {"kind": "none", "reason": "no engine is started or replaced", "phases": [], "refused": None}
    prefills = [e for e in entries if e["role"] == "prefill"]
    decodes = [e for e in entries if e["role"] == "decode"]
    running = [e for e in entries if e["action"] != "start"]
    mixed = _first_problem([e for e in running if e["role"] == "prefill"],
                           [e for e in running if e["role"] == "decode"],
                           lambda e: [_versions(e)[0]] if e["running"] is not None or e["action"] != "replace" else [])
    if mixed:
        reason = "the running fleet is already mixed (two NIXL compatibility classes serve): %s" % mixed
        return _refuse_or_outage(entries, changing, reason, accept_outage)
    problem = _unknown(changing) or _first_problem(prefills, decodes, _versions)
    if problem is None:
        return {"kind": "rolling", "reason": "every engine keeps its NIXL compatibility: one at a time, each out of "
                "the routers while it is replaced and proven", "phases": _rolling(entries, changing), "refused": None}
    small = [role for role in ROLES if len([e for e in entries if e["role"] == role]) < 2]
    if small:
        reason = ("the NIXL compatibility changes (%s), and a roll by sets needs at least 2 prefill and 2 decode "
                  "engines; the fleet has %s and %s" % (problem, _names(entries, "prefill"), _names(entries, "decode")))
        return _refuse_or_outage(entries, changing, reason, accept_outage)
    return {"kind": "sets", "reason": "the NIXL compatibility changes fleet-wide (%s): by sets, so that no old engine "
            "is paired with a new one" % problem, "phases": _sets(entries), "refused": None}


def phase_pairs(entries, phase):
    """The [producer, consumer] pairs that prove a phase: every pair of one of its engines with an engine the routers
    serve after it (its own engines included), both ways."""
    urls = set(phase["serving_after"]["prefill"] + phase["serving_after"]["decode"])
    mine = set(phase["engines"])
    serving = [e for e in entries if e["url"] in urls or e["engine"] in mine]
    return probe_pairs([{"engine": e["engine"], "role": e["role"]} for e in serving], mine)


def describe(plan):
    """The lines launch shows: the kind, its reason, and the order of the phases."""
    lines = ["roll: %s - %s" % (plan["kind"], plan["refused"] or plan["reason"])]
    for i, phase in enumerate(plan["phases"], 1):
        lines.append("phase %d: routers serve prefill [%s] decode [%s]; replace and prove %s; then routers serve "
                     "prefill [%s] decode [%s]" % (
                         i, ", ".join(phase["serving_before"]["prefill"]), ", ".join(phase["serving_before"]["decode"]),
                         ", ".join(phase["engines"]), ", ".join(phase["serving_after"]["prefill"]),
                         ", ".join(phase["serving_after"]["decode"])))
    return lines


def _strip(url):
    return str(url).rstrip("/")


def router_moves(routers, direction, engines=None, serving=None):
    """What narwhal.deploy.router_members does on each router that runs, as [{host, remove | add | workers}]:
    `routers`: [{host, workers: {prefill: [url], decode: [url]}, ...}] (the routers' records: what each was given);
    `direction`: out (`engines`, [{engine, role, url}], leave every router that holds them; a router whose role would
    be left empty keeps them: vllm-router needs one prefill and one decode, and it answers errors for them until it is
    given them again), in (they come back where they were held) or set (`serving`, the complete worker set; none when
    a role of it is empty: the routers keep what they hold meanwhile, a stated outage)."""
    moves = []
    for router in routers:
        base = dict((k, v) for k, v in router.items() if k != "workers")
        held = dict((role, [_strip(u) for u in (router.get("workers") or {}).get(role) or []]) for role in ROLES)
        if direction == "set":
            if all(serving.get(role) for role in ROLES):
                moves.append(dict(base, workers=dict((r, [_strip(u) for u in serving[r]]) for r in ROLES)))
            continue
        mine = [e for e in engines or [] if _strip(e["url"]) in held.get(e["role"], [])]
        if not mine:
            continue
        if direction == "in":
            moves.append(dict(base, add=[{"role": e["role"], "url": _strip(e["url"])} for e in mine]))
            continue
        going = set(_strip(e["url"]) for e in mine)
        if all([u for u in held[role] if u not in going] for role in ROLES):
            moves.append(dict(base, remove=[_strip(e["url"]) for e in mine]))
    return moves
