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
  - Public API for an operator's own playbooks (for example a engine image inventory or check). It is the same read, with
    the same code and refusals, as M(narwhal.deploy.engine_host_facts), which reads all five in one module run.
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
    C(KEY), C(CREDENTIAL), C(AUTH), C(PRIVATE)) are never returned with their value, and the full env is not
    returned at all; their names are listed in RV(ansible_facts.narwhal_image.withheld_env) so the operator
    knows the image carries a credential.
  - The values of secret-looking flags (C(--api-key), C(--hf-token), C(--*-password) ...) in the image's
    C(Entrypoint) and C(Cmd), and of secret-looking labels, are returned as C(<redacted>).
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
    default: [vllm, nixl, nixl-cu12, nixl-cu13, nixl-rocm, rixl, torch, transformers, ucx-py, ucx-py-cu12, ucxx,
      triton, pytorch-triton-rocm, flashinfer-python]
attributes:
  check_mode:
    description: Can run in check mode; inspects and may run the version container, but writes no cache file.
requirements:
  - A Docker daemon on the engine host on which O(image) is present (asked over its Engine API with the Python
    standard library; the Docker SDK for Python is not needed)
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.docker_access
  - narwhal.deploy.image_read
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
          description: Configured entry point, null when none (values of secret-looking flags C(<redacted>)).
          type: list
          elements: str
          returned: always
          sample: [vllm, serve]
        cmd:
          description: Configured command, null when none (values of secret-looking flags C(<redacted>)).
          type: list
          elements: str
          returned: always
          sample: null
        env:
          description: Runtime-environment keys of the image's C(Env) (see the description for the filter).
          type: dict
          returned: always
          sample: {CUDA_VERSION: 12.9.1, PATH: /usr/local/bin:/usr/bin:/bin, UCX_HOME: /usr/local/ucx}
        withheld_env:
          description:
            - Names of the image's C(Env) entries that look like secrets (for example C(HF_TOKEN)). Their values
              are never returned, cached, recorded in the inspection extracts or the launch records.
          type: list
          elements: str
          returned: always
          sample: [HF_TOKEN]
        labels:
          description: Image labels (values of secret-looking labels C(<redacted>)).
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DOCKER_ACCESS_SPEC, IMAGE_READ_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.daemon import make_client, read_image
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.image import DEFAULT_DISTRIBUTIONS


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            distributions=dict(type="list", elements="str", default=list(DEFAULT_DISTRIBUTIONS)),
            **IMAGE_READ_SPEC,
            **DOCKER_ACCESS_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = read_image(module, p["image"], p["distributions"], p["cache_dir"], p["docker_host"], p["timeout"],
                       client_factory=make_client)
    module.exit_json(changed=False, ansible_facts={"narwhal_image": facts})


if __name__ == "__main__":
    main()
