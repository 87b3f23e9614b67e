#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_host_facts
short_description: Read everything discovery needs from an engine host in one module execution
version_added: 0.1.0
description:
  - Runs the readers of M(narwhal.deploy.interface_facts), M(narwhal.deploy.gpu_facts),
    M(narwhal.deploy.rdma_facts), M(narwhal.deploy.image_facts) and M(narwhal.deploy.model_facts) in this
    order in one process, so discovery costs one round trip per host instead of five. Each fact, each error
    message and the image cache are exactly those of the single module.
  - The first reader that fails fails the module with that reader's message.
  - O(sysfs_root) and O(dev_root) are those of the GPU and RDMA readers, O(net_sysfs_root) the
    O(narwhal.deploy.interface_facts#module:sysfs_root) of the interface's speed; O(docker_host), O(cache_dir) and
    O(timeout) those of the image reader; O(command_timeout) is the deadline of each host tool of the interface,
    GPU and RDMA readers.
  - Needs the privileges of the most demanding reader (the Docker socket for the image, the checkpoint
    directory for the model), so discovery runs it with C(become).
  - Read-only towards the host; only the image facts cache (O(cache_dir)) is written on a cache miss.
options:
  interface:
    description: Fabric interface name (O(narwhal.deploy.interface_facts#module:name)).
    type: str
    required: true
  family:
    description: Address family of the interface's global addresses (O(narwhal.deploy.interface_facts#module:family)).
    type: str
    choices: [any, ipv4, ipv6]
    default: any
  image:
    description: Engine image reference or ID (O(narwhal.deploy.image_facts#module:image)).
    type: str
    required: true
  distributions:
    description:
      - Python distributions whose versions are read from the image. The default is what discovery records for
        every engine image (the inspection extracts; the image cache is keyed by the requested set).
    type: list
    elements: str
    default: [vllm, nixl, nixl-cu12, nixl-cu13, nixl-rocm, rixl, torch, transformers]
  extra_distributions:
    description:
      - Further distributions read as well, after O(distributions) (discovery passes C(NARWHAL_EXPECTED_PACKAGES)).
    type: list
    elements: str
    default: []
  model_path:
    description: The checkpoint directory (O(narwhal.deploy.model_facts#module:path)).
    type: path
    required: true
  net_sysfs_root:
    description:
      - Root of the sysfs tree the fabric interface's speed is read from
        (O(narwhal.deploy.interface_facts#module:sysfs_root)). Apart from O(sysfs_root) because the interface is the
        kernel's own, read with C(ip), while O(sysfs_root) may be a simulated hardware tree (the proving ground's
        profiles, whose interfaces are real veths).
    type: path
    default: /sys
attributes:
  check_mode:
    description: Can run in check mode; the image facts cache is read but never written.
requirements:
  - iproute2 (C(ip)) with JSON output and a Docker daemon on the engine host (asked over its Engine API with the
    Python standard library; the Docker SDK for Python is not needed)
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.host_roots
  - narwhal.deploy.docker_access
  - narwhal.deploy.image_read
  - narwhal.deploy.command_timeout
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the engine host
  narwhal.deploy.engine_host_facts:
    interface: eth1
    image: vllm/vllm-openai:v0.33.0
    model_path: /srv/models/Llama-3.1-8B-Instruct
  become: true

- name: Show the GPUs and the vLLM version
  ansible.builtin.debug:
    msg: "{{ ansible_facts.narwhal_gpus.gpus | length }} GPUs, vllm {{ ansible_facts.narwhal_image.distributions.vllm }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts of the five single modules.
  returned: always
  type: dict
  contains:
    narwhal_interface:
      description: As returned by M(narwhal.deploy.interface_facts).
      returned: always
      type: dict
      sample: {name: eth1, global_addresses: [172.31.201.11]}
    narwhal_gpus:
      description: As returned by M(narwhal.deploy.gpu_facts).
      returned: always
      type: dict
      sample: {vendor: nvidia, gpus: []}
    narwhal_rdma:
      description: As returned by M(narwhal.deploy.rdma_facts).
      returned: always
      type: dict
      sample: {hcas: []}
    narwhal_image:
      description: As returned by M(narwhal.deploy.image_facts).
      returned: always
      type: dict
      sample: {id: "sha256:6a0b...", cached: true}
    narwhal_model:
      description: As returned by M(narwhal.deploy.model_facts) (with C(manifest) when the checkpoint holds the deliver stage's).
      returned: always
      type: dict
      sample: {path: /srv/models/tiny-llama, dtype: bfloat16}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import (
    COMMAND_TIMEOUT_SPEC,
    DOCKER_ACCESS_SPEC,
    HOST_ROOTS_SPEC,
    IMAGE_READ_SPEC,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_model
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.daemon import make_client, read_image
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import read_gpus
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.image import DISCOVERY_DISTRIBUTIONS
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.interface_reader import read_interface
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.rdma_reader import read_rdma


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interface=dict(type="str", required=True),
            family=dict(type="str", default="any", choices=["any", "ipv4", "ipv6"]),
            **HOST_ROOTS_SPEC,
            image=dict(type="str", required=True),
            distributions=dict(type="list", elements="str", default=list(DISCOVERY_DISTRIBUTIONS)),
            extra_distributions=dict(type="list", elements="str", default=[]),
            **IMAGE_READ_SPEC,
            **DOCKER_ACCESS_SPEC,
            **COMMAND_TIMEOUT_SPEC,
            model_path=dict(type="path", required=True),
            net_sysfs_root=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = {
        "narwhal_interface": read_interface(module, p["interface"], p["family"], p["command_timeout"],
                                            p["net_sysfs_root"]),
        "narwhal_gpus": read_gpus(module, p["sysfs_root"], p["dev_root"], p["command_timeout"]),
        "narwhal_rdma": read_rdma(module, p["sysfs_root"], p["dev_root"], p["command_timeout"]),
    }
    facts["narwhal_image"] = read_image(module, p["image"], p["distributions"] + p["extra_distributions"],
                                        p["cache_dir"], p["docker_host"],
                                        p["timeout"], client_factory=make_client)
    facts["narwhal_model"] = read_model(module, p["model_path"])
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
