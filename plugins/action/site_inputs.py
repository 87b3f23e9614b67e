# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.site_inputs, the action plugin (documentation: plugins/modules/site_inputs.py).
Reads and validates the site .env in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.site import module_spec, site_inputs
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(site_inputs)
    module_spec = staticmethod(module_spec)
