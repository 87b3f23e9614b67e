# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.transfer_probe, the action plugin (documentation: plugins/modules/transfer_probe.py).
Probes the pairs in this process when the task runs on the controller; on an engine host (the
consumer-side probe, with become) the module runs there."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._probe.transfer import module_spec, transfer_probe
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(transfer_probe)
    module_spec = staticmethod(module_spec)
    remote_module = True
