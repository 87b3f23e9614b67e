"""The one JSON request (plugins/module_utils/_common/http.py::call): one TLS context per process, not one per request
(Ansible's open_url reads the CA certificates for each; ~20 ms of CPU per request, measured on the transfer probe)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common import http


class Echo(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"got": json.loads(body), "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):  # noqa: N802
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b"no such page")

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()


def test_requests_share_one_tls_context(server, monkeypatch):
    built = []
    real = http.make_context
    monkeypatch.setattr(http, "_CONTEXT", [])
    monkeypatch.setattr(http, "make_context", lambda **kw: built.append(kw) or real(**kw))
    for n in range(5):
        assert http.call(server + "/v1", "k3y", {"n": n}) == (200, {"got": {"n": n}, "auth": "Bearer k3y"})
    assert http.call(server + "/missing") == (404, "no such page")
    assert built == [{"validate_certs": True}]
    assert http.tls_context() is http.tls_context()


def test_nothing_answering_is_status_0():
    status, text = http.call("http://127.0.0.1:9/none", timeout=2)
    assert status == 0 and text
