#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: interface_facts
short_description: Read the global addresses of an engine host's fabric interface
version_added: 0.1.0
description:
  - Public API for an operator's own playbooks (for example a fabric interface inventory or check). It is the same read, with
    the same code and refusals, as M(narwhal.deploy.engine_host_facts), which reads all five in one module run.
  - Reads the interfaces with C(ip -j addr show) and returns the addresses of the named one, each classified as
    usable or not.
  - Usable addresses are global-scope unicast addresses only; loopback, link-local (also when labelled scope
    global), tentative, dadfailed, deprecated (preferred lifetime 0) and temporary (privacy) addresses are never
    usable.
  - Fails, naming the interface and the host, when the interface cannot carry traffic, that is when it is
    administratively down (no C(UP) flag), up without carrier (flag C(NO-CARRIER)) or in an operstate other than C(UP) and C(UNKNOWN)
    (C(DOWN), C(LOWERLAYERDOWN), C(NOTPRESENT), C(TESTING), C(DORMANT)). C(UNKNOWN) is what drivers without carrier
    reporting (loopback, tun, wireguard) show, and is usable.
  - Reads the interface's nominal speed from C(class/net/<name>/speed) below O(sysfs_root) (Mb/s, as its driver
    reports it; the kernel's own tree, as C(ip) reads the kernel's interfaces). A speed the driver does not know
    (C(-1)) or a file that cannot be read gives no speed and says why, and an interface the kernel lists under
    C(devices/virtual) (a veth, bond, VLAN or bridge) is marked virtual.
    The transfer probe compares the KV rate it measures with it (M(narwhal.deploy.transfer_probe)).
  - Read-only; never reports a change.
options:
  name:
    description: Interface name, for example the value of C(NARWHAL_FABRIC_INTERFACE).
    type: str
    required: true
  family:
    description: Address family of RV(ansible_facts.narwhal_interface.global_addresses).
    type: str
    choices: [any, ipv4, ipv6]
    default: any
  sysfs_root:
    description: Root of the sysfs tree the interface's speed is read from (a copy in tests).
    type: path
    default: /sys
requirements:
  - iproute2 (C(ip)) with JSON output on the engine host
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.command_timeout
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the fabric interface
  narwhal.deploy.interface_facts:
    name: eth1
    family: ipv6

- name: Show the usable addresses
  ansible.builtin.debug:
    var: ansible_facts.narwhal_interface.global_addresses
"""

RETURN = r"""
ansible_facts:
  description: Facts about the interface.
  returned: always
  type: dict
  contains:
    narwhal_interface:
      description: The interface and its addresses.
      returned: always
      type: dict
      contains:
        name:
          description: Interface name.
          type: str
          returned: always
          sample: eth1
        operstate:
          description: Operational state as C(ip) reports it.
          type: str
          returned: always
          sample: UP
        mtu:
          description: MTU of the interface.
          type: int
          returned: always
          sample: 1500
        host_id:
          description: Identity of the physical host (hash of its machine ID and host name), equal for engines that share a host.
          type: str
          returned: always
          sample: 1c1e5e2c4d0a7b9f
        global_addresses:
          description: Usable global addresses of the requested family, without prefix length.
          type: list
          elements: str
          returned: always
          sample: ["10.0.0.11", "fd00::11"]
        addresses:
          description: Every address of the interface with C(address), C(family), C(prefixlen), C(scope), C(flags), C(usable) and C(reason).
          type: list
          elements: dict
          returned: always
          sample: [{"address": "fe80::1", "family": "ipv6", "prefixlen": 64, "scope": "link", "flags": [], "usable": false, "reason": "scope link"}]
        speed:
          description:
            - The interface's nominal speed from C(class/net/<name>/speed) below O(sysfs_root). C(mbps) is its value
              in Mb/s (null when the driver reports none or the file cannot be read), C(virtual) whether the kernel
              lists the interface under C(devices/virtual) (its speed is then its driver's figure, not a physical
              link's, and a veth always reports 10000), and C(why) why C(mbps) is null or what a virtual one's means.
          type: dict
          returned: always
          sample: {"mbps": 100000, "virtual": false, "why": null}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import COMMAND_TIMEOUT_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.interface_reader import read_interface


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            family=dict(type="str", default="any", choices=["any", "ipv4", "ipv6"]),
            sysfs_root=dict(type="path", default="/sys"),
            **COMMAND_TIMEOUT_SPEC,
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = read_interface(module, p["name"], p["family"], p["command_timeout"], p["sysfs_root"])
    module.exit_json(changed=False, ansible_facts={"narwhal_interface": facts})


if __name__ == "__main__":
    main()
