# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pytest fixtures of the prepare tests (_prepare/test_checks.py, _prepare/test_run.py):
the hand-shaped launch config (tests/fixtures/hand-shaped), its records, and its P/D-compatible variant."""
import copy

import pytest
from test_support.prepare import HAND_LAUNCH, compatible


@pytest.fixture
def launch():
    return copy.deepcopy(HAND_LAUNCH)


@pytest.fixture
def records(launch):
    return launch["engines"]


@pytest.fixture
def pd_launch():
    return compatible(copy.deepcopy(HAND_LAUNCH))
