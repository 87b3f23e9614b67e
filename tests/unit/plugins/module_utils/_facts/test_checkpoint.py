# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint reader's manifest (plugins/module_utils/_facts/checkpoint.py::read_stamp): the STAMP the deliver
stage writes into NARWHAL_MODEL_PATH, read by discovery (narwhal_model.manifest) with its digest recomputed.
The config reads are tests/unit/plugins/module_utils/_facts/test_model.py's."""

from __future__ import annotations

import json
import os

import pytest
from test_support.model import checkpoint, stamp

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP, manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import checkpoint as _checkpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import ModelConfigError

QWEN = "aiconf__Qwen--Qwen2.5-7B"


def _stamped(tmp_path):
    path = checkpoint(tmp_path, QWEN)
    (path / "model-00001-of-00002.safetensors").write_bytes(b"\x01" * 100)
    (path / "sub").mkdir()
    (path / "sub" / "extra.bin").write_bytes(b"\x02" * 7)
    return path, stamp(path)


def test_no_stamp_no_manifest_and_the_facts_of_before(tmp_path):
    path = checkpoint(tmp_path, QWEN)
    facts = _checkpoint.read_checkpoint(str(path))
    assert "manifest" not in facts
    assert _checkpoint.read_stamp(str(path)) is None


def test_a_stamp_is_read_with_its_digest_recomputed_and_the_host_mtimes_left_out(tmp_path):
    path, document = _stamped(tmp_path)
    facts = _checkpoint.read_checkpoint(str(path))
    assert facts["manifest"] == {"digest": document["digest"], "files": document["files"]}
    assert facts["manifest"]["digest"] == manifest_digest(document["files"])
    assert set(facts["manifest"]["files"]) == {"config.json",
                                               "model-00001-of-00002.safetensors", "sub/extra.bin"}
    assert facts["manifest"]["files"]["sub/extra.bin"] == {"size": 7, "sha256": document["files"]["sub/extra.bin"][
        "sha256"]}
    raw = json.loads((path / STAMP).read_text())
    assert "mtime_ns" in raw["files"]["sub/extra.bin"]  # the STAMP's own, not the fact's


def test_a_stamp_whose_digest_is_not_its_files_is_refused_naming_it_and_the_fix(tmp_path):
    path = checkpoint(tmp_path, QWEN)
    stamp(path, digest="sha256:" + "0" * 64)
    with pytest.raises(ModelConfigError) as err:
        _checkpoint.read_checkpoint(str(path))
    text = str(err.value)
    assert str(path / STAMP) in text
    assert "sha256:" + "0" * 64 in text
    assert "rerun the deliver stage (ansible-playbook narwhal.deploy.deliver" in text


def test_an_edited_files_map_is_refused(tmp_path):
    path, _document = _stamped(tmp_path)
    raw = json.loads((path / STAMP).read_text())
    raw["files"]["sub/extra.bin"]["sha256"] = "f" * 64
    (path / STAMP).write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError, match="was changed after the deliver stage wrote it"):
        _checkpoint.read_stamp(str(path))


@pytest.mark.parametrize("text, why", [
    ('{"digest": "sha256:', "is not valid JSON"),
    ("\xff\xfe", "is not valid JSON"),
    ("[1, 2]", "is damaged"),
    ('{"digest": "sha256:x"}', "is damaged"),
    ('{"digest": "sha256:x", "files": {"a": {"size": 1}}}', "is damaged"),
    ('{"digest": "sha256:x", "files": {"a": {"size": "many", "sha256": "ab"}}}', "is damaged"),
    ('{"digest": "sha256:x", "files": {"a": 3}}', "is damaged"),
])
def test_an_unreadable_stamp_is_a_clear_failure(tmp_path, text, why):
    path = checkpoint(tmp_path, QWEN)
    (path / STAMP).write_bytes(text.encode("latin-1"))
    with pytest.raises(ModelConfigError) as err:
        _checkpoint.read_checkpoint(str(path))
    assert why in str(err.value)
    assert str(path / STAMP) in str(err.value)
    assert "rerun the deliver stage" in str(err.value)


def test_a_stamp_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    path = checkpoint(tmp_path, QWEN)
    os.mkfifo(path / STAMP)
    with pytest.raises(ModelConfigError, match="cannot read the model manifest .*FIFO"):
        _checkpoint.read_stamp(str(path))


def test_a_dangling_stamp_link_is_refused(tmp_path):
    path = checkpoint(tmp_path, QWEN)
    (path / STAMP).symlink_to(tmp_path / "gone")
    with pytest.raises(ModelConfigError, match="cannot read the model manifest .*No such file"):
        _checkpoint.read_stamp(str(path))
