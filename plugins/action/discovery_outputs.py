# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.discovery_outputs, the action plugin (documentation: plugins/modules/discovery_outputs.py).
Plans and writes discovery's output set in this process, reading each engine's facts from its host
variables (narwhal_interface, narwhal_gpus, narwhal_rdma, narwhal_image, narwhal_model) where the task does not pass
them."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.outputs import (
    discovery_outputs,
    module_spec,
)
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction
from ansible_collections.narwhal.deploy.plugins.plugin_utils._hostvars import discovery_facts


class ActionModule(StepAction):
    step = staticmethod(discovery_outputs)
    module_spec = staticmethod(module_spec)
    host_facts = staticmethod(discovery_facts)
