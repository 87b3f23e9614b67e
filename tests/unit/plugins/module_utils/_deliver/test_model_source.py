# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_manifest (plugins/module_utils/_deliver/model_source.py), run as its action plugin runs it (conftest's
step_runner): the manifest of a checkpoint directory, the cache that spares an unchanged file a second hash, and the
refusals that name NARWHAL_MODEL_SOURCE."""

from __future__ import annotations

import json
import os
import stat

import pytest
from test_support.delivery import CHECKPOINT, expected_digest, expected_files, make_checkpoint, set_mtime

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import model_source


@pytest.fixture
def hashes(monkeypatch):
    """The paths the step hashes, in order (file_sha256 as model_source calls it, counted)."""
    seen = []
    real = model_source.file_sha256

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(model_source, "file_sha256", counting)
    return seen


@pytest.fixture
def site(tmp_path):
    """(source checkpoint, manifest file) of a project at tmp_path."""
    return make_checkpoint(tmp_path / "checkpoint"), tmp_path / "config" / "model-manifest.json"


def _args(src, dest, **more):
    return dict({"source": str(src), "dest": str(dest)}, **more)


def test_the_manifest_is_every_files_size_and_sha256_and_is_kept(step_runner, site):
    src, dest = site
    how, result = step_runner("model_manifest", _args(src, dest))
    assert how == "exit", result
    assert result["files"] == expected_files() and result["digest"] == expected_digest()
    assert result["count"] == len(CHECKPOINT) and result["bytes"] == sum(len(d) for d in CHECKPOINT.values())
    assert result["changed"] is True and result["source"] == str(src) and sorted(result["hashed"]) == sorted(CHECKPOINT)
    kept = json.loads(dest.read_text())
    assert kept["digest"] == expected_digest() and kept["files"] == expected_files() and kept["source"] == str(src)
    mtimes = {rel: (src / rel).stat().st_mtime_ns for rel in CHECKPOINT}
    assert kept["seen"] == {rel: [len(CHECKPOINT[rel]), mtimes[rel]] for rel in CHECKPOINT}
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644 and sorted(os.listdir(dest.parent)) == [dest.name]


def test_a_rerun_hashes_nothing_and_writes_nothing(step_runner, site, hashes):
    src, dest = site
    step_runner("model_manifest", _args(src, dest))
    assert len(hashes) == len(CHECKPOINT)
    before, inode = dest.read_bytes(), dest.stat().st_ino
    del hashes[:]
    how, result = step_runner("model_manifest", _args(src, dest))
    assert how == "exit" and result["changed"] is False and result["hashed"] == [] and hashes == []
    assert result["digest"] == expected_digest() and dest.read_bytes() == before and dest.stat().st_ino == inode


def test_only_a_file_whose_size_or_mtime_changed_is_hashed_again(step_runner, site, hashes):
    src, dest = site
    step_runner("model_manifest", _args(src, dest))
    shard = src / "shards" / "model-00002-of-00002.safetensors"
    changed = dict(CHECKPOINT, **{"shards/model-00002-of-00002.safetensors": b"\x09\x02\x03" * 1000})
    mtime = shard.stat().st_mtime_ns
    shard.write_bytes(changed["shards/model-00002-of-00002.safetensors"])  # the same size
    set_mtime(shard, mtime + 1_000_000_000)
    del hashes[:]
    how, result = step_runner("model_manifest", _args(src, dest))
    assert how == "exit" and result["hashed"] == ["shards/model-00002-of-00002.safetensors"] and len(hashes) == 1
    assert result["digest"] == expected_digest(changed) != expected_digest() and result["changed"] is True
    assert json.loads(dest.read_text())["digest"] == expected_digest(changed)


def test_the_cache_of_another_directory_or_a_damaged_one_is_not_used(step_runner, site, hashes, tmp_path):
    src, dest = site
    step_runner("model_manifest", _args(src, dest))
    other = make_checkpoint(tmp_path / "other")
    for rel in CHECKPOINT:  # the same names, sizes and mtimes: still another directory
        set_mtime(other / rel, (src / rel).stat().st_mtime_ns)
    del hashes[:]
    how, result = step_runner("model_manifest", _args(other, dest))
    assert how == "exit" and len(hashes) == len(CHECKPOINT) and result["source"] == str(other)
    dest.write_text("{not json")
    del hashes[:]
    how, result = step_runner("model_manifest", _args(other, dest))
    assert how == "exit" and len(hashes) == len(CHECKPOINT) and result["changed"] is True
    assert json.loads(dest.read_text())["source"] == str(other)


def test_check_mode_returns_the_manifest_and_writes_nothing(step_runner, site):
    src, dest = site
    how, result = step_runner("model_manifest", _args(src, dest), check_mode=True)
    assert how == "exit" and result["changed"] is True and result["digest"] == expected_digest()
    assert not dest.exists() and not dest.parent.exists()


def test_a_relative_source_is_the_projects_and_links_inside_are_followed(step_runner, tmp_path):
    project = tmp_path / "project"
    files = dict(CHECKPOINT)
    make_checkpoint(project / "models" / "m", files)
    (project / "models" / "m" / "tokenizer.model").symlink_to("tokenizer.json")  # inside: a file of the checkpoint
    (project / "models" / "m" / ".cache" / "huggingface").mkdir(parents=True)  # a download tool's: not the model's
    (project / "models" / "m" / ".cache" / "huggingface" / "x.lock").write_text("")
    (project / "models" / "m" / ".narwhal-manifest.json").write_text("{}")  # a host's STAMP: never the model's
    how, result = step_runner("model_manifest", {"source": "models/m", "root": str(project),
                                                 "dest": str(project / "config" / "model-manifest.json")})
    assert how == "exit", result
    files["tokenizer.model"] = CHECKPOINT["tokenizer.json"]
    assert result["files"] == expected_files(files) and result["source"] == str(project / "models" / "m")


def test_mistral_params_json_is_a_checkpoint_too(step_runner, tmp_path):
    src = make_checkpoint(tmp_path / "m", {"params.json": b"{}", "consolidated.safetensors": b"x"})
    how, result = step_runner("model_manifest", _args(src, tmp_path / "model-manifest.json"))
    assert how == "exit" and result["count"] == 2


def _refusal(step_runner, src, dest):
    how, result = step_runner("model_manifest", _args(src, dest))
    assert how == "fail" and result["input"] == "NARWHAL_MODEL_SOURCE", result
    assert result["msg"].startswith("NARWHAL_MODEL_SOURCE: ") and not dest.exists()
    return result["msg"]


def test_refusals_name_the_input_the_path_and_the_fix(step_runner, tmp_path):
    dest = tmp_path / "config" / "model-manifest.json"
    msg = _refusal(step_runner, tmp_path / "absent", dest)
    assert "%s is not a directory on the controller" % (tmp_path / "absent") in msg
    assert "set NARWHAL_MODEL_SOURCE" in msg
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    (tmp_path / "empty" / ".git" / "HEAD").write_text("ref")
    assert "%s holds no files" % (tmp_path / "empty") in _refusal(step_runner, tmp_path / "empty", dest)
    no_config = make_checkpoint(tmp_path / "no-config", {"model.safetensors": b"w", "tokenizer.json": b"{}"})
    msg = _refusal(step_runner, no_config, dest)
    assert "%s has no config.json" % no_config in msg and "or unset it" in msg


def test_a_link_out_of_the_directory_is_refused(step_runner, tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"weights")
    snapshot = make_checkpoint(tmp_path / "snapshot", {"config.json": b"{}"})
    (snapshot / "model.safetensors").symlink_to("../blobs/abc")
    msg = _refusal(step_runner, snapshot, tmp_path / "model-manifest.json")
    assert "%s/model.safetensors is a symbolic link to ../blobs/abc, outside the directory" % snapshot in msg
    assert "cp -rL" in msg and "point NARWHAL_MODEL_SOURCE at the copy" in msg
    (snapshot / "model.safetensors").unlink()
    (snapshot / "loop").symlink_to(".")
    assert "%s/loop" % snapshot in _refusal(step_runner, snapshot, tmp_path / "model-manifest.json")
    (snapshot / "loop").unlink()
    (snapshot / "dangling").symlink_to("nowhere")
    assert "not a regular file" in _refusal(step_runner, snapshot, tmp_path / "model-manifest.json")
