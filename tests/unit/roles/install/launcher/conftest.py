"""The launcher runs here from its source tree, as launcher_path() (narwhal_launcher/common.py) expects of tests:
sys.argv[0] names that tree, whatever started the test process (pytest, or a pytest-xdist worker, whose argv[0]
is '-c')."""

import os
import sys

import pytest

LAUNCHER_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..", "roles", "install", "files",
                            "launcher")


@pytest.fixture(autouse=True)
def _launcher_argv0(monkeypatch):
    monkeypatch.setattr(sys, "argv", [os.path.abspath(LAUNCHER_DIR)] + sys.argv[1:])
