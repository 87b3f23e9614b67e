# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.private_file, the action plugin (documentation: plugins/modules/private_file.py).
Writes the controller's report files in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.private_file import module_spec, private_file
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(private_file)
    module_spec = staticmethod(module_spec)
