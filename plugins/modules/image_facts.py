#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_facts
short_description: Inspect an engine image on the host's Docker daemon and report its installed distributions
version_added: 0.1.0
description:
  - Inspects O(image) through the Docker daemon at O(docker_host) (image ID, tags, digests, entrypoint, env,
    labels).
  - Reads the versions of O(distributions) by running a short-lived container of that image with the entry point
    replaced by C(python3 -c <script>) (falling back to C(python)), without network, which prints
    the C(importlib.metadata) version of each requested distribution. The container is always removed.
  - The answer is cached per image ID in O(cache_dir). A rerun for the same image ID and the same set of requested
    distributions returns the cached versions and starts no container.
  - Only runtime-environment keys of the image's C(Env) are returned (exact C(PATH), C(LD_LIBRARY_PATH),
    C(LD_PRELOAD), C(LIBRARY_PATH), C(CPATH); prefixes C(ROCM_), C(HIP_), C(HSA_), C(HCC_), C(AMD_), C(MIOPEN_),
    C(RCCL_), C(CUDA_), C(CUDNN_), C(NV_), C(NVIDIA_), C(NCCL_), C(UCX_), C(NIXL_), C(VLLM_), C(TORCH_),
    C(PYTORCH_), C(PYTHON)). Names that look like secrets (C(TOKEN), C(SECRET), C(PASSW), C(API_KEY), C(*_KEY),
    C(CREDENTIAL), C(AUTH), C(PRIVATE)) are never returned, and the full env is not returned at all.
  - Read-only towards the image and the daemon; never reports a change.
options:
  image:
    description:
      - Image reference (C(repo:tag), C(repo@sha256:...)) or image ID, as known to the daemon of this host.
    type: str
    required: true
  distributions:
    description:
      - Python distribution names whose versions are read from the image. Missing ones are left out of the result.
    type: list
    elements: str
    default: [vllm, nixl, nixl-cu12, nixl-cu13, nixl-rocm, rixl, torch, ucx-py, ucx-py-cu12, ucxx, triton,
      pytorch-triton-rocm, flashinfer-python, transformers]
  cache_dir:
    description:
      - Directory holding one C(<image id hex>.json) file (mode C(0600)) per inspected image.
      - Created outside check mode when missing. In check mode the cache is read but never written.
    type: path
    default: /var/cache/narwhal/image-facts
  docker_host:
    description:
      - Docker daemon URL.
    type: str
    default: unix:///var/run/docker.sock
  timeout:
    description:
      - Seconds to wait for the Docker API and for the version container to finish.
      - A container still running then is killed and removed.
    type: int
    default: 120
attributes:
  check_mode:
    description: Can run in check mode; inspects and may run the version container, but writes no cache file.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
  facts:
    description: Returns its results as facts.
    support: full
  idempotent:
    description: A second run with the same inputs changes nothing.
    support: full
requirements:
  - Docker SDK for Python (C(docker), Debian C(python3-docker) 5.0.3 or later) on the engine host
  - A Docker daemon on the engine host on which O(image) is present
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Inspect the engine image
  narwhal.deploy.image_facts:
    image: vllm/vllm-openai:v0.33.0

- name: Also read the version of an extra distribution
  narwhal.deploy.image_facts:
    image: registry.example.com/engines/vllm-rocm:2026.1
    distributions: [vllm, nixl, nixl-rocm, rixl, torch, amdsmi]
    cache_dir: /var/cache/narwhal/image-facts

- name: Show the platform and the NIXL distribution
  ansible.builtin.debug:
    msg: "{{ ansible_facts.narwhal_image.platform }} / {{ ansible_facts.narwhal_image.nixl_distribution }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the image.
  returned: always
  type: dict
  contains:
    narwhal_image:
      description: The inspected image.
      returned: always
      type: dict
      contains:
        image:
          description: The reference asked for (O(image)).
          type: str
          returned: always
          sample: narwhal-sim/engine-standin:latest
        id:
          description: Full image ID.
          type: str
          returned: always
          sample: sha256:6a0bf322ed5f1c2a7e3f05f9c5d1c0e8b6e0f1a2b3c4d5e6f708192a3b4c5d6e
        repo_tags:
          description: Tags of the image on this host.
          type: list
          elements: str
          returned: always
          sample: [narwhal-sim/engine-standin:latest]
        repo_digests:
          description: Repository digests of the image on this host (empty for locally built or loaded images).
          type: list
          elements: str
          returned: always
          sample: [vllm/vllm-openai@sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0]
        architecture:
          description: Image architecture.
          type: str
          returned: always
          sample: amd64
        os:
          description: Image operating system.
          type: str
          returned: always
          sample: linux
        entrypoint:
          description: Configured entry point, null when none.
          type: list
          elements: str
          returned: always
          sample: [vllm, serve]
        cmd:
          description: Configured command, null when none.
          type: list
          elements: str
          returned: always
          sample: null
        env:
          description: Runtime-environment keys of the image's C(Env) (see the description for the filter).
          type: dict
          returned: always
          sample: {CUDA_VERSION: 12.9.1, PATH: /usr/local/bin:/usr/bin:/bin, UCX_HOME: /usr/local/ucx}
        labels:
          description: Image labels.
          type: dict
          returned: always
          sample: {org.opencontainers.image.version: 0.33.0}
        distributions:
          description: Installed distributions among O(distributions), name to version.
          type: dict
          returned: always
          sample: {vllm: 0.33.0, nixl: 1.5.1, nixl-cu12: 1.5.1}
        platform:
          description:
            - C(cpu) when the vllm version contains C(cpu); C(rocm) with a C(rocm) vllm or C(+rocm) torch version,
              a ROCm env (C(ROCM_PATH), C(HIP_*), ...) or C(nixl-rocm) (or C(rixl) without CUDA evidence);
              C(cuda) with a C(+cu) version, C(CUDA_VERSION) or C(NVIDIA_*) env, or C(nixl-cu12)/C(nixl-cu13);
              C(cpu) with a C(+cpu) torch; otherwise C(unknown).
          type: str
          returned: always
          sample: cuda
        nixl_distribution:
          description:
            - The NIXL distribution present, null when none. On C(rocm) the first of C(nixl-rocm), C(rixl), C(nixl),
              C(nixl-cu13), C(nixl-cu12); otherwise the first of C(nixl), C(nixl-cu13), C(nixl-cu12).
          type: str
          returned: always
          sample: nixl
        cached:
          description: True when the versions came from the cache and no container was started.
          type: bool
          returned: always
          sample: false
"""

import json
import os
import tempfile
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.narwhal.deploy.plugins.module_utils._image import (
    DEFAULT_DISTRIBUTIONS,
    VERSION_SCRIPT,
    ImageFactsError,
    build_facts,
    cache_document,
    cache_file_name,
    cached_distributions,
    normalize_requested,
    parse_script_output,
)

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
    except (OSError, ValueError):
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            distributions=dict(type="list", elements="str", default=list(DEFAULT_DISTRIBUTIONS)),
            cache_dir=dict(type="path", default="/var/cache/narwhal/image-facts"),
            docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
            timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    reference = module.params["image"]
    requested = normalize_requested(module.params["distributions"])
    cache_dir = module.params["cache_dir"]
    docker_host = module.params["docker_host"]
    timeout = module.params["timeout"]

    if not HAS_DOCKER:
        module.fail_json(
            msg=missing_required_lib("docker", reason="to inspect image %s" % reference)
            + " On Debian/Ubuntu engine hosts: apt-get install python3-docker.",
            exception=DOCKER_IMPORT_ERROR,
        )

    try:
        client = make_client(docker_host, timeout)
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
        module.exit_json(changed=False, ansible_facts={"narwhal_image": build_facts(reference, attrs, dists, True)})

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

    module.exit_json(changed=False, ansible_facts={"narwhal_image": build_facts(reference, attrs, dists, False)})


if __name__ == "__main__":
    main()
