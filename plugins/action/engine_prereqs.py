# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.engine_prereqs, the action plugin (documentation: plugins/modules/engine_prereqs.py).
Turns each `src` of O(held) (a file on the controller, such as the engine API key) into the sha256 of its content
here (plugin_utils/_held.py), then runs the module on the task's host: prepare's one module run per host also reads
what install would write there, and no digest is logged."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.plugin_utils._held import DigestingAction

__metaclass__ = type


class ActionModule(DigestingAction):
    _MODULE = "narwhal.deploy.engine_prereqs"
    _OPTION = "held"
    _OPTIONAL = True
