# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkout's paths for the unit tests: the one place that knows how deep tests/unit/plugins/test_support sits.

test_support is the package of the tests' shared helpers (tests/unit/conftest.py puts tests/unit/plugins on
sys.path; its __init__.py stays empty, as ansible-test's empty-init sanity test requires under tests/unit/plugins).
A test module imports from test_support, conftest fixtures, the collection and libraries: never from another test
module."""
import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[4]  # tests/unit/plugins/test_support -> the checkout
REAL = REPO / "tests" / "fixtures" / "real"  # recorded outputs of real tools and real configs
RECORDED = REPO / "tests" / "fixtures" / "recorded"  # real engines' answers recorded on this project's machine
# the launch config shaped by hand for the tests (not discovery's output: tests/fixtures/hand-shaped/README.md)
HAND_LAUNCH_CONFIG = REPO / "tests" / "fixtures" / "hand-shaped" / "launch-config.nvidia-tcp.amd-rdma.json"
PROFILES = REPO / "tests" / "harness" / "profiles"  # the simulated hosts' trees
STANDIN_SITE = REPO / "tests" / "harness" / "images" / "engine-standin" / "site"  # the stand-in engine's Python
GUARD = REPO / "roles" / "install" / "files" / "guard" / "narwhal_guard.py"  # the engines' key guard (install puts it)


def load_file(name, path):
    """The module of a Python file that is not importable by name (a script of scripts/, the stand-in's files)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
