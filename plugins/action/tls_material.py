# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.tls_material, the action plugin (documentation: plugins/modules/tls_material.py).
Makes or checks the TLS material of NARWHAL_TLS_DIR in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._tls.material import module_spec, tls_material
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(tls_material)
    module_spec = staticmethod(module_spec)
