# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_groups
short_description: Groups prefill and decode from the fleet roles in the site's .env
version_added: 0.1.0
description:
  - Adds every engine host of the inventory (named C(engine-<n>)) to the group of its C(NARWHAL_NODE_<n>_ROLE)
    in the site's C(.env) (C(prefill) or C(decode)), so C(--limit decode) works and plays can target C(prefill). The C(.env)
    stays the single source of the roles written into the launch records.
  - Works like C(ansible.builtin.constructed) - put this file after the inventory that defines the hosts (in an
    inventory directory, sources are read in name order - C(hosts.yml) before C(narwhal.yml)).
  - C(NARWHAL_NODE_<n>_ROLE) of the controller's environment overrides the file, as the site inputs do.
  - The configuration file's name must end with C(narwhal.yml) or C(narwhal.yaml).
options:
  plugin:
    description: The name of this plugin.
    required: true
    choices: [narwhal.deploy.fleet_groups]
  env_file:
    description:
      - The site's C(.env). Relative paths are relative to the directory above the inventory directory when that
        holds it, else to the inventory directory. C($NARWHAL_ENV_FILE) overrides it.
    type: str
    default: .env
  strict:
    description: Fail when an engine host has no valid role in C(.env) (otherwise it joins no role group).
    type: bool
    default: false
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
# inventory/narwhal.yml (next to inventory/hosts.yml)
plugin: narwhal.deploy.fleet_groups
env_file: ../.env
"""

import os
import re

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import DotenvError, read_dotenv

ROLES = ("prefill", "decode")


def fleet_roles(hosts, values):
    """Pure: {host: role} for the engine hosts whose NARWHAL_NODE_<n>_ROLE in `values` is prefill or decode,
    and the list of (host, problem) for the others."""
    roles, problems = {}, []
    for host in hosts:
        match = ENGINE_NAME.match(host)
        if not match:
            continue
        key = "NARWHAL_NODE_%s_ROLE" % match.group(1)
        role = (values.get(key) or "").strip()
        if role in ROLES:
            roles[host] = role
        else:
            problems.append((host, "%s is %s; set %s=prefill or decode in .env"
                             % (key, repr(role) if role else "not set", key)))
    return roles, problems


class InventoryModule(BaseInventoryPlugin):
    NAME = "narwhal.deploy.fleet_groups"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("narwhal.yml", "narwhal.yaml"))

    def parse(self, inventory, loader, path, cache=False):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        env_file = os.environ.get("NARWHAL_ENV_FILE") or self.get_option("env_file")
        if not os.path.isabs(env_file):
            here = os.path.dirname(os.path.abspath(path))
            above = os.path.join(os.path.dirname(here), env_file)
            env_file = above if os.path.exists(above) else os.path.join(here, env_file)
        try:
            values = read_dotenv(env_file)
        except DotenvError as exc:
            raise AnsibleParserError("narwhal.deploy.fleet_groups (%s): %s; set env_file in that file or "
                                     "NARWHAL_ENV_FILE" % (path, exc))
        values.update((k, v) for k, v in os.environ.items() if re.match(r"^NARWHAL_NODE_[0-9]+_ROLE$", k))
        roles, problems = fleet_roles(sorted(self.inventory.hosts), values)
        if problems and self.get_option("strict"):
            raise AnsibleParserError("narwhal.deploy.fleet_groups: " + "; ".join(
                "%s: %s" % p for p in problems))
        for role in ROLES:
            self.inventory.add_group(role)
        for host, role in roles.items():
            self.inventory.add_child(role, host)
