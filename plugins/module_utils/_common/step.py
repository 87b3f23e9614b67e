# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a step is given and how it refuses. A step is the work of one task, a function `step(run) -> result` in its
stage's package (_inputs/site.py, _discover/outputs.py, _prepare/run.py, _probe/transfer.py, _bench/results.py,
_outputs/private_file.py). Its action plugin (plugins/plugin_utils/_action.py::StepAction, the way ansible-core's
set_fact is written) calls it in the controller's process; transfer_probe's module main() calls it on an engine host
too. Neither is an AnsibleModule: a step reads `run.params`, `run.check_mode` and `run.diff`, adds to `run.warnings`
and `run.secrets` (values its caller removes from the result, as AnsibleModule's no_log values), returns the
result's keys and ends a refusal with `raise StepError(msg, **keys)`.
"""

from __future__ import annotations

__metaclass__ = type


class StepError(Exception):
    """A step's refusal: `result` is the failed task's result (msg and the other keys given)."""

    def __init__(self, msg, **keys):
        super().__init__(msg)
        self.result = dict(keys, msg=str(msg))


class StepRun:
    """One run of a step: its validated parameters, the task's check and diff mode, what it warns and what must not
    be shown."""

    def __init__(self, params, check_mode=False, diff=False):
        self.params = params
        self.check_mode = bool(check_mode)
        self.diff = bool(diff)
        self.warnings = []
        self.secrets = set()
