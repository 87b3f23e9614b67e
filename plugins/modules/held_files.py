#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: held_files
short_description: Name the files and directories of a host that differ from what it should hold, in one read
version_added: 0.1.0
description:
  - Reads every path of O(files) once (type, mode, owner, and the sha256 of a file's content when O(files[].sha256)
    is given) and returns the paths that are not as wanted, so that a role writes or fetches only those
    (M(ansible.builtin.copy), M(ansible.builtin.file) and M(ansible.builtin.fetch) each cost a module run per path
    even when nothing differs). Install, launch and the router stage use it, so that a rerun with nothing changed
    reads each host once.
  - Symbolic links are followed, as M(ansible.builtin.copy) follows them.
  - Digests are compared on the host and never returned; O(files[].sha256) is hidden from the output (the digest of
    the engine API key is one), and a O(files[].src) is read on the controller, where the task runs.
  - Read-only; never reports a change.
options:
  files:
    description: What the host should hold.
    type: list
    elements: dict
    required: true
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
        description:
          - The sha256 (hex) the file's content should have; not compared when omitted. An empty string matches no
            file (for a file whose wanted content is unknown, such as a controller copy that does not exist yet).
        type: str
      src:
        description:
          - A file on the controller whose content the host's file should have; the action plugin reads its sha256
            on the controller and compares it as O(files[].sha256) (a controller file that does not exist matches no
            host file). Not with O(files[].sha256).
        type: path
      mode:
        description: The permission bits it should have, in octal (C("0600")); not compared when omitted.
        type: str
      owner:
        description: The user that should own it (name or uid); not compared when omitted.
        type: str
      group:
        description: The group that should own it (name or gid); not compared when omitted.
        type: str
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.engine_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read what the engine host holds of the install
  narwhal.deploy.held_files:
    files:
      - {path: /opt/narwhal/config, state: directory, mode: "0700", owner: root}
      - path: /opt/narwhal/config/engine-2.env
        sha256: "{{ role_env_text | hash('sha256') }}"
        mode: "0600"
        owner: root
  become: true
  register: held

- name: Write the role environment only when it differs
  ansible.builtin.copy:
    dest: /opt/narwhal/config/engine-2.env
    content: "{{ role_env_text }}"
    owner: root
    mode: "0600"
  become: true
  when: "'/opt/narwhal/config/engine-2.env' in held.differ"
"""

RETURN = r"""
differ:
  description: The paths of O(files) that are not as wanted (absent, another type, content, mode, owner or group), in the
    order of O(files).
  returned: success
  type: list
  elements: str
  sample: [/opt/narwhal/config/engine-2.env]
reasons:
  description: For each path of RV(differ), why (C(content), C(mode), C(owner), C(group), or C(absent, not a file) and the
    like).
  returned: success
  type: dict
  sample: {"/opt/narwhal/config/engine-2.env": ["content"]}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import HELD_FILE_SPEC, SRC_ON_CONTROLLER
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import HeldReadError, read_held


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=HELD_FILE_SPEC),
        ),
        supports_check_mode=True,
    )
    wanted = module.params["files"]
    if any(want.get("src") is not None for want in wanted):  # the action plugin reads src on the controller
        module.fail_json(msg="files: " + SRC_ON_CONTROLLER % "held_files")
    try:
        reasons = read_held(wanted)
    except HeldReadError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, differ=list(reasons), reasons=reasons)


if __name__ == "__main__":
    main()
