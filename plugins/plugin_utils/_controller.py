# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the controller steps (site_inputs, discovery_outputs, prepare_run, transfer_probe, private_file) run in the
controller's process, and when they do not.

Each step is a function of a module-like object (plugins/module_utils/_steps/<step>.py): its module's main() passes
the AnsibleModule, its action plugin (plugins/action/<step>.py, a ControllerStepAction) passes a ControllerModule,
the part of AnsibleModule that the steps use, without a module process: the parameters validated against the same
argument spec, check and diff mode, warn, get_bin_path, no_log_values, fail_json (raises StepFailedError) and
exit_json (returns the result).
The result has the shape AnsibleModule would have sent (invocation, warnings, the file details of a result that
names a path or dest, no_log values removed, JSON types), so that a registered result is the same whichever way the
step ran.

ControllerStepAction decides where a step runs (runs_here): a task whose connection is local and that does not
become another user runs the step in this process (no module process); any other task (another host, or become)
runs the module as it would without the action plugin, on the task's host.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.common.process import get_bin_path
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase

__metaclass__ = type

try:  # ansible-core >= 2.19: the encoder and decoder a module's arguments and result travel with
    from ansible.module_utils.common.json import Direction, get_module_decoder, get_module_encoder

    _ARGS_CODEC = (get_module_encoder("legacy", Direction.CONTROLLER_TO_MODULE),
                   get_module_decoder("legacy", Direction.CONTROLLER_TO_MODULE))
    _RESULT_CODEC = (get_module_encoder("legacy", Direction.MODULE_TO_CONTROLLER),
                     get_module_decoder("legacy", Direction.MODULE_TO_CONTROLLER))
except ImportError:  # older ansible-core
    from ansible.module_utils.common.json import AnsibleJSONEncoder

    _ARGS_CODEC = _RESULT_CODEC = (AnsibleJSONEncoder, json.JSONDecoder)


class StepFailedError(Exception):
    """fail_json of a step run in-process: carries the result a failed module would have returned."""

    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


def as_json(data, codec=_ARGS_CODEC):
    """`data` as the module would receive it (or, with _RESULT_CODEC, as the controller reads a module's
    result): plain lists, dicts, strings and numbers, no template or lazy types."""
    encoder, decoder = codec
    return json.loads(json.dumps(data, cls=encoder), cls=decoder)


def path_info(result):
    """AnsibleModule.add_path_info: a result naming a `path` (or `dest`) carries that file's details."""
    path = result.get("path", result.get("dest"))
    if path is None:
        return result
    try:
        st = os.lstat(path)
    except OSError:
        result["state"] = "absent"
        return result
    result.update(uid=st.st_uid, gid=st.st_gid, mode="0%03o" % stat.S_IMODE(st.st_mode), size=st.st_size)
    try:
        result["owner"] = pwd.getpwuid(st.st_uid)[0]
    except KeyError:
        result["owner"] = str(st.st_uid)
    try:
        result["group"] = grp.getgrgid(st.st_gid)[0]
    except KeyError:
        result["group"] = str(st.st_gid)
    if stat.S_ISLNK(st.st_mode):
        result["state"] = "link"
    elif os.path.isdir(path):
        result["state"] = "directory"
    elif os.stat(path).st_nlink > 1:
        result["state"] = "hard"
    else:
        result["state"] = "file"
    return result


class ControllerModule:
    """What the controller steps use of AnsibleModule, for a step run inside its action plugin.

    `spec` is the module's own AnsibleModule keyword arguments (argument_spec, mutually_exclusive, ...), shared
    with the module file; `name` is the task's action as AnsibleModule names itself in an unsupported-parameter
    error. A validation error fails like the module (StepFailedError)."""

    def __init__(self, spec, args, name, check_mode=False, diff=False):
        self.check_mode, self._diff, self._name = bool(check_mode), bool(diff), name
        self.warnings = []
        validator = ArgumentSpecValidator(spec["argument_spec"], spec.get("mutually_exclusive"),
                                          spec.get("required_together"), spec.get("required_one_of"),
                                          spec.get("required_if"), spec.get("required_by"))
        args = as_json(args)
        validated = validator.validate(args)
        self.params = dict(args, **validated.validated_parameters)
        self.no_log_values = set(validated._no_log_values)
        try:
            error = validated.errors[0]
        except IndexError:
            error = None
        if error:  # even in check mode, as AnsibleModule
            msg = validated.errors.msg
            if isinstance(error, UnsupportedError):
                msg = "Unsupported parameters for (%s) module: %s" % (name, msg)
            self.fail_json(msg=msg)

    def warn(self, warning):
        self.warnings.append(warning)

    def get_bin_path(self, arg, required=False, opt_dirs=None):
        try:
            return get_bin_path(arg, opt_dirs=opt_dirs)
        except ValueError as exc:
            if required:
                self.fail_json(msg=str(exc))
            return None

    def _formatted(self, result):
        path_info(result)
        result.setdefault("invocation", {"module_args": self.params})
        if self.warnings:
            result["warnings"] = list(self.warnings)
        preserved = dict((k, v) for k, v in result.items() if v is None or isinstance(v, bool))
        result = remove_values(result, self.no_log_values)
        result.update(preserved)
        return as_json(result, _RESULT_CODEC)

    def exit_json(self, **kwargs):
        return self._formatted(kwargs)

    def fail_json(self, msg, exception=None, **kwargs):
        kwargs.update(failed=True, msg=str(msg))
        if isinstance(exception, str):  # a traceback text, as AnsibleModule takes it
            kwargs["exception"] = exception
        raise StepFailedError(self._formatted(kwargs))


def run_step(step, spec, args, name, check_mode=False, diff=False):
    """The result of a step run in this process. `step(module)` returns the keyword arguments of exit_json and
    ends a failure with module.fail_json (its module's main() passes them to AnsibleModule's)."""
    try:
        module = ControllerModule(spec, args, name, check_mode, diff)
        return module.exit_json(**step(module))
    except StepFailedError as exc:
        return exc.result


class ControllerStepAction(ActionBase):
    """A step (plugins/module_utils/_steps/<step>.py): `step(module)`, `module_spec()`, and optionally
    `host_facts(args, hostvars, hosts)` that fills arguments the task did not give from the engines' host variables
    (`hosts`: {inventory host: engine-<n>}, the fact narwhal_engines the opening play sets; `members`: {engine-<n>:
    its hosts, the head first}, the fact narwhal_members)."""

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
            args = self.host_facts(args, task_vars.get("hostvars") or {}, task_vars.get("narwhal_engines"),
                                   task_vars.get("narwhal_members"))
        if not self.runs_here():
            try:
                result.update(self._execute_module(module_args=args, task_vars=task_vars))
            finally:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        result.update(run_step(self.step, self.module_spec(), args, self._task.action,
                               check_mode=self._task.check_mode, diff=self._task.diff))
        return result
