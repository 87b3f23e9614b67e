#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/model_manifest.py does the work in the
# controller's process, with the step plugins/module_utils/_deliver/model_source.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Make the manifest of the checkpoint the deliver stage sends to the engine hosts
version_added: 0.2.0
description:
  - Walks the checkpoint directory O(source) (C(NARWHAL_MODEL_SOURCE)) on the controller and returns its manifest -
    the size and sha256 of every file and their digest (docs/delivery.md, "Checkpoints"), which
    M(narwhal.deploy.model_delivery) checks on every engine host.
  - Symbolic links inside the directory are followed; the file C(.narwhal-manifest.json) (a host's STAMP) and
    directories whose names start with C(.) (C(.cache), C(.git)) are not part of the checkpoint.
  - Each file is hashed 1 MiB at a time, except a file whose size and mtime equal what the previous run recorded in
    O(dest) - its sha256 is taken from there. O(dest) (mode C(0644)) holds the manifest, the source directory and
    what was seen of each file; it is written whole, and only when it differs.
  - Refused naming C(NARWHAL_MODEL_SOURCE) and the fix - a directory that does not exist or holds no files, a
    symbolic link that leads out of the directory (a Hugging Face cache snapshot), a file that is neither regular nor
    a directory, and a directory without C(config.json) (or Mistral's C(params.json)) at its top.
options:
  source:
    description: The checkpoint directory (C(NARWHAL_MODEL_SOURCE)); relative to O(root) unless absolute.
    type: path
    required: true
  root:
    description: The project directory, which a relative O(source) or O(dest) is relative to.
    type: path
  dest:
    description: The manifest file, C(<NARWHAL_CONFIG_DIR>/model-manifest.json); its directory is made when missing.
    type: path
    required: true
attributes:
  check_mode:
    description: Hashes what it must and returns the manifest; writes nothing.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: The checkpoint's manifest, made once at the source
  narwhal.deploy.model_manifest:
    source: "{{ narwhal_site.site.NARWHAL_MODEL_SOURCE }}"
    root: "{{ narwhal_site.project_dir }}"
    dest: "{{ narwhal_site.paths.config_dir }}/model-manifest.json"
  delegate_to: localhost
  run_once: true
  register: manifest
"""

RETURN = r"""
source:
  description: The checkpoint directory, absolute, its links resolved (what the sync copies).
  returned: always
  type: str
  sample: /srv/checkpoints/Llama-3.1-8B-Instruct
dest:
  description: The manifest file.
  returned: always
  type: str
digest:
  description: The manifest's digest.
  returned: always
  type: str
  sample: sha256:5d41402abc4b2a76b9719d911017c592ae2d1e3ff0fe7e9c0d4c3a8ab1c4b7e2
files:
  description: Each file's path relative to O(source) mapped to its C(size) and C(sha256).
  returned: always
  type: dict
bytes:
  description: The size of all the files.
  returned: always
  type: int
count:
  description: How many files.
  returned: always
  type: int
hashed:
  description: The files hashed this time (the others' sha256 came from O(dest)).
  returned: always
  type: list
  elements: str
"""
