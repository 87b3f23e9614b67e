# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""engine_prereqs' checks (plugins/module_utils/_facts/prereqs.py). The port check: a listener on the attestation
port that answers the engine's attestation URL is the attestation sidecar (accepted, reported); anything else on the
engine's ports is refused, naming port and fix. Real listening sockets on 127.0.0.1 and real GETs
(_common/http.py::get_status; the listeners found through /proc/net/tcp as on an engine host). The read of `ip`:
its trouble is named, never read as a missing interface."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_support.model import checkpoint, stamp

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import attestation_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import get_status
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import port_set
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import prereqs


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
    busy = prereqs.foreign_listeners(ports, None)
    return prereqs.port_problems(rec, busy, url or attestation_url(node["address"], node["attest_port"]),
                                 get_status, 5)


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
        busy = prereqs.foreign_listeners({node["attest_port"]}, None)
        report, problems = prereqs.port_problems(rec, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                                 get_status, 1)
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
    busy = prereqs.foreign_listeners(port_set(head), None)
    _report, problems = prereqs.port_problems(head, busy, attestation_url("127.0.0.1", node["attest_port"]),
                                              get_status, 5)
    assert problems == ["something already listens on port %d of this host; stop it or give engine-2 other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT, "
                        "NARWHAL_DATA_PARALLEL_RPC_PORT)" % head["data_parallel_rpc_port"]]


def test_the_kv_events_ports_of_this_hosts_ranks_must_be_free(listen):
    """With KV events (the record's kv_events) each data-parallel rank this host runs publishes on the record's port
    + its global rank (_common/ports.py::kv_events_range): another program there is refused, naming the input."""
    rec = record(free_port(), free_port(), free_port())
    kv = free_port()
    with_kv = dict(rec, kv_events={"endpoint": "tcp://*:%d" % kv, "port": kv, "hash_seed": "0"})
    assert port_set(with_kv) == port_set(rec) | {kv}
    # the second host of an engine of DP 4 over 2 hosts binds the ports of ranks 2 and 3
    member = dict(with_kv, data_parallel_size=4, data_parallel_size_local=2,
                  member={"rank": 1, "start_rank": 2, "head_address": "x"})
    assert port_set(member) == {rec["node"]["side_channel_port"], kv + 2, kv + 3}
    listen(kv)
    busy = prereqs.foreign_listeners(port_set(with_kv), None)
    assert busy == [kv]
    problems = prereqs.port_problems(with_kv, busy, attestation_url("127.0.0.1", rec["node"]["attest_port"]),
                                     get_status, 1)[1]
    assert problems == ["something already listens on port %d of this host; stop it or give engine-2 other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT, "
                        "NARWHAL_KV_EVENTS_PORT)" % kv]
    # without kv_events the port is not the engine's
    assert prereqs.foreign_listeners(port_set(rec), None) == []


def test_a_headless_host_does_not_need_its_engines_http_or_attestation_port_free(listen):
    """A host after the head of an engine across hosts (member_record's view, member.rank > 0) runs engine cores
    only: another program on the engine's HTTP or attestation port there is no conflict; on its side channel it is."""
    rec = record(free_port(), free_port(), free_port())
    node = rec["node"]
    headless = dict(rec, member={"rank": 1, "start_rank": 2, "head_address": "x"})
    listen(node["engine_port"], handler=BaseHTTPRequestHandler)
    listen(node["attest_port"], handler=BaseHTTPRequestHandler)
    busy = prereqs.foreign_listeners(port_set(headless), None)
    assert busy == []
    assert prereqs.port_problems(headless, busy, attestation_url("127.0.0.1", node["attest_port"]), get_status,
                                 1)[1] == []
    listen(node["side_channel_port"])
    busy = prereqs.foreign_listeners(port_set(headless), None)
    assert busy == [node["side_channel_port"]]
    assert prereqs.port_problems(headless, busy, attestation_url("127.0.0.1", node["attest_port"]), get_status,
                                 1)[1][0].startswith("something already listens on port %d of this host"
                                                     % node["side_channel_port"])
    # the same listeners are the head's conflict
    assert sorted(prereqs.foreign_listeners(port_set(rec), None)) == sorted(
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


# ------------------------------------------------------------------------------------------ the read of ip


class _PrereqModule:
    """The two things prereqs.read_links asks of its AnsibleModule."""

    def __init__(self, bindir, timeout=1):
        self.params = {"command_timeout": timeout}
        self.bindir = bindir

    def get_bin_path(self, name):
        path = self.bindir / name
        return str(path) if path.exists() else None


@pytest.mark.parametrize("script, needle", [
    ("/bin/sleep 30", "did not answer within 1 s (timed out, killed)"),
    ("echo '[1]'", "is not the JSON 'ip -j' writes ('[1]'): entry 0 is a JSON int"),
    ("echo 'RTNETLINK answers: Operation not permitted' >&2; exit 2", "failed on host"),
])
def test_prereqs_name_ip_trouble_instead_of_a_missing_interface(tmp_path, script, needle):
    (tmp_path / "ip").write_text("#!/bin/sh\n%s\n" % script)
    (tmp_path / "ip").chmod(0o755)
    problem = prereqs.read_links(_PrereqModule(tmp_path))
    assert isinstance(problem, str) and needle in problem and "'ip -j addr show'" in problem
    assert socket.gethostname() in problem
    assert prereqs.read_links(_PrereqModule(tmp_path / "none")).startswith("'ip' (iproute2) is not installed")


# ------------------------------------------------------------------------------------------ the checkpoint's manifest


def test_the_checkpoints_manifest_now_is_read_for_the_stale_check(tmp_path):
    """engine_prereqs' model_manifest: the digest of the STAMP the checkpoint holds now (None without one, or without
    the directory, which path_problems names); a damaged STAMP is a problem naming NARWHAL_MODEL_PATH."""
    path = checkpoint(tmp_path, "aiconf__Qwen--Qwen2.5-7B")
    rec = {"runtime": {"model_path": str(path)}}
    assert prereqs.model_manifest(rec) == (None, [])
    assert prereqs.model_manifest({"runtime": {"model_path": str(tmp_path / "gone")}}) == (None, [])
    document = stamp(path)
    assert prereqs.model_manifest(rec) == (document["digest"], [])
    stamp(path, digest="sha256:" + "0" * 64)
    digest, problems = prereqs.model_manifest(rec)
    assert digest is None and len(problems) == 1
    assert problems[0].startswith("the model manifest %s/%s records digest" % (path, STAMP))
    assert problems[0].endswith("(NARWHAL_MODEL_PATH)") and "rerun the deliver stage" in problems[0]
