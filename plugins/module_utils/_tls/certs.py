# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a certificate of the TLS material must be (docs/tls.md), given what was read of it: the names a host's leaf
must hold, whether its subjectAltName covers them, its days left, and when the site CA issues it again. Pure: the
step (_tls/material.py) parses the PEM files with `cryptography` and hands the facts of a certificate here as a dict:

    {"not_before": aware UTC datetime, "not_after": aware UTC datetime, "ips": [normalised IP addresses],
     "dns": [lower-case DNS names], "is_ca": bool, "server_auth": True | False | None (no extendedKeyUsage)}
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view

__metaclass__ = type

MODES = ("site", "operator", "off")

RENEW_DAYS = 30  # a site certificate with fewer days left is issued again (NARWHAL_TLS_CERT_DAYS must be more)

CA_DAYS = 3650  # the site CA's validity: 10 years

# an inventory host's name as a file name under <dir>/hosts/ (no separator, no leading dot)
HOST_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]*\Z")

# a DNS name as a dNSName holds it (RFC 5280 4.2.1.6: preferred name syntax; a leading "*." only in a certificate)
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
DNS_NAME = re.compile(r"^%s(?:\.%s)*\Z" % (_LABEL, _LABEL))


def normal_name(name):
    """(kind, name) of a name a host is reached at: ("ip", the address as Python writes it: IPv6 compressed, lower
    case, without brackets or a zone) or ("dns", the name in lower case without a trailing dot). ValueError for
    anything else (a URL, a name with spaces or non-ASCII letters)."""
    text = str(name).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return "ip", str(ipaddress.ip_address(text.split("%", 1)[0] if ":" in text else text))
    except ValueError:
        pass
    text = text.lower().rstrip(".")
    if len(text) > 253 or not DNS_NAME.match(text) or re.match(r"^[0-9.]+\Z", text):
        raise ValueError("%r is neither an IP address nor a DNS name" % (name,))
    return "dns", text


def normal_names(names):
    """The names as normal_name writes them, each once, in their order. ValueError naming the first bad one."""
    found = []
    for name in names:
        value = normal_name(name)[1]
        if value not in found:
            found.append(value)
    return found


def san_names(facts):
    """A certificate's subjectAltName as one list: its IP addresses, then its DNS names."""
    return list(facts["ips"]) + list(facts["dns"])


def _dns_match(pattern, name):
    """A dNSName against a host's name, a leftmost '*' label matching one label (RFC 6125 6.4.3, as Python's ssl
    and OpenSSL's X509_check_host match)."""
    if pattern == name:
        return True
    if not pattern.startswith("*.") or "." not in name:
        return False
    return name.split(".", 1)[1] == pattern[2:] and "*" not in pattern[2:]


def covers(facts, name):
    """Whether the certificate's subjectAltName covers the (normalised) name: an address by an iPAddress entry, a
    DNS name by a dNSName entry (wildcards as TLS clients match them). The subject's CN does not count: Python's ssl
    checks the SAN alone."""
    kind, value = normal_name(name)
    if kind == "ip":
        return value in facts["ips"]
    return any(_dns_match(pattern, value) for pattern in facts["dns"])


def missing_names(facts, names):
    """The names of `names` the certificate does not cover, in their order."""
    return [name for name in normal_names(names) if not covers(facts, name)]


def days_left(not_after, now):
    """Whole days from `now` until `not_after` (negative once expired)."""
    return int((not_after - now).total_seconds() // 86400)


def iso_utc(moment):
    """An aware datetime as ISO 8601 UTC with a Z: 2027-12-06T10:44:44Z."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def validity_problem(facts, now):
    """Why the certificate is not valid at `now` (expired, or not yet valid), or None."""
    if now >= facts["not_after"]:
        return "expired on %s" % iso_utc(facts["not_after"])
    if now < facts["not_before"]:
        return "is not valid before %s (check this controller's clock)" % iso_utc(facts["not_before"])
    return None


def leaf_problem(facts, names, now):
    """Why a host's certificate cannot serve it (an operator's certificate: each is refused), or None: not valid
    now, a CA certificate, an extendedKeyUsage without serverAuth, a name of the host missing from its SAN."""
    invalid = validity_problem(facts, now)
    if invalid:
        return invalid
    if facts["is_ca"]:
        return "is a CA certificate (basicConstraints CA:TRUE), not a server's"
    if facts["server_auth"] is False:
        return "has an extendedKeyUsage without serverAuth, which TLS clients refuse for a server"
    missing = missing_names(facts, names)
    if missing:
        return "does not hold %s in its subjectAltName (it holds %s)" % (
            ", ".join(missing), ", ".join(san_names(facts)) or "none")
    return None


def renew_reason(facts, names, now, issued_by_ca, key_matches):
    """Why the site CA must issue a host's certificate (again), or None to keep it: `facts` None (missing or
    unreadable), its key not the certificate's, not signed by the site CA, other names than the host's (the
    normalised sets differ), fewer than RENEW_DAYS days left, or not valid now."""
    if facts is None:
        return "missing or unreadable"
    if not key_matches:
        return "its key does not match it"
    if not issued_by_ca:
        return "not signed by the site CA"
    wanted = normal_names(names)
    if sorted(san_names(facts)) != sorted(wanted):
        return "its names changed (%s -> %s)" % (", ".join(san_names(facts)) or "none", ", ".join(wanted))
    invalid = validity_problem(facts, now)
    if invalid:
        return invalid
    left = days_left(facts["not_after"], now)
    if left < RENEW_DAYS:
        return "%d days left (fewer than %d)" % (left, RENEW_DAYS)
    return None


def ca_problem(facts, now, site):
    """Why ca.crt cannot be the CA (not a CA certificate, not valid now; a site CA also when fewer than RENEW_DAYS
    days are left, as every certificate it issued would be renewed at each run), or None."""
    if not facts["is_ca"]:
        return "is not a CA certificate (basicConstraints CA:TRUE)"
    invalid = validity_problem(facts, now)
    if invalid:
        return invalid
    left = days_left(facts["not_after"], now)
    if site and left < RENEW_DAYS:
        return "has %d days left (fewer than %d)" % (left, RENEW_DAYS)
    return None


def _append(names, name):
    if name and name not in names:
        names.append(name)


def engine_host_names(play_hosts, engines, members, fleet, launch=None):
    """[{host, names}] for the engine hosts of a play: each inventory host gets the host of its engine's fleet URL
    (for an engine across hosts the head's, which serves its HTTP API) and the fabric address its launch record gives
    that host (node.address; a member's own for a host after the head), so a certificate holds both the name clients
    use and the address the launcher probes. `engines`: {inventory host: engine-<n>} (narwhal_engines), `members`:
    {engine-<n>: its hosts, the head first} (narwhal_members), `fleet`: the resolved fleet, `launch`: the launch
    records ({"engines": {engine-<n>: record}}), if read. Hosts that run no engine are left out; a host left without
    a name is kept with none (the step refuses it, naming the host)."""
    urls = dict((entry.get("engine"), entry.get("url")) for entry in fleet or [] if isinstance(entry, dict))
    records = (launch or {}).get("engines") or {}
    out = []
    for host in play_hosts:
        engine = (engines or {}).get(host)
        if engine is None:
            continue
        names = []
        parsed = split_url(urls.get(engine))
        if parsed:
            _append(names, parsed[1])
        hosts = (members or {}).get(engine) or [host]
        record = records.get(engine)
        if isinstance(record, dict):
            try:
                view = member_view(record, hosts.index(host) if host in hosts else 0)
                _append(names, view["node"]["address"])
            except (KeyError, TypeError):
                pass  # a record without this host: prepare_run refuses it by name
        out.append({"host": host, "names": names})
    return out
