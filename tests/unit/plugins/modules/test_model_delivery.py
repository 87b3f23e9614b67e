# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_delivery (plugins/modules/model_delivery.py, its work in _deliver/model_host.py) on real directories: a
commit checks the synced copy whole, stamps it and swaps it into place or leaves the checkpoint untouched; a check
matches what a commit left, the fast path sees a size or mtime change, the full one same-size damage."""

from __future__ import annotations

import json
import os

import pytest
from test_support.delivery import (
    CHECKPOINT,
    copy_checkpoint,
    expected_digest,
    expected_files,
    make_checkpoint,
    set_mtime,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP
from ansible_collections.narwhal.deploy.plugins.modules import model_delivery

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def src(tmp_path):
    return make_checkpoint(tmp_path / "source")


@pytest.fixture
def dest(tmp_path):
    (tmp_path / "models").mkdir()
    return tmp_path / "models" / "m"


def _partial(dest):
    return dest.parent / (dest.name + ".narwhal-partial")


def _check(module_runner, path, verify="fast", files=None):
    return module_runner(model_delivery.main, {"state": "check", "path": str(path), "verify": verify,
                                               "digest": expected_digest(files), "files": expected_files(files)})


def _commit(module_runner, dest, files=None, **more):
    return module_runner(model_delivery.main, dict({
        "state": "commit", "path": str(_partial(dest)), "dest": str(dest), "digest": expected_digest(files),
        "files": expected_files(files)}, **more))


def _delivered(module_runner, src, dest):
    copy_checkpoint(src, _partial(dest))
    how, result = _commit(module_runner, dest)
    assert how == "exit", result
    return result


def test_a_host_without_the_checkpoint_gets_all_of_it(module_runner, src, dest):
    how, result = _check(module_runner, dest)
    assert how == "exit" and result["changed"] is False
    assert result["match"] is False and result["exists"] is False and result["parent_exists"] is True
    assert result["differing"] == sorted(CHECKPOINT)
    assert result["rsync_opts"] == ["--exclude=/" + STAMP, "--exclude=.*/"]
    result = _delivered(module_runner, src, dest)
    assert result["changed"] is True and result["previous"] is None and result["digest"] == expected_digest()
    assert result["received"] == sorted(CHECKPOINT) and result["replaced"] == []
    assert result["received_bytes"] == sum(len(d) for d in CHECKPOINT.values())
    assert not _partial(dest).exists() and {rel: (dest / rel).read_bytes() for rel in CHECKPOINT} == CHECKPOINT
    stamp = json.loads((dest / STAMP).read_text())
    assert stamp["digest"] == expected_digest() and stamp["version"] == 1
    assert stamp["files"] == {rel: dict(entry, mtime_ns=(dest / rel).stat().st_mtime_ns)
                              for rel, entry in expected_files().items()}


@pytest.mark.parametrize("verify", ["fast", "full"])
def test_a_delivered_checkpoint_matches(module_runner, src, dest, verify):
    _delivered(module_runner, src, dest)
    how, result = _check(module_runner, dest, verify)
    assert how == "exit" and result["match"] is True and result["differing"] == [] and result["damaged"] == []
    assert result["stamp_digest"] == expected_digest() and "holds the manifest" in result["reason"]
    assert result["rsync_opts"][-1] == "--link-dest=%s" % dest


def test_the_fast_path_sees_a_size_or_mtime_change_and_an_extra_file(module_runner, src, dest):
    _delivered(module_runner, src, dest)
    with open(dest / "tokenizer.json", "ab") as fh:
        fh.write(b" ")
    set_mtime(dest / "config.json", (dest / "config.json").stat().st_mtime_ns + 10**9)
    (dest / "model-00003.safetensors").write_bytes(b"stray")
    how, result = _check(module_runner, dest)
    assert how == "exit" and result["match"] is False
    assert result["differing"] == ["config.json", "model-00003.safetensors", "tokenizer.json"]
    assert result["difference"] == ("config.json (modified since its last check), model-00003.safetensors (not in "
                                    "the manifest), tokenizer.json (20 bytes, expected 19)")
    assert "differs from the manifest %s" % expected_digest() in result["reason"]


def test_same_size_damage_passes_the_fast_path_and_the_full_check_finds_it(module_runner, src, dest):
    _delivered(module_runner, src, dest)
    shard = dest / SHARD
    mtime, data = shard.stat().st_mtime_ns, bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    set_mtime(shard, mtime)  # bit rot: the same size and mtime
    assert _check(module_runner, dest)[1]["match"] is True
    how, result = _check(module_runner, dest, "full")
    assert how == "exit" and result["match"] is False
    assert result["differing"] == [SHARD] and result["damaged"] == [SHARD]
    assert result["difference"] == "%s (sha256 differs)" % SHARD


def test_right_files_without_a_stamp_do_not_match_until_a_commit(module_runner, src, dest):
    copy_checkpoint(src, dest)  # copied by hand
    for verify in ("fast", "full"):
        how, result = _check(module_runner, dest, verify)
        assert how == "exit" and result["match"] is False and result["stamp_digest"] is None
    assert result["differing"] == [] and STAMP in result["reason"]


def test_a_commit_swaps_keeps_the_previous_and_names_what_it_received(module_runner, src, dest):
    _delivered(module_runner, src, dest)
    new = dict(CHECKPOINT, **{"tokenizer.json": b'{"version": "1.1"}\n'})
    partial = _partial(dest)
    for rel in CHECKPOINT:  # what rsync --link-dest makes: unchanged files hard-linked, the changed one written
        (partial / rel).parent.mkdir(parents=True, exist_ok=True)
        if new[rel] == CHECKPOINT[rel]:
            os.link(dest / rel, partial / rel)
    (partial / "tokenizer.json").write_bytes(new["tokenizer.json"])
    how, result = _commit(module_runner, dest, new)
    assert how == "exit" and result["changed"] is True, result
    assert result["received"] == ["tokenizer.json"] and result["replaced"] == ["tokenizer.json"]
    assert result["received_bytes"] == len(new["tokenizer.json"])
    previous = dest.parent / (dest.name + ".narwhal-previous")
    assert result["previous"] == str(previous) and (previous / "tokenizer.json").read_bytes() == CHECKPOINT[
        "tokenizer.json"]
    assert (dest / "tokenizer.json").read_bytes() == new["tokenizer.json"]
    assert json.loads((dest / STAMP).read_text())["digest"] == expected_digest(new)
    assert _check(module_runner, dest, files=new)[1]["match"] is True
    _delivered(module_runner, src, dest)  # an older previous is replaced
    assert (previous / "tokenizer.json").read_bytes() == new["tokenizer.json"]


def test_a_copy_that_differs_is_refused_and_the_checkpoint_left_as_it_was(module_runner, src, dest):
    _delivered(module_runner, src, dest)
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    partial = copy_checkpoint(src, _partial(dest))
    (partial / SHARD).write_bytes(b"\0" * len(CHECKPOINT[SHARD]))
    (partial / "config.json").unlink()
    how, result = _commit(module_runner, dest)
    assert how == "fail"
    assert result["msg"] == (
        "the copy at %s does not match the manifest %s: config.json (missing), %s (sha256 differs); rerun the deliver "
        "stage (ansible-playbook narwhal.deploy.deliver), which syncs the copy again comparing every file by checksum"
        % (partial, expected_digest(), SHARD))
    assert result["differing"] == ["config.json", SHARD]
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    assert partial.is_dir() and not (partial / STAMP).exists()  # the copy stays for the next sync, unstamped
    (partial / "config.json").write_bytes(CHECKPOINT["config.json"])
    (partial / SHARD).write_bytes(CHECKPOINT[SHARD])
    (partial / "notes.txt").write_text("extra")
    how, result = _commit(module_runner, dest)
    assert how == "fail" and "notes.txt (not in the manifest)" in result["msg"] and result["differing"] == ["notes.txt"]


def test_a_rerun_without_a_copy_is_no_change_and_a_missing_copy_is_refused(module_runner, src, dest):
    how, result = _commit(module_runner, dest)
    assert how == "fail" and "no copy of the checkpoint at %s to move into %s" % (_partial(dest), dest) in result["msg"]
    _delivered(module_runner, src, dest)
    how, result = _commit(module_runner, dest)
    assert how == "exit" and result["changed"] is False and result["previous"] is None


def test_check_mode_commits_nothing(module_runner, src, dest):
    partial = copy_checkpoint(src, _partial(dest))
    how, result = _commit(module_runner, dest, _ansible_check_mode=True)
    assert how == "exit" and result["changed"] is True
    assert partial.is_dir() and not dest.exists() and not (partial / STAMP).exists()


def test_a_manifest_whose_files_are_not_its_digest_is_refused(module_runner, src, dest):
    copy_checkpoint(src, _partial(dest))
    how, result = module_runner(model_delivery.main, {
        "state": "commit", "path": str(_partial(dest)), "dest": str(dest), "digest": "sha256:" + "0" * 64,
        "files": expected_files()})
    assert how == "fail"
    assert "is not sha256:%s (its files digest to %s)" % ("0" * 64, expected_digest()) in result["msg"]
    assert not dest.exists()


def test_a_host_without_rsync_is_told_to_install_it(module_runner, dest, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(os.path, "exists", lambda p, real=os.path.exists: real(p) and not p.endswith("/rsync"))
    how, result = _check(module_runner, dest)
    assert how == "fail" and result["msg"] == ("%s does not hold the checkpoint and this host has no rsync, which the "
                                               "deliver stage syncs it with: install rsync (apt-get install rsync, dnf "
                                               "install rsync)" % dest)
    assert result["differing"] == sorted(CHECKPOINT)
