# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""private_file, the step (_common/step.py; plugins/modules/private_file.py documents it, plugins/action/private_file.py
runs it in the controller's process): write one owner-only file whole, or leave it as it is when it already holds that
content with that mode. For the reports the playbooks keep on the controller (status, probes, summaries).
"""

from __future__ import annotations

import os
import stat
import tempfile

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError


def module_spec():
    """The argument spec of private_file (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            content=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )


def _current(dest):
    """(bytes, mode) of dest, (None, None) when absent; OSError for anything else than a regular file."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        raise OSError("is not a regular file")
    with open(dest, "rb") as fh:
        return fh.read(), stat.S_IMODE(st.st_mode)


def write_whole(dest, data, mode=0o600):
    """data into dest through a temporary file of the same directory (fsync, then rename): a reader sees the old
    file or the new one, never a part."""
    directory = os.path.dirname(dest) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(dest), dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def private_file(run):
    dest, content = run.params["dest"], run.params["content"]
    data = content.encode("utf-8")
    try:
        before, mode = _current(dest)
    except OSError as exc:
        raise StepError("cannot write %s: %s; remove or rename it" % (dest, exc.strerror or exc), dest=dest)
    changed = before != data or mode != 0o600
    result = {"changed": changed, "dest": dest}
    if run.diff:
        result["diff"] = {"before": "" if before is None else before.decode("utf-8", "replace"), "after": content,
                          "before_header": dest, "after_header": dest}
    if changed and not run.check_mode:
        try:
            write_whole(dest, data)
        except OSError as exc:
            raise StepError("cannot write %s: %s; check that its directory exists and is writable"
                            % (dest, exc.strerror or exc), dest=dest)
    return result
