#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: site_inputs
short_description: Read and validate the deployment inputs of a site from its .env
version_added: 0.1.0
description:
  - Runs on the controller. Reads the C(.env) file with python-dotenv, lets C(NARWHAL_*) variables of the
    process environment override it, and validates every input against the collection's input description
    (types, defaults, allowed values).
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
        - With O(root), also C(project_dir) (O(root)) and C(paths), the absolute paths of the outputs and the key
          file (C(fleet), C(launch_config), C(config_dir), C(deployment_env), C(runs_dir), C(api_key_file)).
      returned: always
      type: dict
      sample: {"site": {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_ENGINE_PORT": 8000}, "nodes": {"1": {"ROLE": "prefill"}},
               "env_file": "/srv/narwhal/.env", "env_sha256": "9f2c..."}
"""

import hashlib
import io
import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.narwhal.deploy.plugins.module_utils._dotenv import (
    DOTENV_IMPORT_ERROR,
    DotenvError,
    decode_dotenv,
    literal_expansions,
    parse_dotenv,
    read_dotenv_bytes,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs import (
    InputError,
    check_env_file,
    is_input_name,
    load_inputs,
    unknown_name_warning,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._paths import (
    DEPLOYMENT_ENV,
    check_paths,
    git_ignore_checker,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import redact_text, secret_values

try:
    from dotenv.parser import parse_stream
except ImportError:
    parse_stream = None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            env_file=dict(type="path", required=True),
            use_process_env=dict(type="bool", default=True),
            root=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    if DOTENV_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("python-dotenv"), exception=DOTENV_IMPORT_ERROR)
    path = module.params["env_file"]
    try:
        raw = read_dotenv_bytes(path)
    except DotenvError as exc:
        module.fail_json(msg="site inputs: %s; copy .env.example to .env and fill it in, or point "
                             "NARWHAL_ENV_FILE at the site's file" % exc)
    try:
        text = decode_dotenv(path, raw)
        parsed = parse_dotenv(text)
    except DotenvError as exc:
        module.fail_json(msg="site inputs: %s; save it as UTF-8" % exc, input="NARWHAL_ENV_FILE")
    # values of secret-looking names of .env and of the controller's environment: hidden wherever they are pasted
    secrets = secret_values(parsed, os.environ if module.params["use_process_env"] else {})
    values = {k: v for k, v in parsed.items() if k.startswith("NARWHAL_")}
    if module.params["use_process_env"]:
        for key, value in os.environ.items():
            if not key.startswith("NARWHAL_"):
                continue
            if is_input_name(key):
                values[key] = value
            else:  # the project's tool variables and others: not inputs (a near miss of an input is warned about)
                warning = unknown_name_warning(key)
                if warning:
                    module.warn(warning)
    for key in literal_expansions(values):
        module.warn("%s holds '${...}', which stays literal: .env values are not expanded from the environment; "
                    "write the value itself" % key)
    try:
        # what python-dotenv passes silently: unparseable lines, repeated keys (the last wins)
        check_env_file([(b.key, b.value, b.original.line, b.error) for b in parse_stream(io.StringIO(text))], path)
        inputs = load_inputs(values)
        root = module.params["root"]
        if root:
            paths = check_paths(root, inputs["site"], env_file=path,
                                ignored=git_ignore_checker(module, root), resolve=os.path.realpath)
    except InputError as exc:
        module.fail_json(msg=redact_text("invalid site input in %s: %s" % (path, exc), secrets), input=exc.key)
    inputs["nodes"] = {str(n): v for n, v in inputs["nodes"].items()}
    inputs["env_file"] = path
    inputs["env_sha256"] = hashlib.sha256(raw).hexdigest()
    if root:
        paths["deployment_env"] = os.path.join(paths["config_dir"], DEPLOYMENT_ENV)
        inputs["paths"] = paths
        inputs["project_dir"] = os.path.normpath(root)
    module.exit_json(changed=False, ansible_facts={"narwhal_site": inputs})


if __name__ == "__main__":
    main()
