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
  - NVIDIA hosts are read with C(nvidia-smi -q -x).
  - AMD hosts are read with C(amd-smi static --json) when C(amd-smi) exists, else with
    C(rocm-smi --showproductname --showbus --showuniqueid --json). The render and card nodes of each AMD GPU
    come from the KFD topology (C(class/kfd/kfd/topology/nodes/*/properties)) and the DRM class
    (C(class/drm/renderD*/device), C(class/drm/card*/device)) below O(sysfs_root).
  - A host without any of these tools reports vendor C(none) and no GPUs; that is not an error.
  - A tool that exists but fails, or prints output that cannot be read, fails the module with the command,
    the cause on the host and the fix.
  - GPUs are identified by their host index. They are never merged by UUID (sanitised or masked captures
    carry equal UUIDs).
  - Read-only; never reports a change.
options:
  sysfs_root:
    description:
      - Root of the sysfs tree to read (PCI NUMA nodes, KFD topology, DRM class).
      - Tests and simulated hosts point it at a prepared tree.
    type: path
    default: /sys
  dev_root:
    description:
      - Directory in which the vendor-wide device nodes are looked up.
      - Paths are always reported with their C(/dev/...) names.
    type: path
    default: /dev
attributes:
  check_mode:
    description: Can run in check mode and return the same result.
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
  - C(nvidia-smi), C(amd-smi) or C(rocm-smi) on the engine host for a GPU host
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
              C(devices) (device paths this GPU needs), C(numa_node) (int or null), C(memory_mib) (int or null).
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

from ansible_collections.narwhal.deploy.plugins.module_utils._gpu import (
    GpuParseError,
    amd_facts,
    empty_facts,
    nvidia_facts,
    parse_amd_smi_static_json,
    parse_nvidia_smi_xml,
    parse_rocm_smi_json,
)

ROCM_DIRS = ["/opt/rocm/bin"]
ROCM_SMI_ARGS = ["--showproductname", "--showbus", "--showuniqueid", "--json"]

FIX = {
    "nvidia-smi": "check that the NVIDIA kernel driver is loaded and matches the user-space tools "
    "('lsmod | grep nvidia', 'dmesg | grep -i nvrm'); reinstall or reload the driver, then rerun discovery",
    "amd-smi": "check that the amdgpu driver is loaded ('lsmod | grep amdgpu') and that the connecting user may open "
    "/dev/kfd and /dev/dri/renderD* (groups video and render); then rerun discovery",
    "rocm-smi": "check that the amdgpu driver is loaded ('lsmod | grep amdgpu') and that the connecting user may open "
    "/dev/kfd and /dev/dri/renderD* (groups video and render); then rerun discovery",
}


def run_tool(module, tool, argv, parser):
    command = " ".join([tool] + argv[1:])
    rc, out, err = module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C"})
    if rc != 0:
        cause = (err or out or "").strip().splitlines()
        module.fail_json(
            msg=f"'{command}' failed on this host (rc={rc}): {cause[0] if cause else 'no output'}; {FIX[tool]}",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    try:
        return command, parser(out)
    except GpuParseError as exc:
        module.fail_json(
            msg=f"'{command}' ran on this host but its output cannot be read: {exc}; run '{command}' by hand on "
            f"the host: a wrapper, a mismatched tool version or a broken driver prints something else; {FIX[tool]}",
            stdout=out,
            stderr=err,
        )
    return None, None  # not reached


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            dev_root=dict(type="path", default="/dev"),
        ),
        supports_check_mode=True,
    )
    sysfs_root = module.params["sysfs_root"]
    dev_root = module.params["dev_root"]

    nvidia_smi = module.get_bin_path("nvidia-smi")
    if nvidia_smi:
        source, parsed = run_tool(module, "nvidia-smi", [nvidia_smi, "-q", "-x"], parse_nvidia_smi_xml)
        facts = nvidia_facts(parsed, sysfs_root, dev_root, source)
    else:
        amd_smi = module.get_bin_path("amd-smi", opt_dirs=ROCM_DIRS)
        rocm_smi = None if amd_smi else module.get_bin_path("rocm-smi", opt_dirs=ROCM_DIRS)
        if amd_smi:
            source, parsed = run_tool(module, "amd-smi", [amd_smi, "static", "--json"], parse_amd_smi_static_json)
        elif rocm_smi:
            source, parsed = run_tool(module, "rocm-smi", [rocm_smi] + ROCM_SMI_ARGS, parse_rocm_smi_json)
        else:
            source, parsed = None, None
        if parsed is None:
            facts = empty_facts()
        else:
            facts = amd_facts(parsed, sysfs_root, source)
            for gpu in facts["gpus"]:
                if not any(path.startswith("/dev/dri/renderD") for path in gpu["devices"]):
                    module.warn(
                        f"AMD GPU {gpu['index']} ({gpu['pci_bus_id']}) has no render node: neither the KFD "
                        f"topology nor the DRM class below {sysfs_root} maps its PCI bus id; a container for it "
                        "would get no GPU"
                    )
    module.exit_json(changed=False, ansible_facts={"narwhal_gpus": facts})


if __name__ == "__main__":
    main()
