# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_common/tools.py::file_sha256, the deliver stage's one file hash: a checkpoint's shard or an image archive is read
HASH_CHUNK (1 MiB) at a time, never whole."""

from __future__ import annotations

import hashlib
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common import tools


def test_a_large_file_is_hashed_one_mebibyte_at_a_time(tmp_path, monkeypatch):
    data = os.urandom(2 * tools.HASH_CHUNK + 12345)
    (tmp_path / "shard").write_bytes(data)
    reads = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def read(self, size=-1):
            reads.append(size)
            return self.fh.read(size)

    monkeypatch.setattr(tools, "open", lambda *a, **k: Spy(real_open(*a, **k)), raising=False)
    assert tools.file_sha256(str(tmp_path / "shard")) == hashlib.sha256(data).hexdigest()
    assert tools.HASH_CHUNK == 1024 * 1024 and reads == [tools.HASH_CHUNK] * 4  # three blocks, then the end
