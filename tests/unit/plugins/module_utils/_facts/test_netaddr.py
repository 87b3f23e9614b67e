# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Address choice over real `ip -j addr` captures (tests/fixtures/real/net):
plugins/module_utils/_facts/netaddr.py; the interface's nominal speed from its sysfs `speed` file (link_speed; the
reader over trees laid out as the kernel lays them out is in test_interface_reader.py)."""


import pytest
from test_support.paths import REAL

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    global_addresses,
    interface_addresses,
    link_problem,
    link_refusal,
    link_speed,
    parse_ip_json,
)

NET = REAL / "net"


def iface(capture, name):
    link, addresses = interface_addresses(parse_ip_json((NET / capture).read_text()), name)
    assert link is not None
    return addresses


@pytest.mark.parametrize(
    "capture,name,family,expected",
    [
        # wlan0: 169.254/16 labelled scope global, a temporary, a mngtmpaddr (stable), a deprecated /128
        ("nix_stat__ip-j-addr.json", "wlan0", "ipv4", ["192.168.2.230"]),
        ("nix_stat__ip-j-addr.json", "wlan0", "ipv6", ["2003:df:174b:85e7:4e20:b8ff:fea8:105f"]),
        ("nix_stat__ip-j-addr.json", "tailscale0", "ipv6", ["fd7a:115c:a1e0::c436:fc3a"]),
        ("nix_stat__ip-j-addr.json", "lo", "any", []),
        # netplan: temporary + mngtmpaddr on wlan0, single-line JSON without trailing newline
        ("netplan__ip-d-j-addr.json", "wlan0", "ipv6", ["2001:9e8:a19f:1c00:f24f:f724:5dd1:d0ad"]),
        ("netplan__ip-d-j-addr.json", "enp0s31f6", "any", ["192.168.178.62", "2001:9e8:a19f:1c00:56e1:adff:fe5f:24b4"]),
        ("netplan__ip-d-j-addr.json", "wwan0", "any", []),
        # cloud-init: an fe80:: address labelled scope global is still link-local
        ("cloud-init__sample-ipaddrshow-json.json", "enp0s25", "ipv6", []),
        ("cloud-init__sample-ipaddrshow-json.json", "enp0s25", "ipv4", ["192.168.2.18"]),
        ("cloud-init__sample-ipaddrshow-json-down.json", "eth0", "any", []),
    ],
)
def test_global_addresses_from_real_captures(capture, name, family, expected):
    assert global_addresses(iface(capture, name), family) == expected


def test_rejection_reasons_are_named():
    reasons = {a["address"]: a["reason"] for a in iface("nix_stat__ip-j-addr.json", "wlan0")}
    assert reasons["169.254.11.146"] == "link-local"
    assert reasons["2003:df:174b:85e7:9132:9421:5943:ae00"] == "temporary"
    assert reasons["2003:df:174b:8579:4e20:b8ff:fea8:105f"] == "deprecated"
    assert reasons["fe80::4e20:b8ff:fea8:105f"] == "scope link"


# ------------------------------------------------------------------------------------------------
# links that cannot carry KV (issue 24): operstate and flags as `ip -j` prints them


def link(capture, name):
    found, _addresses = interface_addresses(parse_ip_json((NET / capture).read_text()), name)
    assert found is not None
    return found


@pytest.mark.parametrize(
    "capture,name,expected",
    [
        # up and running: an ethernet, a wlan
        ("cloud-init__sample-ipaddrshow-json.json", "enp0s25", None),
        ("nix_stat__ip-j-addr.json", "wlan0", None),
        # operstate UNKNOWN: loopback and drivers without carrier reporting (wireguard, tun, tailscale) carry data
        ("nix_stat__ip-j-addr.json", "lo", None),
        ("netplan__ip-d-j-addr.json", "wg0", None),
        ("netplan__ip-d-j-addr.json", "tun1", None),
        ("nix_stat__ip-j-addr.json", "tailscale0", None),
        # administratively up, no carrier: the cable is out
        ("nix_stat__ip-j-addr.json", "end0",
         "it is administratively up but has no carrier (ip reports flag NO-CARRIER, operstate DOWN)"),
        # administratively down
        ("cloud-init__sample-ipaddrshow-json-down.json", "eth0",
         "it is administratively down (ip reports no UP flag, operstate DOWN)"),
        ("netplan__ip-d-j-addr.json", "wwan0", "it is administratively down (ip reports no UP flag, operstate DOWN)"),
    ],
)
def test_link_problem_of_real_captures(capture, name, expected):
    assert link_problem(link(capture, name)) == expected


@pytest.mark.parametrize(
    "fields,expected",
    [
        # a veth of the proving ground's simulated hosts
        ({"operstate": "UP", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]}, None),
        # a VLAN whose parent has no carrier (ip prints NO-CARRIER and M-DOWN)
        ({"operstate": "LOWERLAYERDOWN", "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP", "M-DOWN"]},
         "it is administratively up but has no carrier (ip reports flag NO-CARRIER, operstate LOWERLAYERDOWN)"),
        # UNKNOWN is usable unless NO-CARRIER is flagged
        ({"operstate": "UNKNOWN", "flags": ["POINTOPOINT", "NOARP", "UP", "NO-CARRIER"]},
         "it is administratively up but has no carrier (ip reports flag NO-CARRIER, operstate UNKNOWN)"),
        # 802.1X not yet authorised, a cable test running: L1 up but no user data (operstates.rst)
        ({"operstate": "DORMANT", "flags": ["BROADCAST", "UP", "LOWER_UP"]}, "its link is not up (ip reports "
                                                                             "operstate DORMANT)"),
        ({"operstate": "TESTING", "flags": ["BROADCAST", "UP", "LOWER_UP"]}, "its link is not up (ip reports "
                                                                             "operstate TESTING)"),
        ({"operstate": "LOWERLAYERDOWN"}, "its link is not up (ip reports operstate LOWERLAYERDOWN)"),
        # what `ip` did not print is not judged
        ({}, None),
        ({"operstate": "UP"}, None),
    ],
    ids=["veth", "vlan-no-carrier", "unknown-no-carrier", "dormant", "testing", "no-flags", "nothing", "up-no-flags"],
)
def test_link_problem(fields, expected):
    assert link_problem(dict(fields, ifname="eth1")) == expected


def test_link_refusal_names_the_tool_the_host_and_the_fix():
    message = link_refusal("end0", link("nix_stat__ip-j-addr.json", "end0"), "host engine-1")
    assert message == (
        "'ip -j addr show' on host engine-1: interface end0 cannot carry KV: it is administratively up but has no "
        "carrier (ip reports flag NO-CARRIER, operstate DOWN), so its addresses must not go into the records; "
        "restore its link (cable, transceiver, switch port or peer: 'ip link show end0', 'ethtool end0'), or set "
        "NARWHAL_FABRIC_INTERFACE (or NARWHAL_NODE_<n>_FABRIC_INTERFACE) to an interface whose link is up, then "
        "rerun discovery")
    down = link_refusal("eth0", link("cloud-init__sample-ipaddrshow-json-down.json", "eth0"), "host engine-2")
    assert "bring it up ('ip link set eth0 up'" in down
    assert link_refusal("wlan0", link("nix_stat__ip-j-addr.json", "wlan0"), "host engine-1") is None


# /sys/class/net/<if>/speed as the kernel writes it (Documentation/ABI/testing/sysfs-class-net): Mb/s, -1 for a
# driver that does not know it; reading fails (EINVAL) where the driver has no ethtool link settings or the interface
# is not running (loopback here, and a bridge without ports seen on this machine reads -1)
@pytest.mark.parametrize("text, virtual, mbps, why", [
    ("100000\n", False, 100000, None),
    ("25000", False, 25000, None),
    ("10000\n", True, 10000, "a virtual interface"),  # a veth: seen in the proving ground's containers
    ("-1\n", False, None, "reports -1"),
    ("4294967295\n", False, None, "reports 4294967295"),
    ("0\n", False, None, "reports 0"),
    ("fast\n", False, None, "not a number of Mb/s"),
    (None, False, None, "cannot read"),
])
def test_link_speed(text, virtual, mbps, why):
    speed = link_speed(text, "/sys/class/net/eth1/speed", virtual, "Invalid argument" if text is None else None)
    assert speed["mbps"] == mbps and speed["virtual"] is virtual
    if why is None:
        assert speed["why"] is None
    else:
        assert why in speed["why"] and (text is not None or "Invalid argument" in speed["why"])
