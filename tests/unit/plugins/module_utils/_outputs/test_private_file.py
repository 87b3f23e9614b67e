"""narwhal.deploy.private_file: the controller's report files, written whole with mode 0600 (module_utils step run
the way its action plugin runs it; the playbook path is covered by the roles that use it in molecule)."""
from __future__ import annotations

import os
import stat

from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.private_file import module_spec, private_file
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import run_step


def _run(args, check_mode=False, diff=False):
    return run_step(private_file, module_spec(), args, "narwhal.deploy.private_file", check_mode=check_mode, diff=diff)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_owner_only_then_changes_nothing(tmp_path):
    dest = tmp_path / "status.json"
    first = _run({"dest": str(dest), "content": '{"a": 1}\n'})
    assert first["changed"] is True and not first.get("failed")
    assert dest.read_text() == '{"a": 1}\n' and _mode(dest) == 0o600
    assert _run({"dest": str(dest), "content": '{"a": 1}\n'})["changed"] is False
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary file left


def test_a_wider_mode_is_a_change(tmp_path):
    dest = tmp_path / "probes.json"
    dest.write_text("[]")
    dest.chmod(0o644)
    assert _run({"dest": str(dest), "content": "[]"})["changed"] is True and _mode(dest) == 0o600


def test_check_mode_writes_nothing_and_diff_shows_both(tmp_path):
    dest = tmp_path / "summary.json"
    dest.write_text("old\n")
    dest.chmod(0o600)
    result = _run({"dest": str(dest), "content": "new\n"}, check_mode=True, diff=True)
    assert result["changed"] is True and dest.read_text() == "old\n"
    assert (result["diff"]["before"], result["diff"]["after"]) == ("old\n", "new\n")


def test_refusals_name_the_file(tmp_path):
    directory = tmp_path / "a-dir"
    directory.mkdir()
    refused = _run({"dest": str(directory), "content": "x"})
    assert refused["failed"] is True and "cannot write %s: is not a regular file" % directory in refused["msg"]
    missing = tmp_path / "absent" / "f.json"
    refused = _run({"dest": str(missing), "content": "x"})
    assert refused["failed"] is True and "cannot write %s" % missing in refused["msg"]
    assert "directory exists" in refused["msg"] and not missing.parent.exists()
