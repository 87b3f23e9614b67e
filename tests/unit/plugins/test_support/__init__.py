# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared helpers of the unit tests, imported as `test_support` (tests/unit/conftest.py puts tests/unit/plugins on
sys.path). A test module imports from here, from conftest fixtures, the collection and libraries: never from another
test module. The paths below are the one place that knows how deep this folder sits in the checkout."""
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[4]  # tests/unit/plugins/test_support -> the checkout
REAL = REPO / "tests" / "fixtures" / "real"  # recorded outputs of real tools and real configs
PROFILES = REPO / "tests" / "harness" / "profiles"  # the simulated hosts' trees
STANDIN_SITE = REPO / "tests" / "harness" / "images" / "engine-standin" / "site"  # the stand-in engine's Python
