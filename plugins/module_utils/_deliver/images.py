# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The images of the deliver stage, pure (docs/delivery.md, "Images"): a Docker reference's parts, the plan (which
image each reference is pinned to, and what each host does to hold it), the pin file's document, the X-Registry-Auth
value of a Docker config.json for one registry, and the words of a failed pull.

Python 3.8 + standard library: the host module image_delivery ships it (the reference, the auth value, the words of
a failed pull); the controller runs the planner (plugins/filter/narwhal.py::image_plan).

The plan, per reference (its pin: {"image_id", "digest": "<repository>@sha256:..." or None, "source"}):
  1. -e deliver_image_repin=true: an archive of NARWHAL_IMAGE_ARCHIVE_DIR that tags the reference (exactly one
     image), else the registry: one resolver host pulls the reference and the pin follows what it got;
  2. else the pin file's pin; a host that holds the reference as another image is refused (the tag moved);
  3. else the image all the hosts that hold the reference agree on (those that disagree are refused);
  4. else an archive that tags the reference; else the registry, through a resolver host.
A host that lacks the pinned image gets, in this order: a tag of the image it holds by ID, the archive that holds the
image (no network), a pull of the pinned digest; a host no source can serve is refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError

__metaclass__ = type

AUTH_KEY = "NARWHAL_REGISTRY_AUTH_FILE"
CA_KEY = "NARWHAL_REGISTRY_CA_FILE"
ARCHIVE_KEY = "NARWHAL_IMAGE_ARCHIVE_DIR"
REPIN = "-e deliver_image_repin=true"
PIN_VERSION = 1
PIN_SOURCES = ("registry", "archive", "hosts")
ACTIONS = ("none", "tag", "pull", "pull-resolve", "load")

DOCKER_HUB = "docker.io"
# the names Docker gives Docker Hub (distribution/reference normalize.go; the CLI's config.json key for it)
HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
HUB_SERVER = "https://index.docker.io/v1/"

_ID = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


# ------------------------------------------------------------------------------------------------ references

def parse_reference(text):
    """The parts of a Docker reference as the Engine reads it (distribution/reference, normalize.go):
    {"reference", "id"} for an image ID (sha256:<64 hex>, or the 64 hex digits alone; the other parts None), else
    {"reference",
    "registry" (host[:port], docker.io when the first component is no host), "path" (library/<name> on Docker Hub
    for a one-component name), "repository" (registry/path), "name" (the reference without tag and digest, as
    written), "tag" ("latest" when neither tag nor digest is given, None beside a digest alone), "digest"}.
    ValueError for what is no reference (the inputs' check, _inputs/validate.py::check_image, comes first)."""
    text = str(text or "").strip()
    match = _ID.match(text)
    if match:
        return {"reference": text, "id": "sha256:" + match.group(1), "registry": None, "path": None,
                "repository": None, "name": None, "tag": None, "digest": None}
    name, _at, digest = text.partition("@")
    if _at and not _DIGEST.match(digest):
        raise ValueError("%r: its digest is not sha256:<64 hex>" % text)
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, _colon, tag = name.rpartition(":")
    if not name or not tag and tag is not None:
        raise ValueError("%r is not an image reference" % text)
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name
    registry = DOCKER_HUB if registry in HUB_ALIASES else registry
    if registry == DOCKER_HUB and "/" not in path:
        path = "library/" + path
    if tag is None and not digest:
        tag = "latest"
    return {"reference": text, "id": None, "registry": registry, "path": path,
            "repository": "%s/%s" % (registry, path), "name": name, "tag": tag, "digest": digest or None}


def same_repository(left, right):
    """Two repository names (as written or as RepoDigests/RepoTags hold them) that are the same repository."""
    try:
        return parse_reference(left)["repository"] == parse_reference(right)["repository"]
    except (ValueError, KeyError):
        return False


def repo_digest(reference, repo_digests):
    """The RepoDigests entry ("<repository>@sha256:...", as Docker wrote it) of the reference's repository, or
    None (an image built or loaded here has none)."""
    try:
        parts = parse_reference(reference)
    except ValueError:
        return None
    for entry in sorted(repo_digests or []):
        name, _at, digest = str(entry).partition("@")
        if _DIGEST.match(digest) and parts.get("repository") and same_repository(name, parts["name"]):
            return str(entry)
    return None


def tags_reference(reference, repo_tags):
    """True when one of an image's RepoTags is the reference (Docker Hub's short names included)."""
    try:
        want = parse_reference(reference)
    except ValueError:
        return False
    if want["id"] or want["digest"]:
        return False
    for tag in repo_tags or []:
        try:
            have = parse_reference(tag)
        except ValueError:
            continue
        if not have["id"] and (have["repository"], have["tag"]) == (want["repository"], want["tag"]):
            return True
    return False


# ------------------------------------------------------------------------------------------------ registry auth

def _server(key):
    """A config.json `auths` key as a registry host[:port]: scheme and path dropped, Docker Hub's names as docker.io."""
    text = re.sub(r"^[a-z]+://", "", str(key).strip().lower()).split("/", 1)[0]
    return DOCKER_HUB if text in HUB_ALIASES else text


def _auth_document(text):
    """The `auths` of a config.json text; InputError naming AUTH_KEY (never a byte of the file) when malformed."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        where = " (line %d, column %d)" % (exc.lineno, exc.colno) if hasattr(exc, "lineno") else ""
        raise InputError(AUTH_KEY, "the file is not JSON%s; it must be Docker's config.json format {\"auths\": "
                                   "{\"<registry host[:port]>\": {\"auth\": \"<base64 of user:password>\"}}} (what "
                                   "docker login writes without a credential helper); correct the file"
                         % where) from None
    if not isinstance(document, dict) or not isinstance(document.get("auths", {}), dict):
        raise InputError(AUTH_KEY, "the file is JSON, but not Docker's config.json format (an object whose \"auths\" "
                                   "is an object of registries); correct the file")
    auths = document.get("auths") or {}
    if not auths and (document.get("credsStore") or document.get("credHelpers")):
        raise InputError(AUTH_KEY, "the file names a credential helper (credsStore/credHelpers), which the hosts "
                                   "cannot run; give a file with the credentials in \"auths\" (docker login with "
                                   "no helper configured writes one)")
    return auths


def _credentials(registry, entry):
    """The AuthConfig of one `auths` entry: username and password (from "auth" or the fields), or identitytoken."""
    if not isinstance(entry, dict):
        raise InputError(AUTH_KEY, "the entry for registry %s is not an object; correct the file" % registry)
    config = {}
    if entry.get("auth"):
        try:
            plain = base64.b64decode(str(entry["auth"]), validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            plain = ""
        user, colon, password = plain.partition(":")
        if not colon or not user:
            raise InputError(AUTH_KEY, "the \"auth\" of registry %s is not the base64 of user:password; correct the "
                                       "file (docker login writes it)" % registry)
        config = {"username": user, "password": password}
    elif entry.get("username") or entry.get("password"):
        if not isinstance(entry.get("username"), str) or not isinstance(entry.get("password"), str):
            raise InputError(AUTH_KEY, "the entry for registry %s needs both \"username\" and \"password\" as "
                                       "strings; correct the file" % registry)
        config = {"username": entry["username"], "password": entry["password"]}
    if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
        config["identitytoken"] = entry["identitytoken"]
    if not config:
        raise InputError(AUTH_KEY, "the entry for registry %s holds no credentials (\"auth\", \"username\" and "
                                   "\"password\", or \"identitytoken\"); correct the file" % registry)
    return config


def auth_registries(text):
    """The registries (host[:port], docker.io for Docker Hub) a config.json text holds credentials for, sorted;
    every entry checked (InputError naming AUTH_KEY)."""
    auths = _auth_document(text)
    for key, entry in auths.items():
        _credentials(_server(key), entry)
    return sorted(set(_server(key) for key in auths))


def registry_auth(text, registry):
    """The X-Registry-Auth header value (URL-safe base64 of the JSON AuthConfig, as the docker CLI sends it) for
    `registry` from a config.json text, or None when the file has no entry for it (an anonymous pull)."""
    registry = _server(registry)
    for key, entry in sorted(_auth_document(text).items()):
        if _server(key) == registry:
            config = _credentials(registry, entry)
            config["serveraddress"] = HUB_SERVER if registry == DOCKER_HUB else registry
            return base64.urlsafe_b64encode(json.dumps(config, sort_keys=True).encode("utf-8")).decode("ascii")
    return None


# ------------------------------------------------------------------------------------------------ failed pulls

_AUTH_WORDS = ("unauthorized", "no basic auth credentials", "authentication required", " 401 ", "denied")
_CA_WORDS = ("x509: certificate signed by unknown authority", "certificate signed by unknown authority",
             "x509:", "failed to verify certificate")
_MISSING_WORDS = ("manifest unknown", "not found", "name unknown", "does not exist")
_UNREACHABLE_WORDS = ("connection refused", "no such host", "i/o timeout", "network is unreachable",
                      "no route to host", "server gave http response to https client", "timeout exceeded",
                      "dial tcp", "tls handshake timeout")


def pull_failure(message, host, reference, registry, key, authenticated):
    """The refusal of a failed pull of `reference` on `host`: what went wrong in the registry's or daemon's words
    (`message`), and the input that fixes it (NARWHAL_REGISTRY_AUTH_FILE, NARWHAL_REGISTRY_CA_FILE, the reference's
    key, or the registry's address). `authenticated`: the pull sent credentials."""
    text = str(message)
    low = " %s " % re.sub(r"[^a-z0-9:./ -]+", " ", text.lower())
    head = "%s: pulling %s (%s) from registry %s failed: %s" % (host, reference, key, registry, text)
    if any(w in low for w in _CA_WORDS):
        return "%s. The registry's TLS certificate is signed by a CA the host's Docker does not trust: set %s to " \
               "that CA's PEM certificate (installed as /etc/docker/certs.d/%s/ca.crt), then rerun" \
               % (head, CA_KEY, registry)
    if any(w in low for w in _UNREACHABLE_WORDS):
        return "%s. The host cannot reach the registry: check that %s (from %s) is its address and port and that " \
               "this host reaches it (DNS, routes, firewall), then rerun" % (head, registry, key)
    if any(w in low for w in _AUTH_WORDS):
        if authenticated:
            return "%s. The registry refused the credentials of %s for %s: correct that file's entry for %s " \
                   "(docker login %s writes it), then rerun" % (head, AUTH_KEY, registry, registry, registry)
        return "%s. The registry wants credentials and none were sent: set %s to a Docker config.json (mode 0600) " \
               "with an entry for %s, then rerun" % (head, AUTH_KEY, registry)
    if any(w in low for w in _MISSING_WORDS):
        return "%s. The registry has no image %s: correct %s, or push the image there, then rerun" \
               % (head, reference, key)
    return "%s. Check the registry and the host's Docker daemon log (journalctl -u docker), then rerun" % head


# ------------------------------------------------------------------------------------------------ the pin file

def pin_document(pins):
    """The pin file's document: {"version": 1, "images": {reference: {"image_id", "digest", "source"}}}."""
    return {"version": PIN_VERSION,
            "images": dict((str(ref), {"image_id": pin["image_id"], "digest": pin.get("digest"),
                                       "source": pin["source"]}) for ref, pin in sorted(pins.items()))}


def pin_text(pins):
    """The pin file's bytes as text: sorted keys, two spaces, a final newline (the same pins, the same text)."""
    return json.dumps(pin_document(pins), indent=2, sort_keys=True) + "\n"


def read_pins(text, where):
    """The pins of a pin file's text (None or '' for a file that is not there: no pins); InputError naming the
    file when it is not a pin file."""
    if not text:
        return {}
    fix = "restore it from a backup, or remove it (every reference is then pinned again, from the hosts that " \
          "hold it or its registry) and rerun"
    try:
        document = json.loads(text)
    except ValueError:
        raise InputError(where, "the pin file is not JSON; %s" % fix) from None
    if not isinstance(document, dict) or document.get("version") != PIN_VERSION \
            or not isinstance(document.get("images"), dict):
        raise InputError(where, "not a pin file of version %d ({\"version\": 1, \"images\": {...}}); %s"
                         % (PIN_VERSION, fix))
    pins = {}
    for ref, pin in document["images"].items():
        if not isinstance(pin, dict) or not _ID.match(str(pin.get("image_id") or "")) \
                or pin.get("source") not in PIN_SOURCES \
                or pin.get("digest") is not None and not isinstance(pin.get("digest"), str):
            raise InputError(where, "the pin of %s is not {\"image_id\": \"sha256:...\", \"digest\": ... or null, "
                                    "\"source\": registry|archive|hosts}; %s" % (ref, fix))
        pins[str(ref)] = {"image_id": str(pin["image_id"]), "digest": pin.get("digest"), "source": pin["source"]}
    return pins


# ------------------------------------------------------------------------------------------------ the plan

def _with_resolved(hosts, resolved):
    """The hosts' reads as plain dicts, with what each resolver pulled: it holds the reference as that image."""
    out = {}
    for host, read in sorted((hosts or {}).items()):
        images = [dict(entry) for entry in (read or {}).get("images") or []]
        held = set(str(i) for i in (read or {}).get("held") or [])
        for entry in images:
            done = resolved.get(entry["reference"])
            if done and done.get("host") == host:
                entry.update(present=True, image_id=done["image_id"])
                held.add(done["image_id"])
        out[str(host)] = {"images": images, "held": held}
    return out


def _needs(hosts):
    """{reference: [(host, its read of the reference), ...]} in host order."""
    needs = {}
    for host in sorted(hosts):
        for entry in hosts[host]["images"]:
            needs.setdefault(entry["reference"], []).append((host, entry))
    return needs


def _parts(ref, holders):
    try:
        return parse_reference(ref)
    except ValueError as exc:
        raise InputError(holders[0][1]["key"], "%s; give an image reference like registry.example:5000/ns/image:tag, "
                                               "then rerun" % exc) from None


def _archive_images(archives):
    """(archive, image) pairs of the archive index, archives in name order."""
    for archive in sorted(archives, key=lambda a: a["name"]):
        for image in archive.get("images") or []:
            yield archive, image


def _archive_pin(ref, parts, archives):
    """The pin of an archive that tags the reference (one image), else None; refused when archives disagree."""
    if parts["digest"]:
        return None  # a loaded image has no registry digest: only a pull makes <repository>@<digest> resolvable
    found = [(a, i) for a, i in _archive_images(archives) if tags_reference(ref, i.get("repo_tags"))]
    ids = sorted(set(i["image_id"] for _a, i in found))
    if len(ids) > 1:
        raise InputError(ARCHIVE_KEY, "the archives %s tag %s as different images (%s); keep only the archive of the "
                                      "image to deliver in the directory, then rerun"
                         % (", ".join(sorted(set(a["name"] for a, _i in found))), ref, ", ".join(ids)))
    return {"image_id": ids[0], "digest": None, "source": "archive"} if ids else None


def _shown(pin):
    return "%s (%s)" % (pin["image_id"], pin["digest"]) if pin.get("digest") else pin["image_id"]


def _tag_moved(ref, host, entry, pin, pin_file):
    how = "docker pull %s && docker tag %s %s" % (pin["digest"], pin["digest"], ref) if pin.get("digest") else \
        "docker load the archive of %s and docker tag %s %s" % (pin["image_id"], pin["image_id"], ref)
    shown = repo_digest(ref, entry.get("repo_digests"))
    return InputError(entry["key"], "on host %s, %s is image %s%s, but %s pins it to %s (source: %s): the tag moved "
                                    "since it was pinned. To deliver what the reference is now to every host (an "
                                    "upgrade), rerun with %s; to keep the pinned image, put it back on %s (%s), "
                                    "then rerun" % (host, ref, entry["image_id"], " (%s)" % shown if shown else "",
                                                    pin_file, _shown(pin), pin["source"], REPIN, host, how))


def _holders_pin(ref, holders, pin_file):
    """The image every host that holds the reference agrees on (with its registry digest when one has it), None when
    no host holds it; refused when they disagree."""
    present = [(h, e) for h, e in holders if e.get("present")]
    ids = sorted(set(e["image_id"] for _h, e in present))
    if len(ids) > 1:
        who = "; ".join("%s on %s" % (i, ", ".join(h for h, e in present if e["image_id"] == i)) for i in ids)
        raise InputError(present[0][1]["key"], "the hosts that hold %s disagree on its image (%s) and %s pins none "
                                               "yet. Rerun with %s to pin every host to what its registry serves now, "
                                               "or make the hosts agree (docker pull, docker tag), then rerun"
                         % (ref, who, pin_file, REPIN))
    if not ids:
        return None
    digests = [d for d in (repo_digest(ref, e.get("repo_digests")) for _h, e in present) if d]
    return {"image_id": ids[0], "digest": digests[0] if digests else None, "source": "hosts"}


def _pin(ref, parts, holders, known, repin):
    """The reference's pin, or None when a resolver must pull it (see the module's docstring for the order)."""
    pins, archives, resolved, pin_file = known
    if ref in resolved:
        return {"image_id": resolved[ref]["image_id"], "digest": resolved[ref].get("digest"), "source": "registry"}
    if repin:
        return _archive_pin(ref, parts, archives)
    if ref in pins:
        pin = pins[ref]
        for host, entry in holders:
            if entry.get("present") and entry["image_id"] != pin["image_id"]:
                raise _tag_moved(ref, host, entry, pin, pin_file)
        return pin
    return _holders_pin(ref, holders, pin_file) or _archive_pin(ref, parts, archives)


def _id_pin(ref, parts, holders):
    """An image ID reference: every host must hold it (no registry or archive delivers an ID)."""
    for host, entry in holders:
        if not entry.get("present"):
            raise InputError(entry["key"], "%s is an image ID, which no registry or archive delivers, and host %s does "
                                           "not hold it; load that image there (docker load), or set %s to a reference "
                                           "(repository:tag) that a registry or an archive of %s holds, then rerun"
                             % (ref, host, entry["key"], ARCHIVE_KEY))
    return {"image_id": parts["id"], "digest": None, "source": "hosts"}


def _no_source(ref, host, entry, pin):
    return InputError(entry["key"], "host %s lacks %s, pinned to %s (source: %s), and nothing can deliver it: no "
                                    "archive of %s holds that image and it has no registry digest to pull. Put its "
                                    "docker save archive into %s, or push it to a registry and rerun with %s, or load "
                                    "it on %s, then rerun" % (host, ref, _shown(pin), pin["source"], ARCHIVE_KEY,
                                                              ARCHIVE_KEY, REPIN, host))


def _action(ref, parts, host, entry, held, pin, archives):
    """What `host` does to hold the pinned image as `ref`: none, tag (it holds the image by ID), load (an archive
    holds it), pull (its registry digest); refused when none of them can."""
    tag = bool(parts["tag"]) and not parts["digest"]
    base = {"key": entry["key"], "reference": ref, "image_id": pin["image_id"], "tag": tag, "image": None,
            "registry": None, "archive": None}
    if entry.get("present") and entry.get("image_id") == pin["image_id"]:
        return dict(base, action="none", tag=False)
    if tag and pin["image_id"] in held:
        return dict(base, action="tag", image=pin["image_id"])
    if not parts["digest"]:
        for archive, image in _archive_images(archives):
            if image["image_id"] == pin["image_id"]:
                return dict(base, action="load", image=pin["image_id"],
                            archive={"path": archive["path"], "name": archive["name"], "sha256": archive["sha256"]})
    if pin.get("digest"):
        return dict(base, action="pull", image=pin["digest"], registry=parse_reference(pin["digest"])["registry"])
    raise _no_source(ref, host, entry, pin)


def _resolvers(plan, ref, parts, holders):
    """No pin yet: the first host that needs the reference pulls it (pull-resolve); the others pull the digest it
    gets (`image` None until then)."""
    first = holders[0][0]
    plan["resolvers"][ref] = first
    plan["pending"].append(ref)
    for host, entry in holders:
        plan["hosts"][host].append({"key": entry["key"], "reference": ref, "image_id": None, "archive": None,
                                    "action": "pull-resolve" if host == first else "pull",
                                    "image": ref if host == first else None, "registry": parts["registry"],
                                    "tag": host != first and bool(parts["tag"]) and not parts["digest"]})


def plan_images(hosts, pins=None, archives=None, repin=False, resolved=None, pin_file="the pin file"):
    """The image plan. `hosts`: {inventory host: the read of image_delivery state=read ({"images": [{"key",
    "reference", "present", "image_id", "repo_digests", "repo_tags"}], "held": [image IDs]})}; `pins`: the pin file's
    (read_pins); `archives`: the archive index ([{"path", "name", "sha256", "images": [{"image_id", "repo_tags"}]}]);
    `resolved`: {reference: {"host", "image_id", "digest"}} of the resolvers' pulls (the second call).
    -> {"hosts": {host: [{"key", "reference", "action", "image", "image_id", "registry", "archive", "tag"}]},
    "pins": this run's pins, "resolvers": {reference: host}, "pending": [references a resolver must pull first],
    "registries": {host: [registries it pulls from]}, "ca_registries": {host: [the registries of every reference it
    runs, pulled this run or not: NARWHAL_REGISTRY_CA_FILE is kept on each]}, "pin_text": the pin file (its pins and
    this run's), "lines": [what each host does]}. InputError naming the host, the reference, its key and the fix."""
    pins, resolved = dict(pins or {}), dict(resolved or {})
    archives = list(archives or [])
    reads = _with_resolved(hosts, resolved)
    plan = {"hosts": dict((h, []) for h in reads), "pins": {}, "resolvers": {}, "pending": [], "registries": {},
            "ca_registries": dict((h, []) for h in reads)}
    for ref, holders in sorted(_needs(reads).items()):
        parts = _parts(ref, holders)
        for host, _entry in holders:
            if parts["registry"] and parts["registry"] not in plan["ca_registries"][host]:
                plan["ca_registries"][host] = sorted(plan["ca_registries"][host] + [parts["registry"]])
        pin = _id_pin(ref, parts, holders) if parts["id"] else \
            _pin(ref, parts, holders, (pins, archives, resolved, pin_file), repin)
        if pin is None:
            _resolvers(plan, ref, parts, holders)
            continue
        plan["pins"][ref] = pin
        for host, entry in holders:
            plan["hosts"][host].append(_action(ref, parts, host, entry, reads[host]["held"], pin, archives))
    merged = dict(pins)
    merged.update(plan["pins"])
    plan["pin_text"] = pin_text(merged)
    for host, actions in plan["hosts"].items():
        plan["registries"][host] = sorted(set(a["registry"] for a in actions if a["registry"]))
    plan["lines"] = describe(plan)
    return plan


def describe(plan):
    """One line per host and reference that something happens to: what the host does."""
    lines = []
    for host, actions in sorted(plan["hosts"].items()):
        for a in actions:
            if a["action"] == "none":
                continue
            resolver = plan["resolvers"].get(a["reference"])
            loaded_from = (a["archive"] or {}).get("name")
            what = {"tag": "tag %s as it" % a["image"], "load": "load %s from %s" % (a["image_id"], loaded_from),
                    "pull": "pull %s" % (a["image"] or "the digest %s resolves" % resolver),
                    "pull-resolve": "pull it from %s and pin every host to what it gets" % a["registry"]}[a["action"]]
            lines.append("%s: %s (%s): %s" % (host, a["reference"], a["key"], what))
    return lines


def resolved_pulls(results):
    """{reference: {"host", "image_id", "digest"}} of the resolvers' registered pulls (image_delivery state=pull,
    looped): a result that was skipped, failed or ran in check mode (no image_id) is left out."""
    out = {}
    for result in results or []:
        for item in (result or {}).get("results") or [result or {}]:
            if item.get("image_id") and item.get("reference") and not item.get("failed") and item.get("host"):
                out[str(item["reference"])] = {"host": str(item["host"]), "image_id": str(item["image_id"]),
                                               "digest": item.get("digest")}
    return out


# ------------------------------------------------------------------------------------------------ archives

def archive_images(manifest_text, name):
    """[{"image_id", "repo_tags"}] of a docker save archive's manifest.json (Config: "<hex>.json", or
    "blobs/sha256/<hex>" in the OCI layout Docker 25 writes; the image ID is "sha256:<hex>"); InputError naming the
    archive and NARWHAL_IMAGE_ARCHIVE_DIR when it is not one."""
    try:
        entries = json.loads(manifest_text)
    except ValueError:
        entries = None
    images = []
    for entry in entries if isinstance(entries, list) and entries else [None]:
        config = str((entry or {}).get("Config") or "") if isinstance(entry, dict) else ""
        match = re.search(r"([0-9a-f]{64})(?:\.json)?$", config)
        if not match:
            raise InputError(ARCHIVE_KEY, "%s: its manifest.json is not a docker save manifest (a list of {\"Config\", "
                                          "\"RepoTags\", \"Layers\"}); make it with docker save -o %s <image>, or "
                                          "remove it from the directory, then rerun" % (name, name))
        images.append({"image_id": "sha256:" + match.group(1),
                       "repo_tags": sorted(str(t) for t in entry.get("RepoTags") or [])})
    return images


def sidecar_sha256(text, name):
    """The sha256 of `name` in a sha256sum line ('<64 hex>  <name>' or '<64 hex> *<name>', or the hex alone);
    InputError naming the sidecar when it holds none."""
    first = (str(text or "").strip().splitlines() or [""])[0].split()
    if first and re.match(r"^[0-9a-fA-F]{64}$", first[0]) and (len(first) == 1 or first[-1].lstrip("*").endswith(
            name)):
        return first[0].lower()
    raise InputError(ARCHIVE_KEY, "%s.sha256 is not what sha256sum writes for %s ('<64 hex>  %s'); write it with "
                                  "sha256sum %s > %s.sha256, or remove it, then rerun" % (name, name, name, name, name))
