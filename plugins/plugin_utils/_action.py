# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller steps' action plugins, written as ansible-core writes set_fact
(lib/ansible/modules/set_fact.py holds the documentation, lib/ansible/plugins/action/set_fact.py the work): the task's
arguments are validated against the step's argument spec (ArgumentSpecValidator, as ActionBase.validate_argument_spec
does), the step runs in this process (plugins/module_utils/_common/step.py) and its result is the task's. No module
process, no AnsibleModule.

transfer_probe alone also runs on an engine host (narwhal_probe_from=consumer): its action plugin sets
`remote_module`, and a task whose connection is not this controller, or that becomes another user, runs the module
there (plugins/modules/transfer_probe.py, whose main() calls the same step).
"""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError, StepRun

__metaclass__ = type


def plain(value):
    """`value` as plain JSON types (dict, list, str, int, float, bool, None): the templated arguments of ansible-core
    2.19 carry tagged strings and lazy containers, which a step writes into files and hashes."""
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def validated(spec, args, name):
    """(parameters, secrets, error) of a task's arguments checked against a step's AnsibleModule keyword arguments, as
    ActionBase.validate_argument_spec checks them: the parameters with their defaults, the values of its no_log
    options, and the message of the first error (None when there is none)."""
    validator = ArgumentSpecValidator(spec["argument_spec"], spec.get("mutually_exclusive"),
                                      spec.get("required_together"), spec.get("required_one_of"),
                                      spec.get("required_if"), spec.get("required_by"))
    result = validator.validate(args)
    params = dict(args, **result.validated_parameters)
    secrets = set(params[name_] for name_, option in spec["argument_spec"].items()
                  if option.get("no_log") and isinstance(params.get(name_), str) and params[name_])
    try:
        error = result.errors[0]
    except IndexError:
        return params, secrets, None
    msg = result.errors.msg
    if isinstance(error, UnsupportedError):
        msg = "Unsupported parameters for (%s) module: %s" % (name, msg)
    return params, secrets, msg


def run_step(step, spec, args, name, check_mode=False, diff=False):
    """The task result of `step` (plugins/module_utils/_common/step.py) run in this process over the task's
    arguments `args`: a bad argument fails as the module would, a StepError is a failed result, the step's warnings
    are the result's, and no value of a no_log option or of the step's secrets is left in it."""
    params, secrets, error = validated(spec, args, name)
    if error:
        return {"failed": True, "msg": error}
    task = StepRun(params, check_mode=check_mode, diff=diff)
    try:
        result = step(task)
    except StepError as exc:
        result = dict(exc.result, failed=True)
    if task.warnings:
        result["warnings"] = list(task.warnings)
    secrets |= task.secrets
    return remove_values(result, secrets) if secrets else result


class StepAction(ActionBase):
    """A controller step. `step(task)` does the work (plugins/module_utils/_common/step.py), `module_spec()` gives its
    AnsibleModule keyword arguments (the module's documentation states the same options, tests/unit/plugins/action
    checks it), and `host_facts(args, hostvars, hosts, members)`, where set, fills arguments the task did not give from
    the engines' host variables (`hosts`: {inventory host: engine-<n>}, the fact narwhal_engines of the opening play;
    `members`: {engine-<n>: its hosts, the head first}, the fact narwhal_members)."""

    _supports_check_mode = True
    _supports_async = False

    step = None
    module_spec = None
    host_facts = None
    remote_module = False

    def runs_here(self):
        """The task's connection is this controller and nothing runs as another user."""
        return self._connection.transport == "local" and not self._play_context.become

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = plain(dict(self._task.args))
        if self.host_facts is not None:
            args = plain(self.host_facts(args, task_vars.get("hostvars") or {}, task_vars.get("narwhal_engines"),
                                         task_vars.get("narwhal_members")))
        if self.remote_module and not self.runs_here():
            try:
                result.update(self._execute_module(module_args=args, task_vars=task_vars))
            finally:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        result.update(run_step(self.step, self.module_spec(), args, self._task.action,
                               check_mode=self._task.check_mode, diff=self._task.diff))
        return result
