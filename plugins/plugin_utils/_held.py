# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of a held read (plugins/module_utils/_common/held.py is the host's): each wanted path's `src`,
a file on the controller, becomes the sha256 of its content, so that the module compares it on the host and no
digest is logged. The action plugins of held_files and engine_prereqs (its `held`) call with_digests."""

from __future__ import annotations

import hashlib

__metaclass__ = type


def controller_sha256(path):
    """sha256 (hex) of a controller file's content; '' when it does not exist (an empty sha256 matches no host
    file, so the path differs and the role writes or fetches it)."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                sha.update(chunk)
    except FileNotFoundError:
        return ""
    return sha.hexdigest()


def with_digests(files):
    """A wanted list (held_files' files, engine_prereqs' held) with every `src` replaced by the sha256 of that
    controller file -> (files, error)."""
    done = []
    for item in files or []:
        if isinstance(item, dict) and item.get("src") is not None:
            item = dict(item)
            src = item.pop("src")
            if item.get("sha256") is not None:
                return None, "%s has both src and sha256; give one" % item.get("path")
            try:
                item["sha256"] = controller_sha256(src)
            except OSError as exc:
                return None, "cannot read %s on the controller: %s" % (src, exc.strerror or exc)
        done.append(item)
    return done, None
