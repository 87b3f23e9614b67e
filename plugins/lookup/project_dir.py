# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: project_dir
short_description: The operator's project directory (the one that holds .env, config/ and runs/)
version_added: 0.1.0
description:
  - The collection's playbooks read the site's C(.env) and write C(config/) and C(runs/) in the operator's own
    project directory, never inside the installed collection.
  - With a term (the C(narwhal_project_dir) variable), that directory, made absolute against the controller's
    current directory.
  - Without one, the first directory that holds a C(.env) file of the current directory, the inventory's
    directory (O(inventory_dir)) and the two directories above it; when none does, the current directory (the
    site inputs then fail, naming the C(.env) path they looked for and how to choose another).
options:
  _terms:
    description: The project directory as the operator set it (an empty string when unset).
    required: false
  inventory_dir:
    description: The inventory's directory (the C(inventory_dir) magic variable).
    type: str
    default: ""
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Where this site's .env, config/ and runs/ are
  ansible.builtin.debug:
    msg: "{{ lookup('narwhal.deploy.project_dir', narwhal_project_dir | default(''), inventory_dir=inventory_dir) }}"
"""

RETURN = r"""
_raw:
  description: The absolute path of the project directory (one string).
  type: list
  elements: str
"""

import os

from ansible.plugins.lookup import LookupBase


def project_dir(explicit, inventory_dir, cwd, exists=os.path.isfile):
    """Pure rule (the file test is a parameter): the explicit directory, else the first candidate with a .env."""
    if explicit:
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(explicit)))
    candidates = [cwd]
    if inventory_dir:
        here = os.path.normpath(os.path.join(cwd, inventory_dir))
        candidates += [here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))]
    for candidate in candidates:
        if exists(os.path.join(candidate, ".env")):
            return candidate
    return cwd


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        explicit = str(terms[0]) if terms and terms[0] else ""
        return [project_dir(explicit, self.get_option("inventory_dir") or "", os.getcwd())]
