# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of an endpoint's text: a host (an address or a DNS name) and a port -> an http(s) URL, an engine's
attestation URL, a Prometheus target (host:port), a ZMQ endpoint (an engine's KV events); and back, a URL -> (scheme,
host, port, path) and the same URL on another port. An IPv6 host is written in brackets everywhere (RFC 3986 section
3.2.2), read without them. An engine's URL is https unless NARWHAL_TLS is off (engine_scheme); the attestation
sidecar's is its own (http).

A URL with user information (http://user:KEY@host:port) is refused by one function, refuse_userinfo, wherever the
fleet is read (the fleet lookup, scripts/narwhal-fleet, prepare, the router and benchmark plans, monitoring): the
fleet would hand the credential to every client and write it into every file made from it. Its message shows the URL
with the user information replaced by <redacted>, never the credential.

Discovery (the engines' URLs in deployment.env), the router and benchmark plans, the monitoring targets, the host
modules and the launcher (narwhal_launcher/health.py, in launch_engine.pyz: _prepare/launcher.py::PLANNER_FILES)
build and read their endpoints here. Pure and standard library only; no urllib (tests/unit/plugins/test_layout.py
counts it as I/O): the grammar below is written out.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import REDACTED

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


def engine_scheme(tls):
    """The scheme of the engines' URLs for NARWHAL_TLS `tls`: https unless it is off (site or operator certificates:
    the engines serve --ssl-certfile/--ssl-keyfile)."""
    return "http" if tls == "off" else "https"


def http_url(host, port, path="", scheme="http"):
    """scheme://host:port followed by `path` (empty, or starting with /); `scheme` http or https."""
    if scheme not in ("http", "https"):
        raise ValueError("scheme %r is not http or https" % (scheme,))
    return "%s://%s:%d%s" % (scheme, url_host(host), int(port), path)


def engine_url(address, port, scheme="http"):
    """An engine's URL (the server's root the router and the probes extend with /v1/...), in `scheme`
    (engine_scheme(NARWHAL_TLS))."""
    return http_url(address, port, scheme=scheme)


def attestation_url(address, port):
    """The URL of an engine's attestation sidecar (http: the sidecar is not the collection's and serves its own
    scheme; NARWHAL_NODE_<n>_ATTESTATION_URL names another)."""
    return http_url(address, port, ATTESTATION_PATH)


def target(host, port):
    """A Prometheus target: host:port, an IPv6 host in brackets."""
    return "%s:%d" % (url_host(host), int(port))


def zmq_endpoint(host, port):
    """A ZMQ TCP endpoint a subscriber connects to: tcp://host:port, an IPv6 host in brackets (ZMQ's own spelling,
    libzmq src/tcp_address.cpp)."""
    return "tcp://%s:%d" % (url_host(host), int(port))


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


USERINFO_FIX = ("remove it from the URL (in .env, the controller's environment, deployment.env or the fleet file: "
                "whichever sets it) and rerun discovery; the engines authenticate with the key in "
                "NARWHAL_API_KEY_FILE, sent as a Bearer header, never in a URL")

# scheme:// then the authority up to the first / ? or #: user information is what it holds before an @ (RFC 3986
# section 3.2.1); and what follows, up to a query or fragment
_AUTHORITY = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#]*)(?P<path>[^?#]*)")
# an authority without user information: a host (a name, an address, [an IPv6 address]) and an optional numeric port
_HOST_PORT = re.compile(r"^(?:\[[^\]]*\]|[^:\[\]]*)(?::[0-9]*)?\Z")
# what a message must not show: everything between :// and the last @ before a query or fragment (a credential may
# hold a / that ends the authority early: http://user:ab/cd@host reads as host "user" but still carries "ab/cd")
_SHOWN_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)[^?#\s]*@")


def redact_userinfo(text):
    """`text` with the user information of every URL in it shown as <redacted> (scheme://<redacted>@host...)."""
    if not isinstance(text, str):
        return text
    return _SHOWN_USERINFO.sub(lambda m: m.group("head") + REDACTED + "@", text)


def has_userinfo(url):
    """True for a URL whose authority carries user information (user@ or user:password@ before the host), or whose
    authority is no host[:port] and an @ follows (user:pass/word@host: a / in the password ends the authority early,
    and the credential is in the text all the same)."""
    m = _AUTHORITY.match(url.strip()) if isinstance(url, str) else None
    if not m:
        return False
    return "@" in m.group("authority") or ("@" in m.group("path") and not _HOST_PORT.match(m.group("authority")))


def refuse_userinfo(url, where, key="NARWHAL_FLEET", fix=None):
    """Refuse `url` when it carries user information: PlanError(key) naming `where` (the fleet entry and field, e.g.
    "NARWHAL_FLEET config/fleet.json: engine-2, field url") and the fix, the URL shown with its user information
    redacted. The engines authenticate with the key in NARWHAL_API_KEY_FILE (a Bearer header), never a URL."""
    if not has_userinfo(url):
        return url
    raise PlanError("%s: the URL %s carries user information (user@ or user:password@ before the host), which every "
                    "client of the fleet would be handed and every file made from it would hold; %s"
                    % (where, redact_userinfo(url), fix or USERINFO_FIX), key)


# the fleet fields that hold URLs
FLEET_URL_FIELDS = ("url", "attestation_url")


def refuse_fleet_userinfo(fleet, where="NARWHAL_FLEET"):
    """refuse_userinfo for every URL field of every entry of a fleet (a list of objects; anything else is left to the
    reader's own checks), the entry named by its engine (or its index)."""
    if not isinstance(fleet, list):
        return fleet
    for i, entry in enumerate(fleet):
        if not isinstance(entry, dict):
            continue
        engine = entry.get("engine")
        who = engine if isinstance(engine, str) and engine else "entry %d" % i
        for field in FLEET_URL_FIELDS:
            refuse_userinfo(entry.get(field), "%s: %s, field %s" % (where, who, field))
    return fleet
