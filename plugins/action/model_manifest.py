# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.model_manifest, the action plugin (documentation: plugins/modules/model_manifest.py).
Makes the manifest of NARWHAL_MODEL_SOURCE in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.model_source import model_manifest, module_spec
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(model_manifest)
    module_spec = staticmethod(module_spec)
