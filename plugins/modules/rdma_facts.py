#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_facts
short_description: Inventory the RDMA HCAs of an engine host, their ports and the verbs device nodes
version_added: 0.1.0
description:
  - Public API for an operator's own playbooks (for example a RDMA inventory or check). It is the same read, with
    the same code and refusals, as M(narwhal.deploy.engine_host_facts), which reads all five in one module run.
  - Reads C(class/infiniband) below O(sysfs_root) (HCA type, firmware, board id, ports with state, physical
    state, link layer, rate and netdev), C(class/infiniband/<hca>/device) for the NUMA node, PCI bus id and
    PCIe path (where that link resolves below C(devices/)), and C(class/infiniband_verbs/uverbs*/ibdev) for the
    verbs device of each HCA.
  - When C(class/infiniband) does not exist, falls back to C(ibstat), then C(ibv_devinfo); a host with none
    of them reports no HCAs, which is not an error. Their output must list each HCA once, each with its ports
    (numbered from 1, each once, as many as the HCA states); anything else fails the module naming the tool and
    the host, never a smaller inventory.
  - Device nodes (C(/dev/infiniband/uverbs*), C(/dev/infiniband/rdma_cm)) are those that exist below
    O(dev_root).
  - Read-only; never reports a change.
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
- name: Inventory the HCAs
  narwhal.deploy.rdma_facts:

- name: Read a simulated host's sysfs tree
  narwhal.deploy.rdma_facts:
    sysfs_root: /opt/narwhal-sim/profiles/nvidia-8gpu-rdma/sys

- name: Active InfiniBand HCA ports as UCX_NET_DEVICES entries
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.narwhal_rdma.hcas
         | selectattr('ports.0.active') | map(attribute='name') | map('regex_replace', '$', ':1') | list }}
"""

RETURN = r"""
ansible_facts:
  description: Facts about the RDMA devices of the host.
  returned: always
  type: dict
  contains:
    narwhal_rdma:
      description: RDMA inventory.
      returned: always
      type: dict
      contains:
        hcas:
          description:
            - One entry per HCA (natural name order) with C(name), C(hca_type), C(fw_ver), C(board_id),
              C(numa_node) (int or null), C(pci_bus_id) (or null), C(pci_path) (or null), C(uverbs)
              (C(/dev/infiniband/uverbsN) or null) and C(ports).
            - C(pci_path) is the PCIe hierarchy above the HCA as sysfs nests it below C(devices/) -- its root bus
              (C(pciDDDD:BB)), then every bridge (root port, switch ports) down to its parent; null without a
              C(device) link that resolves into C(devices/), and always null from C(ibstat) / C(ibv_devinfo).
              It is compared with the GPUs' C(pci_path) (M(narwhal.deploy.gpu_facts)) to find each GPU's
              nearest port.
            - Each port has C(port) (int), C(state) (for example C(ACTIVE)), C(phys_state) (for example
              C(LinkUp)), C(link_layer) (C(InfiniBand) or C(Ethernet)), C(rate), C(rate_bits_s), C(netdev) (or
              null) and C(active) (bool).
            - C(rate) is the port's data rate as the kernel writes it (C(ports/<n>/rate), active width times active
              speed, for example C(200 Gb/sec (4X HDR)); from C(ibstat) its number of Gb/s). C(rate_bits_s) is that
              rate in bits per second (int), null when C(rate) is not in that form (C(ibv_devinfo) prints one lane's
              speed, not the port's). The transfer probe compares the KV rate it measures with it.
          type: list
          elements: dict
          returned: always
          sample:
            - name: mlx5_0
              hca_type: MT4129
              fw_ver: 28.41.1000
              board_id: MT_0000000838
              numa_node: 0
              pci_bus_id: "0000:1a:00.0"
              pci_path: ["pci0000:00", "0000:00:01.0", "0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:13:01.0"]
              uverbs: /dev/infiniband/uverbs0
              ports:
                - port: 1
                  state: ACTIVE
                  phys_state: LinkUp
                  link_layer: InfiniBand
                  rate: 400 Gb/sec (4X NDR)
                  rate_bits_s: 400000000000
                  netdev: null
                  active: true
        rdma_cm:
          description: C(/dev/infiniband/rdma_cm) when it exists, else null.
          type: str
          returned: always
          sample: /dev/infiniband/rdma_cm
        devices:
          description: Every existing C(/dev/infiniband/uverbs*) plus C(rdma_cm).
          type: list
          elements: str
          returned: always
          sample: [/dev/infiniband/uverbs0, /dev/infiniband/rdma_cm]
        source:
          description: Where the HCA list came from (the sysfs directory or the command), null when there is none.
          type: str
          returned: always
          sample: /sys/class/infiniband
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import COMMAND_TIMEOUT_SPEC, HOST_ROOTS_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.rdma_reader import read_rdma


def main():
    module = AnsibleModule(
        argument_spec=dict(**HOST_ROOTS_SPEC, **COMMAND_TIMEOUT_SPEC),
        supports_check_mode=True,
    )
    facts = read_rdma(module, module.params["sysfs_root"], module.params["dev_root"], module.params["command_timeout"])
    module.exit_json(changed=False, ansible_facts={"narwhal_rdma": facts})


if __name__ == "__main__":
    main()
