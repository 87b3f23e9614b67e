# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""narwhal.deploy.held_files, the action plugin (documentation: plugins/modules/held_files.py).
Turns each `src` (a file on the controller) into the sha256 of its content here, then runs the module on the task's
host: one module run compares the host's files with the controller's, and no digest is logged."""

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
    """The module's `files` with every `src` replaced by the sha256 of that controller file -> (files, error)."""
    done = []
    for item in files or []:
        if isinstance(item, dict) and item.get("src") is not None:
            item = dict(item)
            src = item.pop("src")
            if item.get("sha256") is not None:
                return None, "files: %s has both src and sha256; give one" % item.get("path")
            try:
                item["sha256"] = controller_sha256(src)
            except OSError as exc:
                return None, "files: cannot read %s on the controller: %s" % (src, exc.strerror or exc)
        done.append(item)
    return done, None


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        args = dict(self._task.args)
        files, error = with_digests(args.get("files"))
        if error:
            result.update(failed=True, msg=error)
            return result
        args["files"] = files
        try:
            result.update(self._execute_module(module_name="narwhal.deploy.held_files", module_args=args,
                                               task_vars=task_vars))
        finally:  # the remote temporary directory of a run without pipelining
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
