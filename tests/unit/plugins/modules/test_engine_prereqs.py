# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""engine_prereqs' port check: a listener on the attestation port that answers the engine's attestation URL is the
attestation sidecar (accepted, reported); anything else on the engine's ports is refused, naming port and fix.
Real listening sockets on 127.0.0.1 and real GETs (found through /proc/net/tcp as on an engine host)."""

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_support.paths import HAND_LAUNCH_CONFIG

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import attestation_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import port_set
from ansible_collections.narwhal.deploy.plugins.module_utils._docker import engine_api as _engine_api
from ansible_collections.narwhal.deploy.plugins.modules import engine_prereqs, interface_facts


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sidecar(BaseHTTPRequestHandler):
    """Answers its attestation URL (/v1/attestation) with 200; everything else 404, like a plain web server."""

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's name
        body = json.dumps({"evidence": "x"}).encode() if self.path == "/v1/attestation" else b"not found"
        self.send_response(200 if self.path == "/v1/attestation" else 404)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def listen():
    servers = []

    def start(port, handler=Sidecar):
        srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def record(attest, engine_port, side):
    return {"engine": "engine-2", "node": {"address": "127.0.0.1", "engine_port": engine_port, "attest_port": attest,
                                           "side_channel_port": side, "side_channel_ports": [side, side]}}


def check(rec, url=None):
    node = rec["node"]
    ports = {node["engine_port"], node["attest_port"], node["side_channel_port"]}
    busy = engine_prereqs.foreign_listeners(ports, None)
    return engine_prereqs.port_problems(rec, busy, url or attestation_url(node["address"], node["attest_port"]),
                                        engine_prereqs.get_status, 5)


def test_nothing_listening_passes():
    report, problems = check(record(free_port(), free_port(), free_port()))
    assert problems == [] and report["listening"] is False and report["answered"] is None


def test_the_attestation_sidecar_is_accepted_and_reported(listen):
    rec = record(free_port(), free_port(), free_port())
    listen(rec["node"]["attest_port"])
    report, problems = check(rec)
    assert problems == []
    assert report == {"url": "http://127.0.0.1:%d/v1/attestation" % rec["node"]["attest_port"],
                      "port": rec["node"]["attest_port"], "listening": True, "answered": True, "status": 200,
                      "error": None}


def test_another_program_on_the_attestation_port_is_refused(listen):
    rec = record(free_port(), free_port(), free_port())
    attest = rec["node"]["attest_port"]
    listen(attest)
    # the listener answers, but not at this engine's attestation URL: a plain web server, not the sidecar
    report, problems = check(rec, "http://127.0.0.1:%d/other" % attest)
    assert report["answered"] is False and report["status"] == 404
    assert len(problems) == 1
    assert problems[0].startswith("something already listens on port %d of host " % attest)
    assert "does not answer the attestation URL http://127.0.0.1:%d/other (HTTP 404)" % attest in problems[0]
    assert "NARWHAL_NODE_<n>_ATTEST_PORT" in problems[0]


def test_a_silent_listener_on_the_attestation_port_is_refused():
    rec = record(free_port(), free_port(), free_port())
    with socket.socket() as sock:  # listens, never answers HTTP: the GET times out
        sock.bind(("127.0.0.1", rec["node"]["attest_port"]))
        sock.listen(1)
        node = rec["node"]
        busy = engine_prereqs.foreign_listeners({node["attest_port"]}, None)
        report, problems = engine_prereqs.port_problems(rec, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                                        engine_prereqs.get_status, 1)
    assert report["listening"] and report["answered"] is False and report["status"] is None and report["error"]
    assert "is not the attestation sidecar" in problems[0]


def test_an_attestation_url_on_another_port_cannot_vouch_for_the_listener(listen):
    rec = record(free_port(), free_port(), free_port())
    listen(rec["node"]["attest_port"])
    elsewhere = listen(free_port())
    report, problems = check(rec, "http://127.0.0.1:%d/v1/attestation" % elsewhere.server_address[1])
    assert report["answered"] is False and "is not on that port" in problems[0]
    assert "NARWHAL_NODE_<n>_ATTESTATION_URL" in problems[0]


def test_the_head_of_an_engine_across_hosts_needs_its_data_parallel_rpc_port_free(listen):
    rec = record(free_port(), free_port(), free_port())
    node = rec["node"]
    assert port_set(rec) == {node["engine_port"], node["attest_port"], node["side_channel_port"]}
    head = dict(rec, data_parallel_rpc_port=free_port(), member={"rank": 0, "start_rank": 0, "head_address": "x"})
    headless = dict(head, member={"rank": 1, "start_rank": 2, "head_address": "x"})
    assert head["data_parallel_rpc_port"] in port_set(head)
    # a headless host connects to the RPC port and serves no HTTP API or attestation: only its side channel is its own
    assert port_set(headless) == {node["side_channel_port"]}
    listen(head["data_parallel_rpc_port"])
    busy = engine_prereqs.foreign_listeners(port_set(head), None)
    _report, problems = engine_prereqs.port_problems(head, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                                     engine_prereqs.get_status, 5)
    assert problems == ["something already listens on port %d of this host; stop it or give engine-2 other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT, "
                        "NARWHAL_DATA_PARALLEL_RPC_PORT)" % head["data_parallel_rpc_port"]]


def test_a_headless_host_does_not_need_its_engines_http_or_attestation_port_free(listen):
    """A host after the head of an engine across hosts (member_record's view, member.rank > 0) runs engine cores
    only: another program on the engine's HTTP or attestation port there is no conflict; on its side channel it is."""
    rec = record(free_port(), free_port(), free_port())
    node = rec["node"]
    headless = dict(rec, member={"rank": 1, "start_rank": 2, "head_address": "x"})
    listen(node["engine_port"], handler=BaseHTTPRequestHandler)
    listen(node["attest_port"], handler=BaseHTTPRequestHandler)
    busy = engine_prereqs.foreign_listeners(port_set(headless), None)
    assert busy == []
    assert engine_prereqs.port_problems(headless, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                        engine_prereqs.get_status, 1)[1] == []
    listen(node["side_channel_port"])
    busy = engine_prereqs.foreign_listeners(port_set(headless), None)
    assert busy == [node["side_channel_port"]]
    assert engine_prereqs.port_problems(headless, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                        engine_prereqs.get_status, 1)[1][0].startswith(
        "something already listens on port %d of this host" % node["side_channel_port"])
    # the same listeners are the head's conflict
    assert sorted(engine_prereqs.foreign_listeners(port_set(rec), None)) == sorted(
        [node["engine_port"], node["attest_port"], node["side_channel_port"]])


def test_the_sidecar_on_the_engine_port_is_still_a_conflict(listen):
    """Only the attestation port may be held by the sidecar: the same program on the engine's HTTP or side-channel
    port is refused with the message that names the port and the fix."""
    rec = record(free_port(), free_port(), free_port())
    listen(rec["node"]["attest_port"])
    listen(rec["node"]["engine_port"])
    listen(rec["node"]["side_channel_port"])
    report, problems = check(rec)
    assert report["answered"] is True
    ports = sorted([rec["node"]["engine_port"], rec["node"]["side_channel_port"]])
    assert problems == ["something already listens on port %s of this host; stop it or give engine-2 other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT)"
                        % ",".join(map(str, ports))]


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
