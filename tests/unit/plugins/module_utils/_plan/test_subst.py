# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Complete-value substitution (plugins/module_utils/_plan/subst.py) and
scripts/narwhal-fleet, which resolves the fleet with it."""

import json
import os
import subprocess
import sys

import pytest
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import (
    SubstitutionError,
    layered_env,
    resolve_values,
)

ENV = {"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000", "EMPTY": ""}


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"url": "${NARWHAL_NODE_1_URL}"}, {"url": "http://10.0.0.11:8000"}),
        ([{"a": ["${EMPTY}", 3, None]}], [{"a": ["", 3, None]}]),
        ({"plain": "$HOME and {braces}"}, {"plain": "$HOME and {braces}"}),
    ],
)
def test_complete_values_resolve(data, expected):
    assert resolve_values(data, ENV) == expected


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"url": "http://${HOST}:8000"}, "not a complete"),
        ({"url": "${NARWHAL_NODE_1_URL}/v1"}, "not a complete"),
        ({"url": "${ NARWHAL_NODE_1_URL }"}, "not a complete"),
        ({"url": "${UNSET_NAME}"}, "${UNSET_NAME} is not set"),
        ({"x": ["${1BAD}"]}, "$.x[0]"),
    ],
)
def test_substitution_errors_name_the_value(data, needle):
    with pytest.raises(SubstitutionError) as err:
        resolve_values(data, ENV)
    assert needle in str(err.value)


def test_substitution_is_not_recursive_and_layers():
    env = layered_env({"A": "process"}, {"A": "dotenv", "B": "${C}"}, {"A": "generated", "C": "x", "D": "gen"})
    assert env["A"] == "process" and env["D"] == "gen"
    assert resolve_values({"b": "${B}"}, env) == {"b": "${C}"}


def test_fleet_cli_prints_resolved_fleet_and_fails_on_unset(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"iid": "n1", "url": "${NARWHAL_NODE_1_URL}"}]))
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=http://[fd00::11]:8000\n")
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(fleet),
           "--env-file", str(tmp_path / "none.env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [{"iid": "n1", "url": "http://[fd00::11]:8000"}]
    (tmp_path / "deployment.env").write_text("")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 1 and "${NARWHAL_NODE_1_URL} is not set" in bad.stderr
