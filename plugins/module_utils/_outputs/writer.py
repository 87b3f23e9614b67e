# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a set of generated files as one set: under one lock, through one journal, all or nothing.

A set (discovery: deployment.env, the fleet, the launch records, their extracts and index; prepare: a run
directory) has an anchor directory (NARWHAL_CONFIG_DIR, NARWHAL_RUNS_DIR) that holds its control files:

- ``.narwhal-<set>.lock``: ``flock(LOCK_EX)`` held from reading the current state to the end of the swap. A second
  run waits up to LOCK_WAIT_S seconds, then is refused naming the lock and its holder. The kernel releases the
  lock when its holder dies; the holder deletes the file when it is done.
- ``.narwhal-<set>.staging``: the operations of a swap (target, new temp, backup of the previous file), written and
  fsynced before the first temp exists. New content goes to temps next to each target
  (``.narwhal-<pid>-<token>-<i>.new``, a new run directory ``.narwhal-<pid>-<token>.run``), each fsynced; each
  replaced target gets a hard-link backup (``...-<i>.old``).
- ``.narwhal-<set>.journal``: the staging file renamed, the commit point: from here the new set rolls forward. The
  temps are renamed over their targets, removed files unlinked, the backups and the journal deleted.
- ``.narwhal-<set>.rollback``: the journal renamed when a rename of the swap failed: the backups are renamed back.

Recovery runs when the next run of any writer of the set takes the lock: staging -> its temps are deleted (the
previous set was never touched); journal -> the swap is completed (the new set); rollback -> it is undone (the
previous set). So a kill at any instant leaves, once the next run has started, either the complete previous set or
the complete new set. Temps of dead processes next to the set's files are deleted as well. Check mode changes
nothing: it neither recovers nor cleans, and plans against the set the recovery will produce.

A file whose content and mode are unchanged is not touched (idempotence). Failures to write (ENOSPC, EACCES,
EROFS, ...) are OutputError, naming the file, the cause, the fix and what was kept.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time
import uuid

from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    NotRegularFileError,
    open_regular,
    read_regular,
)

__metaclass__ = type

LOCK_WAIT_S = 60.0  # how long a second run waits for the set's lock before it is refused

_POLL_S = 0.05

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_TEMP = re.compile(r"^\.narwhal-(\d+)-[0-9a-f]+(-\d+\.(new|old)|\.run)$")

_LEGACY = re.compile(r"^\.narwhal-(bak-)?[a-z0-9_]{8}$")  # temps and backups of the writer before the journal

_STATES = ("rollback", "journal", "staging")  # at most one exists: each is the one before it renamed


class OutputError(Exception):
    """A write (or read) of the set failed; the message names the file, the cause, the fix and what was kept."""

    def __init__(self, msg, path=None):
        Exception.__init__(self, msg)
        self.path = path


def _fix(exc, path):
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free space and rerun"
    if code in (errno.EACCES, errno.EPERM):
        return "give this user (uid %d) write access to %s and rerun" % (os.geteuid(), os.path.dirname(path) or ".")
    if code == errno.EROFS:
        return "its file system is mounted read-only: remount it read-write (or choose another path) and rerun"
    return "fix the cause and rerun"


def _failed(verb, path, exc, kept):
    reason = getattr(exc, "strerror", None) or str(exc)
    return OutputError("%s %s failed: %s; %s — %s" % (verb, path, reason, _fix(exc, path), kept), path)


# ------------------------------------------------------------------------------------------------
# small file operations (every one a step a kill can interrupt)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path, data, mode):
    """Create path (it must not exist) with data and mode, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _backup(path, backup):
    """A second name for the previous file (a hard link: no space, no copy); a copy where links are not supported."""
    try:
        os.link(path, backup)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, getattr(errno, "ENOTSUP", -1),
                             getattr(errno, "EOPNOTSUPP", -1)):
            raise
        with open(path, "rb") as fh:
            _write_new(backup, fh.read(), stat.S_IMODE(os.stat(path).st_mode))


def _bytes(content):
    return content if isinstance(content, bytes) else content.encode("utf-8")


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


# ------------------------------------------------------------------------------------------------
# the journal


def _control(anchor, name, kind):
    return os.path.join(anchor, ".narwhal-%s.%s" % (name, kind))


def _pending(anchor, name, tidy=True):
    """The interrupted swap of a previous run: (state, journal path, ops, pid), or None.

    ops: [{"target", "new", "old", "dir"}] with absolute paths. An unreadable staging file is a kill while it was
    written, before any temp existed: it is deleted (tidy). An unreadable journal, or one that is not a regular file
    of this user (recovery renames and deletes what it lists), is not one this code wrote: refused."""
    for state in _STATES:
        path = _control(anchor, name, state)
        try:
            st = os.lstat(path)
            raw = b"" if not stat.S_ISREG(st.st_mode) else read_regular(path)  # never opens a FIFO
        except FileNotFoundError:
            continue
        except (OSError, NotRegularFileError) as exc:
            raise _failed("reading", path, exc, "the set was not changed")
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OutputError("%s is not a journal this user (uid %d) wrote (a %s of uid %d); narwhal did not write it "
                              "so: look at it, move it away and rerun — the set was not changed"
                              % (path, os.geteuid(), "file" if stat.S_ISREG(st.st_mode) else "link or special file",
                                 st.st_uid), path)
        try:
            doc = json.loads(raw)
            ops = []
            for entry in doc["ops"]:
                op = dict((k, None if entry[k] is None else os.path.normpath(os.path.join(anchor, entry[k])))
                          for k in ("target", "new", "old"))
                op["dir"] = bool(entry.get("dir"))
                ops.append(op)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            if state == "staging":
                if tidy:
                    _remove(path)
                return None
            raise OutputError("the journal %s of an interrupted write cannot be read (%s); narwhal does not write "
                              "it so: look at it, move it away and rerun — the set was not changed" % (path, exc), path)
        return state, path, ops, doc.get("pid")
    return None


def _write_staging(path, anchor, name, ops):
    rel = [dict([(k, None if op[k] is None else os.path.relpath(op[k], anchor)) for k in ("target", "new", "old")]
                + [("dir", op["dir"])]) for op in ops]
    doc = {"version": 1, "set": name, "pid": os.getpid(), "ops": rel}
    _write_new(path, (json.dumps(doc, indent=1) + "\n").encode(), 0o600)
    _fsync_dir(anchor)


def _roll_forward(ops):
    for op in ops:
        if op["new"] is not None:
            if os.path.lexists(op["new"]):
                os.replace(op["new"], op["target"])
        elif os.path.lexists(op["target"]):
            os.unlink(op["target"])
    _sync_dirs(op["target"] for op in ops)
    for op in ops:
        if op["old"] is not None:
            _remove(op["old"])


def _roll_back(ops):
    for op in ops:
        if op["old"] is not None:
            if os.path.lexists(op["old"]):
                os.replace(op["old"], op["target"])
                if os.path.lexists(op["old"]):  # still the same file: rename(2) did nothing
                    os.unlink(op["old"])
        elif os.path.lexists(op["target"]):  # new in the set: it did not exist before
            _remove(op["target"])
        if op["new"] is not None:
            _remove(op["new"])
    _sync_dirs(op["target"] for op in ops)


def _sync_dirs(paths):
    for directory in sorted(set(os.path.dirname(p) or "." for p in paths)):
        if os.path.isdir(directory):
            _fsync_dir(directory)


def recover(anchor, name):
    """Complete or undo the interrupted swap of a previous run (the caller holds the lock) -> a note, or None."""
    found = _pending(anchor, name)
    if found is None:
        return None
    state, path, ops, pid = found
    try:
        if state == "staging":
            for op in ops:
                for key in ("new", "old"):
                    if op[key] is not None:
                        _remove(op[key])
            done = "its staged files were deleted; the set it was writing had not been touched"
        elif state == "journal":
            _roll_forward(ops)
            done = "its new set, complete and staged before the interruption, was put in place (rolled forward)"
        else:
            _roll_back(ops)
            done = "the previous set was restored (rolled back)"
        os.unlink(path)
        _fsync_dir(anchor)
    except OSError as exc:
        raise _failed("recovering the interrupted write recorded in", path, exc,
                      "the set stays as that run left it until a run recovers it")
    return "a previous %s run (pid %s) was interrupted while writing its outputs; %s [%s]" % (name, pid, done, path)


def overlay(anchor, name):
    """For check mode: {target: the file that holds its content once recovered, or None when it will be absent}."""
    found = _pending(anchor, name, tidy=False)
    if found is None or found[0] == "staging":
        return {}, None
    state, path, ops, pid = found
    view = {}
    for op in ops:
        if state == "journal":
            if op["new"] is None:
                view[op["target"]] = None
            elif os.path.lexists(op["new"]):
                view[op["target"]] = op["new"]
        elif op["old"] is not None:
            if os.path.lexists(op["old"]):
                view[op["target"]] = op["old"]
        else:
            view[op["target"]] = None
    how = "completes" if state == "journal" else "undoes"
    return view, ("a previous %s run (pid %s) was interrupted while writing its outputs and left %s; the next run "
                  "without check mode %s that write first" % (name, pid, path, how))


# ------------------------------------------------------------------------------------------------
# plan and swap


def _current(path, view=None):
    source = (view or {}).get(os.path.normpath(path), path)
    if source is None:
        return None, None
    try:
        with open_regular(source) as fh:  # an output that is a FIFO is refused by name, never waited on
            return fh.read(), stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
    except FileNotFoundError:
        return None, None
    except (OSError, NotRegularFileError) as exc:
        raise _failed("reading", path, exc, "nothing was changed")


def set_changes(files, remove=(), view=None):
    """files: {path: (text or bytes, mode)} -> list of changes [(path, before_text_or_None, after_or_None, mode)]."""
    changes = []
    for path in sorted(files):
        text, mode = files[path]
        data, cur_mode = _current(path, view)
        if data is None or data != _bytes(text) or cur_mode != mode:
            changes.append((path, None if data is None else data.decode("utf-8", "replace"), text, mode))
    for path in sorted(set(remove) - set(files)):
        data, _mode = _current(path, view)
        if data is not None:
            changes.append((path, data.decode("utf-8", "replace"), None, None))
    return changes


class _Swap:
    def __init__(self, anchor, name, kept):
        self.anchor, self.name, self.kept = anchor, name, kept
        self.token = "%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
        self.staging = _control(anchor, name, "staging")
        self.journal = _control(anchor, name, "journal")

    def temp(self, target, suffix):
        return os.path.join(os.path.dirname(target) or ".", ".narwhal-%s%s" % (self.token, suffix))

    def run(self, ops, stage):
        """stage() creates the temps and backups of ops; then the journal commits and the renames follow."""
        action = ["writing", self.staging]
        try:
            os.makedirs(self.anchor, exist_ok=True)
            _write_staging(self.staging, self.anchor, self.name, ops)
            stage(action)
            _sync_dirs([p for op in ops for p in (op["new"], op["old"]) if p is not None])
        except OSError as exc:
            self._abort_staging(ops)
            raise _failed(action[0], action[1], exc, self.kept)
        try:
            os.replace(self.staging, self.journal)  # the commit point
        except OSError as exc:
            self._abort_staging(ops)
            raise _failed("writing", self.journal, exc, self.kept)
        try:
            _fsync_dir(self.anchor)
            for op in ops:
                action[:] = ["writing" if op["new"] is not None else "removing", op["target"]]
                if op["new"] is not None:
                    os.replace(op["new"], op["target"])
                else:
                    os.unlink(op["target"])
        except OSError as exc:
            raise self._abort_commit(ops, action, exc)
        try:  # the new set is in place; what is left is tidying, which the next run's recovery redoes
            _roll_forward(ops)
            os.unlink(self.journal)
            _fsync_dir(self.anchor)
        except OSError:
            pass

    def _abort_staging(self, ops):
        try:
            for op in ops:
                for key in ("new", "old"):
                    if op[key] is not None:
                        _remove(op[key])
            _remove(self.staging)
        except OSError:
            pass  # the staging file stays: the next run deletes what it lists

    def _abort_commit(self, ops, action, exc):
        rollback = _control(self.anchor, self.name, "rollback")
        try:
            os.replace(self.journal, rollback)
        except OSError:
            return _failed(action[0], action[1], exc, "the set is incomplete: the next run completes the new set "
                                                      "from %s" % self.journal)
        try:
            _roll_back(ops)
            os.unlink(rollback)
        except OSError:
            return _failed(action[0], action[1], exc, "the next run restores the previous set from %s" % rollback)
        return _failed(action[0], action[1], exc, self.kept)


def apply_set(changes, anchor=None, name="outputs", kept="the previous set is intact"):
    """Swap in a planned set: every new file staged as a fsynced temp next to its target, then the journal, then the
    renames (see the module doc). The caller holds the set's lock (OutputSet). Raises OutputError."""
    if not changes:
        return []
    anchor = anchor or os.path.dirname(changes[0][0]) or "."
    swap = _Swap(anchor, name, kept)
    ops = []
    for i, (path, before, after, mode) in enumerate(changes):
        ops.append({"target": path, "dir": False, "data": None if after is None else _bytes(after), "mode": mode,
                    "new": None if after is None else swap.temp(path, "-%d.new" % i),
                    "old": None if before is None else swap.temp(path, "-%d.old" % i)})

    def stage(action):
        for op in ops:
            action[:] = ["writing", op["target"]]
            if op["new"] is not None:
                os.makedirs(os.path.dirname(op["target"]) or ".", exist_ok=True)
                _write_new(op["new"], op["data"], op["mode"])
            if op["old"] is not None:
                _backup(op["target"], op["old"])

    swap.run(ops, stage)
    return [c[0] for c in changes]


def create_tree(path, files, anchor, name, dir_mode=0o700):
    """A new directory (path must not exist) with files {path/...: (text or bytes, mode)}, built aside in its parent
    and renamed into place: it appears complete or not at all. Raises OutputError."""
    swap = _Swap(anchor, name, "%s was not created" % path)
    tmp = swap.temp(path, ".run")
    ops = [{"target": path, "new": tmp, "old": None, "dir": True}]

    def stage(action):
        action[:] = ["creating", path]
        os.mkdir(tmp, dir_mode)
        dirs = {tmp}
        for target in sorted(files):
            text, mode = files[target]
            action[:] = ["writing", target]
            dest = os.path.join(tmp, os.path.relpath(target, path))
            parent = os.path.dirname(dest)
            if parent not in dirs:
                os.makedirs(parent, dir_mode, exist_ok=True)
                dirs.add(parent)
            _write_new(dest, _bytes(text), mode)
        for directory in sorted(dirs, reverse=True):
            _fsync_dir(directory)

    swap.run(ops, stage)
    return sorted(files)


# ------------------------------------------------------------------------------------------------
# the lock and the set


class LockBusyError(OutputError):
    pass


def _holder(fd):
    """(pid, name) the holder wrote into the lock file."""
    try:
        words = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    except OSError:
        words = []
    return (words[0] if words else "?"), (words[1] if len(words) > 1 else "run")


def _lock(path, who, what, shared=False):
    """flock on path (created 0600); waits up to LOCK_WAIT_S, then LockBusyError naming the holder."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        fd = os.open(path, (os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT) | _CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        pid, holder = _holder(fd)
                        raise LockBusyError("another %s holds %s (pid %s) and did not release it within %g s; wait for "
                                            "it to finish and rerun (a killed run leaves no stale lock: the kernel "
                                            "releases it) — %s" % (holder, path, pid, LOCK_WAIT_S, what), path)
                    time.sleep(_POLL_S)
            mine = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                if not shared:
                    try:
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, ("%d %s\n" % (os.getpid(), who)).encode(), 0)
                    except OSError:
                        pass  # the holder's name is a courtesy to the next run; a full disk must not stop recovery
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder deleted the file as it finished: lock the current one
        if shared and now is None:
            return None


class OutputSet:
    """with OutputSet(anchor, name) as out: out.plan(files, remove) -> changes; out.apply(changes) / out.create_tree.

    Takes the set's lock (waiting up to LOCK_WAIT_S), recovers an interrupted swap of a previous run and, in plan,
    deletes temps of dead processes next to the set's files. In check mode nothing is created, recovered or
    deleted: the lock is taken only where it exists, and plans compare with the set the recovery will produce
    (out.pending says so). create=False: a reader that creates no missing anchor directory. who: the run's
    name in a refusal the next run gets."""

    def __init__(self, anchor, name, check_mode=False, create=True, who=None):
        self.anchor, self.name, self.check_mode, self.create = anchor, name, check_mode, create
        self.who = who or name
        self.lock_path = _control(anchor, name, "lock")
        self.view, self.pending, self.notes = {}, None, []
        self._fd = None

    def __enter__(self):
        what = "nothing was changed"
        if not os.path.isdir(self.anchor):
            if self.check_mode or not self.create:
                return self
            try:
                os.makedirs(self.anchor, exist_ok=True)
            except OSError as exc:
                raise _failed("creating", self.anchor, exc, what)
        try:
            if self.check_mode:
                self._fd = _lock(self.lock_path, self.who, what, shared=True)
            else:
                self._fd = _lock(self.lock_path, self.who, what)
        except OSError as exc:
            if not self.check_mode:
                raise _failed("creating the lock", self.lock_path, exc, what)
            self._fd = None  # check mode: no lock file (no run holds the set) or none this user may open
        try:
            if self.check_mode:
                self.view, self.pending = overlay(self.anchor, self.name)
                if self.pending:
                    self.notes.append("%s; this check compared with the set it will leave" % self.pending)
            else:
                note = recover(self.anchor, self.name)
                if note:
                    self.notes.append(note)
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc):
        self._release()
        return False

    def _release(self):
        if self._fd is None:
            return
        try:
            if not self.check_mode:
                try:
                    os.unlink(self.lock_path)  # still ours: a waiter checks the file it locked is the current one
                except OSError:
                    pass
        finally:
            os.close(self._fd)
            self._fd = None

    def read(self, path):
        """The content path will have once an interrupted swap is recovered (bytes), or None when it is absent."""
        return _current(path, self.view)[0]

    def plan(self, files, remove=()):
        if not self.check_mode:
            self.clean(list(files) + list(remove))
        return set_changes(files, remove, self.view)

    def clean(self, paths):
        """Delete temps of dead processes (and of the writer before the journal) next to paths and the anchor."""
        removed = []
        for directory in sorted(set([self.anchor] + [os.path.dirname(p) or "." for p in paths])):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for entry in sorted(names):
                match = _TEMP.match(entry)
                if (match and not _alive(int(match.group(1)))) or _LEGACY.match(entry):
                    try:
                        _remove(os.path.join(directory, entry))
                        removed.append(os.path.join(directory, entry))
                    except OSError:
                        pass
        if removed:
            self.notes.append("deleted %d temporary file(s) left by interrupted runs: %s"
                              % (len(removed), ", ".join(removed)))
        return removed

    def apply(self, changes, kept="the previous set is intact"):
        return apply_set(changes, self.anchor, self.name, kept)

    def create_tree(self, path, files):
        return create_tree(path, files, self.anchor, self.name)
