# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validation of the `.env` inputs against their description (_inputs/catalogue.py). Pure code: it takes a
mapping of values and returns validated inputs or raises InputError naming the key and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import FIX, InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import (
    DEFAULT_HASH_ALGO,
    HASH_SEED_ENV,
    HASH_SEED_MAX,
    KV_AWARE,
    events_on,
    hash_algo,
    hash_seed,
    role_policy,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import local_host_reason
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import control_character
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import (
    IFNAME,
    INPUTS,
    NODE_INPUTS,
    NODE_KEY,
    TOOL_VARIABLES,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import check_args, parse_env_words, split_args
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import LOG_SIZE
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import ROLE_ENV_KEYS

__metaclass__ = type


# `re` with a str pattern: [0-9] is the ASCII digits only (int() would also take '8_000' and full-width digits)
WHOLE = re.compile(r"^-?[0-9]+$")

# Docker's image reference grammar, as distribution/reference (reference.go, regexp.go; the parser of the Docker
# Engine and CLI) defines it:
#   reference        := name [ ":" tag ] [ "@" digest ]
#   name             := [domain '/'] remote-name          at most 255 characters (NameTotalLengthMax)
#   domain           := host [':' port-number]            host: domain-name | IPv4address | '[' IPv6address ']'
#   domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
#   remote-name      := path-component ['/' path-component]*
#   path-component   := /[a-z0-9]+/ [separator /[a-z0-9]+/]*      separator := /[_.]|__|[-]+/
#   tag              := /[\w][\w.-]{0,127}/                 (\w: ASCII letters, digits, _)
#   digest           := algorithm ":" hex                 (go-digest checks the hex of a registered algorithm:
#                                                          sha256 64, sha384 96, sha512 128 lowercase digits)
# An image ID (sha256:<64 hex>, or a prefix of its hex) parses as a name (and a tag) under the same grammar.
IMAGE_NAME_MAX = 255
IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(r"^(?:(?:%s(?:\.%s)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?%s(?:/%s)*$"
                        % (_DOMAIN_COMPONENT, _DOMAIN_COMPONENT, _PATH_COMPONENT, _PATH_COMPONENT))
IMAGE_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
# the longest reference the grammar allows: a name, ':' and a tag, '@sha512:' and its hex
IMAGE_REF_MAX = IMAGE_NAME_MAX + 1 + 128 + len("@sha512:") + 128

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:@/-]*$")

DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")

DNS_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")

NUMERIC_LABEL = re.compile(r"^(0[xX][0-9A-Fa-f]*|[0-9]+)$")

URL = re.compile(r"^(https?)://([^/?#]*)(/[^?#]*)?(\?[^#]*)?(#.*)?$")

AUTHORITY = re.compile(r"^(\[[^\]]*\]|[^:\[\]]*)(?::([0-9]*))?$")


# a subset of what deployment.env takes unquoted (_discover/fleet.py::ENV_VALUE): no quotes, $, #, ;, !, spaces or
# backslashes
URL_PATH = re.compile(r"^/[A-Za-z0-9._~%/:@+,=-]*$")


def one_line(key, raw):
    """Refuse a value that could add a line to a line-based file (deployment.env, the role environment) or hide
    in a terminal: C0/C1 control characters (newline, carriage return, NUL, tab ...), DEL, U+2028/U+2029."""
    if not isinstance(raw, str):
        return
    bad = control_character(raw)
    if bad is not None:
        raise InputError(key, "%r contains the control character %r (U+%04X); a value is one line of printable text "
                              "(values are written into line-based files and paths): remove it from .env (a quoted "
                              "value spanning several lines is one)" % (raw, bad, ord(bad)))


def _whole(key, raw):
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    if not WHOLE.match(text):
        raise InputError(key, "%r is not a whole number written with the ASCII digits 0-9 (no '_', '+', spaces or "
                              "other digits); %s" % (raw, FIX))
    return int(text, 10)


def _check(spec, key, raw):
    kind = spec["kind"]
    value = raw.strip() if isinstance(raw, str) else raw
    if kind == "int":
        return _positive(key, value)
    if kind == "bool":
        return _bool(key, value)
    if kind == "port":
        return _port(key, value)
    if kind == "seconds":
        return _seconds(spec, key, value)
    if kind == "whole":
        return _ranged(spec, key, value)
    if kind == "count_or_percent":
        return _count_or_percent(key, raw, value)
    if kind == "count_or_all":
        if value == "all":
            return value
        return _positive(key, value)
    if kind == "int_list":
        return _gpu_indices(key, raw, value)
    if kind == "rate_list":
        return rate_list(key, raw, value)
    if kind == "choice_list":
        return choice_list(spec, key, raw, value)
    if kind == "number":
        return _number(key, raw, value)
    if kind == "fraction":
        return _fraction(key, raw, value)
    if kind == "duration":
        return prometheus_duration(key, value)[0]
    if kind == "abspath":
        return _engine_host_path(key, raw, value)
    if kind == "path":
        return _checkout_path(key, raw, value)
    if kind == "choice" and value not in spec["choices"]:
        raise InputError(key, "%r is not one of %s; %s" % (raw, ", ".join(spec["choices"]), FIX))
    if kind == "log_size" and not LOG_SIZE.match(value):
        raise InputError(key, "%r is not a log size (a whole number and k, m or g, e.g. 100m: Docker's max-size); %s"
                         % (raw, FIX))
    if kind == "role" and value not in ("prefill", "decode"):
        raise InputError(key, "role %r is not prefill or decode; %s" % (raw, FIX))
    if kind == "interface" and (not IFNAME.match(value) or value in (".", "..")):
        raise InputError(key, "%r is not a network interface name; %s" % (raw, FIX))
    if kind == "image":
        check_image(key, value)
    if kind == "model_name":
        check_served_name(key, value)
    if kind == "dist_list":
        bad = [x for x in (i.strip() for i in value.split(",")) if x and not DIST_NAME.match(x)]
        if bad:
            raise InputError(key, "%r is not a distribution name (letters, digits, . _ -); %s" % (bad[0], FIX))
    if kind == "ip":
        return _address(key, raw, value)
    if kind == "bind":
        return _bind_address(key, raw, value)
    if kind in ("url", "url_path"):
        parse_url(key, value, allow_path=kind == "url_path")
    if kind in ("args", "env"):
        _planner_words(kind, key, value)
    return value


def _count_or_percent(key, raw, value):
    """A whole number of hosts (0 or more) or a percentage (0% to 100%), kept as its text (_common/reach.py reads
    it)."""
    text = str(value)
    number = text[:-1] if text.endswith("%") else text
    if not number.isdigit() or not number.isascii() or (text.endswith("%") and int(number) > 100):
        raise InputError(key, "%r is not a count of hosts (e.g. 1) or a percentage of them (e.g. 10%%); %s"
                         % (raw, FIX))
    return text


def _port(key, value):
    number = _whole(key, value)
    if not 1 <= number <= 65535:
        raise InputError(key, "port %d is out of range 1-65535; %s" % (number, FIX))
    return number


def _seconds(spec, key, value):
    number = _whole(key, value)
    if not spec["min"] <= number <= spec["max"]:
        raise InputError(key, "%d seconds is out of range %d-%d; %s" % (number, spec["min"], spec["max"], FIX))
    return number


def _ranged(spec, key, value):
    number = _whole(key, value)
    if not spec["min"] <= number <= spec["max"]:
        raise InputError(key, "%d is out of range %d-%d; %s" % (number, spec["min"], spec["max"], FIX))
    return number


def _gpu_indices(key, raw, value):
    """A comma-separated list of distinct GPU indices (ASCII digits) as ints."""
    items = [x.strip() for x in value.split(",")]
    if not all(WHOLE.match(x) for x in items):
        raise InputError(key, "%r is not a comma-separated list of GPU indices like 4,5,6,7 (ASCII digits 0-9); %s"
                         % (raw, FIX))
    items = [int(x, 10) for x in items]
    if any(i < 0 for i in items) or len(set(items)) != len(items):
        raise InputError(key, "%r has negative or repeated GPU indices; %s" % (raw, FIX))
    return items


def _engine_host_path(key, raw, value):
    """An absolute path on the engine hosts (kind abspath), without a trailing '/'."""
    parts = value.split("/")
    if not value.startswith("/") or not value.strip("/"):
        raise InputError(key, "%r is not an absolute path below / on the engine hosts; %s" % (raw, FIX))
    if "," in value or any(p in (".", "..") for p in parts):
        raise InputError(key, "%r has a ',' or a '.'/'..' component; an engine-host path is mounted into the "
                              "container (docker --mount separates options by commas) and must not leave its "
                              "directory: write it plainly; %s" % (raw, FIX))
    # One spelling per directory: /srv/models/x/ is /srv/models/x. Every stage takes the served model name from
    # the last component of NARWHAL_MODEL_PATH (records, the probe's and the router's `basename`), and a trailing
    # '/' would make that component '' for `basename` while the records strip it, so the probe would ask the
    # engines for model "". vLLM itself would serve the --model string exactly as given when no
    # --served-model-name is set (vllm/config/model.py, get_served_model_name: "the fallback is to use
    # self.model"); the launcher always sets --served-model-name, so the name is the one derived here.
    return value.rstrip("/")


def _checkout_path(key, raw, value):
    """A path relative to the checkout or absolute (kind path): not empty, no '..' component, no leading '~'."""
    if not value:
        raise InputError(key, "is empty; %s" % FIX)
    if ".." in value.split("/") or value.startswith("~"):
        raise InputError(key, "%r has a '..' component or a '~' (which nothing expands); write the path "
                              "without them: relative to the checkout, or absolute for a place outside it; %s"
                         % (raw, FIX))
    return value


def _bind_address(key, raw, value):
    """An IPv4 or IPv6 address to bind on, as `ipaddress` writes it; empty: the stage's own address (the engine's
    advertised address, the router host's address)."""
    if value == "":
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError(key, "%r is not an IPv4 or IPv6 address to bind on (0.0.0.0 or :: for every interface; "
                              "no brackets, no port); %s" % (raw, FIX))


def _planner_words(kind, key, value):
    """Extra vLLM arguments (kind args) or environment words (kind env) under the planner's rules
    (launcher-managed flags and variables, secret-looking names), refused at the first stage that reads the
    input."""
    try:
        if kind == "args":
            check_args(split_args(value, key), key)
        else:
            parse_env_words(value, key)
    except PlanError as exc:
        raise InputError(key, "%s; %s" % (exc, FIX))


BOOL_WORDS = {"true": True, "false": False}


def _bool(key, value):
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in BOOL_WORDS:
        raise InputError(key, "%r is not true or false; %s" % (value, FIX))
    return BOOL_WORDS[word]


def _positive(key, value):
    number = _whole(key, value)
    if number < 1:
        raise InputError(key, "must be at least 1, got %d; %s" % (number, FIX))
    return number


NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def _number(key, raw, value):
    """A positive decimal (ASCII digits, an optional fraction): no sign, exponent, inf or nan."""
    if not NUMBER.match(str(value)) or float(value) <= 0:
        raise InputError(key, "%r is not a positive number like 250 or 12.5 (ASCII digits, one optional '.'); %s"
                         % (raw, FIX))
    number = float(value)
    return int(number) if number.is_integer() else number


# The alert inputs (NARWHAL_ALERT_*) take the kinds fraction and duration; the monitoring stage reads them.
RERUN_MONITORING = "correct it in .env (or the environment), then rerun the monitoring stage"


def _fraction(key, raw, value):
    """A decimal above 0 and at most 1 (a share: 0.95 is 95 percent)."""
    if not NUMBER.match(str(value)) or not 0 < float(value) <= 1:
        raise InputError(key, "%r is not a share above 0 and at most 1 like 0.95 (ASCII digits, one optional '.'); %s"
                         % (raw, RERUN_MONITORING))
    return float(value)


# A Prometheus duration (prometheus/common model.ParseDuration, which reads a rule's `for`): whole numbers of y, w, d,
# h, m, s, ms, each unit at most once and the largest first (30s, 2m, 1h30m); "0" alone is zero.
PROM_DURATION = re.compile(r"^(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
                           r"(?:([0-9]+)ms)?$")
PROM_DURATION_MS = (365 * 86400000, 7 * 86400000, 86400000, 3600000, 60000, 1000, 1)


def prometheus_duration(key, raw):
    """-> (the duration's text, its milliseconds) of a Prometheus duration above zero; refused naming `key`
    otherwise (a zero `for` fires on the first evaluation that matches: one failed scrape would page)."""
    text = str(raw).strip() if raw is not None else ""
    m = PROM_DURATION.match(text) if text and text != "0" else None
    if m is None:
        raise InputError(key, "%r is not a Prometheus duration above zero: whole numbers with the units y, w, d, h, m, "
                              "s, ms, largest first, each once (30s, 2m, 1h30m); %s" % (raw, RERUN_MONITORING))
    ms = sum(int(n) * PROM_DURATION_MS[i] for i, n in enumerate(m.groups()) if n)
    if ms == 0:
        raise InputError(key, "%r is zero; a zero duration fires an alert on the first evaluation that matches (one "
                              "failed scrape would page): give a duration above zero such as 2m; %s"
                         % (raw, RERUN_MONITORING))
    return text, ms


def rate_list(key, raw, value):
    """Request rates: positive numbers or `inf`, comma-separated, none twice -> a list in the given order (numbers,
    and the string "inf")."""
    rates, seen = [], set()
    for item in (x.strip() for x in str(value).split(",")):
        if item == "inf":
            rate = "inf"
        elif NUMBER.match(item) and float(item) > 0:
            rate = _number(key, item, item)
        else:
            raise InputError(key, "%r is not a comma-separated list of request rates in requests/s like 1,2,4 "
                                  "(positive numbers, or inf for every request at once); %s" % (raw, FIX))
        if rate in seen:
            raise InputError(key, "%r names the rate %s twice; %s" % (raw, rate, FIX))
        seen.add(rate)
        rates.append(rate)
    return rates


def choice_list(spec, key, raw, value):
    """Names of spec["choices"], comma-separated, none twice -> a list in the given order."""
    names = [x.strip() for x in str(value).split(",")]
    for name in names:
        if name not in spec["choices"]:
            raise InputError(key, "%r names %r, not one of %s; %s" % (raw, name, ", ".join(spec["choices"]), FIX))
        if names.count(name) > 1:
            raise InputError(key, "%r names %s twice; %s" % (raw, name, FIX))
    return names


def _address(key, raw, value):
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise InputError(key, "%r is not an IPv4 or IPv6 address (IPv4 as four decimal numbers like 10.0.0.11; no "
                              "brackets, no prefix length); %s" % (raw, FIX))
    reason = local_host_reason(str(ip))
    if reason:
        raise InputError(key, "%r is %s, which the other engines and the router cannot reach; set the node's "
                              "global fabric address; %s" % (raw, reason, FIX))
    if getattr(ip, "ipv4_mapped", None) is not None:
        raise InputError(key, "%r is an IPv4-mapped IPv6 address; write the IPv4 address %s itself (with "
                              "NARWHAL_BIND_FAMILY=ipv4); %s" % (raw, ip.ipv4_mapped, FIX))
    return str(ip)


def _shown(value, limit=80):
    """%r of a value, cut to `limit` characters (a refusal never repeats a megabyte)."""
    return repr(value) if len(value) <= limit else "%r... (%d characters)" % (value[:limit], len(value))


def check_image(key, value):
    """Refuse what the Docker Engine would refuse as an image reference or ID (the grammar above IMAGE_NAME_MAX),
    naming the part that breaks it: the whole length, the digest, the tag, the name's length or its form."""
    example = "like vllm/vllm-openai:v0.33.0, registry.example:5000/ns/image:tag or an image ID sha256:<64 hex>"
    what = "%s is not an image reference" % _shown(value)
    if len(value) > IMAGE_REF_MAX:
        raise InputError(key, "%s: it is %d characters long, and Docker's grammar allows at most %d (a name of up to "
                              "%d, a tag of up to 128, a digest); give the engine image's reference or ID (%s); %s"
                         % (what, len(value), IMAGE_REF_MAX, IMAGE_NAME_MAX, example, FIX))
    name, at, digest = value.partition("@")
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, _colon, tag = name.rpartition(":")
    if at:
        algorithm, _colon, hexdigits = digest.partition(":")
        size = IMAGE_DIGEST_HEX.get(algorithm)
        if size is None or len(hexdigits) != size or not re.match(r"^[0-9a-f]+$", hexdigits):
            raise InputError(key, "%s: its digest %s is not sha256:, sha384: or sha512: followed by 64, 96 or 128 "
                                  "lowercase hex digits, the digests Docker verifies; copy the digest from "
                                  "'docker images --digests' (%s); %s" % (what, _shown(digest), example, FIX))
    if tag is not None and not IMAGE_TAG.match(tag):
        raise InputError(key, "%s: its tag %s is not a Docker tag (1 to 128 ASCII letters, digits, '_', '.' and "
                              "'-', not starting with '.' or '-'); %s" % (what, _shown(tag), FIX))
    if len(name) > IMAGE_NAME_MAX:
        raise InputError(key, "%s: its name is %d characters long, and Docker's limit is %d; %s"
                         % (what, len(name), IMAGE_NAME_MAX, FIX))
    if not IMAGE_NAME.match(name):
        case = (" (a repository path is lowercase: Docker refuses capital letters there)"
                if IMAGE_NAME.match(name.lower()) else "")
        raise InputError(key, "%s: its name %s is not a Docker repository name%s ([registry-host[:port]/]path, the "
                              "path of '/'-separated components of lowercase letters and digits joined by one '.', "
                              "one or two '_' or dashes; %s); %s" % (what, _shown(name), case, example, FIX))


def check_served_name(key, name, derived_from=None):
    """The served model name becomes the container path /models/<name, / as _>, a vllm serve argument and a
    role-environment line: letters, digits and . _ - + : @ /, no empty, '.' or '..' component."""
    if MODEL_NAME.match(name or "") and not any(p in ("", ".", "..") for p in name.split("/")):
        return name
    what = "%r" % name if derived_from is None else "its last component %r, the default served model name," % name
    fix = FIX if derived_from is None else "set NARWHAL_SERVED_MODEL_NAME (or correct %s), then rerun discovery" % key
    raise InputError(key, "%s is not a served model name the engines can use: it becomes the container path "
                          "/models/<name with / as _> and a vllm serve argument, so it takes letters, digits and "
                          ". _ - + : @ /, starts with a letter or digit and has no empty, '.' or '..' component; %s"
                     % (what, fix))


def _url_host(key, url, host):
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise InputError(key, "%r has an invalid IPv6 host; %s" % (url, FIX))
    else:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
            if all(NUMERIC_LABEL.match(x) for x in labels) or (labels and labels[-1].isdigit()):
                raise InputError(key, "%r writes its host %s in a numeric form that is not a dotted-quad IPv4 address "
                                      "(resolvers read 127.1 or 0x7f.1 as 127.0.0.1); write the address as four "
                                      "decimal numbers like 10.0.0.11; %s" % (url, host, FIX))
            if not host or len(host) > 253 or not all(DNS_LABEL.match(x) for x in labels):
                raise InputError(key, "%r has no valid host (an IPv4 address, an IPv6 address in brackets or a DNS "
                                      "name); %s" % (url, FIX))
    reason = local_host_reason(host)
    if reason:
        raise InputError(key, "%r points at %s (%s), which only reaches the machine a client runs on; the fleet's "
                              "clients run elsewhere: use the engine host's reachable address; %s"
                         % (url, host, reason, FIX))


def parse_url(key, url, allow_path=True):
    """Split an http(s) URL into (scheme, host, port, path); the port defaults by scheme. User information, a
    query or a fragment is refused; a path only where `allow_path` (the attestation URL)."""
    m = URL.match(url or "")
    if not m:
        raise InputError(key, "%r is not an http(s) URL like http://10.0.0.11:8000 (IPv6 in brackets); %s"
                         % (url, FIX))
    scheme, authority, path, query, fragment = m.groups()
    if "@" in authority:
        # the value is not repeated: user information may hold a password
        raise InputError(key, "the URL carries user information (user@ or user:password@ before the host), which "
                              "the fleet would hand to every client; drop it (the engines authenticate with the key "
                              "in NARWHAL_API_KEY_FILE); %s" % FIX)
    if query is not None or fragment is not None:
        raise InputError(key, "%r has a query (?...) or a fragment (#...); give scheme://host:port%s only; %s"
                         % (url, "/path" if allow_path else "", FIX))
    if path and not allow_path:
        raise InputError(key, "%r has a path (%s); an engine URL is the server's root, which the router and the "
                              "probes extend with /v1/...: give scheme://host:port only; %s" % (url, path, FIX))
    if path and not URL_PATH.match(path):
        raise InputError(key, "%r has a path with characters other than letters, digits and . _ ~ %% / : @ + , = -; "
                              "%s" % (url, FIX))
    hp = AUTHORITY.match(authority)
    if not hp:
        raise InputError(key, "%r is not an http(s) URL like http://10.0.0.11:8000 (IPv6 in brackets); %s"
                         % (url, FIX))
    host, port = hp.groups()
    _url_host(key, url, host)
    if port == "":
        raise InputError(key, "%r has an empty port after ':'; %s" % (url, FIX))
    port = int(port) if port else (443 if scheme == "https" else 80)
    if not 1 <= port <= 65535:
        raise InputError(key, "%r has port %d out of range 1-65535; %s" % (url, port, FIX))
    return scheme, host, port, path or ""


def _suggest(name, names):
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return " (did you mean %s?)" % close[0] if close else ""


def _unknown_site_key(key):
    if key in ROLE_ENV_KEYS:
        why = ("is a key of the role environment that prepare writes for the launcher, not a site input; remove it "
               "from .env")
    elif key in TOOL_VARIABLES:
        why = ("is read by the project's scripts from the controller environment, not from .env; remove it from "
               ".env")
    else:
        names = [s["name"][len("NARWHAL_"):] for s in INPUTS]
        hint = _suggest(key[len("NARWHAL_"):], names).replace("mean ", "mean NARWHAL_")
        why = ("is not a site input%s; a misspelt key would be ignored and its default used: correct or remove it in "
               ".env (docs/inputs.md lists every input)" % hint)
    return InputError(key, why)


def _unknown_node_key(key, known):
    m = re.match(r"^NARWHAL_NODE_([1-9][0-9]*)_(.*)$", key)
    if not m:
        return InputError(key, "is not a per-node input: write NARWHAL_NODE_<n>_<setting> with n = 1, 2, ... (the <n> "
                               "of engine-<n>, no leading zero); %s" % FIX)
    hint = _suggest(m.group(2), sorted(known)).replace("mean ", "mean NARWHAL_NODE_%s_" % m.group(1))
    return InputError(key, "is not a known per-node input%s (NARWHAL_NODE_<n>_{%s}); %s"
                      % (hint, ",".join(sorted(known)), FIX))


def check_env_file(entries, where):
    """The entries of a .env file as python-dotenv's parser reads them, in file order: (key or None, value or
    None, line number, unparseable). python-dotenv skips an unparseable line and keeps the last of repeated keys,
    both silently: refuse them, and a NARWHAL_ key without '=' (read as unset)."""
    seen = {}
    for key, value, line, error in entries:
        if error:
            raise InputError("NARWHAL_ENV_FILE", "%s line %d is not KEY=VALUE as python-dotenv reads it (it would skip "
                                                 "the line silently); fix or remove the line" % (where, line))
        if not key or not key.startswith("NARWHAL_"):
            continue
        if value is None:
            raise InputError(key, "%s line %d names %s without '=' (read as unset); write %s=<value> or remove the "
                                  "line" % (where, line, key, key))
        if key in seen:
            raise InputError(key, "is set twice in %s (lines %d and %d); python-dotenv would keep the last value "
                                  "silently: keep one line" % (where, seen[key], line))
        seen[key] = line


def is_input_name(key):
    """A site input, or a well-formed per-node key (load_inputs refuses an unknown per-node setting)."""
    return key in dict((s["name"], s) for s in INPUTS) or key.startswith("NARWHAL_NODE_")


def unknown_name_warning(key):
    """For a NARWHAL_ variable of the controller environment that is no input: a warning naming the input it
    resembles, or None (the project's tool variables and names like no input)."""
    if key in TOOL_VARIABLES or key in ROLE_ENV_KEYS or is_input_name(key):
        return None
    hint = _suggest(key[len("NARWHAL_"):], [s["name"][len("NARWHAL_"):] for s in INPUTS])
    if not hint:
        return None
    return ("%s in the controller environment is not a site input%s and is ignored" %
            (key, hint.replace("mean ", "mean NARWHAL_")))


def load_inputs(values):
    """Validate every NARWHAL_ value. Returns {"site": {...}, "nodes": {n: {...}}}.

    `values` is the merged mapping (process environment over .env). Every value must be one line of printable
    text; unknown NARWHAL_ keys are errors naming the closest input (a typo would silently drop a setting), as
    are cross-input contradictions (an address of the other family, GPU lists that disagree with the TP size).
    """
    site_specs = dict((s["name"], s) for s in INPUTS)
    known = dict((s["name"], s) for s in NODE_INPUTS)
    for key in sorted(values):
        if not key.startswith("NARWHAL_"):
            continue
        one_line(key, values[key])
        if key in site_specs:
            continue
        m = NODE_KEY.match(key)
        if key.startswith("NARWHAL_NODE_"):
            if not m or m.group(2) not in known:
                raise _unknown_node_key(key, known)
            continue
        raise _unknown_site_key(key)
    site = {}
    for spec in INPUTS:
        key = spec["name"]
        raw = values.get(key)
        if raw is None or (isinstance(raw, str) and raw.strip() == ""):
            if spec.get("required"):
                raise InputError(key, "is required (%s); add it to .env" % spec["doc"].split(";", 1)[0].rstrip("."))
            default = spec.get("default")
            # a list's default is written as in .env (the docs show it so) and read like a set value
            site[key] = rate_list(key, default, default) if spec["kind"] == "rate_list" and default else default
            continue
        site[key] = _check(spec, key, raw)
    nodes = {}
    for key in sorted(values):
        m = NODE_KEY.match(key)
        if not m:
            continue
        raw = values[key]
        if raw is None or str(raw).strip() == "":
            continue
        n = int(m.group(1))
        nodes.setdefault(n, {})[m.group(2)] = _check(known[m.group(2)], key, raw)
    _cross_check(site, nodes)
    return {"site": site, "nodes": nodes}


def _check_kv_events(site, nodes):
    """KV events (_common/kv_events.py) against the inputs that decide whether they can work: the prefill policy,
    the bind family, the engines' PYTHONHASHSEED and their --prefix-caching-hash-algo."""
    policy, policy_key = role_policy(site, "prefill")
    if policy == KV_AWARE and site.get("NARWHAL_KV_EVENTS") == "off":
        raise InputError("NARWHAL_KV_EVENTS", "is off but %s is kv_aware, which routes prefills by the engines' own KV "
                                              "events: without them it has nothing to route by; set NARWHAL_KV_EVENTS="
                                              "auto (or on), or pick another prefill policy (e.g. %s=cache_aware); %s"
                         % (policy_key, policy_key, FIX))
    if not events_on(site):
        return
    if site.get("NARWHAL_BIND_FAMILY") == "ipv6":
        raise InputError("NARWHAL_KV_EVENTS", "KV events are on (NARWHAL_KV_EVENTS=%s%s) but NARWHAL_BIND_FAMILY is "
                                              "ipv6: vLLM's event publisher binds tcp://*:<port> without ZMQ_IPV6, on "
                                              "IPv4 only (vllm/distributed/kv_events.py), so a router could not reach "
                                              "the events at the engines' IPv6 addresses; set NARWHAL_KV_EVENTS=off "
                                              "and a prefill policy other than kv_aware; %s"
                         % (site.get("NARWHAL_KV_EVENTS") or "auto",
                            ", %s=kv_aware" % policy_key if policy == KV_AWARE else "", FIX))
    seed = hash_seed(site)
    envs = [("NARWHAL_ENGINE_ENV", site.get("NARWHAL_ENGINE_ENV"))] + [
        ("NARWHAL_NODE_%d_ENGINE_ENV" % n, nodes[n].get("ENGINE_ENV")) for n in sorted(nodes)]
    for key, text in envs:
        value = parse_env_words(text or "", key).get(HASH_SEED_ENV)
        if value is not None and value != seed:
            same = ("or set NARWHAL_KV_HASH_SEED=%s" % value if WHOLE.match(value) and 0 <= int(value) <= HASH_SEED_MAX
                    else "(%s is no seed all engines share)" % value)
            raise InputError(key, "sets %s=%s, but while KV events are on every engine runs with PYTHONHASHSEED=%s "
                                  "(NARWHAL_KV_HASH_SEED), the seed of vLLM's block hashes, so that the engines' "
                                  "events agree; remove it from %s %s; %s"
                             % (HASH_SEED_ENV, value, seed, key, same, FIX))
    _check_hash_algos(site, nodes)


def _check_hash_algos(site, nodes):
    """Every engine (a node with a role) must hash its blocks with one --prefix-caching-hash-algo while KV events are
    on: its extra arguments are NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS, then its node's, and vLLM keeps the last."""
    site_words = [w for k in ("NARWHAL_EXTRA_ARGS", "NARWHAL_ENGINE_ARGS") for w in split_args(site.get(k), k)]
    algos = {}
    for n in sorted(n for n in nodes if nodes[n].get("ROLE")):
        key = "NARWHAL_NODE_%d_EXTRA_ARGS" % n
        node_algo = hash_algo(split_args(nodes[n].get("EXTRA_ARGS"), key))
        algos[n] = (node_algo or hash_algo(site_words) or DEFAULT_HASH_ALGO, key if node_algo else None)
    if len(set(algo for algo, _key in algos.values())) > 1:
        shown = ", ".join("engine-%d %s" % (n, algos[n][0]) for n in sorted(algos))
        key = next((k for _a, k in algos.values() if k), "NARWHAL_EXTRA_ARGS")
        raise InputError(key, "the engines hash their KV blocks with different --prefix-caching-hash-algo (%s), so "
                              "their KV events would name one prompt prefix by different hashes; while KV events are "
                              "on give every engine one algorithm (in NARWHAL_EXTRA_ARGS, or the same in every "
                              "NARWHAL_NODE_<n>_EXTRA_ARGS); %s" % (shown, FIX))


def _cross_check(site, nodes):
    _check_kv_events(site, nodes)
    if not site.get("NARWHAL_SERVED_MODEL_NAME") and site.get("NARWHAL_MODEL_PATH"):
        check_served_name("NARWHAL_MODEL_PATH", site["NARWHAL_MODEL_PATH"].rstrip("/").rsplit("/", 1)[-1],
                          derived_from="NARWHAL_MODEL_PATH")
    family = site.get("NARWHAL_BIND_FAMILY")
    tp, per_engine = site.get("NARWHAL_TP_SIZE"), site.get("NARWHAL_GPUS_PER_ENGINE")
    for n in sorted(nodes):
        node = nodes[n]
        if node.get("IP") and family:
            version = ipaddress.ip_address(node["IP"]).version
            if "ipv%d" % version != family:
                raise InputError("NARWHAL_NODE_%d_IP" % n,
                                 "%s is an IPv%d address but NARWHAL_BIND_FAMILY is %s (the engines bind and are "
                                 "reached on that family); set an %s address or change NARWHAL_BIND_FAMILY; %s"
                                 % (node["IP"], version, family, family, FIX))
        ids = node.get("GPU_IDS")
        dp, dp_key = _data_parallel(site, node, n)
        hosts = _hosts(node, n, dp, dp_key)
        if ids and hosts > 1 and tp and len(ids) * hosts != tp * dp:
            raise InputError("NARWHAL_NODE_%d_GPU_IDS" % n,
                             "lists %d GPU(s) (%s) on each of the %d hosts of engine-%d (NARWHAL_NODE_%d_HOSTS), %d "
                             "in all, but NARWHAL_TP_SIZE x %s is %d x %d; an engine's GPU count must equal TP x DP: "
                             "list %s GPU(s) per host or change NARWHAL_TP_SIZE or %s; %s"
                             % (len(ids), ",".join(map(str, ids)), hosts, n, n, len(ids) * hosts, dp_key, tp, dp,
                                "%d" % (tp * dp // hosts) if tp * dp % hosts == 0 else "another number of",
                                dp_key, FIX))
        if ids and hosts == 1 and tp and len(ids) != tp * dp:
            raise InputError("NARWHAL_NODE_%d_GPU_IDS" % n,
                             "lists %d GPU(s) (%s) but NARWHAL_TP_SIZE is %d%s; an engine's GPU count must equal "
                             "TP x DP: list %d GPU(s) or change NARWHAL_TP_SIZE%s; %s"
                             % (len(ids), ",".join(map(str, ids)), tp,
                                " and %s is %d" % (dp_key, dp) if dp > 1 else "", tp * dp,
                                " or %s" % dp_key if dp > 1 else "", FIX))
        if ids and not tp and (len(ids) * hosts) % dp:
            raise InputError(dp_key, "is %d but NARWHAL_NODE_%d_GPU_IDS lists %d GPU(s), which %d data-parallel "
                                     "ranks cannot share equally (an engine's GPU count must equal TP x DP); list a "
                                     "multiple of %d GPUs or change %s; %s" % (dp, n, len(ids), dp, dp, dp_key, FIX))
    engines_by_count = [n for n in sorted(nodes) if nodes[n].get("ROLE") and not nodes[n].get("GPU_IDS")]
    for n in engines_by_count:
        dp, dp_key = _data_parallel(site, nodes[n], n)
        hosts = _hosts(nodes[n], n, dp, dp_key)
        if hosts > 1 and isinstance(per_engine, int):
            if tp and per_engine * hosts != tp * dp:
                raise InputError("NARWHAL_TP_SIZE", "is %d and %s is %d, so engine-%d needs %d GPU(s), but "
                                                    "NARWHAL_GPUS_PER_ENGINE gives it %d on each of its %d hosts "
                                                    "(NARWHAL_NODE_%d_HOSTS), %d in all; an engine's GPU count must "
                                                    "equal TP x DP: change NARWHAL_TP_SIZE, %s or "
                                                    "NARWHAL_GPUS_PER_ENGINE; %s"
                                 % (tp, dp_key, dp, n, tp * dp, per_engine, hosts, n, per_engine * hosts, dp_key,
                                    FIX))
            if not tp and per_engine * hosts % dp:
                raise InputError(dp_key, "is %d but NARWHAL_GPUS_PER_ENGINE gives engine-%d %d GPU(s) on each of "
                                         "its %d hosts (%d in all), which %d data-parallel ranks cannot share equally; "
                                         "change NARWHAL_GPUS_PER_ENGINE or %s; %s"
                                 % (dp, n, per_engine, hosts, per_engine * hosts, dp, dp_key, FIX))
            continue
        if tp and isinstance(per_engine, int) and per_engine != tp * dp:
            raise InputError("NARWHAL_TP_SIZE", "is %d but NARWHAL_GPUS_PER_ENGINE gives engine-%d %d GPU(s)%s; an "
                                                "engine's GPU count must equal TP x DP: change NARWHAL_TP_SIZE or "
                                                "NARWHAL_GPUS_PER_ENGINE%s; %s"
                             % (tp, n, per_engine, " and %s is %d" % (dp_key, dp) if dp > 1 else "",
                                " or %s" % dp_key if dp > 1 else "", FIX))
        if not tp and isinstance(per_engine, int) and per_engine % dp:
            raise InputError(dp_key, "is %d but NARWHAL_GPUS_PER_ENGINE gives engine-%d %d GPU(s), which %d "
                                     "data-parallel ranks cannot share equally (an engine's GPU count must equal TP x "
                                     "DP); set NARWHAL_GPUS_PER_ENGINE to a multiple of %d or change %s; %s"
                             % (dp, n, per_engine, dp, dp, dp_key, FIX))


def _hosts(node, n, dp, dp_key):
    """The number of hosts node `n` spans (NARWHAL_NODE_<n>_HOSTS, default 1), refused when its DP ranks cannot be
    spread equally over them: vLLM gives each host --data-parallel-size-local ranks, the same on every host here
    (the head's local size is the one it waits for per host: vLLM docs/serving/data_parallel_deployment.md)."""
    hosts = node.get("HOSTS") or 1
    key = "NARWHAL_NODE_%d_HOSTS" % n
    if hosts > 64:
        raise InputError(key, "is %d; an engine spans at most 64 hosts here; %s" % (hosts, FIX))
    if hosts > 1 and dp % hosts:
        raise InputError(key, "is %d but %s is %d: an engine across hosts runs the same number of data-parallel "
                              "ranks on each host (DP / hosts, vllm serve --data-parallel-size-local), so the DP size "
                              "must be a multiple of the host count; set %s to a multiple of %d (e.g. %d) or change "
                              "%s; %s" % (hosts, dp_key, dp, dp_key, hosts, hosts * max(1, -(-dp // hosts)), key, FIX))
    return hosts


def _data_parallel(site, node, n):
    """(the data-parallel size of node `n`, the input it came from)."""
    if node.get("DATA_PARALLEL_SIZE") is not None:
        return node["DATA_PARALLEL_SIZE"], "NARWHAL_NODE_%d_DATA_PARALLEL_SIZE" % n
    return site.get("NARWHAL_DATA_PARALLEL_SIZE") or 1, "NARWHAL_DATA_PARALLEL_SIZE"
