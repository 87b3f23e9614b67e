# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host's side of the checkpoint delivery (plugins/module_utils/_deliver/model_host.py): the walk the source and the
hosts share, the chunked sha256, the STAMP and the rsync options of the sync; the module's states are
tests/unit/plugins/modules/test_model_delivery.py."""

from __future__ import annotations

import hashlib
import os

from test_support.delivery import CHECKPOINT, make_checkpoint

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import model_host
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP


def test_the_walk_names_regular_files_and_leaves_out_the_stamp_and_dot_directories(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    (root / STAMP).write_text("{}")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("x")
    (root / "shards" / ".cache").mkdir()
    (root / "shards" / ".cache" / "lock").write_text("")
    (root / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # a dot file is a file of the checkpoint
    (root / "alias.json").symlink_to("config.json")
    (root / "outside").symlink_to(tmp_path)
    os.mkfifo(root / "pipe")
    files, links_out, odd = model_host.checkpoint_files(str(root))
    assert sorted(files) == sorted(list(CHECKPOINT) + [".gitattributes", "alias.json"])
    assert files["alias.json"].st_size == len(CHECKPOINT["config.json"])  # the link followed
    assert links_out == [("outside", str(tmp_path))] and odd == ["pipe"]
    assert sorted(model_host.checkpoint_files(str(root / "shards"))[0]) == ["model-00002-of-00002.safetensors"]


def test_the_stamp_is_the_manifest_with_each_files_mtime(tmp_path):
    root = make_checkpoint(tmp_path / "m", {"config.json": b"{}"})
    files = {"config.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}}
    stats = model_host.checkpoint_files(str(root))[0]
    document = model_host.stamp_document("sha256:d", files, stats)
    assert document == {"version": 1, "digest": "sha256:d", "files": {"config.json": dict(
        files["config.json"], mtime_ns=stats["config.json"].st_mtime_ns)}}
    assert model_host.read_stamp(str(root)) is None
    (root / STAMP).write_text("not json")
    assert model_host.read_stamp(str(root)) is None
    (root / STAMP).write_text('{"digest": "sha256:d", "files": {"a": {"size": 1}}}')  # no sha256: not a STAMP
    assert model_host.read_stamp(str(root)) is None


def test_the_sync_links_what_the_checkpoint_in_place_holds_and_skips_what_is_not_the_models():
    assert model_host.rsync_opts("/srv/models/m", False) == ["--exclude=/" + STAMP, "--exclude=.*/"]
    assert model_host.rsync_opts("/srv/models/m", True) == ["--exclude=/" + STAMP, "--exclude=.*/",
                                                            "--link-dest=/srv/models/m"]
