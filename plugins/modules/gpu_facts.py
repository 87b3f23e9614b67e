#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Inventory the GPUs of an engine host and the device nodes they need
version_added: 0.1.0
description:
  - Public API for an operator's own playbooks (for example a GPU inventory or check). It is the same read, with
    the same code and refusals, as M(narwhal.deploy.engine_host_facts), which reads all five in one module run.
  - NVIDIA hosts are read with C(nvidia-smi -q -x).
  - AMD hosts are read with C(amd-smi static --json) when C(amd-smi) exists, else with
    C(rocm-smi --showproductname --showbus --showuniqueid --json). The render and card nodes of each AMD GPU
    come from the KFD topology (C(class/kfd/kfd/topology/nodes/*/properties)) and the DRM class
    (C(class/drm/renderD*/device), C(class/drm/card*/device)) below O(sysfs_root).
  - A host without any of these tools reports vendor C(none) and no GPUs; that is not an error.
  - A tool that exists but fails, or prints output that cannot be read, fails the module with the command,
    the cause on the host and the fix. So does output that describes no real host (an impossible inventory), such
    as the same GPU index, PCI bus id, minor number or KFD node twice (rocm-smi C(card0) and C(card00)), a negative
    or non-integer index, a memory size, bus id or number that is printed but is not one, more GPUs than
    C(attached_gpus). The inventory is never made smaller or empty instead.
  - An AMD GPU without a render node (neither the KFD topology nor the DRM class maps its PCI bus id) fails the
    module, naming the GPU, because a container given it would see fewer GPUs than the engine's tensor parallel
    size.
  - GPUs are identified by their host index. They are never merged by UUID (sanitised or masked captures
    carry equal UUIDs).
  - Each GPU's NUMA node and PCIe path are read below O(sysfs_root) too. Of the device nodes only NVIDIA's
    vendor-wide ones (RV(ansible_facts.narwhal_gpus.devices)) are looked up below O(dev_root).
  - Read-only; never reports a change.
requirements:
  - C(nvidia-smi), C(amd-smi) or C(rocm-smi) on the engine host for a GPU host
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.host_roots
  - narwhal.deploy.command_timeout
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Inventory the GPUs
  narwhal.deploy.gpu_facts:

- name: Read a simulated host's sysfs tree
  narwhal.deploy.gpu_facts:
    sysfs_root: /opt/narwhal-sim/profiles/amd-4gpu-rdma/sys

- name: Show the device paths of GPU 0
  ansible.builtin.debug:
    msg: "{{ ansible_facts.narwhal_gpus.gpus[0].devices + ansible_facts.narwhal_gpus.devices }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the GPUs of the host.
  returned: always
  type: dict
  contains:
    narwhal_gpus:
      description: GPU inventory.
      returned: always
      type: dict
      contains:
        vendor:
          description: C(nvidia), C(amd) or C(none).
          type: str
          returned: always
          sample: nvidia
        gpus:
          description:
            - One entry per GPU, in host index order, with C(index) (int), C(uuid) (str or null; C(GPU-...) on
              NVIDIA, the AMD C(Unique ID) as printed), C(name), C(pci_bus_id) (C(dddd:bb:dd.f), lower case),
              C(pci_path), C(devices) (device paths this GPU needs), C(numa_node) (int or null), C(memory_mib)
              (int or null).
            - C(pci_path) is the PCIe hierarchy above the GPU as sysfs nests it below C(devices/) -- its root bus
              (C(pciDDDD:BB)), then every bridge (root port, switch ports) down to its parent, for example
              C([pci0000:00, 0000:00:01.0, 0000:10:00.0]); null when O(sysfs_root) does not place the GPU (no
              C(bus/pci/devices/<bdf>) link into C(devices/)). Discovery pairs each GPU with the RDMA port
              behind the deepest PCIe switch it shares (M(narwhal.deploy.rdma_facts) returns the same key).
            - NVIDIA entries also carry C(minor_number); GPUs in MIG mode carry C(mig_devices) (list of
              C(index), C(gpu_instance_id), C(compute_instance_id), C(uuid), C(memory_mib)).
            - AMD entries also carry C(device_source) (C(kfd-topology), C(drm-class) or both).
          type: list
          elements: dict
          returned: always
          sample:
            - index: 0
              uuid: GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e
              name: Tesla V100S-PCIE-32GB
              pci_bus_id: "0000:00:0d.0"
              pci_path: ["pci0000:00", "0000:00:01.0", "0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"]
              devices: [/dev/nvidia0]
              numa_node: 0
              memory_mib: 32510
              minor_number: 0
        devices:
          description:
            - Vendor-wide device paths. NVIDIA C(/dev/nvidiactl), C(/dev/nvidia-uvm), C(/dev/nvidia-uvm-tools)
              (those that exist below O(dev_root)); AMD C(/dev/kfd).
          type: list
          elements: str
          returned: always
          sample: [/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
        driver_version:
          description: Driver version the tool reports, null when unknown.
          type: str
          returned: always
          sample: 460.73.01
        source:
          description: The command that produced the inventory, null for vendor C(none).
          type: str
          returned: always
          sample: nvidia-smi -q -x
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import COMMAND_TIMEOUT_SPEC, HOST_ROOTS_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import read_gpus


def main():
    module = AnsibleModule(
        argument_spec=dict(**HOST_ROOTS_SPEC, **COMMAND_TIMEOUT_SPEC),
        supports_check_mode=True,
    )
    facts = read_gpus(module, module.params["sysfs_root"], module.params["dev_root"], module.params["command_timeout"])
    module.exit_json(changed=False, ansible_facts={"narwhal_gpus": facts})


if __name__ == "__main__":
    main()
