# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names: the engine name engine-<n> (an engine's identity in `.env`, records, fleet and runs:
docs/vllm-requirements.md, "Engine endpoints and the fleet") and the inventory host that carries it (the host variable
narwhal_node, or a host named engine-<n>), environment variable names, the names of the files discovery writes, and
local-only hosts.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError

__metaclass__ = type


# The engine name, written once: the JSON Schemas of the fleet and the records take ENGINE_PATTERN
# (_outputs/schemas.py), everything else matches ENGINE_NAME (group 1: the node number n of NARWHAL_NODE_<n>_*).
ENGINE_PATTERN = "^engine-[1-9][0-9]*$"
ENGINE_NAME = re.compile(r"^engine-([1-9][0-9]*)\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# The files discovery writes into NARWHAL_CONFIG_DIR, by name (docs/outputs.md)
DEPLOYMENT_ENV = "deployment.env"
INSPECTION_FILE = "engine-launch.%s.inspection.json"
POLICY_FILE = "engine-launch.policy.json"
SOURCES_FILE = "engine-launch.sources.json"
# The manifest of NARWHAL_MODEL_SOURCE the deliver stage writes into NARWHAL_CONFIG_DIR (prepare compares the records'
# runtime.model_manifest with its digest)
MODEL_MANIFEST_FILE = "model-manifest.json"


# The host variable that ties an inventory host of group engines to node <n> of .env (docs/inputs.md, "The inventory")
NODE_VAR = "narwhal_node"
NODE_VALUE = re.compile(r"^[1-9][0-9]{0,5}\Z")
# The host variable that gives each inventory host of an engine across hosts its place: 0 the head, 1.. the others
RANK_VAR = "narwhal_rank"
RANK_VALUE = re.compile(r"^(0|[1-9][0-9]?)\Z")


def engine_number(name):
    m = ENGINE_NAME.match(name or "")
    if not m:
        raise InputError(name, "%r is not an engine name engine-<n> (n = the <n> of NARWHAL_NODE_<n>_*); give the "
                               "engines' names, or set narwhal_node: <n> for the inventory host" % name)
    return int(m.group(1))


def host_engine(host, node=None):
    """The engine an inventory host of group engines runs: engine-<narwhal_node> when the host variable narwhal_node
    is set (a positive integer: the <n> of NARWHAL_NODE_<n>_*), else the host's own name when it is engine-<n>."""
    named = ENGINE_NAME.match(str(host))
    if node is None or node == "":
        if named:
            return str(host)
        raise InputError(NODE_VAR, "inventory host %s is in group engines but has no host variable %s and is not "
                                   "named engine-<n>; set %s: <n> for it in the inventory (the <n> of "
                                   "NARWHAL_NODE_<n>_* in .env), or name the host engine-<n>"
                         % (host, NODE_VAR, NODE_VAR))
    text = str(node).strip() if not isinstance(node, (bool, float)) else ""
    if not NODE_VALUE.match(text):
        raise InputError(NODE_VAR, "inventory host %s has %s: %r, which is not a node number; set it to the positive "
                                   "integer <n> of NARWHAL_NODE_<n>_* in .env (e.g. %s: 3)"
                         % (host, NODE_VAR, node, NODE_VAR))
    engine = "engine-%d" % int(text)
    if named and str(host) != engine:
        raise InputError(NODE_VAR, "inventory host %s has %s: %s, so it would run %s under the name of another "
                                   "engine; a host named engine-<n> is node <n>: set %s: %s or remove it (or rename "
                                   "the host)" % (host, NODE_VAR, text, engine, NODE_VAR, named.group(1)))
    return engine


def host_rank(host, rank):
    """The narwhal_rank of an inventory host (None when unset): 0 for the head of an engine across hosts, 1.. for
    its headless workers."""
    if rank is None or rank == "":
        return None
    text = str(rank).strip() if not isinstance(rank, (bool, float)) else ""
    if not RANK_VALUE.match(text):
        raise InputError(RANK_VAR, "inventory host %s has %s: %r, which is not a host rank; set it to 0 for the head "
                                   "of its engine and 1, 2, ... for the other hosts of that engine (or remove it for "
                                   "an engine on one host)" % (host, RANK_VAR, rank))
    return int(text)


def engine_hosts(hosts):
    """{engine-<n>: [its inventory hosts in narwhal_rank order, the head first]} of the hosts of group engines,
    given as (host, narwhal_node or None[, narwhal_rank or None]). An engine on one host needs no narwhal_rank (or
    0); the hosts of an engine across hosts carry narwhal_rank 0 .. count-1, each once. Refuses a host without an
    engine, two hosts of one engine without ranks, a repeated or missing rank, naming the hosts."""
    found = {}
    for item in hosts:
        host, node = item[0], item[1]
        rank = host_rank(host, item[2] if len(item) > 2 else None)
        found.setdefault(host_engine(host, node), []).append((rank, str(host)))
    members = {}
    for engine, ranked in found.items():
        n = engine.split("-")[1]
        if len(ranked) == 1:
            rank, host = ranked[0]
            if rank not in (None, 0):
                raise InputError(RANK_VAR, "inventory host %s has %s: %d but is the only host of %s (node %s of "
                                           ".env); the head of an engine is rank 0: set %s: 0 and list its other "
                                           "hosts with ranks 1, 2, ... (NARWHAL_NODE_%s_HOSTS), or remove %s"
                                 % (host, RANK_VAR, rank, engine, n, RANK_VAR, n, RANK_VAR))
            members[engine] = [host]
            continue
        unranked = [h for r, h in ranked if r is None]
        if unranked:
            names = [h for _r, h in ranked]
            raise InputError(NODE_VAR, "inventory hosts %s are %s %s (node %s of .env) and %s no %s; an engine on "
                                       "one host is one host of group engines: give them distinct %s values (two "
                                       "engines on one machine are two inventory hosts with the same ansible_host), "
                                       "or, for one engine across hosts (NARWHAL_NODE_%s_HOSTS), give each host its "
                                       "%s: 0 for the head, 1, 2, ... for the others"
                             % (" and ".join([", ".join(names[:-1]), names[-1]]), "both" if len(names) == 2 else
                                "all", engine, n, "%s has" % unranked[0] if len(unranked) == 1 else
                                "%s have" % ("both" if len(unranked) == 2 == len(names) else ", ".join(unranked)),
                                RANK_VAR, NODE_VAR, n, RANK_VAR))
        by_rank = {}
        for rank, host in sorted(ranked):
            if rank in by_rank:
                raise InputError(RANK_VAR, "inventory hosts %s and %s of %s both have %s: %d; each host of an engine "
                                           "across hosts has its own rank (0 the head, 1 .. %d the others)"
                                 % (by_rank[rank], host, engine, RANK_VAR, rank, len(ranked) - 1))
            by_rank[rank] = host
        missing = [r for r in range(len(ranked)) if r not in by_rank]
        if missing:
            raise InputError(RANK_VAR, "the %d inventory hosts of %s have %s %s, so rank %s is missing; give them the "
                                       "ranks 0 .. %d, 0 for the head (the host that serves the engine's HTTP API)"
                             % (len(ranked), engine, RANK_VAR, ", ".join(str(r) for r in sorted(by_rank)),
                                ", ".join(str(r) for r in missing), len(ranked) - 1))
        members[engine] = [by_rank[r] for r in range(len(ranked))]
    return members


def inventory_engines(hosts):
    """{inventory host: engine-<n>} of the hosts of group engines, given as (host, narwhal_node or None[,
    narwhal_rank or None]); every host of an engine across hosts maps to that engine (engine_hosts checks them)."""
    hosts = list(hosts)
    of_host = dict((host, engine) for engine, names in engine_hosts(hosts).items() for host in names)
    return dict((str(item[0]), of_host[str(item[0])]) for item in hosts)


def local_host_reason(host):
    """Why `host` (an address or a name, IPv6 with or without brackets) only reaches the machine itself or no
    machine (loopback in any spelling, unspecified, link-local, multicast, an IPv4-mapped loopback, a localhost
    name), or None. Numeric spellings that resolvers accept but ipaddress does not (127.1, 0x7f.1, 2130706433)
    are the caller's to refuse as non-canonical."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    lowered = name.lower().rstrip(".")
    if lowered in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback") \
            or lowered.endswith(".localhost"):
        return "a localhost name"
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None and (mapped.is_loopback or mapped.is_unspecified):
        return "an IPv4-mapped loopback or unspecified address"
    for test, why in (("is_unspecified", "the unspecified address"), ("is_loopback", "a loopback address"),
                      ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address")):
        if getattr(ip, test) or (mapped is not None and getattr(mapped, test)):
            return why
    return None
