# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a host already holds of the files it should hold (plugins/modules/held_files.py, and engine_prereqs for
install, read them): one read of a few paths, then only the paths that differ are written or fetched (roles/install,
roles/launch/tasks/record.yml, roles/router, roles/monitoring).

read_held(wanted) is the read, on the host; differences(wanted, held) is pure: `wanted` is the list of what should
be there, `held` what one read found.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat

__metaclass__ = type

# The options of one wanted path (held_files' files, engine_prereqs' held), documented in held_files.
HELD_FILE_SPEC = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", choices=["file", "directory"], default="file"),
    sha256=dict(type="str", no_log=True),
    src=dict(type="path"),
    mode=dict(type="str"),
    owner=dict(type="str"),
    group=dict(type="str"),
)

SRC_ON_CONTROLLER = ("src is read on the controller by the module's action plugin; run the module through its action "
                     "(narwhal.deploy.%s), or give sha256")


class HeldReadError(Exception):
    """A wanted path could not be read (its message names it and the fix)."""


def read_path(path, digest):
    """What the host holds at path: state, mode, owner, uid, group, gid and (digest) the sha256 of a regular file's
    content."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"state": "absent"}
    if stat.S_ISDIR(st.st_mode):
        state = "directory"
    elif stat.S_ISREG(st.st_mode):
        state = "file"
    else:
        state = "other"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    found = {"state": state, "mode": stat.S_IMODE(st.st_mode), "owner": owner, "uid": st.st_uid, "group": group,
             "gid": st.st_gid}
    if digest and state == "file":
        sha = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                sha.update(chunk)
        found["sha256"] = sha.hexdigest()
    return found


def read_held(wanted):
    """{path: reasons} of the wanted paths the host does not hold as wanted, after one read of each path. Raises
    HeldReadError naming a path it cannot read, or a mode that is not octal."""
    held = {}
    for want in wanted:
        path = want["path"]
        try:
            held[path] = read_path(path, want.get("sha256") is not None)
        except OSError as exc:
            raise HeldReadError("cannot read %s: %s; check that the connecting user can read it (become)"
                                % (path, exc.strerror or exc))
    try:
        return differences(wanted, held)
    except ValueError as exc:
        raise HeldReadError("a mode of files is not octal: %s" % exc)


def mode_bits(mode):
    """An octal mode as the roles write it ('0600', '600', 0o600) -> int, None when not given."""
    if mode is None or mode == "":
        return None
    if isinstance(mode, int):
        return mode
    return int(str(mode), 8)


def why_differs(want, have):
    """The reasons a held path is not as wanted (empty: it is). `want`: path, state (file or directory), and
    optionally sha256 (of a file's content; an empty string matches no file), mode, owner, group. `have`: what the
    read found: state (file, directory, absent or other), mode (int), owner (name, or uid as a string), uid, group
    (name, or gid as a string), gid, sha256 (files)."""
    state = want.get("state") or "file"
    if have.get("state") != state:
        return ["%s, not a %s" % (have.get("state") or "absent", state)]
    reasons = []
    if state == "file" and want.get("sha256") is not None and want["sha256"] != have.get("sha256"):
        reasons.append("content")
    mode = mode_bits(want.get("mode"))
    if mode is not None and mode != have.get("mode"):
        reasons.append("mode")
    if want.get("owner") and str(want["owner"]) not in (have.get("owner"), str(have.get("uid"))):
        reasons.append("owner")
    if want.get("group") and str(want["group"]) not in (have.get("group"), str(have.get("gid"))):
        reasons.append("group")
    return reasons


def differences(wanted, held):
    """{path: reasons} of every wanted path that the host does not hold as wanted, in the order of `wanted`
    (a path wanted twice: the first entry counts)."""
    found = {}
    for want in wanted:
        path = want["path"]
        if path in found:
            continue
        reasons = why_differs(want, held.get(path) or {"state": "absent"})
        found[path] = reasons
    return dict((path, reasons) for path, reasons in found.items() if reasons)
