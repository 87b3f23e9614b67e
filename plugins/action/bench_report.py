# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.bench_report, the action plugin (documentation: plugins/modules/bench_report.py).
Writes one benchmark run's directory in this process (no module process)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.results import bench_report, module_spec
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction


class ActionModule(StepAction):
    step = staticmethod(bench_report)
    module_spec = staticmethod(module_spec)
