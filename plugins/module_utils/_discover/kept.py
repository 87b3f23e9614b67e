# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery, pure planning: what discovery keeps of an engine whose host is unreachable in this run (issue 36).

An unreachable host drops out of the play (the opening play names it in the fact narwhal_lost), so discovery has no
facts of its engine. Rather than write a fleet without that engine, discovery keeps the engine's previous outputs as
they are: its deployment.env lines, its fleet entry, its launch record and its inspection extracts, byte for byte
(_discover/outputs.py plans the rest around them, _discover/fleet.py::build_fleet takes its address and host from
them). An engine with a lost host and no earlier outputs, or outputs that are not those discovery wrote (checked
against the sources index), or outputs discovered from other inputs than today's .env, is refused by name before
anything is written.

`kept_outputs(lost, inputs, read, paths, records)` takes how the previous set is read (`read(path)` -> bytes or None,
OutputSet.read: as the recovery of an interrupted write leaves it) and does no I/O of its own.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import (
    DEPLOYMENT_ENV,
    POLICY_FILE,
    SOURCES_FILE,
    engine_number,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.members import member_inspection
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import policy_changes

__metaclass__ = type

# the end of a kept engine's row in the table discovery shows (records carry no time: discovery writes byte-identical
# files for unchanged inputs, _discover/policy.py::check_policy)
KEPT_NOTE = "unreachable: kept its last record"

# an engine's lines in deployment.env, NARWHAL_NODE_<n>_<suffix> (_discover/fleet.py::build_fleet)
ENV_SUFFIXES = ("IP", "URL", "ATTESTATION_URL", "ENGINE_PORT", "ATTEST_PORT", "ROLE", "FABRIC_INTERFACE")


class _MissingError(Exception):
    """The previous outputs lack what discovery would keep of an engine (the message says what)."""


def lost_engines(lost, given, engines, members=None):
    """{engine: [its inventory hosts unreachable in this run]} of the engines of this discovery. `given`
    (discovery_outputs' lost_engines, the action plugin's mapping through narwhal_engines) wins; without it a lost
    host is the engine of its name or a host `members` lists after an engine's head. Other hosts (routers) are not
    discovery's."""
    if given is not None:
        return dict((e, sorted(set(hosts))) for e, hosts in given.items() if e in engines and hosts)
    found = {}
    for host in lost or []:
        for engine in engines:
            if host == engine or host in [m.get("host") for m in (members or {}).get(engine) or []]:
                found.setdefault(engine, []).append(host)
    return found


def bring_back(engine, hosts):
    """The fix of a refusal about a lost engine."""
    names = " and ".join(hosts)
    return ("bring %s back (until `ansible %s -m ansible.builtin.ping` answers: power, network, ssh) and rerun "
            "discovery (ansible-playbook narwhal.deploy.discover), or take %s out of the fleet: remove %s from the "
            "inventory and the NARWHAL_NODE_%d_* inputs from .env"
            % (names, hosts[0], engine, names, engine_number(engine)))


def unreachable(engine, hosts):
    """How a refusal about a lost engine starts."""
    return "the host%s %s of %s %s unreachable in this run" % ("s" if len(hosts) > 1 else "", ", ".join(hosts), engine,
                                                               "are" if len(hosts) > 1 else "is")


def _sha(raw):
    return hashlib.sha256(raw).hexdigest()


def _parse_env(raw):
    """{KEY: value} of the deployment.env discovery wrote (plain KEY=VALUE lines, _discover/fleet.py::render_env)."""
    found = {}
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            found[key] = value
    return found


def _json(raw, what):
    if raw is None:
        raise _MissingError("there is no %s" % what)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise _MissingError("%s is not JSON" % what)


def _previous_set(read, paths):
    """(launch config, sources index, policy extract) of the previous set, each checked against the index."""
    config_dir, launch_path = paths["config_dir"], paths["launch_config"]
    index_path = os.path.join(config_dir, SOURCES_FILE)
    index = _json(read(index_path), "sources index %s" % index_path)
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
        raise _MissingError("the sources index %s lists no files" % index_path)
    raw = read(launch_path)
    if raw is None or _sha(raw) != index.get("launch_config_sha256"):
        why = "missing" if raw is None else "not the one the sources index %s records" % index_path
        raise _MissingError("the launch config %s is %s" % (launch_path, why))
    launch = _json(raw, "launch config %s" % launch_path)
    policy_path = os.path.join(config_dir, POLICY_FILE)
    raw = read(policy_path)
    if raw is None or _sha(raw) != index["files"].get(POLICY_FILE):
        raise _MissingError("the policy extract %s is missing or not the one the sources index records" % policy_path)
    return launch, index, _json(raw, "policy extract %s" % policy_path)


def _kept_engine(engine, env, previous, read, config_dir):
    """What discovery keeps of one engine: its deployment.env values and, with `previous` (launch config, index,
    policy extract), its record and the texts of its inspection extracts."""
    prefix = "NARWHAL_NODE_%d_" % engine_number(engine)
    values = dict((suffix, env.get(prefix + suffix)) for suffix in ENV_SUFFIXES)
    absent = [prefix + s for s in ENV_SUFFIXES if not values[s]]
    if absent:
        raise _MissingError("%s has no %s" % (os.path.join(config_dir, DEPLOYMENT_ENV), ", ".join(absent)))
    kept = {"engine": engine, "env": values, "address": values["IP"], "host_id": engine, "record": None,
            "extracts": {}}
    if previous is None:
        return kept
    launch, index, _policy = previous
    record = (launch.get("engines") or {}).get(engine) if isinstance(launch, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("node"), dict):
        raise _MissingError("the launch config has no record of it")
    if record["node"].get("address") != values["IP"]:
        raise _MissingError("its launch record's address %s is not deployment.env's %s%s=%s"
                            % (record["node"].get("address"), prefix, "IP", values["IP"]))
    for rank in range(len(record.get("members") or []) + 1):
        name = member_inspection(engine, rank)
        raw = read(os.path.join(config_dir, name))
        if raw is None or _sha(raw) != index["files"].get(name):
            why = "missing" if raw is None else "not the one the sources index records"
            raise _MissingError("its inspection extract %s is %s" % (name, why))
        kept["extracts"][name] = raw.decode("utf-8")
    kept.update(record=record, host_id=record["node"].get("host_id") or engine)
    return kept


def _shown(value):
    return "unset" if value in (None, "", []) else json.dumps(value)


def _same_policy(engine, hosts, recorded, inputs):
    """Refuse keeping a record discovered from other inputs than today's: a site input, or one of the engine's own
    NARWHAL_NODE_<n>_* (the other engines' inputs are theirs)."""
    n = engine_number(engine)
    nodes = dict((int(k), v) for k, v in (inputs.get("nodes") or {}).items())
    mine = {"site": recorded.get("site") or {}, "nodes": {engine: (recorded.get("nodes") or {}).get(engine) or {}}}
    changes = policy_changes(mine, dict(inputs, nodes={n: nodes.get(n, {})}))
    if changes:
        key = changes[0][0]
        raise InputError(key, "%s, so discovery would keep its last record, but that record was discovered from "
                              "other inputs: %s; undo the change until %s is back, or %s"
                         % (unreachable(engine, hosts),
                            "; ".join("%s was %s, .env has %s" % (k, _shown(a), _shown(b)) for k, a, b in changes),
                            engine, bring_back(engine, hosts)))


def kept_outputs(lost, inputs, read, paths, records):
    """-> {engine: {engine, hosts, env, address, host_id, record, extracts, unreachable, fix}} for every engine of
    `lost` ({engine: [its lost hosts]}); `records`: whether this discovery writes launch records (then each kept
    engine's record and extracts must be there, discovery's own, from today's policy inputs). A refusal raises
    InputError naming the host and the engine, before anything is written."""
    if not lost:
        return {}
    config_dir = paths["config_dir"]
    env = _parse_env(read(os.path.join(config_dir, DEPLOYMENT_ENV)))
    previous, why = None, None
    if records:
        try:
            previous = _previous_set(read, paths)
        except _MissingError as exc:
            why = str(exc)
    kept = {}
    for engine, hosts in sorted(lost.items(), key=lambda item: engine_number(item[0])):
        try:
            if why:
                raise _MissingError(why)
            kept[engine] = dict(_kept_engine(engine, env, previous, read, config_dir), hosts=list(hosts),
                                unreachable=unreachable(engine, hosts), fix=bring_back(engine, hosts))
        except _MissingError as exc:
            raise InputError(hosts[0], "%s and discovery has no earlier record of %s to keep (%s), so it would write "
                                       "a fleet without it; %s"
                             % (unreachable(engine, hosts), engine, exc, bring_back(engine, hosts)))
        if previous is not None:
            _same_policy(engine, hosts, previous[2], inputs)
    return kept
