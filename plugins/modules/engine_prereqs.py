#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_prereqs
short_description: Check an engine host's remote prerequisites for a launch record, without changing it
version_added: 0.1.0
description:
  - Runs on the engine host during prepare, read-only. Checks that the Docker daemon answers (over its Engine
    API, with the Python standard library; neither this module nor the launcher needs the Docker SDK), that the
    image with the recorded ID is present, that the model path exists and is readable (and its manifest, when the
    deliver stage stamped one, readable and intact), that every recorded device path
    exists, that the fabric interface exists, can carry traffic (operstate UP or UNKNOWN, administratively up, no
    C(NO-CARRIER) flag) and still carries the recorded address, and that nothing else
    listens on the ports this host's part of the engine binds (its HTTP and attestation ports, except on a headless
    host after the head of an engine across hosts; its side-channel ports; the head's data-parallel RPC port).
    Sockets held by processes of this engine's
    own running container, C(narwhal-<engine>), are allowed, so a prepare of the running engine is not refused.
  - A listener on the attestation port that answers a GET of the engine's attestation URL (O(attestation_url), by
    default the one discovery derives from the record, C(http://<node.address>:<node.attest_port>/v1/attestation))
    with a 2xx status is the attestation sidecar, not a conflict; whether it answered is returned in
    RV(attestation). Anything else listening on the engine's ports is refused.
  - Fails with every problem found, each naming what is missing and how to fix it. Its one host tool,
    C(ip -j addr show), runs with the deadline O(command_timeout); when it times out, fails or prints output that
    is not the JSON of C(ip -j), that is one of those problems.
  - Reads the fabric interface once and returns it as the fact C(narwhal_interface), in the shape
    M(narwhal.deploy.interface_facts) returns (its speed read below C(/sys)), so prepare reads the interface once (M(narwhal.deploy.prepare_run)'s
    write stage compares the same facts with the record).
  - With O(read_gpus), also reads the GPUs as M(narwhal.deploy.gpu_facts) does (below O(sysfs_root) and O(dev_root),
    the same facts and the same errors) and returns them as the fact C(narwhal_gpus), after every prerequisite
    passed, so that prepare's host checks are one module run per host.
  - With O(held), also reads what the host holds of those paths, as M(narwhal.deploy.held_files) does, and returns
    the paths that differ as RV(held_differ) - prepare reads what install would write, and install writes only those
    paths without a read of its own. Its action plugin turns each O(held[].src) (a controller file) into the
    sha256 of its content on the controller; no digest is returned.
options:
  record:
    description: The engine's launch record (one entry of the launch config).
    type: dict
    required: true
  attestation_url:
    description:
      - The engine's attestation URL (the fleet's C(attestation_url), e.g. a C(NARWHAL_NODE_<n>_ATTESTATION_URL)
        override). Its port must be the record's C(node.attest_port). Default from the record.
    type: str
  attestation_timeout:
    description: Seconds the GET of the attestation URL may take.
    type: int
    default: 5
  read_gpus:
    description: Also read the GPUs (the fact C(narwhal_gpus)), once every prerequisite passed.
    type: bool
    default: false
  held:
    description:
      - What the host should hold, as M(narwhal.deploy.held_files)' O(narwhal.deploy.held_files#module:files) (the same
        suboptions and comparison); read once every prerequisite passed. Not read when omitted.
    type: list
    elements: dict
    suboptions:
      path:
        description: Absolute path on the host.
        type: path
        required: true
      state:
        description: A regular file or a directory.
        type: str
        choices: [file, directory]
        default: file
      sha256:
        description: The sha256 (hex) the file's content should have; an empty string matches no file.
        type: str
      src:
        description: A controller file whose content the host's file should have (read by the action plugin).
        type: path
      mode:
        description: The permission bits it should have, in octal.
        type: str
      owner:
        description: The user that should own it (name or uid).
        type: str
      group:
        description: The group that should own it (name or gid).
        type: str
attributes:
  idempotent:
    description: Never changes anything.
requirements:
  - A Docker daemon on the engine host
  - iproute2 (C(ip))
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.docker_access
  - narwhal.deploy.host_roots
  - narwhal.deploy.command_timeout
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Check the engine host
  narwhal.deploy.engine_prereqs:
    record: "{{ narwhal_prepare.records[inventory_hostname] }}"
  become: true

- name: Check the engine host and read its GPUs in the same run
  narwhal.deploy.engine_prereqs:
    record: "{{ narwhal_prepare.records[inventory_hostname] }}"
    read_gpus: true
  become: true
"""

RETURN = r"""
image_id:
  description: ID of the recorded image on this host.
  returned: success
  type: str
  sample: sha256:c261354381582881da50c70a35a35bbe65b52c1b48cb2591b0c97e7291c60d18
model_manifest:
  description:
    - The digest of the manifest the record's checkpoint (C(runtime.model_path)) holds now
      (C(.narwhal-manifest.json), which the deliver stage writes), recomputed from its files map; null without one.
      prepare_run's write stage compares it with the record's C(runtime.model_manifest). A manifest that cannot be
      read or whose digest is not its files' is a missing prerequisite.
  returned: success
  type: str
  sample: sha256:5d41402abc4b2a76b9719d911017c592ae2c5d3a3c1e5b7b8a9f0e1d2c3b4a59
attestation:
  description:
    - The attestation port as found. C(url) asked, C(port), C(listening) (something listens on the port),
      C(answered) (null when nothing listens; true when the listener answered the URL with 2xx, so it is the
      sidecar and accepted), C(status) (the HTTP status, null without an answer) and C(error) (why it did not
      answer, else null).
  returned: always
  type: dict
  sample: {"url": "http://172.31.241.11:8010/v1/attestation", "port": 8010, "listening": true, "answered": true,
           "status": 200, "error": null}
ansible_facts:
  description: Facts of the engine host.
  returned: success
  type: complex
  contains:
    narwhal_interface:
      description:
        - The recorded fabric interface as found (C(name), C(operstate), C(mtu), C(host_id), C(global_addresses) of
          any family, C(addresses) with their classification), as M(narwhal.deploy.interface_facts) returns it.
      type: dict
      returned: success
      sample: {"name": "eth1", "operstate": "UP", "mtu": 1500, "host_id": "5f2c0e9a1b7d4c3e",
               "global_addresses": ["172.31.241.11"], "addresses": []}
    narwhal_gpus:
      description:
        - With O(read_gpus), the GPU inventory as M(narwhal.deploy.gpu_facts) returns it (C(vendor), C(gpus),
          C(devices), C(driver_version), C(source)).
      type: dict
      returned: success and O(read_gpus)
      sample: {"vendor": "none", "gpus": [], "devices": [], "driver_version": null, "source": null}
held_differ:
  description: With O(held), its paths that the host does not hold as wanted, in the order of O(held).
  returned: success and O(held)
  type: list
  elements: str
  sample: [/opt/narwhal/config/engine-2.env]
python:
  description: The Python that ran the check (and will run the launcher).
  returned: always
  type: str
  sample: /usr/bin/python3
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import HELD_FILE_SPEC
from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import (
    COMMAND_TIMEOUT_SPEC,
    DOCKER_ACCESS_SPEC,
    HOST_ROOTS_SPEC,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.prereqs import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(record=dict(type="dict", required=True),
                           **DOCKER_ACCESS_SPEC,
                           attestation_url=dict(type="str"),
                           attestation_timeout=dict(type="int", default=5),
                           read_gpus=dict(type="bool", default=False),
                           held=dict(type="list", elements="dict", options=HELD_FILE_SPEC),
                           **HOST_ROOTS_SPEC,
                           **COMMAND_TIMEOUT_SPEC),
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
