# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""held_files (plugins/modules/held_files.py and its action plugin): one read of real files names the paths that
differ, never returns a digest, and the action turns a controller src into its sha256."""

import grp
import hashlib
import os
import pwd

from ansible_collections.narwhal.deploy.plugins.action.held_files import controller_sha256, with_digests
from ansible_collections.narwhal.deploy.plugins.modules import held_files

ME = pwd.getpwuid(os.getuid()).pw_name


def _tree(tmp_path):
    conf = tmp_path / "config"
    conf.mkdir(mode=0o700)
    os.chmod(conf, 0o700)
    env = conf / "engine-2.env"
    env.write_text("NARWHAL_ENGINE=engine-2\n")
    os.chmod(env, 0o600)
    return conf, env


def test_a_host_that_holds_everything_differs_in_nothing(module_runner, tmp_path):
    conf, env = _tree(tmp_path)
    sha = hashlib.sha256(b"NARWHAL_ENGINE=engine-2\n").hexdigest()
    how, result = module_runner(held_files.main, {"files": [
        {"path": str(conf), "state": "directory", "mode": "0700", "owner": ME},
        {"path": str(env), "sha256": sha, "mode": "0600", "owner": ME}]})
    assert how == "exit"
    assert result["changed"] is False
    assert result["differ"] == [] and result["reasons"] == {}


def test_what_differs_is_named_and_no_digest_is_returned(module_runner, tmp_path):
    conf, env = _tree(tmp_path)
    os.chmod(env, 0o644)
    missing = conf / "engine-launch.engine-2.json"
    how, result = module_runner(held_files.main, {"files": [
        {"path": str(conf), "state": "directory", "mode": "0755"},
        {"path": str(env), "sha256": "0" * 64, "mode": "0600"},
        {"path": str(missing), "sha256": "1" * 64},
        {"path": str(env), "state": "directory"}]})
    assert how == "exit"
    assert result["differ"] == [str(conf), str(env), str(missing)]
    assert result["reasons"] == {str(conf): ["mode"], str(env): ["content", "mode"],
                                 str(missing): ["absent, not a file"]}
    assert "0" * 64 not in repr(result) and hashlib.sha256(b"NARWHAL_ENGINE=engine-2\n").hexdigest() not in repr(result)


def test_the_group_is_read_and_compared(module_runner, tmp_path):
    _conf, env = _tree(tmp_path)
    mine = grp.getgrgid(os.getgid()).gr_name
    other = next((g.gr_name for g in grp.getgrall() if g.gr_gid != os.getgid()), "no-such-group")
    how, result = module_runner(held_files.main, {"files": [
        {"path": str(env), "group": mine}, {"path": str(env) + ".b", "group": mine}]})
    assert how == "exit" and result["differ"] == [str(env) + ".b"]
    how, result = module_runner(held_files.main, {"files": [{"path": str(env), "group": other}]})
    assert how == "exit" and result["reasons"] == {str(env): ["group"]}
    how, result = module_runner(held_files.main, {"files": [{"path": str(env), "group": str(os.getgid())}]})
    assert how == "exit" and result["differ"] == []


def test_src_reaches_the_module_only_through_its_action(module_runner, tmp_path):
    _conf, env = _tree(tmp_path)
    how, result = module_runner(held_files.main, {"files": [{"path": str(env), "src": str(env)}]})
    assert how == "fail" and "action plugin" in result["msg"]


def test_the_action_reads_src_on_the_controller(tmp_path):
    _conf, env = _tree(tmp_path)
    sha = hashlib.sha256(env.read_bytes()).hexdigest()
    assert controller_sha256(str(env)) == sha
    assert controller_sha256(str(tmp_path / "absent")) == ""
    files, error = with_digests([{"path": "/h/a", "src": str(env), "mode": "0600"}, {"path": "/h/b", "sha256": "x"},
                                 {"path": "/h/c", "src": str(tmp_path / "absent")}])
    assert error is None
    assert files == [{"path": "/h/a", "sha256": sha, "mode": "0600"}, {"path": "/h/b", "sha256": "x"},
                     {"path": "/h/c", "sha256": ""}]
    files, error = with_digests([{"path": "/h/a", "src": str(env), "sha256": sha}])
    assert files is None and "both src and sha256" in error
