# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of an endpoint's text: a host (an address or a DNS name) and a port -> an http URL, an engine's
attestation URL, a Prometheus target (host:port); and back, a URL -> (scheme, host, port, path) and the same URL on
another port. An IPv6 host is written in brackets everywhere (RFC 3986 section 3.2.2), read without them.

Discovery (the engines' URLs in deployment.env), the router and benchmark plans, the monitoring targets, the host
modules and the launcher (narwhal_launcher/health.py, in launch_engine.pyz: _prepare/launcher.py::PLANNER_FILES)
build and read their endpoints here. Pure and standard library only; no urllib (tests/unit/plugins/test_layout.py
counts it as I/O): the grammar below is written out.
"""

from __future__ import annotations

import ipaddress
import re

__metaclass__ = type

# the path of an engine's attestation sidecar on its attestation port (NARWHAL_NODE_<n>_ATTESTATION_URL's default)
ATTESTATION_PATH = "/v1/attestation"

# scheme :// host (a name, an IPv4 address or [an IPv6 address]) : port, then an optional path; no user info, query
# or fragment, and no default port: every endpoint this collection writes names its port.
URL = re.compile(r"^(?P<scheme>https?)://(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9][A-Za-z0-9.-]*))"
                 r":(?P<port>[0-9]{1,5})(?P<path>/[^?#\s]*)?\Z")


def url_host(host):
    """`host` as a URL or a target writes it: an IPv6 address (the one kind of host with a ':') in brackets."""
    return "[%s]" % host if ":" in host else host


def http_url(host, port, path=""):
    """http://host:port followed by `path` (empty, or starting with /)."""
    return "http://%s:%d%s" % (url_host(host), int(port), path)


def engine_url(address, port):
    """An engine's URL (the server's root the router and the probes extend with /v1/...)."""
    return http_url(address, port)


def attestation_url(address, port):
    """The URL of an engine's attestation sidecar."""
    return http_url(address, port, ATTESTATION_PATH)


def target(host, port):
    """A Prometheus target: host:port, an IPv6 host in brackets."""
    return "%s:%d" % (url_host(host), int(port))


def split_url(url):
    """-> (scheme, host, port, path) of an http(s) URL with a host and a port: the host without brackets, the port
    an int, the path without its trailing / ("" for the root); None for anything else (no port, user information, a
    query or a fragment, an IPv6 host that is not one, a port out of 1-65535, not a str)."""
    m = URL.match(url) if isinstance(url, str) else None
    if not m:
        return None
    port = int(m.group("port"))
    if not 0 < port < 65536:
        return None
    host = m.group("v6")
    if host is not None:
        try:
            if ipaddress.ip_address(host).version != 6:
                return None
        except ValueError:
            return None
    else:
        host = m.group("name")
    return m.group("scheme"), host, port, (m.group("path") or "").rstrip("/")


def url_port(url):
    """The port of `url` (split_url's rules), or None."""
    parsed = split_url(url)
    return parsed[2] if parsed else None


def with_port(url, port):
    """`url`'s scheme and host on another port, without its path; None when split_url cannot read `url`."""
    parsed = split_url(url)
    if parsed is None:
        return None
    return "%s://%s:%d" % (parsed[0], url_host(parsed[1]), int(port))
