# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a set of generated files as one set: all staged and validated first, then swapped in.

A file whose content and mode are unchanged is not touched (idempotence). When a swap fails half-way the
files already replaced are restored, so the previous set stays byte-for-byte intact.
"""

from __future__ import annotations

import os
import stat
import tempfile

__metaclass__ = type


def _current(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(), stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None, None


def _bytes(content):
    return content if isinstance(content, bytes) else content.encode("utf-8")


def plan_set(files, remove=()):
    """files: {path: (text or bytes, mode)} -> list of changes [(path, before_text_or_None, after_or_None, mode)]."""
    changes = []
    for path in sorted(files):
        text, mode = files[path]
        data, cur_mode = _current(path)
        if data is None or data != _bytes(text) or cur_mode != mode:
            changes.append((path, None if data is None else data.decode("utf-8", "replace"), text, mode))
    for path in sorted(set(remove) - set(files)):
        data, _mode = _current(path)
        if data is not None:
            changes.append((path, data.decode("utf-8", "replace"), None, None))
    return changes


def apply_set(changes):
    """Stage every new file next to its target, then replace them all; roll back on failure."""
    staged, backups, done = [], [], []
    try:
        for path, _before, after, mode in changes:
            if after is None:
                continue
            directory = os.path.dirname(path) or "."
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".narwhal-", dir=directory)
            with os.fdopen(fd, "wb") as fh:
                fh.write(_bytes(after))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            staged.append((tmp, path))
        for path, before, _after, _mode in changes:
            if before is not None:
                fd, bak = tempfile.mkstemp(prefix=".narwhal-bak-", dir=os.path.dirname(path) or ".")
                os.close(fd)
                os.unlink(bak)
                os.link(path, bak)
                backups.append((bak, path))
        for tmp, path in staged:
            os.replace(tmp, path)
            done.append(path)
        for path, _before, after, _mode in changes:
            if after is None:
                os.unlink(path)
                done.append(path)
    except Exception:
        for bak, path in backups:
            os.replace(bak, path)  # a no-op when path is still the same inode: finally removes the link
        for tmp, _path in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        for path, before, _after, _mode in changes:
            if before is None and path in done and os.path.exists(path):
                os.unlink(path)
        raise
    finally:
        for bak, _path in backups:
            if os.path.exists(bak):
                os.unlink(bak)
    return [c[0] for c in changes]
