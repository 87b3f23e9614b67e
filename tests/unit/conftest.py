"""Shared test setup: make `ansible_collections.narwhal.deploy` importable from a plain checkout
(collections/ansible_collections/narwhal/deploy is a link to the repository root), make the shared helpers
importable as `test_support` (tests/unit/plugins/test_support), and run modules' main() and the controller steps.

The test tree mirrors what it tests (tests/unit/plugins/module_utils/_facts/test_gpu.py tests
plugins/module_utils/_facts/gpu.py; tests/unit/roles/install/launcher/ the launcher). Test files are imported with
pytest's --import-mode=importlib (pyproject.toml), so files of one name may stand in different folders and no
test folder needs an __init__.py; a test module imports helpers from test_support, never from another test module.
"""
import importlib
import pathlib
import sys

import pytest
from ansible.module_utils import _internal, basic
from ansible.module_utils.testing import patch_module_args

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "plugins"))  # test_support


class ExitJsonError(Exception):
    pass


class FailJsonError(Exception):
    pass


@pytest.fixture
def module_runner(monkeypatch):
    """Run a module's main() with arguments; returns ("exit"|"fail", result) instead of exiting."""

    def exit_json(self, **kwargs):
        raise ExitJsonError(kwargs)

    def fail_json(self, **kwargs):
        raise FailJsonError(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    # a module runs in a process of its own: its warnings are returned with the result, never sent to the
    # controller's Display (which they would be once a test imported a controller plugin in this process)
    monkeypatch.setattr(_internal, "is_controller", False)

    def run(main, args):
        with patch_module_args(args):
            try:
                main()
            except ExitJsonError as exc:
                return "exit", exc.args[0]
            except FailJsonError as exc:
                return "fail", exc.args[0]
        raise AssertionError("module returned without exit_json/fail_json")

    return run


@pytest.fixture
def dev(tmp_path):
    """A host's /dev with the NVIDIA control nodes the GPU facts look for (the per-GPU nodes come from the facts
    builders in test_support.records)."""
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (root / name).write_text("")
    return root


@pytest.fixture
def step_runner():
    """Run a controller step as its action plugin does (plugins/plugin_utils/_action.py::run_step: the arguments
    validated against its spec, then the step in this process): step_runner("prepare_run", args, check_mode=False,
    diff=False) -> ("exit"|"fail", result); the step's warnings are the result's `warnings`."""

    def run(name, args, check_mode=False, diff=False):
        args = dict(args)  # a module's check and diff mode arguments (test_support.records.module_args) as the task's
        check_mode = args.pop("_ansible_check_mode", check_mode)
        diff = args.pop("_ansible_diff", diff)
        from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import run_step

        action = importlib.import_module("ansible_collections.narwhal.deploy.plugins.action.%s" % name).ActionModule
        result = run_step(action.step, action.module_spec(), args, "narwhal.deploy.%s" % name, check_mode, diff)
        return ("fail" if result.get("failed") else "exit"), result

    return run
