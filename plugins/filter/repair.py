# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of a status run that repairs (-e narwhal_repair=true; playbooks/status.yml, roles/status/tasks/repair.yml):
repair_records (the launch records it reads on the controller) and repair_plan (what it starts, restarts, leaves
alone and puts back: _launch/repair.py::engine_states, _launch/peers.py::after_restart)."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import after_restart, describe_restart
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import peer_facts as record_peer_facts
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.repair import engine_states


def _record_path(runs_dir, doc):
    """The controller's copy of an engine's installed launch record (the run directory prepare wrote), or None."""
    run, engine = doc.get("run_id_installed"), doc.get("engine")
    if not run or not engine:
        return None
    return "%s/%s/%s/engine-launch.%s.json" % (str(runs_dir).rstrip("/"), run, engine, engine)


def repair_records(docs, runs_dir):
    """The launch record files repair_plan reads (lookup('file') on the controller): each engine's installed run's."""
    paths = []
    for doc in docs or []:
        path = _record_path(runs_dir, doc)
        if path and path not in paths:
            paths.append(path)
    return paths


def _peers(docs, runs_dir, texts, records):
    """{engine: peer_facts} from the installed records' texts ({path: text}), else the launch config's records."""
    peers = {}
    for doc in docs:
        path, engine = _record_path(runs_dir, doc), doc.get("engine")
        if engine in peers or not path or path not in texts:
            continue
        try:
            peers[engine] = record_peer_facts(json.loads(texts[path]))
        except ValueError as exc:
            raise AnsibleFilterError("the launch record %s does not parse (%s); rerun prepare" % (path, exc))
    for engine, record in (records or {}).items():
        peers.setdefault(engine, record_peer_facts(record))
    return peers


def repair_plan(docs, fleet, runs_dir, texts=None, records=None, lost=None, check=False):
    """What a status run with narwhal_repair=true does (after_restart), from the status documents of the play's hosts
    (status_engine), the resolved fleet, the runs directory, the texts of repair_records' files, the launch config's
    records (for an engine whose installed record the controller lacks) and the lost engines (narwhal_lost.engines).
    Adds `hosts` (the inventory host, the head, of each engine of `order`) and `lines` (what the run shows; with
    check, what it would do)."""
    if not isinstance(fleet, list):
        raise AnsibleFilterError("repair_plan takes the resolved fleet (a list, lookup('narwhal.deploy.fleet')), not %s"
                                 % type(fleet).__name__)
    if not isinstance(lost or [], list):
        raise AnsibleFilterError("repair_plan: lost must be a list of engines (narwhal_lost.engines), not %r" % (lost,))
    docs = [d for d in docs or [] if isinstance(d, dict)]
    states = engine_states(docs)
    plan = after_restart(fleet, states, _peers(docs, runs_dir, texts or {}, records), lost or [])
    plan["hosts"] = [states[e]["host"] for e in plan["order"]]
    plan["lines"] = describe_restart(plan, [e["engine"] for e in fleet if e["engine"] in (lost or [])], check)
    return plan


class FilterModule:
    def filters(self):
        return {"repair_records": repair_records, "repair_plan": repair_plan}
