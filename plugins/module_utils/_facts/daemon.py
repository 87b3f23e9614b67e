# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host-side reader of image_facts (Docker daemon, version container, cache file), shared by
image_facts and engine_host_facts. The pure helpers stay in _facts/image.py.

The daemon is asked through _docker/engine_api.py (the standard library over the daemon's socket, no Docker
SDK): a rerun, whose image facts come from the cache, costs one GET of the image; a first run adds the version
container (create, start, wait, logs, remove).
read_image() takes the running AnsibleModule and a client factory; on an error it calls module.fail_json.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import json
import os
import tempfile

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    Client,
    DaemonUnreachable,
    EngineAPIError,
    NotFound,
    Timeout,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.image import (
    VERSION_SCRIPT,
    ImageFactsError,
    build_facts,
    cache_document,
    cache_file_name,
    cached_distributions,
    normalize_requested,
    parse_script_output,
)

__metaclass__ = type

PYTHONS = ("python3", "python")

CONTAINER_LABEL = "org.narwhal.deploy.image-facts"


class NoPythonError(Exception):
    pass


def make_client(docker_host, timeout):
    """The Docker Engine API client (tests replace this)."""
    return Client(docker_host, timeout=timeout)


def _remove(api, container):
    try:
        api.remove(container, force=True)
    except Exception:  # noqa: BLE001 - cleanup must not hide the real error
        pass


def _missing_executable(text):
    text = str(text).lower()
    return "executable file not found" in text or "no such file or directory" in text


def run_version_container(api, image_id, python, names, timeout):
    """Run VERSION_SCRIPT with `python` in a throw-away container; return its stdout."""
    container = api.create(None, api.config(
        image_id,
        entrypoint=[python, "-c", VERSION_SCRIPT],
        command=list(names),
        network_mode="none",
        labels={CONTAINER_LABEL: "version-probe"},
        environment={"PYTHONDONTWRITEBYTECODE": "1"},
    ))["Id"]
    try:
        try:
            api.start(container)
        except EngineAPIError as exc:
            if _missing_executable(exc):
                raise NoPythonError(str(exc))
            raise
        try:
            result = api.wait(container, timeout=timeout)
        except Timeout as exc:
            try:
                api.kill(container)
            except Exception:  # noqa: BLE001
                pass
            raise ImageFactsError("version container did not finish within %ss (%s)" % (timeout, exc))
        status = result.get("StatusCode") if isinstance(result, dict) else result
        stdout = api.logs(container, stdout=True, stderr=False)
        if status != 0:
            stderr = api.logs(container, stdout=False, stderr=True).decode("utf-8", "replace")
            if status in (126, 127) or _missing_executable(stderr):
                raise NoPythonError("exit %s: %s" % (status, stderr[-300:]))
            raise ImageFactsError("version container exited with %s: %s" % (status, stderr[-500:].strip()))
        return stdout
    finally:
        _remove(api, container)


def read_versions(client, image_id, names, timeout):
    tried = []
    for python in PYTHONS:
        try:
            out = run_version_container(client, image_id, python, names, timeout)
        except NoPythonError as exc:
            tried.append("%s (%s)" % (python, exc))
            continue
        return parse_script_output(out, names)
    raise NoPythonError("; ".join(tried))


def load_cache(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None


def write_cache(module, cache_dir, path, document):
    if not os.path.isdir(cache_dir):
        os.makedirs(cache_dir, 0o700)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".image-facts-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o600)
        module.atomic_move(tmp, path)
        os.chmod(path, 0o600)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_image(module, reference, distributions, cache_dir, docker_host, timeout, client_factory=None):
    """narwhal_image: inspect `reference`, read the versions of `distributions` (cached by image ID in
    cache_dir: a hit starts no container)."""
    requested = normalize_requested(distributions)
    try:
        client = (client_factory or make_client)(docker_host, timeout)
        attrs = client.image(reference)
    except DaemonUnreachable as exc:  # no socket, no permission, refused, no answer in time
        module.fail_json(
            msg="cannot inspect image %s: the Docker daemon at %s is not answering (%s); start it "
            "('systemctl start docker') and make sure the connecting user may use its socket (group docker), "
            "then rerun discovery" % (reference, docker_host, exc)
        )
    except NotFound:
        module.fail_json(
            msg="image %s is not present on this host's Docker daemon (%s); load or pull it there, "
            "then rerun discovery" % (reference, docker_host)
        )
    except EngineAPIError as exc:  # a DOCKER_HOST it cannot use, or the daemon refused
        module.fail_json(msg="cannot inspect image %s on %s: %s" % (reference, docker_host, exc))
    image_id = attrs.get("Id")
    try:
        path = os.path.join(cache_dir, cache_file_name(image_id))
    except ImageFactsError as exc:
        module.fail_json(msg="image %s: the daemon reported an unusable ID: %s" % (reference, exc))
    dists = cached_distributions(load_cache(path), image_id, requested)
    if dists is not None:
        return build_facts(reference, attrs, dists, True)
    try:
        dists = read_versions(client, image_id, requested, timeout)
    except NoPythonError as exc:
        module.fail_json(
            msg="image %s (%s) has no usable python3 or python to read distribution versions with (%s); "
            "use an engine image with Python in its PATH, then rerun discovery" % (reference, image_id, exc)
        )
    except ImageFactsError as exc:
        module.fail_json(
            msg="reading distribution versions from image %s (%s) failed: %s; check that the image starts "
            "with 'docker run --rm --network none --entrypoint python3 %s -c \"import importlib.metadata\"' "
            "on this host, then rerun discovery" % (reference, image_id, exc, reference)
        )
    except EngineAPIError as exc:
        module.fail_json(
            msg="running a version container of image %s (%s) on %s failed: %s; check the Docker daemon's "
            "log ('journalctl -u docker'), then rerun discovery" % (reference, image_id, docker_host, exc)
        )
    if not module.check_mode:
        try:
            write_cache(module, cache_dir, path, cache_document(image_id, requested, dists))
        except OSError as exc:
            module.warn("could not write the image facts cache %s: %s" % (path, exc))
    return build_facts(reference, attrs, dists, False)
