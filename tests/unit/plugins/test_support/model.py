# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint directories made from the recorded model configs (tests/fixtures/real/models)."""

from __future__ import annotations

import shutil

from test_support.paths import REAL

MODELS = REAL / "models"


def checkpoint(tmp_path, src, extra=()):
    """A checkpoint dir holding <src>__config.json as config.json (+ tokenizer_config.json when captured)."""
    path = tmp_path / src
    path.mkdir()
    shutil.copyfile(MODELS / (f"{src}__config.json"), path / "config.json")
    tokenizer = MODELS / (f"{src}__tokenizer_config.json")
    if tokenizer.exists():
        shutil.copyfile(tokenizer, path / "tokenizer_config.json")
    for name in extra:
        (path / name).write_text("{}")
    return path
