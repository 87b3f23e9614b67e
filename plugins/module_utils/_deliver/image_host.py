# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The work of the host module image_delivery (docs/delivery.md, "Images"): read what the host's Docker holds of
the references, pull an image (with the X-Registry-Auth value built from the registry's entry of a Docker
config.json on the host), tag it as the reference, check an archive's sha256 and load it. Over the Engine API
(_docker/engine_api.py); the rules and the words are _deliver/images.py's. Python 3.8 + standard library.

Credentials: the module reads them from `auth_file` (a 0600 copy the role removes after the pulls); the header value
and the password are registered as no_log values, and never reach a result, a message or an argument.
"""

from __future__ import annotations

import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import file_sha256
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.images import (
    AUTH_KEY,
    parse_reference,
    pull_failure,
    registry_auth,
    repo_digest,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    DaemonUnreachable,
    EngineAPIError,
    NotFound,
)

__metaclass__ = type


def make_client(docker_host, timeout):
    """The Docker Engine API client (tests replace this)."""
    return Client(docker_host, timeout=timeout)


class RefusedError(Exception):
    """A refusal of this module: its message is the task's."""


def _inspect(api, ref):
    """The image's inspect document, None when the daemon has no such image."""
    try:
        return api.image(ref)
    except NotFound:
        return None


def read(api, references):
    """{"images": [{"key", "reference", "present", "image_id", "repo_digests", "repo_tags"}], "held": [IDs]}."""
    images = []
    for entry in references:
        found = _inspect(api, entry["reference"]) or {}
        images.append({"key": entry["key"], "reference": entry["reference"], "present": bool(found),
                       "image_id": found.get("Id"), "repo_digests": list(found.get("RepoDigests") or []),
                       "repo_tags": list(found.get("RepoTags") or [])})
    held = sorted(set(s.get("Id") for s in api.images() or [] if s.get("Id")))
    return {"changed": False, "images": images, "held": held}


def tag_as(api, image, reference, check_mode):
    """Tag `image` (an ID or a reference the host holds) as `reference`; True when the tag moved (or would)."""
    source = _inspect(api, image)
    if source is None:
        raise RefusedError("cannot tag %s as %s: the host does not hold %s" % (image, reference, image))
    current = _inspect(api, reference)
    if current is not None and current.get("Id") == source.get("Id"):
        return False
    if not check_mode:
        parts = parse_reference(reference)
        api.tag(source["Id"], parts["name"], parts["tag"])
    return True


def _auth(module, registry):
    """The X-Registry-Auth value for `registry` from the module's auth_file (None without one, or without an entry
    for that registry), registered as a no_log value."""
    path = module.params["auth_file"]
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RefusedError("%s: its copy on this host (%s) cannot be read (%s); rerun (the role copies it again)"
                           % (AUTH_KEY, path, getattr(exc, "strerror", None) or type(exc).__name__))
    try:
        value = registry_auth(text, registry)
    except InputError as exc:
        raise RefusedError(str(exc))
    if value:
        module.no_log_values.add(value)
    return value


def _pull(module, api, image, parts, host):
    """Pull `image` (POST /images/create); RefusedError in the words of images.pull_failure."""
    params = module.params
    auth = _auth(module, parts["registry"])
    try:
        api.pull(parts["name"], parts["digest"] or parts["tag"], auth, timeout=params["stream_timeout"])
    except DaemonUnreachable as exc:
        raise RefusedError("%s: the Docker daemon at %s does not answer (%s); start it, then rerun"
                           % (host, params["docker_host"], exc))
    except EngineAPIError as exc:
        raise RefusedError(pull_failure(exc.explanation or exc, host, params["reference"], parts["registry"],
                                        params["key"], bool(auth)))


def _expect(after, image_id, host, what):
    if image_id and after.get("Id") != image_id:
        raise RefusedError("%s: %s gave image %s, and the pin is %s; check the pin file and the source, then rerun"
                           % (host, what, after.get("Id"), image_id))


def pull(module, api, host):
    """state=pull: `image` (the reference itself for a resolver, else <repository>@<digest>) unless the host already
    holds that digest; then, with `tag`, tagged as `reference`."""
    params = module.params
    image, reference = params["image"], params["reference"]
    parts = parse_reference(image)
    if parts["id"]:
        raise RefusedError("%s: %s is an image ID; no registry delivers an ID" % (host, image))
    before = _inspect(api, image)
    if before is not None and parts["digest"]:
        after, pulled = before, False
    elif module.check_mode:
        return {"changed": True, "pulled": True, "image_id": None, "digest": None, "repo_digests": [],
                "reference": reference, "host": host}
    else:
        _pull(module, api, image, parts, host)
        after, pulled = _inspect(api, image), True
        if after is None:
            raise RefusedError("%s: the pull of %s ended, but the host holds no %s; check the Docker daemon's log "
                               "(journalctl -u docker), then rerun" % (host, image, image))
    _expect(after, params["image_id"], host, "pulling %s" % image)
    changed = before is None or before.get("Id") != after.get("Id")
    if params["tag"]:
        changed = tag_as(api, after["Id"], reference, module.check_mode) or changed
    digests = list(after.get("RepoDigests") or [])
    return {"changed": changed, "pulled": pulled, "image_id": after.get("Id"), "repo_digests": digests,
            "digest": repo_digest(reference, digests) or repo_digest(image, digests), "reference": reference,
            "host": host}


def _load(module, api, host):
    """Check the archive's sha256, then load it; RefusedError naming the archive and the fix."""
    params = module.params
    path, want = params["path"], params["sha256"].lower().replace("sha256:", "")
    try:
        found = file_sha256(path)
    except OSError as exc:
        raise RefusedError("%s: the archive's copy %s cannot be read (%s); rerun (the role copies it again)"
                           % (host, path, exc.strerror or exc))
    if found != want:
        raise RefusedError("%s: the archive's copy %s has sha256 %s, and the archive's is %s: damaged on the way, "
                           "or the archive changed on the controller; the copy is removed, rerun to copy it again"
                           % (host, path, found, want))
    try:
        with open(path, "rb") as handle:
            api.load(handle, os.fstat(handle.fileno()).st_size, timeout=params["stream_timeout"])
    except EngineAPIError as exc:
        raise RefusedError("%s: the Docker daemon refused the archive %s: %s; check that it is a docker save archive "
                           "(docker load -i on the controller), then rerun" % (host, path, exc.explanation or exc))


def load(module, api, host):
    """state=load: nothing when the host holds `image_id`; else the archive at `path` checked against `sha256` and
    loaded; with `tag`, the image tagged as `reference`. With `remove`, the archive's copy is removed after."""
    params = module.params
    try:
        before = _inspect(api, params["image_id"])
        if before is None and not module.check_mode:
            _load(module, api, host)
            after = _inspect(api, params["image_id"])
            if after is None:
                raise RefusedError("%s: the archive %s was loaded, but the host holds no image %s: the archive holds "
                                   "another image; rebuild the archive index (rerun)"
                                   % (host, params["path"], params["image_id"]))
        changed = before is None
        if params["tag"] and params["reference"] and (before is not None or not module.check_mode):
            changed = tag_as(api, params["image_id"], params["reference"], module.check_mode) or changed
    finally:
        if params["remove"] and not module.check_mode and os.path.lexists(params["path"]):
            os.unlink(params["path"])
    return {"changed": changed, "loaded": changed and before is None, "image_id": params["image_id"],
            "reference": params["reference"], "host": host}


def run_module(module, client_factory=None):
    """image_delivery's main(): one state, its result or its refusal."""
    params = module.params
    host = params["host"] or "this host"
    try:
        api = (client_factory or make_client)(params["docker_host"], params["timeout"])
        if params["state"] == "read":
            result = read(api, params["references"])
        elif params["state"] == "pull":
            result = pull(module, api, host)
        elif params["state"] == "tag":
            result = {"changed": tag_as(api, params["image"], params["reference"], module.check_mode),
                      "image_id": params["image_id"], "reference": params["reference"], "host": host}
        else:
            result = load(module, api, host)
    except RefusedError as exc:
        module.fail_json(msg=str(exc))
    except DaemonUnreachable as exc:
        module.fail_json(msg="%s: the Docker daemon at %s does not answer (%s); start it ('systemctl start docker') "
                             "and make sure the connecting user may use its socket, then rerun"
                             % (host, params["docker_host"], exc))
    except (EngineAPIError, ValueError) as exc:
        module.fail_json(msg="%s: %s %s: %s" % (host, params["state"], params.get("reference") or "", exc))
    module.exit_json(**result)
