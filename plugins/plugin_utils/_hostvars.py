# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the controller steps read of each engine from its host variables (hostvars[engine]), in one place.

The action plugins of discovery_outputs and prepare_run call discovery_facts / prepare_facts with the task's
arguments and task_vars['hostvars']: an argument the task gives wins, so the modules' options stay usable directly.
Every value read is a public name: the facts the fact modules set (narwhal_*) and the prepare role's documented
register prepare_prereqs. Pure: `hostvars` is any mapping of inventory host name to a mapping of its variables, and
`hosts` ({inventory host: engine-<n>}, the fact narwhal_engines of the opening play) says which host runs which
engine; without it an engine's host is the host of its name.
"""

from __future__ import annotations

__metaclass__ = type


# discovery_outputs' `hosts`, per engine: key -> the fact that carries it (engine_host_facts sets them all)
INSPECTION_FACTS = (("gpus", "narwhal_gpus"), ("rdma", "narwhal_rdma"), ("image", "narwhal_image"),
                    ("model", "narwhal_model"))


# discovery_outputs' `interfaces`, per engine
INTERFACE_FACT = "narwhal_interface"


# the result of narwhal.deploy.engine_prereqs as the prepare role registers it: its image_id is the recorded image's
# ID on the host now, its model_manifest the digest of the checkpoint's manifest there now
PREREQS_VAR = "prepare_prereqs"


def host_inspection(hostvars):
    """The inspection discovery gathered on one engine host, as discovery_outputs' `hosts` takes it."""
    return dict((key, hostvars.get(fact)) for key, fact in INSPECTION_FACTS)


def current_inspection(hostvars):
    """What prepare_run's write stage compares a record with: the GPUs and the fabric interface now
    (narwhal_gpus, narwhal_interface, read again by the prepare role), the recorded image's ID on the host and the
    digest of its checkpoint's manifest (prepare_prereqs.model_manifest)."""
    prereqs = hostvars.get(PREREQS_VAR) or {}
    return {"gpus": hostvars.get("narwhal_gpus"), "interface": hostvars.get(INTERFACE_FACT),
            "image_id": prereqs.get("image_id"), "model_manifest": prereqs.get("model_manifest")}


def _heads(hosts=None, members=None):
    """{engine-<n>: the inventory host that runs it}: the head (first) of `members` (narwhal_members) for an engine
    across hosts, else the host `hosts` (narwhal_engines) maps to it."""
    inventory = dict((engine, host) for host, engine in (hosts or {}).items())
    inventory.update((engine, names[0]) for engine, names in (members or {}).items() if names)
    return inventory


def _engines(args, hostvars, hosts=None, members=None):
    """(engine, its head host's variables) for the task's `engines`; None when `engines` is not a list (the argument
    validation names that)."""
    engines = args.get("engines")
    if not isinstance(engines, list):
        return None
    inventory = _heads(hosts, members)
    found = [(e, inventory.get(e, e)) for e in engines]
    return [(e, hostvars[h] if h in hostvars else {}) for e, h in found]


def member_facts(engines, hostvars, members):
    """discovery_outputs' `members`: {engine: [{host, interface, inspection} of each host after the head]} of the
    engines across hosts (`members`: narwhal_members)."""
    found = {}
    for engine in engines:
        for host in (members or {}).get(engine, [])[1:]:
            facts = hostvars[host] if host in hostvars else {}
            found.setdefault(engine, []).append({"host": host, "interface": facts.get(INTERFACE_FACT),
                                                 "inspection": host_inspection(facts)})
    return found


def lost_engines(lost, engines, hosts=None, members=None):
    """discovery_outputs' `lost_engines`: {engine: [its inventory hosts in `lost`]} of the engines of the task
    (`hosts`: narwhal_engines, `members`: narwhal_members; an engine-<n> host without a mapping is its own). A lost
    host of no engine (a router) is not discovery's."""
    engine_of = dict(hosts or {})
    for engine, names in (members or {}).items():
        engine_of.update((name, engine) for name in names or [])
    found = {}
    for host in [h for h in lost if isinstance(h, str)]:
        engine = engine_of.get(host, host)
        if engine in engines:
            found.setdefault(engine, []).append(host)
    return found


def discovery_facts(args, hostvars, hosts=None, members=None):
    """discovery_outputs' arguments with `interfaces`, `hosts` and `members` read from the engines' host variables
    where the task does not give them, and `lost_engines` from `lost` (the inventory hosts unreachable in this
    run)."""
    engines = _engines(args, hostvars, hosts, members)
    if engines is None:
        return args
    args = dict(args)
    if isinstance(args.get("lost"), list) and "lost_engines" not in args:
        args["lost_engines"] = lost_engines(args["lost"], [e for e, _found in engines], hosts, members)
    if "interfaces" not in args:
        args["interfaces"] = dict((e, found.get(INTERFACE_FACT)) for e, found in engines)
    if "hosts" not in args:
        args["hosts"] = dict((e, host_inspection(found)) for e, found in engines)
    if "members" not in args:
        spread = member_facts([e for e, _found in engines], hostvars, members)
        if spread:
            args["members"] = spread
    return args


def prepare_facts(args, hostvars, hosts=None, members=None):
    """prepare_run's arguments with the write stage's `hosts` read from the engines' host variables where the task
    does not give it, and with `tls`, the inventory host that runs each engine (`engine_hosts`: whose certificate it
    serves)."""
    engines = _engines(args, hostvars, hosts, members)
    if engines is None:
        return args
    if args.get("tls") is not None and "engine_hosts" not in args:
        inventory = _heads(hosts, members)
        args = dict(args, engine_hosts=dict((e, inventory.get(e, e)) for e, _found in engines))
    if "hosts" in args or args.get("stage") != "write":
        return args
    current = dict((e, current_inspection(found)) for e, found in engines)
    for engine, _found in engines:  # the other hosts of an engine across hosts, as <engine>#<narwhal_rank>
        for rank, host in enumerate((members or {}).get(engine, [])[1:], 1):
            current["%s#%d" % (engine, rank)] = current_inspection(hostvars[host] if host in hostvars else {})
    return dict(args, hosts=current)
