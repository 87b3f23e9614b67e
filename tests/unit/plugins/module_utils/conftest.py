# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pytest fixtures of the prepare tests (_prepare/test_checks.py, _steps/test_prepare_run.py):
the example launch config, its records, and its P/D-compatible variant."""
import copy

import pytest
from test_support.prepare import EXAMPLE, compatible


@pytest.fixture
def launch():
    return copy.deepcopy(EXAMPLE)


@pytest.fixture
def records(launch):
    return launch["engines"]


@pytest.fixture
def pd_launch():
    return compatible(copy.deepcopy(EXAMPLE))
