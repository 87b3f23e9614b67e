# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.held_files, the action plugin (documentation: plugins/modules/held_files.py).
Turns each `src` (a file on the controller) into the sha256 of its content here (plugin_utils/_held.py), then runs
the module on the task's host: one module run compares the host's files with the controller's, and no digest is
logged."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.narwhal.deploy.plugins.plugin_utils._held import controller_sha256, with_digests

__metaclass__ = type

__all__ = ["ActionModule", "controller_sha256", "with_digests"]


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = dict(self._task.args)
        files, error = with_digests(args.get("files"))
        if error:
            result.update(failed=True, msg="files: " + error)
            return result
        args["files"] = files
        try:
            result.update(self._execute_module(module_name="narwhal.deploy.held_files", module_args=args,
                                               task_vars=task_vars))
        finally:  # the remote temporary directory of a run without pipelining
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
