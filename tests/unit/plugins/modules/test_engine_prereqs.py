# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""engine_prereqs through its main(): the Docker daemon and the image asked over the Engine API, prepare's one read
of the fabric interface (returned as interface_facts returns it), what the host holds, and a fabric link that went
down. Its port check and its read of `ip` are tested beside their code
(tests/unit/plugins/module_utils/_facts/test_prereqs.py)."""

import hashlib
import json
import socket

import pytest
from test_support.paths import HAND_LAUNCH_CONFIG

from ansible_collections.narwhal.deploy.plugins.module_utils._docker import engine_api as _engine_api
from ansible_collections.narwhal.deploy.plugins.modules import engine_prereqs, interface_facts

# ------------------------------------------------------------------------------------------ the Docker daemon


def _standin_id():

    try:
        return _engine_api.Client(timeout=10).image("narwhal-sim/engine-standin:latest")["Id"]
    except _engine_api.EngineAPIError:
        return None


def _docker_problems(module_runner, tmp_path, image_id, docker_host="unix:///var/run/docker.sock"):
    """The module's Docker problems (the daemon, the image) for an engine-1 record of `image_id`."""
    record = json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"]["engine-1"]
    record["runtime"].update(image_id=image_id, model_path=str(tmp_path))
    kind, result = module_runner(engine_prereqs.main, {"record": record, "docker_host": docker_host})
    return [p for p in result.get("problems", []) if "Docker" in p], result


@pytest.mark.skipif(_standin_id() is None, reason="no Docker daemon with the stand-in image here")
def test_the_daemon_and_the_image_are_asked_over_the_engine_api(module_runner, tmp_path):
    problems, result = _docker_problems(module_runner, tmp_path, _standin_id())
    assert problems == [] and result.get("image_id", _standin_id()) == _standin_id()
    missing = "sha256:" + "0" * 64
    problems, _result = _docker_problems(module_runner, tmp_path, missing)
    assert problems == ["image narwhal-sim/engine-standin:latest (%s) is not present in this host's Docker daemon; "
                        "load or pull exactly that image, or rerun discovery if the image was meant to change"
                        % missing]
    socket_path = tmp_path / "docker.sock"
    problems, _result = _docker_problems(module_runner, tmp_path, missing, "unix://%s" % socket_path)
    assert len(problems) == 1 and problems[0].startswith(
        "the Docker daemon at unix://%s does not answer (the Docker daemon does not answer at unix://%s ("
        % (socket_path, socket_path))
    assert problems[0].endswith("); start it (systemctl start docker)")


def _free_ports(count):
    sockets = [socket.socket() for _index in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.skipif(_standin_id() is None, reason="no Docker daemon with the stand-in image here")
def test_prepare_reads_the_interface_once_as_interface_facts_would(module_runner, tmp_path, monkeypatch):
    """engine_prereqs is prepare's one read of the fabric interface: it returns narwhal_interface exactly as
    interface_facts returns it for the same `ip` output (prepare_run compares that with the record); a record
    whose address moved is refused here, naming the address, from the same one read."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "ip-calls"
    links = [{"ifname": "eth1", "operstate": "UP", "mtu": 9000, "addr_info": [
        {"family": "inet", "local": "172.31.241.99", "prefixlen": 24, "scope": "global",
         "valid_life_time": 4294967295, "preferred_life_time": 4294967295}]}]
    (tmp_path / "ip.json").write_text(json.dumps(links))
    (bindir / "ip").write_text("#!/bin/sh\necho x >> %s\nexec /bin/cat %s\n" % (calls, tmp_path / "ip.json"))
    (bindir / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bindir)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    record = json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"]["engine-1"]
    engine_port, attest_port, side_port = _free_ports(3)
    record["runtime"].update(image_id=_standin_id(), model_path=str(tmp_path / "model"))
    record["accelerator_devices"] = []
    record["node"].update(engine_port=engine_port, attest_port=attest_port, side_channel_port=side_port,
                          side_channel_ports=[side_port, side_port], address="172.31.241.99")
    kind, result = module_runner(engine_prereqs.main, {"record": record})
    assert kind == "exit", result
    assert len(calls.read_text().split()) == 1
    assert "held_differ" not in result  # nothing asked, nothing read
    kind, facts = module_runner(interface_facts.main, {"name": "eth1"})
    assert kind == "exit"
    assert result["ansible_facts"]["narwhal_interface"] == facts["ansible_facts"]["narwhal_interface"]
    assert result["ansible_facts"]["narwhal_interface"]["global_addresses"] == ["172.31.241.99"]
    record["node"]["address"] = "172.31.241.11"
    kind, result = module_runner(engine_prereqs.main, {"record": record})
    assert kind == "fail" and result["problems"] == ["eth1 no longer carries the recorded address 172.31.241.11; "
                                                     "rerun discovery"], result
    assert len(calls.read_text().split()) == 3

    # held: the same run reads what install would write (held_files' comparison), never returning a digest
    record["node"]["address"] = "172.31.241.99"
    env = tmp_path / "engine-1.env"
    env.write_text("NARWHAL_ENGINE=engine-1\n")
    env.chmod(0o600)
    sha = hashlib.sha256(b"NARWHAL_ENGINE=engine-1\n").hexdigest()
    held = [{"path": str(tmp_path), "state": "directory"},
            {"path": str(env), "sha256": sha, "mode": "0600"},
            {"path": str(env) + ".key", "sha256": "1" * 64, "mode": "0600"},
            {"path": str(tmp_path / "ip.json"), "mode": "0600"}]
    kind, result = module_runner(engine_prereqs.main, {"record": record, "held": held})
    assert kind == "exit", result
    assert result["held_differ"] == [str(env) + ".key", str(tmp_path / "ip.json")]
    assert sha not in repr(result) and "1" * 64 not in repr(result)
    kind, result = module_runner(engine_prereqs.main, {"record": record, "held": [{"path": str(env), "src": "/x"}]})
    assert kind == "fail" and "action plugin" in result["msg"]


# ------------------------------------------------------------------------------------------ the fabric link


@pytest.mark.parametrize("operstate, flags, cause", [
    ("DOWN", ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "has no carrier (ip reports flag NO-CARRIER"),
    ("DORMANT", ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "its link is not up (ip reports operstate DORMANT)"),
], ids=["no-carrier", "dormant"])
def test_prepare_refuses_a_fabric_link_that_went_down(module_runner, tmp_path, monkeypatch, operstate, flags, cause):
    """A link that lost its carrier after discovery is one of prepare's named problems (no daemon needed: the
    module collects every problem)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    links = [{"ifname": "eth1", "operstate": operstate, "flags": flags, "mtu": 9000, "addr_info": [
        {"family": "inet", "local": "172.31.241.99", "prefixlen": 24, "scope": "global"}]}]
    (tmp_path / "ip.json").write_text(json.dumps(links))
    (bindir / "ip").write_text("#!/bin/sh\nexec /bin/cat %s\n" % (tmp_path / "ip.json"))
    (bindir / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bindir)
    record = json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"]["engine-1"]
    record["runtime"].update(model_path=str(tmp_path))
    record["node"].update(fabric_interface="eth1", address="172.31.241.99")
    kind, result = module_runner(engine_prereqs.main, {"record": record,
                                                       "docker_host": "unix://%s" % (tmp_path / "none.sock")})
    assert kind == "fail"
    refusals = [p for p in result["problems"] if "cannot carry KV" in p]
    assert len(refusals) == 1 and cause in refusals[0], result["problems"]
    assert refusals[0].startswith("'ip -j addr show' on host %s: interface eth1 cannot carry KV: "
                                  % socket.gethostname())
    assert refusals[0].endswith("then prepare a new run (rerun discovery first for another interface)")
