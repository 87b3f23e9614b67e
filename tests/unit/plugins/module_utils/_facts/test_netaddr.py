# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Address choice over real `ip -j addr` captures (tests/fixtures/real/net):
plugins/module_utils/_facts/netaddr.py."""


import pytest
from test_support.paths import REAL

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    global_addresses,
    interface_addresses,
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
