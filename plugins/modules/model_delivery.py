#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_delivery
short_description: Check the checkpoint an engine host holds against its manifest, and move a checked copy into place
version_added: 0.2.0
description:
  - The host's side of the deliver stage's checkpoint delivery (docs/delivery.md, "Checkpoints"). The manifest
    (O(digest), O(files)) is the one M(narwhal.deploy.model_manifest) made at the source.
  - O(state=check) compares the checkpoint at O(path) with the manifest and changes nothing. With O(verify=fast),
    the file C(.narwhal-manifest.json) (the STAMP) that the last commit wrote in O(path) must hold the manifest and
    record the size and mtime of every file as one stat of each finds them now. With O(verify=full), the sha256 of
    every file (read 1 MiB at a time) is compared with the manifest. A file that is not in the manifest differs too,
    except the STAMP and directories whose names start with C(.) (C(.cache), C(.git)). When the checkpoint does not
    match and the host has no C(rsync), the check fails saying so.
  - O(state=commit) checks the copy at O(path) (the deliver stage syncs into C(<dest>.narwhal-partial)) whole
    against the manifest (the sha256 of every file; a file the manifest does not hold is refused), writes the STAMP
    into it, then moves O(dest) to C(<dest>.narwhal-previous) (an older one removed first) and the copy to O(dest) -
    O(dest) is the old checkpoint or the new one, never a half copy. A copy that does not match is refused naming
    it and the files that differ (the failure's C(differing)), and O(dest) is left as it was. Without a copy, a
    O(dest) whose STAMP already holds the manifest is no change.
options:
  state:
    description: C(check) the checkpoint at O(path), or C(commit) the copy at O(path) into O(dest).
    type: str
    choices: [check, commit]
    required: true
  path:
    description:
      - O(state=check) - the checkpoint directory (C(NARWHAL_MODEL_PATH)).
      - O(state=commit) - the synced copy, C(<dest>.narwhal-partial).
    type: path
    required: true
  dest:
    description: O(state=commit) - the checkpoint directory the copy replaces (C(NARWHAL_MODEL_PATH)).
    type: path
  digest:
    description: The manifest's digest (C(sha256:<hex>)).
    type: str
    required: true
  files:
    description: The manifest's files - each file's path relative to the checkpoint directory mapped to its C(size) and C(sha256).
    type: dict
    required: true
  verify:
    description: O(state=check) - C(fast) (the STAMP and one stat per file) or C(full) (the sha256 of every file).
    type: str
    choices: [fast, full]
    default: fast
attributes:
  check_mode:
    description: O(state=check) runs the same; O(state=commit) checks nothing, moves nothing and reports a change.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.engine_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Check the checkpoint against the source's manifest
  narwhal.deploy.model_delivery:
    state: check
    path: /srv/models/Llama-3.1-8B-Instruct
    digest: "{{ manifest.digest }}"
    files: "{{ manifest.files }}"
    verify: fast
  become: true
  register: held

- name: Move the synced copy into place
  narwhal.deploy.model_delivery:
    state: commit
    path: /srv/models/Llama-3.1-8B-Instruct.narwhal-partial
    dest: /srv/models/Llama-3.1-8B-Instruct
    digest: "{{ manifest.digest }}"
    files: "{{ manifest.files }}"
  become: true
  when: not held.match
"""

RETURN = r"""
match:
  description: O(state=check) - the checkpoint holds the manifest's files and its STAMP records them as they are.
  returned: state is check
  type: bool
exists:
  description: O(state=check) - O(path) is a directory.
  returned: state is check
  type: bool
parent_exists:
  description: O(state=check) - the directory that holds O(path) exists.
  returned: state is check
  type: bool
stamp_digest:
  description: O(state=check) - the digest of the STAMP in O(path); null without one.
  returned: state is check
  type: str
differing:
  description:
    - The files that differ from the manifest (missing, not in it, another size, another sha256 or, with
      O(verify=fast), modified since the STAMP recorded them); all of them when O(path) does not exist.
    - On a refused commit, the files of the copy that differ.
  returned: state is check, or a commit failed on its copy
  type: list
  elements: str
damaged:
  description:
    - O(state=check) with O(verify=full) - the differing files that have the manifest's size but another sha256
      (a quick check on size and mtime keeps them - the sync compares them by checksum); empty with O(verify=fast).
  returned: state is check
  type: list
  elements: str
rsync_opts:
  description:
    - O(state=check) - the rsync options of the sync into C(<path>.narwhal-partial/) - the STAMP and directories
      named C(.*) excluded, and C(--link-dest=<path>) when O(path) exists (the files it holds unchanged are
      hard-linked, not sent).
  returned: state is check
  type: list
  elements: str
path:
  description: O(state=check) - the checkpoint directory checked.
  returned: state is check
  type: str
difference:
  description: O(state=check) - the differing files and how (the first five), empty when none differ.
  returned: state is check
  type: str
reason:
  description: O(state=check) - one sentence - why the checkpoint matches or not.
  returned: state is check
  type: str
dest:
  description: O(state=commit) - the checkpoint directory.
  returned: state is commit
  type: str
previous:
  description: O(state=commit) - where the checkpoint it replaced went (C(<dest>.narwhal-previous)), null when none.
  returned: state is commit
  type: str
digest:
  description: O(state=commit) - the manifest's digest, now in O(dest)'s STAMP.
  returned: state is commit
  type: str
received:
  description: O(state=commit) - the files the sync wrote (not hard links of the checkpoint it replaced).
  returned: state is commit
  type: list
  elements: str
received_bytes:
  description: O(state=commit) - the bytes of the files in RV(received).
  returned: state is commit
  type: int
replaced:
  description: O(state=commit) - the files of RV(received) that the replaced checkpoint held under the same name.
  returned: state is commit
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.model_host import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["check", "commit"], required=True),
            path=dict(type="path", required=True),
            dest=dict(type="path"),
            digest=dict(type="str", required=True),
            files=dict(type="dict", required=True),
            verify=dict(type="str", choices=["fast", "full"], default="fast"),
        ),
        required_if=[("state", "commit", ("dest",))],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
