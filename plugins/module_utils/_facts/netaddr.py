# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Classify the addresses of one interface from `ip -j addr show dev <if>` (pure code).

Usable = global scope and a global address: never loopback, link-local (also when a tool labels it
scope global, e.g. 169.254/16 or fe80::/10), multicast, tentative, dadfailed, deprecated (preferred
lifetime 0) or temporary (privacy) addresses.
"""

from __future__ import annotations

import ipaddress
import json

__metaclass__ = type

REJECT_FLAGS = ("tentative", "dadfailed", "deprecated", "temporary")

# Which links can carry traffic. The kernel's Documentation/networking/operstates.rst: operstate UP is "ready to
# pass packets"; UNKNOWN means that "neither driver nor userspace has set operational state" and such an interface
# "must be considered for user data" (loopback, tun, wireguard and other drivers without carrier reporting);
# DOWN ("unable to transfer data on L1, f.e. ethernet is not plugged or interface is ADMIN down"), LOWERLAYERDOWN
# (a stacked interface whose lower device is down), NOTPRESENT, TESTING and DORMANT carry no user data. `ip`
# prints the flag NO-CARRIER for an interface that is administratively UP but not running (IFF_UP without
# IFF_RUNNING, i.e. the kernel's netif_oper_up() is false): a cable out, a switch port down, a peer gone. So an
# UNKNOWN interface is usable unless NO-CARRIER is flagged, and an interface without the UP flag is not.
USABLE_OPERSTATES = ("UP", "UNKNOWN")


def parse_ip_json(text):
    """`ip -j addr` output (one array, or one object/array per line as some tools print) -> list of interface
    objects. ValueError (naming what is wrong) for anything else: no output, not JSON, not interface objects
    (each needs a string `ifname`; `addr_info`, when present, is a list of objects)."""
    text = (text or "").strip()
    if not text:
        raise ValueError("no output (every host has at least the loopback interface)")
    try:
        data = json.loads(text)
    except ValueError:
        data = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip().rstrip(",")
            if line in ("", "[", "]"):
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValueError("line %d is not JSON (%s)" % (number, exc)) from None
            data.extend(item if isinstance(item, list) else [item])
    links = data if isinstance(data, list) else [data]
    names = set()
    for position, link in enumerate(links):
        if not isinstance(link, dict):
            raise ValueError("entry %d is a JSON %s, not an interface object" % (position, type(link).__name__))
        if not isinstance(link.get("ifname"), str):
            raise ValueError("entry %d has no ifname" % position)
        if link["ifname"] in names:
            # the kernel names each interface once: a second object would hide or replace the first one's state
            raise ValueError("interface %s is listed twice" % link["ifname"])
        names.add(link["ifname"])
        addr_info = link.get("addr_info")
        if addr_info is not None and (not isinstance(addr_info, list)
                                      or not all(isinstance(a, dict) for a in addr_info)):
            raise ValueError("interface %s: addr_info is not a list of address objects" % link["ifname"])
        flags = link.get("flags")
        if flags is not None and (not isinstance(flags, list) or not all(isinstance(f, str) for f in flags)):
            raise ValueError("interface %s: flags is not a list of flag names" % link["ifname"])
        if link.get("operstate") is not None and not isinstance(link["operstate"], str):
            raise ValueError("interface %s: operstate is not a state name" % link["ifname"])
    if not links:
        raise ValueError("an empty list (every host has at least the loopback interface)")
    return links


def classify(info):
    """One addr_info entry -> {address, family, prefixlen, scope, flags, usable, reason}."""
    family = {"inet": "ipv4", "inet6": "ipv6"}.get(info.get("family"), info.get("family"))
    address = info.get("local") or info.get("address") or ""
    flags = sorted(k for k, v in info.items() if v is True)
    out = {"address": address, "family": family, "prefixlen": info.get("prefixlen"),
           "scope": info.get("scope"), "flags": flags, "usable": False, "reason": None}
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        out["reason"] = "not an IP address"
        return out
    if info.get("scope") != "global":
        out["reason"] = "scope %s" % info.get("scope")
    elif ip.is_loopback:
        out["reason"] = "loopback"
    elif ip.is_link_local:
        out["reason"] = "link-local"
    elif ip.is_multicast or ip.is_unspecified:
        out["reason"] = "not a unicast address"
    elif any(f in flags for f in REJECT_FLAGS):
        out["reason"] = [f for f in REJECT_FLAGS if f in flags][0]
    elif info.get("preferred_life_time") == 0:
        out["reason"] = "deprecated"
    else:
        out["usable"] = True
    return out


def interface_addresses(links, name):
    """Find interface `name` in parsed `ip -j addr` output -> (link or None, classified addresses)."""
    for link in links:
        if link.get("ifname") == name:
            return link, [classify(a) for a in link.get("addr_info") or []]
    return None, []


def link_problem(link):
    """None when the interface `link` (one object of `ip -j addr`/`ip -j link`) can carry traffic, else why not,
    in the words `ip` uses (operstates.rst, see USABLE_OPERSTATES). A field `ip` did not print is not judged."""
    state = str(link.get("operstate") or "").upper()
    flags = link.get("flags")
    flags = [str(f).upper() for f in flags] if isinstance(flags, list) else None
    said = "operstate %s" % state if state else "no operstate"
    if flags is not None and "UP" not in flags:
        return "it is administratively down (ip reports no UP flag, %s)" % said
    if flags is not None and "NO-CARRIER" in flags:
        return "it is administratively up but has no carrier (ip reports flag NO-CARRIER, %s)" % said
    if state and state not in USABLE_OPERSTATES:
        return "its link is not up (ip reports %s)" % said
    return None


def link_refusal(name, link, where, then="rerun discovery"):
    """The refusal of interface `name` whose `link` cannot carry traffic (None when it can): `where` names the host
    ("host engine-1"); the same words in discovery (interface_facts, engine_host_facts) and prepare
    (engine_prereqs)."""
    problem = link_problem(link)
    if problem is None:
        return None
    if "administratively down" in problem:
        fix = "bring it up ('ip link set %s up', and in the host's network configuration)" % name
    else:
        fix = ("restore its link (cable, transceiver, switch port or peer: 'ip link show %s', 'ethtool %s')"
               % (name, name))
    return ("'ip -j addr show' on %s: interface %s cannot carry KV: %s, so its addresses must not go into the "
            "records; %s, or set NARWHAL_FABRIC_INTERFACE (or NARWHAL_NODE_<n>_FABRIC_INTERFACE) to an interface "
            "whose link is up, then %s" % (where, name, problem, fix, then))


def global_addresses(addresses, family="any"):
    return [a["address"] for a in addresses if a["usable"] and family in ("any", a["family"])]


# Speeds that mean "not known": SPEED_UNKNOWN (-1, include/uapi/linux/ethtool.h) as current kernels print it and as
# older ones printed it unsigned, 65535 (the 16-bit speed field's unknown, which ethtool itself reports as
# "Unknown!"), and 0 (drivers that report no speed without a link).
UNKNOWN_SPEEDS = (-1, 0, 65535, 4294967295)


def link_speed(text, where, virtual=False, error=None):
    """The nominal speed of an interface from its sysfs `speed` file -> {"mbps", "virtual", "why"}.

    `text` is what <sysfs>/class/net/<if>/speed holds (None when it could not be read: `error` says why), `where`
    names that file, `virtual` says whether the kernel lists the interface under devices/virtual (a veth, bond, VLAN
    or bridge: no PCI device of its own). The kernel's ABI (Documentation/ABI/testing/sysfs-class-net, `speed`): the
    link speed in Mb/s, valid only for interfaces whose driver implements ethtool's get_link_ksettings; reading it
    fails with EINVAL where the driver has none (loopback) or the interface is not running, and a driver that does
    not know its speed reports -1. `mbps` is None then, and `why` says which. A virtual interface's figure is its
    driver's: a bond's is the sum of its active links', a veth's a fixed 10000 that bounds nothing
    (drivers/net/veth.c, veth_get_link_ksettings; seen in the proving ground), so `why` says so next to the number."""
    result = {"mbps": None, "virtual": bool(virtual), "why": None}
    if text is None:
        result["why"] = ("cannot read %s (%s): the driver reports no speed (no ethtool link settings, or the "
                         "interface is not running)" % (where, error or "unreadable"))
        return result
    value = text.strip()
    try:
        mbps = int(value)
    except ValueError:
        result["why"] = "%s holds %r, not a number of Mb/s" % (where, value[:40])
        return result
    if mbps in UNKNOWN_SPEEDS or mbps < 0:
        result["why"] = ("%s reports %d: the driver does not know the link's speed (no link negotiated, or a "
                         "virtual device without one)" % (where, mbps))
        return result
    result["mbps"] = mbps
    if virtual:
        result["why"] = ("a virtual interface (listed under devices/virtual): %d Mb/s is what its driver reports, "
                         "not a physical link's rate (a veth always reports 10000)" % mbps)
    return result


def interface_facts(name, link, addresses, family, host, speed=None):
    """narwhal_interface, the facts of one interface (interface_facts in discovery, engine_prereqs in prepare):
    `link` and `addresses` as interface_addresses() returns them, `host` the host's host_id, `speed` what
    link_speed() says of its sysfs speed file."""
    return {
        "name": name,
        "operstate": link.get("operstate"),
        "mtu": link.get("mtu"),
        "host_id": host,
        "global_addresses": global_addresses(addresses, family),
        "addresses": addresses,
        "speed": speed,
    }
