# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""External commands with a deadline, and input files that cannot hang a read.

Every host tool the modules run (ip, nvidia-smi, amd-smi, rocm-smi, ibstat, ibv_devinfo, git) goes through
run_bounded(): argv form, no shell, stdin closed, its own process group, and a deadline. A tool that does not
answer in time is killed with its whole process group (a wrapper script's children too) and CommandTimeoutError
names it; a tool stuck in the kernel (D state) that survives SIGKILL is abandoned after KILL_GRACE seconds
instead of blocking the module. AnsibleModule.run_command has no timeout in every supported ansible-core, and
coreutils `timeout` waits for its child forever, hence subprocess here.

open_regular() opens a file for reading without blocking on a FIFO and refuses anything that is not a regular
file, naming what it is (FIFO, socket, device, symlink loop). read_held() is the one read of what a host holds of a
wanted list (_common/held.py: its options and the pure comparison).
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import errno
import grp
import hashlib
import os
import pwd
import signal
import socket
import stat
import subprocess

from ansible.module_utils.common.process import get_bin_path

from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import differences
from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT

__metaclass__ = type


KILL_GRACE = 5


class CommandTimeoutError(Exception):
    """A command did not finish within its deadline (it was killed)."""

    def __init__(self, argv, timeout):
        super().__init__("%s did not answer within %s s" % (os.path.basename(argv[0]), timeout))
        self.argv = list(argv)
        self.timeout = timeout


def host_id():
    """A stable identity of this machine (machine-id and host name, hashed): engines whose inventory names differ
    but whose host_id is equal share one machine (discovery's and prepare's shared-host checks)."""
    try:
        with open("/etc/machine-id") as fh:
            machine = fh.read().strip()
    except OSError:
        machine = ""
    return hashlib.sha256(("%s/%s" % (machine, socket.gethostname())).encode()).hexdigest()[:16]


def host_name():
    """This host's name as the messages name it (the inventory name is in Ansible's own failure line)."""
    try:
        return socket.gethostname() or "this host"
    except OSError:
        return "this host"


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass


def bin_path(name):
    """The path of the command `name` (PATH and the system directories, as AnsibleModule.get_bin_path looks), or
    None when there is none."""
    try:
        return get_bin_path(name)
    except ValueError:
        return None


def run_bounded(argv, timeout=DEFAULT_TIMEOUT, env_update=None):
    """Run argv (a list) with a deadline -> (rc, stdout, stderr) as text (UTF-8, undecodable bytes replaced).

    Raises CommandTimeoutError when it runs longer than `timeout` seconds, OSError when it cannot be started.
    """
    env = dict(os.environ)
    env.update(env_update or {})
    proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
        [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        start_new_session=True, close_fds=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: abandon it rather than hang the module
        raise CommandTimeoutError(argv, timeout) from None
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def excerpt(text, limit=80):
    """The first `limit` characters of a tool's output on one line, for an error message."""
    text = " ".join(str(text or "").split())
    if not text:
        return "no output"
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


# ------------------------------------------------------------------------------------------------ files

FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


class NotRegularFileError(OSError):
    """The path is not a regular file (or a symlink loop); str() says what it is."""

    def __init__(self, message):
        super().__init__(message)
        self.strerror = message


def file_kind(mode):
    for test, name in FILE_KINDS:
        if test(mode):
            return name
    return "not a regular file"


def path_kind(path):
    """None for a regular file or directory that stats; else a phrase: 'a FIFO', 'a symlink loop', ...
    Raises FileNotFoundError when nothing is there (a dangling symlink included)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        raise
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return file_kind(st.st_mode)


def open_regular(path):
    """Open `path` for reading in binary mode; never blocks on a FIFO. NotRegularFileError when it is not a regular
    file (message: '<path> is a FIFO, not a regular file' / '<path> is a symlink loop'); OSError otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError("%s is a symlink loop" % path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError("%s is %s, not a regular file" % (path, file_kind(st.st_mode)))
        if hasattr(os, "O_NONBLOCK"):
            import fcntl  # POSIX only; reads of a regular file never block anyway

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


HASH_CHUNK = 1 << 20  # a large file (a checkpoint's shard, an image archive) is hashed 1 MiB at a time


def file_sha256(path):
    """The sha256 (hex) of the file at `path`, read HASH_CHUNK bytes at a time: the deliver stage's one file hash
    (checkpoints on the controller and the hosts, image archives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(HASH_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular(path, limit=None):
    """The bytes of a regular file (at most limit + 1 when a limit is given); see open_regular."""
    with open_regular(path) as handle:
        return handle.read() if limit is None else handle.read(limit + 1)


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
    # the read of _common/held.py's wanted list (held_files, engine_prereqs' held); differences() is the pure part
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
