# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names: the engine name engine-<n> (an engine's identity in `.env`, the inventory, records, fleet and runs:
docs/architecture.md, "Engine endpoints and the fleet"), environment variable names, the names of the files
discovery writes, and local-only hosts.
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


def engine_number(name):
    m = ENGINE_NAME.match(name or "")
    if not m:
        raise InputError(name, "inventory host %r is in group engines but is not named engine-<n> "
                               "(n = the <n> of NARWHAL_NODE_<n>_*); rename it in the inventory" % name)
    return int(m.group(1))


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
