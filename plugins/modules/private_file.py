#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/private_file.py does the work in the
# controller's process, with the step plugins/module_utils/_outputs/private_file.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: private_file
short_description: Keep a report file on the controller, readable by its owner only
version_added: 0.1.0
description:
  - Writes O(content) to O(dest) whole, mode C(0600), through a temporary file of the same directory that is
    renamed over it (a reader sees the old file or the new one, never a part), or leaves it untouched when it
    already holds that content with that mode.
  - Used by the playbooks for the reports they keep on the controller (status reports, probe results, run
    summaries) in place of M(ansible.builtin.copy), whose two module runs per file cost more than the report.
  - The directory must exist; a O(dest) that is not a regular file (a directory, a link, a FIFO) is refused by name.
options:
  dest:
    description: Path of the file.
    type: path
    required: true
  content:
    description: The file's text (written as UTF-8).
    type: str
    required: true
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.writer
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Keep the report with the runs
  narwhal.deploy.private_file:
    dest: "{{ narwhal_site.paths.runs_dir }}/probes.json"
    content: "{{ results | to_nice_json }}\n"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dest:
  description: The file.
  returned: always
  type: str
  sample: /srv/narwhal/runs/probes.json
"""
