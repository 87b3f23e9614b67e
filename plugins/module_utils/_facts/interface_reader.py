# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's read of the fabric interface on a host (narwhal_interface): its addresses from `ip -j addr show`
(run through _facts/tool_runner.py, parsed by _facts/netaddr.py) and its nominal speed from sysfs. Python 3.8
compatible (runs on engine hosts).
"""

from __future__ import annotations

import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_id, host_name
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    interface_addresses,
    interface_facts,
    link_refusal,
    link_speed,
    parse_ip_json,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.tool_runner import run_tool

__metaclass__ = type


def read_link_speed(sysfs_root, name):
    """The nominal speed of interface `name` (_facts/netaddr.py::link_speed) from
    ``<sysfs_root>/class/net/<name>/speed``; virtual when the entry resolves below ``devices/virtual``."""
    entry = os.path.join(sysfs_root, "class", "net", name)
    where = os.path.join(entry, "speed")
    try:
        with open(where) as handle:
            text, error = handle.read(), None
    except (OSError, UnicodeDecodeError) as exc:
        text, error = None, getattr(exc, "strerror", None) or str(exc)
    virtual = os.sep + os.path.join("devices", "virtual") + os.sep in os.path.realpath(entry) + os.sep
    return link_speed(text, where, virtual, error)


def read_interface(module, name, family, timeout=DEFAULT_TIMEOUT, sysfs_root="/sys"):
    """narwhal_interface: the addresses of interface `name` from `ip -j addr show`, and its nominal speed from
    sysfs (read_link_speed; the kernel's own /sys unless a test gives a copy)."""
    ip = module.get_bin_path("ip", required=True)
    links = run_tool(module, "ip -j addr show", [ip, "-j", "addr", "show"], parse_ip_json, ValueError,
                     "install a current iproute2 (JSON output needs iproute2 >= 4.13), then rerun discovery",
                     "run 'ip -j addr show' by hand on the host", timeout, tool="ip")
    link, addresses = interface_addresses(links, name)
    if link is None:
        present = ", ".join(x.get("ifname", "?") for x in links)
        module.fail_json(msg="interface %s does not exist on this host (present: %s); set "
                             "NARWHAL_FABRIC_INTERFACE (or NARWHAL_NODE_<n>_FABRIC_INTERFACE) to the fabric "
                             "interface of this host and rerun discovery" % (name, present))
    refusal = link_refusal(name, link, "host %s" % host_name())
    if refusal:
        module.fail_json(msg=refusal)
    return interface_facts(name, link, addresses, family, host_id(), read_link_speed(sysfs_root, name))
