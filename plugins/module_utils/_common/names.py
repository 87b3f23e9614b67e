# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names: the engine name engine-<n> (an engine's identity in `.env`, records, fleet and runs: docs/architecture.md,
"Engine endpoints and the fleet") and the inventory host that carries it (the host variable narwhal_node, or a host
named engine-<n>), environment variable names, the names of the files discovery writes, and local-only hosts.
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


# The host variable that ties an inventory host of group engines to node <n> of .env (docs/inputs.md, "The inventory")
NODE_VAR = "narwhal_node"
NODE_VALUE = re.compile(r"^[1-9][0-9]{0,5}\Z")


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


def inventory_engines(hosts):
    """{inventory host: engine-<n>} of the hosts of group engines, given as (host, narwhal_node or None) pairs;
    refuses a host without an engine and two hosts with one engine, naming them."""
    engines, seen = {}, {}
    for host, node in hosts:
        engine = host_engine(host, node)
        if engine in seen:
            raise InputError(NODE_VAR, "inventory hosts %s and %s are both %s (node %s of .env); each engine is one "
                                       "host of group engines: give them distinct %s values (two engines on one "
                                       "machine are two inventory hosts with the same ansible_host)"
                             % (seen[engine], host, engine, engine.split("-")[1], NODE_VAR))
        seen[engine] = host
        engines[host] = engine
    return engines


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
