# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The .env reader (plugins/module_utils/_inputs/dotenv.py): values stay
literal, here and in scripts/narwhal-fleet; a FIFO is named."""

import json
import os
import subprocess
import sys

import pytest
from test_support.inputs import TOKEN
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import (
    DotenvError,
    parse_dotenv,
    read_dotenv,
)


def test_dotenv_values_are_literal(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    values = parse_dotenv('A=${HOME}/x\nB="${HF_TOKEN}"\nC=${HF_TOKEN:-fallback}\nD=$HOME\n')
    assert values == {"A": "${HOME}/x", "B": "${HF_TOKEN}", "C": "${HF_TOKEN:-fallback}", "D": "$HOME"}


def test_fleet_cli_keeps_dotenv_values_literal(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"iid": "n1", "url": "${NARWHAL_NODE_1_URL}", "model": "${MODEL_DIR}"}]))
    (tmp_path / "site.env").write_text("MODEL_DIR=${HOME}/models\n")
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=http://10.0.0.11:8000\n")
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(fleet),
           "--env-file", str(tmp_path / "site.env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env.update(HOME="/home/operator")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [{"iid": "n1", "url": "http://10.0.0.11:8000", "model": "${HOME}/models"}]
    with pytest.raises(DotenvError, match="is a FIFO"):
        os.mkfifo(tmp_path / "fifo.env")
        read_dotenv(str(tmp_path / "fifo.env"))
