# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a host already holds of the files it should hold (plugins/modules/held_files.py, and engine_prereqs for
install, read them with _common/tools.py::read_held): one read of a few paths, then only the paths that differ are
written or fetched (roles/install, roles/launch/tasks/record.yml, roles/router, roles/monitoring).

differences(wanted, held) is pure: `wanted` is the list of what should be there, `held` what one read found.
"""

from __future__ import annotations

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
