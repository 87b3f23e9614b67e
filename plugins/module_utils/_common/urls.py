# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The URLs of an engine, as discovery writes them into deployment.env and the fleet (IPv6 in brackets).
"""

from __future__ import annotations

import ipaddress

__metaclass__ = type


def url_host(address):
    return "[%s]" % address if ipaddress.ip_address(address).version == 6 else address


def engine_url(address, port):
    return "http://%s:%d" % (url_host(address), port)


def attestation_url(address, port):
    return "http://%s:%d/v1/attestation" % (url_host(address), port)
