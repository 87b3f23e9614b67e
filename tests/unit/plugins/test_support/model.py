# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint directories made from the recorded model configs (tests/fixtures/real/models)."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP, manifest
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


def stamp(path, digest=None):
    """Stamp checkpoint dir `path` as the deliver stage does after its full check: STAMP holds the manifest of its
    files (sha256 and size, plus the mtime_ns the fast check compares); `digest` replaces the true one. -> the
    manifest {"version", "digest", "files"} (canonical)."""
    files, seen = {}, {}
    for item in sorted(pathlib.Path(path).rglob("*")):
        rel = item.relative_to(path).as_posix()
        if item.is_file() and rel != STAMP:
            data = item.read_bytes()
            files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            seen[rel] = dict(files[rel], mtime_ns=item.stat().st_mtime_ns)
    document = manifest(files)
    (pathlib.Path(path) / STAMP).write_text(json.dumps(dict(document, files=seen, digest=digest or document["digest"])))
    return document
