# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_groups
short_description: Groups prefill and decode from the fleet roles in the site's .env
version_added: 0.1.0
description:
  - Adds every engine host of the inventory (group C(engines)) to the group of its C(NARWHAL_NODE_<n>_ROLE)
    in the site's C(.env) (C(prefill) or C(decode)), so C(--limit decode) works and plays can target C(prefill). The C(.env)
    stays the single source of the roles written into the launch records.
  - An engine host is node C(<n>) of C(.env) by its host variable C(narwhal_node) (set where the inventory defines the
    host), or by its name C(engine-<n>).
  - An inventory group C(prefill) or C(decode) of the operator's own that holds an engine host C(.env) gives another
    role is refused by name, as are two hosts with one node.
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
from ansible.vars.plugins import get_vars_from_inventory_sources

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import NODE_VAR, RANK_VAR, inventory_engines
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import DotenvError, read_dotenv
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import ROLE_GROUPS as ROLES
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import check_role_groups


def fleet_roles(engines, values, groups=None):
    """Pure: {host: role} for the engine hosts ({inventory host: engine-<n>}) whose NARWHAL_NODE_<n>_ROLE in
    `values` is prefill or decode, and the list of (host, problem) for the others. Raises InputError when one of
    the inventory's own groups prefill/decode (`groups`: {group: hosts}) holds an engine host of another role."""
    roles, problems = {}, []
    for host in sorted(engines):
        key = "NARWHAL_NODE_%s_ROLE" % engines[host].split("-")[1]
        role = (values.get(key) or "").strip()
        if role in ROLES:
            roles[host] = role
        else:
            problems.append((host, "%s is %s; set %s=prefill or decode in .env"
                             % (key, repr(role) if role else "not set", key)))
    check_role_groups(engines, roles, groups)
    return roles, problems


class InventoryModule(BaseInventoryPlugin):
    NAME = "narwhal.deploy.fleet_groups"

    def _node_of(self, name):
        """(host, narwhal_node, narwhal_rank) of an inventory host: from the inventory that defines it, else from its
        host_vars/ (the vars plugins, as ansible.builtin.constructed reads them with use_vars_plugins)."""
        host = self.inventory.get_host(name)
        own = host.get_vars()
        node, rank = own.get(NODE_VAR), own.get(RANK_VAR)
        if node is None or rank is None:
            try:
                found = get_vars_from_inventory_sources(self.loader, self.inventory.processed_sources, [host], "all")
            except AttributeError:  # an inventory without processed_sources (older ansible-core)
                found = {}
            node = found.get(NODE_VAR) if node is None else node
            rank = found.get(RANK_VAR) if rank is None else rank
        return name, node, rank

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
        groups = dict((name, [h.name for h in group.get_hosts()]) for name, group in self.inventory.groups.items()
                      if name in ("engines",) + ROLES)
        try:
            engines = inventory_engines(self._node_of(host) for host in groups.get("engines", []))
            roles, problems = fleet_roles(engines, values, groups)
        except InputError as exc:
            raise AnsibleParserError("narwhal.deploy.fleet_groups (%s): %s" % (path, exc))
        if problems and self.get_option("strict"):
            raise AnsibleParserError("narwhal.deploy.fleet_groups: " + "; ".join(
                "%s: %s" % p for p in problems))
        for role in ROLES:
            self.inventory.add_group(role)
        for host, role in roles.items():
            self.inventory.add_child(role, host)
