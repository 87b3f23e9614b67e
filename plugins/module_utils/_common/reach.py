# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hosts a run lost (pure): which hosts of the play did not answer when the run opened, which engines they take
with them (an engine across hosts is lost with any of its hosts), and whether the run may go on without them
(NARWHAL_MAX_LOST_HOSTS). playbooks/boilerplate.yml reaches every host of the play once per run; Ansible leaves an
unreachable host out of every later play of the run (ansible-core executor/task_queue_manager.py: a host of
_unreachable_hosts is appended to each new play's _removed_hosts), so the stages after it act on the others, and
leave the lost engines out of the routers' worker sets and of the pairs they probe (docs/day-two.md, "A lost host").
"""

from __future__ import annotations

import math
import re

__metaclass__ = type

BOUND_KEY = "NARWHAL_MAX_LOST_HOSTS"
PERCENT = re.compile(r"^([0-9]+)%$")


def allowed(bound, hosts):
    """How many of `hosts` hosts a run may lose under NARWHAL_MAX_LOST_HOSTS `bound`: a count ("2"), or a percentage
    of the play's hosts, rounded up ("10%": 1 of 4 hosts, 3 of 30)."""
    text = str(bound).strip()
    match = PERCENT.match(text)
    if match:
        return int(math.ceil(int(match.group(1)) * hosts / 100.0))
    return int(text)


def lost_hosts(play_hosts, reached, engines, members, routers, roles, bound):
    """-> {hosts, engines, routers, left_out, refused, empty_role}: `hosts` the play's hosts that did not answer (in
    play order), `engines` the engines with a lost host, `routers` the lost hosts of group routers, `left_out` the
    hosts that answered but serve only a lost engine (the other hosts of an engine across hosts: the run leaves them
    out too), `refused` None, or why the run stops here: more hosts lost than `bound` allows; `empty_role` None, or
    which role of the play has no engine left (a run that changes the fleet stops on it too; status only reports
    it). `play_hosts`: ansible_play_hosts_all; `reached`: the hosts that answered; `engines`: {inventory host:
    engine-<n>} (narwhal_engines); `members`: {engine-<n>: its hosts} (narwhal_members); `routers`: group routers;
    `roles`: {engine-<n>: prefill|decode}."""
    answered = set(reached)
    lost = [h for h in play_hosts if h not in answered]
    lost_engines = []
    for host in lost:
        engine = engines.get(host)
        if engine and engine not in lost_engines:
            lost_engines.append(engine)
    left_out = [h for e in lost_engines for h in members.get(e, ()) if h in answered]
    report = {"hosts": lost, "engines": lost_engines, "routers": [h for h in lost if h in routers],
              "left_out": left_out, "refused": None, "empty_role": None}
    if not lost:
        return report
    limit = allowed(bound, len(play_hosts))
    if len(lost) > limit:
        report["refused"] = (
            "%d of the play's %d hosts did not answer (%s), more than %s=%s allows (%d). Nothing was changed. Bring "
            "them back (ssh to each, then rerun), leave them out of this run (--limit 'all:!%s'), or raise %s in .env"
            % (len(lost), len(play_hosts), ", ".join(lost), BOUND_KEY, bound, limit, ":!".join(lost), BOUND_KEY))
        return report
    for role in ("prefill", "decode"):
        mine = sorted(set(e for e in engines.values() if roles.get(e) == role and
                          any(h in play_hosts for h in members.get(e, ()))))
        if mine and all(e in lost_engines for e in mine):
            report["empty_role"] = (
                "every %s engine of the play is on a host that did not answer (%s): the routers would have no %s "
                "engine to route to. Nothing was changed. Bring a host back (ssh to it, then rerun)"
                % (role, ", ".join("%s on %s" % (e, ", ".join(h for h in members.get(e, ()) if h in lost))
                                   for e in mine), role))
            return report
    return report


def describe(report):
    """The lines the opening shows for a run that lost hosts."""
    lines = []
    for host in report["hosts"]:
        lines.append("%s did not answer: this run goes on without it" % host)
    for engine in report["engines"]:
        lines.append("%s is left out of this run and out of the routers' worker sets; the next run takes it back"
                     % engine)
    for host in report["left_out"]:
        lines.append("%s answered, but serves only a lost engine: left out of this run too" % host)
    if report.get("empty_role"):
        lines.append(report["empty_role"])
    return lines
