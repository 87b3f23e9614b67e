#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/site_inputs.py does the work in the
# controller's process, with the step plugins/module_utils/_inputs/site.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: site_inputs
short_description: Read and validate the deployment inputs of a site from its .env
version_added: 0.1.0
description:
  - Runs on the controller, inside the controller's Ansible process (an action plugin, no module process).
  - Reads the C(.env) file with python-dotenv, lets C(NARWHAL_*) variables of the process environment override it,
    and validates every input against the collection's input description (types, defaults, allowed values).
  - Values are literal. python-dotenv's C(${VAR}) expansion is off, so nothing of the controller's environment
    is pulled into a value or an error message; a value that holds C(${...}) is kept as written and warned about.
    (The fleet file's complete-value C(${NAME}) substitution is separate, see docs/substitution.md.)
  - A bad input fails with a message naming the C(.env) key and how to fix it. Secret-looking values in the
    message (values of names with KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL, secret flags such as
    C(--hf-token), URL passwords, bearer tokens) show as C(<redacted>).
  - The file must be a regular UTF-8 file (a FIFO is refused by name, never waited on).
  - Refused too, because python-dotenv would pass them silently, are a line it cannot parse, a C(NARWHAL_*) key set twice, and an
    unknown C(NARWHAL_*) key in the file (named with the closest input). Unknown C(NARWHAL_*) variables of the
    process environment are ignored, with a warning when they resemble an input.
  - With O(root), the output paths (fleet, launch records, config directory, run directory) are checked too,
    each its own path, none an input, git-ignored inside the checkout.
  - Read-only; never reports a change. Returns no secret values.
options:
  env_file:
    description: Path of the C(.env) file.
    type: path
    required: true
  use_process_env:
    description: Let C(NARWHAL_*) variables of the controller environment override the file.
    type: bool
    default: true
  root:
    description:
      - The project directory (the operator's, or a checkout) that relative paths are relative to. When given, the output paths are checked
        (distinct, not an input, git-ignored inside the checkout, asked with C(git check-ignore) where git and a
        repository are there).
    type: path
requirements:
  - python-dotenv on the controller
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the site inputs once, on the controller
  narwhal.deploy.site_inputs:
    env_file: "{{ narwhal_project_dir }}/.env"
    root: "{{ narwhal_project_dir }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
ansible_facts:
  description: The validated inputs.
  returned: always
  type: dict
  contains:
    narwhal_site:
      description:
        - Site-wide inputs (C(site)), per-node inputs by node number (C(nodes)), the file read and its sha256.
        - C(engines) - the settings of every engine C(engine-<n>) that a per-node input names, its
          C(NARWHAL_NODE_<n>_*) overrides applied over the site values (the filter
          P(narwhal.deploy.node_settings#filter) reads them, and gives an engine not named here the site values).
        - With O(root), also C(project_dir) (O(root)) and C(paths), the absolute paths of the outputs and the key
          file (C(fleet), C(launch_config), C(config_dir), C(deployment_env), C(runs_dir), C(api_key_file)).
      returned: always
      type: dict
      sample: {"site": {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_ENGINE_PORT": 8000}, "nodes": {"1": {"ROLE": "prefill"}},
               "engines": {"engine-1": {"engine": "engine-1", "node": 1, "role": "prefill", "fabric_interface": "eth1",
                                        "engine_port": 8000, "inputs": {"fabric_interface": "NARWHAL_FABRIC_INTERFACE"}}},
               "env_file": "/srv/narwhal/.env", "env_sha256": "9f2c..."}
"""
