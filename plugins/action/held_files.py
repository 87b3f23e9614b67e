# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.held_files, the action plugin (documentation: plugins/modules/held_files.py).
Turns each `src` (a file on the controller) into the sha256 of its content here (plugin_utils/_held.py), then runs
the module on the task's host: one module run compares the host's files with the controller's, and no digest is
logged."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.plugin_utils._held import (
    DigestingAction,
    controller_sha256,
    with_digests,
)

__metaclass__ = type

__all__ = ["ActionModule", "controller_sha256", "with_digests"]


class ActionModule(DigestingAction):
    _MODULE = "narwhal.deploy.held_files"
    _OPTION = "files"
