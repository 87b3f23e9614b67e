# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.prepare_run, the action plugin (documentation: plugins/modules/prepare_run.py).
Validates the records and writes the prepared run in this process, reading the write stage's current
inspection from each engine's host variables (narwhal_gpus, narwhal_interface, prepare_prereqs) where the task does
not pass it."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.run import module_spec, prepare_run
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction
from ansible_collections.narwhal.deploy.plugins.plugin_utils._hostvars import prepare_facts


class ActionModule(StepAction):
    step = staticmethod(prepare_run)
    module_spec = staticmethod(module_spec)
    host_facts = staticmethod(prepare_facts)
