# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host-side reader of image_facts (Docker daemon, version container, cache file), shared by
image_facts and engine_host_facts. The pure helpers stay in _image.

read_image() takes the running AnsibleModule and a client factory; on an error it calls module.fail_json.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.narwhal.deploy.plugins.module_utils._image import (
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

DOCKER_IMPORT_ERROR = None
try:
    import docker
    from docker.errors import APIError, DockerException, ImageNotFound, NotFound
except ImportError:
    HAS_DOCKER = False
    DOCKER_IMPORT_ERROR = traceback.format_exc()

    class DockerException(Exception):  # noqa: N818 - the SDK's name
        pass

    class APIError(DockerException):
        pass

    class NotFound(APIError):  # noqa: N818 - the SDK's name
        pass

    class ImageNotFound(NotFound):
        pass
else:
    HAS_DOCKER = True

PYTHONS = ("python3", "python")
CONTAINER_LABEL = "org.narwhal.deploy.image-facts"


class NoPythonError(Exception):
    pass


def make_client(docker_host, timeout):
    """The Docker client (tests replace this)."""
    return docker.DockerClient(base_url=docker_host, timeout=timeout)


def _remove(container):
    try:
        container.remove(force=True)
    except Exception:  # noqa: BLE001 - cleanup must not hide the real error
        pass


def _missing_executable(text):
    text = str(text).lower()
    return "executable file not found" in text or "no such file or directory" in text


def run_version_container(client, image_id, python, names, timeout):
    """Run VERSION_SCRIPT with `python` in a throw-away container; return its stdout."""
    container = client.containers.create(
        image_id,
        entrypoint=[python, "-c", VERSION_SCRIPT],
        command=list(names),
        network_mode="none",
        labels={CONTAINER_LABEL: "version-probe"},
        environment={"PYTHONDONTWRITEBYTECODE": "1"},
    )
    try:
        try:
            container.start()
        except APIError as exc:
            if _missing_executable(exc):
                raise NoPythonError(str(exc))
            raise
        try:
            result = container.wait(timeout=timeout)
        except Exception as exc:  # requests ReadTimeout / ConnectionError, whatever the SDK version
            try:
                container.kill()
            except Exception:  # noqa: BLE001
                pass
            raise ImageFactsError("version container did not finish within %ss (%s)" % (timeout, exc))
        status = result.get("StatusCode") if isinstance(result, dict) else result
        stdout = container.logs(stdout=True, stderr=False)
        if status != 0:
            stderr = container.logs(stdout=False, stderr=True)
            if isinstance(stderr, bytes):
                stderr = stderr.decode("utf-8", "replace")
            if status in (126, 127) or _missing_executable(stderr):
                raise NoPythonError("exit %s: %s" % (status, stderr[-300:]))
            raise ImageFactsError("version container exited with %s: %s" % (status, stderr[-500:].strip()))
        return stdout
    finally:
        _remove(container)


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


def fail_without_docker(module, reference, has_docker=None, import_error=None):
    """fail_json when the Docker SDK is missing (has_docker defaults to this file's guarded import)."""
    if not (HAS_DOCKER if has_docker is None else has_docker):
        module.fail_json(
            msg=missing_required_lib("docker", reason="to inspect image %s" % reference)
            + " On Debian/Ubuntu engine hosts: apt-get install python3-docker.",
            exception=import_error or DOCKER_IMPORT_ERROR,
        )


def read_image(module, reference, distributions, cache_dir, docker_host, timeout, client_factory=None):
    """narwhal_image: inspect `reference`, read the versions of `distributions` (cached by image ID in
    cache_dir: a hit starts no container)."""
    requested = normalize_requested(distributions)
    try:
        client = (client_factory or make_client)(docker_host, timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means the daemon is not usable
        module.fail_json(
            msg="cannot inspect image %s: the Docker daemon at %s is not answering (%s); start it "
            "('systemctl start docker') and make sure the connecting user may use its socket (group docker), "
            "then rerun discovery" % (reference, docker_host, exc)
        )
    try:
        image = client.images.get(reference)
    except (ImageNotFound, NotFound):
        module.fail_json(
            msg="image %s is not present on this host's Docker daemon (%s); load or pull it there, "
            "then rerun discovery" % (reference, docker_host)
        )
    except DockerException as exc:
        module.fail_json(msg="cannot inspect image %s on %s: %s" % (reference, docker_host, exc))
    attrs = image.attrs
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
    except DockerException as exc:
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
