# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet
short_description: The fleet file with its ${NAME} values resolved
version_added: 0.1.0
description:
  - Reads the fleet file and resolves it with complete-value substitution (see docs/substitution.md). Values come
    from the controller's process environment, over the site C(.env), over C(deployment.env); it is the same code
    as the C(narwhal.deploy.resolve_values) filter and C(scripts/narwhal-fleet).
  - The C(.env) files are read with literal values (python-dotenv's own C(${VAR}) expansion is off); only a fleet
    value that is exactly C(${NAME}) is substituted. Secret-looking values in error messages show as
    C(<redacted>).
options:
  _terms:
    description: Path of the fleet file.
    required: true
  env_file:
    description: The site C(.env).
    type: path
    required: true
  deployment_env:
    description: The generated C(deployment.env).
    type: path
    required: true
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Engine URLs
  ansible.builtin.debug:
    msg: "{{ lookup('narwhal.deploy.fleet', 'config/fleet.json', env_file='.env', deployment_env='config/deployment.env') }}"
"""

RETURN = r"""
_raw:
  description: The resolved fleet (one list).
  type: list
  elements: dict
"""

import json
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text, secret_values
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import read_regular
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import (
    DOTENV_IMPORT_ERROR,
    DotenvError,
    read_dotenv,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import (
    SubstitutionError,
    layered_env,
    resolve_values,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if DOTENV_IMPORT_ERROR:
            raise AnsibleLookupError("narwhal.deploy.fleet needs python-dotenv on the controller")
        env_file, deployment = self.get_option("env_file"), self.get_option("deployment_env")
        try:
            env = layered_env(dict(os.environ),
                              read_dotenv(env_file) if os.path.exists(env_file) else {},
                              read_dotenv(deployment) if os.path.exists(deployment) else {})
        except DotenvError as exc:
            raise AnsibleLookupError("narwhal.deploy.fleet: %s" % exc)
        secrets = secret_values(env)
        out = []
        for term in terms:
            try:
                out.append(resolve_values(json.loads(read_regular(term).decode("utf-8")), env))
            except SubstitutionError as exc:
                raise AnsibleLookupError(redact_text("%s: %s" % (term, exc), secrets))
            except (OSError, ValueError, RecursionError) as exc:
                if isinstance(exc, RecursionError):
                    exc = "nested too deeply to be a fleet"
                raise AnsibleLookupError(redact_text("cannot read the fleet %s: %s; run discovery first"
                                                     % (term, exc), secrets))
        return out
