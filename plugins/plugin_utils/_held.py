# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of a held read (plugins/module_utils/_common/held.py is the host's): each wanted path's `src`,
a file on the controller, becomes the sha256 of its content, so that the module compares it on the host and no
digest is logged. The action plugins of held_files and engine_prereqs (its `held`) are DigestingAction."""

from __future__ import annotations

import hashlib

from ansible.plugins.action import ActionBase

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


class DigestingAction(ActionBase):
    """An action that replaces each `src` of its wanted-list option (_MODULE's _OPTION) by the digest of that
    controller file, then runs the module on the task's host. _OPTIONAL: the option may be left out (not read)."""

    _supports_check_mode = True
    _supports_async = False
    _MODULE = None
    _OPTION = None
    _OPTIONAL = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = dict(self._task.args)
        if not (self._OPTIONAL and args.get(self._OPTION) is None):
            wanted, error = with_digests(args.get(self._OPTION))
            if error:
                result.update(failed=True, msg="%s: %s" % (self._OPTION, error))
                return result
            args[self._OPTION] = wanted
        try:
            result.update(self._execute_module(module_name=self._MODULE, module_args=args, task_vars=task_vars))
        finally:  # the remote temporary directory of a run without pipelining
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
