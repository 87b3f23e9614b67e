# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Output sets are all or nothing (plugins/module_utils/_outputs/writer.py, docs/outputs.md): the journaled swap killed
at every file operation and at random instants, the lock against concurrent discovery and prepare runs, named
errors for a full disk, a denied write or a read-only file system, recovery and check mode.

The writers run in forked children (the modules' main() as the tests run them, imported once): a child counts
the file operations of the writer and SIGKILLs itself before operation k. In the kill tests fsync is a counted
no-op: a SIGKILL loses nothing the kernel holds, so syncing shows nothing there (it matters for power loss) and
only costs time; the other tests write with fsync."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import time

import pytest
from test_support.prepare import HAND_LAUNCH, compatible, good_hosts, make_checkout, prep_args
from test_support.records import module_args, nv_pair

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepRun
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs import writer as _writer

REAL_OS = os
# the second set: engine-2 replaced by engine-3 (its extract removed, one added), another block size (every
# record, the fleet, deployment.env and the index change)
B_EXTRA = {"NARWHAL_NODE_2_ROLE": "", "NARWHAL_NODE_3_ROLE": "decode", "NARWHAL_NODE_3_ENGINE_PORT": "8001",
           "NARWHAL_NODE_3_ATTEST_PORT": "8011", "NARWHAL_NODE_2_ENGINE_PORT": "", "NARWHAL_NODE_2_ATTEST_PORT": "",
           "NARWHAL_BLOCK_SIZE": "32"}
# the set spans two directories: the fleet and the launch config in config/, the rest in config/site/
SPLIT = {"NARWHAL_CONFIG_DIR": "config/site"}


# ------------------------------------------------------------------------------------------------
# helpers


def state(top):
    """{relative path: (bytes, mode)} of every file under top but the lock (which exists while a run holds it)."""
    out = {}
    for dirpath, _dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(dirpath, name)
            if name.endswith(".lock"):
                continue
            with open(path, "rb") as fh:
                out[os.path.relpath(path, top)] = (fh.read(), os.stat(path).st_mode & 0o7777)
    return out


def leftovers(top):
    """Temps, backups, journals and locks of the writer under top."""
    return sorted(os.path.relpath(os.path.join(d, n), top) for d, dirs, names in os.walk(top)
                  for n in names + dirs if n.startswith(".narwhal-"))


def restore(top, files):
    if os.path.exists(top):
        shutil.rmtree(top)
    for rel, (data, mode) in files.items():
        path = os.path.join(top, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        os.chmod(path, mode)


def consistent(config, site):
    """The index's sha256s match the extracts and the launch config it names."""
    index = json.loads((site / "engine-launch.sources.json").read_text())
    for name, digest in index["files"].items():
        assert hashlib.sha256((site / name).read_bytes()).hexdigest() == digest, name
    launch = (config / "engine-launch.local.json").read_bytes()
    assert hashlib.sha256(launch).hexdigest() == index["launch_config_sha256"]
    extracts = sorted(p.name for p in site.iterdir() if p.name.endswith(".inspection.json"))
    assert extracts == sorted(n for n in index["files"] if n.endswith(".inspection.json"))
    return sorted(json.loads(launch)["engines"])


class Counting:
    """The writer's view of os in a child: every file operation counted; SIGKILL before operation kill_at; hook(name,
    n, args) before each operation (to pause or to fail it)."""

    STEPS = frozenset(["open", "write", "fsync", "close", "replace", "unlink", "link", "mkdir", "makedirs", "fchmod",
                       "ftruncate", "pwrite", "rmdir"])

    def __init__(self, kill_at=None, hook=None, sync=True):
        self.n, self.kill_at, self.hook, self.sync = 0, kill_at, hook, sync

    def __getattr__(self, name):
        real = getattr(REAL_OS, name)
        if name not in self.STEPS:
            return real

        def step(*args, **kwargs):
            self.n += 1
            if self.n == self.kill_at:
                REAL_OS.kill(REAL_OS.getpid(), signal.SIGKILL)
            if self.hook:
                self.hook(name, self.n, args)
            if name == "fsync" and not self.sync:
                return None
            return real(*args, **kwargs)

        return step


def spawn(fn, **counting):
    """fn() in a forked child with Counting(**counting) as _outputs.os -> (pid, read end of its report pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 3
        try:
            os.close(r)
            counter = Counting(**counting)
            _writer.os = counter
            out = fn()
            os.write(w, json.dumps({"steps": counter.n, "out": out, "end": time.monotonic()}).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            try:
                os.write(w, json.dumps({"error": repr(exc)}).encode())
            finally:
                code = 4
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def finish(pid, r):
    """-> ("killed" | "done" | "error", report)"""
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _pid, status = os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks)) if chunks else {}
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return "killed", report
    return ("done" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "error"), report


def in_child(fn, **counting):
    return finish(*spawn(fn, **counting))


@pytest.fixture
def warnings(monkeypatch):
    """What the steps warn (every StepRun's warnings go to one list)."""
    seen = []
    init = StepRun.__init__

    def capture(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.warnings = seen

    monkeypatch.setattr(StepRun, "__init__", capture)
    return seen


@pytest.fixture
def no_sync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def discovery_case(tmp_path, step_runner):
    """A checkout with set A written; -> (root, run(args) -> (status, result), args A, args B, state A, state B)."""
    (tmp_path / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).write_text("")
    hosts = nv_pair(tmp_path)
    root = tmp_path / "checkout"
    root.mkdir()
    args_a = module_args(root, hosts, SPLIT)
    args_b = module_args(root, hosts, dict(SPLIT, **B_EXTRA), engines=("engine-1", "engine-3"))

    def run(args):
        return step_runner("discovery_outputs", copy.deepcopy(args))

    assert run(args_b)[0] == "exit"
    new = state(root)
    shutil.rmtree(root / "config")
    assert run(args_a)[0] == "exit"
    old = state(root)
    assert set(old) - set(new) == {"config/site/engine-launch.engine-2.inspection.json"}
    assert set(new) - set(old) == {"config/site/engine-launch.engine-3.inspection.json"}
    return root, run, args_a, args_b, old, new


# ------------------------------------------------------------------------------------------------
# one set, in this process


def test_output_set_unchanged_is_untouched_and_failure_restores(tmp_path, monkeypatch):
    a, b = tmp_path / "deployment.env", tmp_path / "fleet.json"
    files = {str(a): ("A1\n", 0o600), str(b): ("B1\n", 0o600)}
    _writer.apply_set(_writer.set_changes(files))
    assert a.read_text() == "A1\n" and oct(a.stat().st_mode & 0o777) == "0o600"
    assert _writer.set_changes(files) == []
    new = {str(a): ("A2\n", 0o600), str(b): ("B2\n", 0o600)}
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(_writer.os, "replace", failing_replace)
    with pytest.raises(_writer.OutputError) as err:
        _writer.apply_set(_writer.set_changes(new))
    assert str(err.value).endswith("disk full; fix the cause and rerun — the previous set is intact")
    monkeypatch.setattr(_writer.os, "replace", real_replace)
    assert a.read_text() == "A1\n" and b.read_text() == "B1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deployment.env", "fleet.json"]


# ------------------------------------------------------------------------------------------------
# kills


def test_discovery_killed_before_every_file_operation(tmp_path, step_runner, warnings, no_sync):
    """Discovery writing set B over set A (7 files in config/ and config/site/, one extract removed, one added),
    SIGKILLed before each of its file operations in turn. After each kill: a copy of the torn checkout, recovered
    as the next run starts, is A or B byte for byte; the next discovery itself, on the checkout, recovers without
    help, writes B and leaves no temp, backup, journal or lock."""
    root, run, _args_a, args_b, old, new = discovery_case(tmp_path, step_runner)
    ended, report = in_child(lambda: run(args_b)[0], sync=False)
    assert ended == "done" and report["out"] == "exit" and state(root) == new
    total = report["steps"]
    assert total > 40
    scratch = tmp_path / "scratch"
    outcomes, recovered = [], []
    for k in range(1, total + 1):
        restore(root / "config", {r[len("config/"):]: v for r, v in old.items()})
        ended, _report = in_child(lambda: run(args_b)[0], kill_at=k, sync=False)
        assert ended == "killed", k
        if scratch.exists():
            shutil.rmtree(scratch)
        shutil.copytree(root, scratch, symlinks=True)
        with _writer.OutputSet(str(scratch / "config" / "site"), "discovery") as out:
            notes = list(out.notes)
        now = state(scratch)
        assert now in (old, new), "kill before operation %d left a mixed set" % k
        assert leftovers(scratch) == [], k
        outcome = "old" if now == old else "new"
        outcomes.append(outcome)
        recovered.append("-" if not notes else "staging deleted" if "staged files were deleted" in notes[0]
                         else "rolled forward" if "rolled forward" in notes[0] else notes[0])
        del warnings[:]
        status, result = run(args_b)
        assert status == "exit", result
        assert result["changed"] is (outcome == "old"), k
        assert state(root) == new and leftovers(root) == [], k
        assert bool(warnings) == bool(notes), (k, warnings, notes)
    # before the journal's rename: the previous set; from it on: the new set
    switch = outcomes.index("new")
    assert outcomes == ["old"] * switch + ["new"] * (total - switch)
    assert 10 < switch < total - 10
    assert set(recovered) == {"-", "staging deleted", "rolled forward"}, set(recovered)
    print("discovery: %d kills, %d left the previous set, %d the new set; recovery: %s"
          % (total, switch, total - switch, dict((w, recovered.count(w)) for w in set(recovered))))


def test_apply_set_with_a_failed_rename_killed_during_its_rollback(tmp_path, no_sync):
    """A rename of the swap fails (EACCES on the fourth target) and the run is killed at each later operation: the
    next start restores the previous set (or, killed before the rollback was recorded, completes the new one)."""
    top = tmp_path / "config"
    old = {"a.json": (b"A1\n", 0o600), "b.env": (b"B1\n", 0o600), "site/c.json": (b"C1\n", 0o600),
           "site/d.json": (b"D1\n", 0o600), "site/gone.json": (b"G1\n", 0o600)}
    files = {str(top / "a.json"): ("A2\n", 0o600), str(top / "b.env"): ("B2\n", 0o644),
             str(top / "site" / "c.json"): ("C2\n", 0o600), str(top / "site" / "d.json"): ("D2\n", 0o600),
             str(top / "site" / "new.json"): ("N2\n", 0o600)}
    denied = str(top / "site" / "d.json")

    def hook(name, n, args):
        if name == "replace" and args[1] == denied and args[0].endswith(".new"):
            failed_at.append(n)
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), args[1])

    failed_at = []

    def write():
        with _writer.OutputSet(str(top / "site"), "discovery") as out:
            try:
                out.apply(out.plan(files, [str(top / "site" / "gone.json")]))
            except _writer.OutputError as exc:
                return [str(exc), failed_at[0]]
        return None

    restore(top, old)
    ended, report = in_child(write, hook=hook, sync=False)
    msg, fail_step = report["out"]
    assert ended == "done"
    assert msg == ("writing %s failed: Permission denied; give this user (uid %d) write access to %s and rerun — the "
                   "previous set is intact" % (denied, os.geteuid(), top / "site"))
    assert state(top) == old and leftovers(tmp_path) == []
    total = report["steps"]
    assert total - fail_step > 10
    new = dict((os.path.relpath(p, top), (_writer._bytes(text), mode)) for p, (text, mode) in files.items())
    new.update((k, v) for k, v in old.items() if k not in new and k != "site/gone.json")
    rolled_back = 0
    for k in range(fail_step + 1, total + 1):
        restore(top, old)
        ended, _out = in_child(write, hook=hook, kill_at=k, sync=False)
        assert ended == "killed"
        with _writer.OutputSet(str(top / "site"), "discovery") as out:
            notes = list(out.notes)
        if k == fail_step + 1:
            # killed before the rollback was recorded: the journal still commits, the next start completes the swap
            assert state(top) == new and "rolled forward" in notes[0]
        else:
            # killed during the rollback: the next start finishes it (after it, there is nothing left to do)
            assert state(top) == old, k
            assert notes == [] or "the previous set was restored (rolled back)" in notes[0], (k, notes)
            rolled_back += bool(notes)
        assert leftovers(tmp_path) == [], k
    assert rolled_back > 8


def test_random_kills_of_a_swap_loop(tmp_path, no_sync):
    """SIGKILLs at random instants of a process that writes a realistic 8-file set over two directories, A, B, A,
    B ... without pause, until at least 100 kills and at least 10 of them inside a swap (journal or staging; on a
    slow machine more kills land before the child's first write): after each, the recovered files are A or B byte
    for byte, nothing else is left."""
    top = tmp_path / "config"
    rng = random.Random(13)
    sets = []
    for tag in "AB":
        files = {"fleet.json": 3000, "engine-launch.local.json": 40000, "site/deployment.env": 900,
                 "site/engine-launch.policy.json": 2000, "site/engine-launch.sources.json": 1500,
                 "site/engine-launch.engine-1.inspection.json": 30000}
        files["site/engine-launch.engine-%d.inspection.json" % (2 if tag == "A" else 3)] = 30000
        sets.append(dict((rel, (("%s:%s\n" % (tag, rel)) * (size // 20)).encode()) for rel, size in files.items()))
    everything = sorted(set(sets[0]) | set(sets[1]))
    expected = [dict((rel, (data, 0o600)) for rel, data in s.items()) for s in sets]

    def write(files):
        with _writer.OutputSet(str(top / "site"), "discovery") as out:
            out.apply(out.plan(dict((str(top / rel), (data, 0o600)) for rel, data in files.items()),
                               [str(top / rel) for rel in everything if rel not in files]))

    def forever():
        while True:
            write(sets[1])
            write(sets[0])

    restore(top, expected[0])
    started = time.monotonic()
    for _round in range(5):
        write(sets[1])
        write(sets[0])
    per_swap = (time.monotonic() - started) / 10
    landed = {}
    kills = 0

    def inside():
        return landed.get("journal", 0) + landed.get("staging", 0)

    while kills < 100 or inside() < 10:
        assert kills < 2000, "only %d of %d kills landed inside a swap: %s" % (inside(), kills, landed)
        pid, r = spawn(forever)
        time.sleep(rng.uniform(0.002, 0.002 + 4 * per_swap))
        os.kill(pid, signal.SIGKILL)
        assert finish(pid, r)[0] == "killed"
        torn = [n for n in leftovers(tmp_path) if not n.endswith(".lock")]
        kind = next((s for s in ("journal", "staging", "rollback") if any(n.endswith("." + s) for n in torn)),
                    "temps" if torn else "between swaps")
        with _writer.OutputSet(str(top / "site"), "discovery"):
            pass
        now = state(top)
        assert now in expected, "a random kill (%s) left a mixed set" % kind
        assert leftovers(tmp_path) == []
        landed[kind] = landed.get(kind, 0) + 1
        kills += 1
    print("random kills: %d, per swap %.1f ms, landed: %s" % (kills, per_swap * 1000, landed))


@pytest.mark.parametrize("previous", ["none", "changed"])
def test_prepare_killed_before_every_file_operation(tmp_path, step_runner, warnings, no_sync, previous):
    """prepare writing a run (none before: the run directory appears complete or not at all; a changed one: two
    files, in two directories, swapped through the journal), SIGKILLed before each of its file operations."""
    root = make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))
    args = prep_args(root, "write", good_hosts())

    def run():
        return step_runner("prepare_run", copy.deepcopy(args))

    status, result = run()
    assert status == "exit", result
    runs, run_dir = root / "runs", result["run_dir"]
    new = state(runs)
    if previous == "none":
        old = {}
    else:
        old = dict(new)
        manifest = os.path.relpath(os.path.join(run_dir, "manifest.json"), runs)
        role_env = os.path.relpath(os.path.join(run_dir, "engine-2", "engine-2.env"), runs)
        old[manifest] = (b"{}\n", 0o600)
        del old[role_env]
    restore(runs, old)
    ended, report = in_child(lambda: run()[0], sync=False)
    assert ended == "done" and report["out"] == "exit" and state(runs) == new
    total = report["steps"]
    scratch = tmp_path / "scratch"
    outcomes = []
    for k in range(1, total + 1):
        restore(runs, old)
        ended, _out = in_child(lambda: run()[0], kill_at=k, sync=False)
        assert ended == "killed", k
        if scratch.exists():
            shutil.rmtree(scratch)
        if runs.exists():
            shutil.copytree(runs, scratch)
        else:
            scratch.mkdir()
        with _writer.OutputSet(str(scratch), "prepare"):
            pass
        now = state(scratch)
        assert now in (old, new), "kill before operation %d left a partial run" % k
        assert leftovers(scratch) == [], k
        outcomes.append("old" if now == old else "new")
        status, result = run()
        assert status == "exit" and result["changed"] is (now == old), k
        assert state(runs) == new and leftovers(runs) == [], k
    switch = outcomes.index("new")
    assert outcomes == ["old"] * switch + ["new"] * (total - switch) and switch > 5
    print("prepare (%s before): %d kills, %d left the previous state, %d the new run"
          % (previous, total, switch, total - switch))


def test_random_kills_while_runs_are_created(tmp_path, no_sync):
    """SIGKILLs at random instants of a process creating run directories one after the other, until at least 50
    kills and at least 5 of them caught a run directory half-made: after recovery each run directory is complete,
    none partial, no temp directory left. Each kill waits for the child to have started writing (its runs/ exists),
    so a slow fork does not turn the kills into kills before any write."""
    runs = tmp_path / "runs"
    files = {"manifest.json": b"m" * 20000, "launch_engine.pyz": b"z" * 200000, "launch_engine.pyz.sha256": b"s\n"}
    for e in ("engine-1", "engine-2"):
        files.update({"%s/engine-launch.%s.json" % (e, e): b"r" * 8000, "%s/%s.env" % (e, e): b"e" * 600,
                      "%s/prepared.json" % e: b"p" * 5000})

    def forever():
        i = 0
        while True:
            with _writer.OutputSet(str(runs), "prepare") as out:
                run_dir = str(runs / ("run-%06d" % i))
                out.create_tree(run_dir, dict((os.path.join(run_dir, rel), (data, 0o600))
                                              for rel, data in files.items()))
            i += 1

    rng = random.Random(5)
    partial = kills = 0
    while kills < 50 or partial < 5:
        assert kills < 1000, "only %d of %d kills caught a run directory half-made" % (partial, kills)
        pid, r = spawn(forever)
        deadline = time.monotonic() + 10
        while not runs.exists() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.02))
        os.kill(pid, signal.SIGKILL)
        assert finish(pid, r)[0] == "killed"
        kills += 1
        partial += any(n.endswith(".run") for n in leftovers(runs))
        with _writer.OutputSet(str(runs), "prepare"):
            pass
        assert leftovers(runs) == []
        for run_dir in os.listdir(runs):
            assert state(runs / run_dir) == dict((rel, (data, 0o600)) for rel, data in files.items()), run_dir
        shutil.rmtree(runs)
    print("runs created under %d random kills: %d kills left a partial run directory aside, none in place"
          % (kills, partial))


# ------------------------------------------------------------------------------------------------
# concurrent runs


def paused_at_commit(signal_fd, seconds):
    """A hook: at the first rename (the journal's: inside the lock, the set staged) tell the parent, then pause."""
    def hook(name, n, args):
        if name == "replace" and not hook.done:
            hook.done = True
            os.write(signal_fd, b"x")
            time.sleep(seconds)
    hook.done = False
    return hook


def test_two_concurrent_discoveries_the_second_waits(tmp_path, step_runner):
    root, run, args_a, args_b, old, new = discovery_case(tmp_path, step_runner)
    shutil.rmtree(root / "config")
    r, w = os.pipe()
    first = spawn(lambda: run(args_a)[0], hook=paused_at_commit(w, 0.6))
    assert os.read(r, 1) == b"x"  # the first holds the lock, half-way through its swap
    second = spawn(lambda: run(args_b)[0])
    (ended1, report1), (ended2, report2) = finish(*first), finish(*second)
    assert (ended1, report1["out"]) == ("done", "exit") and (ended2, report2["out"]) == ("done", "exit")
    assert report2["end"] > report1["end"]  # it waited for the first
    assert state(root) == new and leftovers(root) == []
    assert consistent(root / "config", root / "config" / "site") == ["engine-1", "engine-3"]


def test_two_concurrent_discoveries_the_second_is_refused_by_name(tmp_path, step_runner, monkeypatch):
    root, run, args_a, args_b, old, new = discovery_case(tmp_path, step_runner)
    shutil.rmtree(root / "config")
    monkeypatch.setattr(_writer, "LOCK_WAIT_S", 0.3)
    r, w = os.pipe()
    first = spawn(lambda: run(args_a)[0], hook=paused_at_commit(w, 1.5))
    assert os.read(r, 1) == b"x"
    second = spawn(lambda: run(args_b))
    (ended1, report1), (ended2, report2) = finish(*first), finish(*second)
    assert (ended1, report1["out"]) == ("done", "exit") and ended2 == "done"
    status, result = report2["out"]
    lock = root / "config" / "site" / ".narwhal-discovery.lock"
    assert status == "fail"
    assert result["msg"] == ("discovery: another discovery holds %s (pid %d) and did not release it within 0.3 s; wait "
                             "for it to finish and rerun (a killed run leaves no stale lock: the kernel releases it) "
                             "— nothing was changed" % (lock, first[0]))
    assert state(root) == old and leftovers(root) == []
    assert consistent(root / "config", root / "config" / "site") == ["engine-1", "engine-2"]


def test_concurrent_discoveries_started_together_leave_one_consistent_set(tmp_path, step_runner):
    root, run, args_a, args_b, old, new = discovery_case(tmp_path, step_runner)
    for _round in range(4):
        shutil.rmtree(root / "config")
        children = [spawn(lambda a=a: run(a)[0]) for a in (args_a, args_b, args_a, args_b)]
        assert [finish(*c)[1]["out"] for c in children] == ["exit"] * 4
        assert state(root) in (old, new) and leftovers(root) == []
        consistent(root / "config", root / "config" / "site")


@pytest.mark.parametrize("wait", [True, False])
def test_two_concurrent_prepares_of_one_run(tmp_path, step_runner, monkeypatch, wait):
    root = make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))
    args = prep_args(root, "write", good_hosts())

    def run():
        status, result = step_runner("prepare_run", copy.deepcopy(args))
        return [status, result.get("changed"), result.get("msg")]

    if not wait:
        monkeypatch.setattr(_writer, "LOCK_WAIT_S", 0.3)
    r, w = os.pipe()
    first = spawn(run, hook=paused_at_commit(w, 0.6 if wait else 1.5))
    assert os.read(r, 1) == b"x"
    second = spawn(run)
    (_e1, report1), (_e2, report2) = finish(*first), finish(*second)
    assert report1["out"] == ["exit", True, None]
    if wait:
        assert report2["out"] == ["exit", False, None]  # it waited, then found the run complete
    else:
        lock = root / "runs" / ".narwhal-prepare.lock"
        assert report2["out"][0] == "fail"
        assert report2["out"][2] == ("prepare: another prepare holds %s (pid %d) and did not release it within 0.3 s; "
                                     "wait for it to finish and rerun (a killed run leaves no stale lock: the kernel "
                                     "releases it) — nothing was changed" % (lock, first[0]))
    status, result = step_runner("prepare_run", copy.deepcopy(args))
    assert status == "exit" and result["changed"] is False
    assert leftovers(root / "runs") == [] and os.listdir(root / "runs") == [os.path.basename(result["run_dir"])]


# ------------------------------------------------------------------------------------------------
# named errors


def failing_writes(monkeypatch, code, where):
    """os.write fails with errno code for files whose path contains where."""
    real = os.write

    def write(fd, data):
        if where in os.readlink("/proc/self/fd/%d" % fd):
            raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_discovery_on_a_full_disk_names_the_file_and_keeps_the_set(tmp_path, step_runner, monkeypatch):
    root, run, _a, args_b, old, _new = discovery_case(tmp_path, step_runner)
    before = dict((p, os.stat(root / p).st_mtime_ns) for p in old)
    failing_writes(monkeypatch, errno.ENOSPC, ".new")
    status, result = run(args_b)
    target = root / "config" / "engine-launch.local.json"
    assert status == "fail"
    assert result["msg"] == ("discovery: writing %s failed: No space left on device; free space and rerun — the "
                             "previous set is intact" % target)
    assert result["path"] == str(target)
    assert state(root) == old and leftovers(root) == []
    assert dict((p, os.stat(root / p).st_mtime_ns) for p in old) == before


def test_discovery_denied_half_way_through_the_renames_rolls_back(tmp_path, step_runner, monkeypatch):
    root, run, _a, args_b, old, _new = discovery_case(tmp_path, step_runner)
    fleet = str(root / "config" / "fleet.json")
    real = os.replace

    def replace(src, dst):
        if dst == fleet and src.endswith(".new"):  # after config/engine-launch.local.json was replaced
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    status, result = run(args_b)
    assert status == "fail"
    assert result["msg"] == ("discovery: writing %s failed: Permission denied; give this user (uid %d) write access "
                             "to %s and rerun — the previous set is intact" % (fleet, os.geteuid(), root / "config"))
    assert state(root) == old and leftovers(root) == []


def test_discovery_on_a_read_only_file_system(tmp_path, step_runner, monkeypatch):
    root, run, _a, args_b, old, _new = discovery_case(tmp_path, step_runner)
    real = os.open

    def open_(path, flags, mode=0o777, **kw):
        if str(path).endswith(".lock") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", open_)
    status, result = run(args_b)
    lock = root / "config" / "site" / ".narwhal-discovery.lock"
    assert result["msg"] == ("discovery: creating the lock %s failed: Read-only file system; its file system is "
                             "mounted read-only: remount it read-write (or choose another path) and rerun — nothing "
                             "was changed" % lock)
    assert state(root) == old


def test_prepare_on_a_full_disk_creates_no_run(tmp_path, step_runner, monkeypatch):
    root = make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))
    args = prep_args(root, "write", good_hosts())
    rid = step_runner("prepare_run", prep_args(root))[1]["run_id"]
    failing_writes(monkeypatch, errno.ENOSPC, ".run/")
    status, result = step_runner("prepare_run", copy.deepcopy(args))
    run_dir = root / "runs" / rid
    assert status == "fail"
    assert result["msg"] == ("prepare: writing %s failed: No space left on device; free space and rerun — %s was not "
                             "created" % (run_dir / "engine-1" / "engine-1.env", run_dir))
    assert not run_dir.exists() and os.listdir(root / "runs") == []


def test_prepare_denied_on_an_existing_run_keeps_its_files(tmp_path, step_runner, monkeypatch):
    root = make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))
    args = prep_args(root, "write", good_hosts())
    run_dir = step_runner("prepare_run", copy.deepcopy(args))[1]["run_dir"]
    (root / "runs" / os.path.basename(run_dir) / "manifest.json").write_text("{}\n")
    os.unlink(os.path.join(run_dir, "engine-2", "engine-2.env"))
    before = state(root / "runs")
    failing_writes(monkeypatch, errno.EACCES, ".new")
    status, result = step_runner("prepare_run", copy.deepcopy(args))
    assert status == "fail" and result["msg"].startswith(
        "prepare: writing %s failed: Permission denied;" % os.path.join(run_dir, "engine-2", "engine-2.env"))
    assert result["msg"].endswith("— the previous files of %s are intact" % run_dir)
    assert state(root / "runs") == before and leftovers(root / "runs") == []


# ------------------------------------------------------------------------------------------------
# recovery, stale temps, check mode


def interrupted(tmp_path, step_runner):
    """Discovery killed after its journal and its first rename: config/engine-launch.local.json is B's, the rest
    A's. -> (root, run, args A, args B, A, B)"""
    case = discovery_case(tmp_path, step_runner)
    root, run, _a, args_b = case[:4]
    renames = []

    def hook(name, n, args):
        if name == "replace":
            renames.append(n)
            if len(renames) == 3:
                os.kill(os.getpid(), signal.SIGKILL)

    assert in_child(lambda: run(args_b)[0], hook=hook)[0] == "killed"
    assert (root / "config" / "site" / ".narwhal-discovery.journal").exists()
    return case


def test_check_mode_compares_with_the_set_the_recovery_leaves_and_changes_nothing(
        tmp_path, step_runner, warnings):
    root, run, args_a, args_b, old, new = interrupted(tmp_path, step_runner)
    torn, torn_left = state(root), leftovers(root)
    assert torn not in (old, new)
    status, result = run(dict(args_b, _ansible_check_mode=True))
    assert status == "exit" and result["changed"] is False  # B is what recovery leaves
    status, result = run(dict(args_a, _ansible_check_mode=True, _ansible_diff=True))
    assert status == "exit" and result["changed"] is True
    assert sorted(d["before_header"] for d in result["diff"]) == sorted(
        str(root / p) for p in set(old) | set(new) if old.get(p) != new.get(p))
    assert state(root) == torn and leftovers(root) == torn_left
    journal = root / "config" / "site" / ".narwhal-discovery.journal"
    assert "the next run without check mode completes that write first" in warnings[0]
    assert str(journal) in warnings[0]


def test_prepare_completes_an_interrupted_discovery_first(tmp_path, step_runner, warnings):
    """prepare reads the fleet and the records under discovery's lock: in check mode it refuses a torn set by name,
    otherwise it completes discovery's write first."""
    root = make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))
    config = root / "config"
    files = {str(config / "fleet.json"): (json.dumps(json.loads((config / "fleet.json").read_text())) + "\n", 0o600),
             str(config / "engine-launch.local.json"): ((config / "engine-launch.local.json").read_text() + "\n",
                                                        0o600)}

    def write():
        with _writer.OutputSet(str(config), "discovery") as out:
            out.apply(out.plan(files))

    renames = []

    def hook(name, n, args):
        if name == "replace":
            renames.append(n)
            if len(renames) == 2:  # after the journal, before the first rename
                os.kill(os.getpid(), signal.SIGKILL)

    assert in_child(write, hook=hook)[0] == "killed"
    journal = config / ".narwhal-discovery.journal"
    status, result = step_runner("prepare_run", prep_args(root, check=True))
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    assert result["msg"].startswith("prepare refused, no run was created: NARWHAL_CONFIG_DIR: a previous discovery "
                                    "run (pid ")
    assert ("was interrupted while writing its outputs and left %s; the next run without check mode completes that "
            "write first; run prepare without check mode (it completes that write first) or rerun discovery"
            % journal) in result["msg"]
    assert journal.exists()
    status, result = step_runner("prepare_run", prep_args(root))
    assert status == "exit", result
    assert not journal.exists() and leftovers(config) == []
    assert all((config / os.path.basename(p)).read_text() == text for p, (text, _m) in files.items())
    assert "was put in place (rolled forward)" in warnings[0]


def test_stale_temps_of_dead_runs_are_deleted_live_ones_kept(tmp_path, step_runner, warnings):
    root, run, _a, args_b, _old, new = discovery_case(tmp_path, step_runner)
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    site = root / "config" / "site"
    stale = [root / "config" / ".narwhal-a1b2c3d4", site / ".narwhal-bak-zz09_xyz",
             site / (".narwhal-%d-0badcafe-3.new" % dead)]
    live = root / "config" / (".narwhal-%d-0badcafe-1.new" % os.getppid())
    for path in stale + [live]:
        path.write_text("x")
    (root / "runs" / (".narwhal-%d-0badcafe.run" % dead) / "engine-1").mkdir(parents=True)
    status, result = run(args_b)
    assert status == "exit"
    assert not any(p.exists() for p in stale) and live.exists()
    assert "deleted 3 temporary file(s) left by interrupted runs" in warnings[0]
    live.unlink()
    assert state(root / "config") == dict((k[len("config/"):], v) for k, v in new.items())
    with _writer.OutputSet(str(root / "runs"), "prepare") as out:
        out.plan({})
    assert os.listdir(root / "runs") == []


@pytest.mark.parametrize("kind", ["garbage", "foreign"])
def test_a_journal_narwhal_did_not_write_is_refused_by_name(tmp_path, step_runner, kind):
    """Recovery renames and deletes what a journal lists: one that is not JSON, or not this user's, is refused."""
    root, run, _a, args_b, old, _new = discovery_case(tmp_path, step_runner)
    journal = root / "config" / "site" / ".narwhal-discovery.journal"
    if kind == "garbage":
        journal.write_text("not json")
        words = "the journal %s of an interrupted write cannot be read (" % journal
    else:
        journal.write_text(json.dumps({"ops": [{"target": "/etc/passwd", "new": None, "old": None}]}))
        os.chown(journal, 4321, 4321)
        words = "%s is not a journal this user (uid %d) wrote (a file of uid 4321)" % (journal, os.geteuid())
    data = journal.read_bytes()
    status, result = run(args_b)
    assert status == "fail" and result["msg"].startswith("discovery: " + words)
    assert result["msg"].endswith("look at it, move it away and rerun — the set was not changed")
    assert state(root) == dict(old, **{os.path.relpath(journal, root): (data, 0o644)})
