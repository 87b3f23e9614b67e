# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.engine_prereqs, the action plugin (documentation: plugins/modules/engine_prereqs.py).
Turns each `src` of O(held) (a file on the controller, such as the engine API key) into the sha256 of its content
here (plugin_utils/_held.py), then runs the module on the task's host: prepare's one module run per host also reads
what install would write there, and no digest is logged."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.narwhal.deploy.plugins.plugin_utils._held import with_digests

__metaclass__ = type


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = dict(self._task.args)
        if args.get("held") is not None:
            held, error = with_digests(args["held"])
            if error:
                result.update(failed=True, msg="held: " + error)
                return result
            args["held"] = held
        try:
            result.update(self._execute_module(module_name="narwhal.deploy.engine_prereqs", module_args=args,
                                               task_vars=task_vars))
        finally:  # the remote temporary directory of a run without pipelining
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
