# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action plugins of the controller steps (plugins/action/{site_inputs,discovery_outputs,prepare_run,
transfer_probe}.py): where the task runs on the controller, the step runs in this process (no module process,
module_utils/_controller.py); elsewhere the module runs on the task's host, as it would without the action plugin."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.narwhal.deploy.plugins.module_utils._controller import run_step


class ControllerStepAction(ActionBase):
    """A step (module_utils/_<step>.py): `step(module)`, `module_spec()`, and optionally `host_facts(args, hostvars)`
    that fills arguments the task did not give from the engines' host variables."""

    _supports_check_mode = True
    _supports_async = False

    step = None
    module_spec = None
    host_facts = None

    def runs_here(self):
        """The task's connection is this controller (delegate_to localhost, connection local) and nothing is run as
        another user: the module would run in a Python of this machine as this user, so the step runs here."""
        return self._connection.transport == "local" and not self._play_context.become

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = dict(self._task.args)
        if self.host_facts is not None:
            args = self.host_facts(args, task_vars.get("hostvars") or {})
        if not self.runs_here():
            try:
                result.update(self._execute_module(module_args=args, task_vars=task_vars))
            finally:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        result.update(run_step(self.step, self.module_spec(), args, self._task.action,
                               check_mode=self._task.check_mode, diff=self._task.diff))
        return result
