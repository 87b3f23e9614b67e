# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.image_sources, the action plugin (documentation: plugins/modules/image_sources.py).
Reads the pin file, indexes the image archives and checks the registry auth file in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.image_sources import image_sources, module_spec
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(image_sources)
    module_spec = staticmethod(module_spec)
