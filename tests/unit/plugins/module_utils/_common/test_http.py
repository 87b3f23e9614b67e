"""The one JSON request (plugins/module_utils/_common/http.py::call): one TLS context per process, not one per request
(Ansible's open_url reads the CA certificates for each; ~20 ms of CPU per request, measured on the transfer probe).
The attestation GET (get_status, engine_prereqs'): no redirect followed, no certificate verified, and why nothing
answered in urllib's own words."""

import json
import shutil
import ssl
import subprocess
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


class Attestation(BaseHTTPRequestHandler):
    """The sidecar's URL answers 200; /moved redirects to it."""

    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/v1/attestation" else 302)
        if self.path != "/v1/attestation":
            self.send_header("Location", "/v1/attestation")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def _serve(srv):
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_the_attestation_get_follows_no_redirect():
    srv = _serve(ThreadingHTTPServer(("127.0.0.1", 0), Attestation))
    url = "http://127.0.0.1:%d" % srv.server_address[1]
    try:
        assert http.get_status(url + "/v1/attestation", 5) == (200, None)
        assert http.get_status(url + "/moved", 5) == (302, "HTTP 302")
        assert http.call(url + "/moved") == (200, {})  # the JSON request follows it
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_attestation_get_says_why_nothing_answered():
    status, why = http.get_status("http://127.0.0.1:9/none", 2)
    assert status is None and "Connection refused" in why and not why.startswith("<urlopen error")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a certificate")
def test_the_attestation_get_verifies_no_certificate(tmp_path):
    """A sidecar behind a self-signed certificate answers the attestation GET; the JSON request refuses it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=sidecar",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Attestation)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    _serve(srv)
    url = "https://127.0.0.1:%d/v1/attestation" % srv.server_address[1]
    try:
        assert http.get_status(url, 5) == (200, None)
        status, text = http.call(url, timeout=5)
        assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in text
    finally:
        srv.shutdown()
        srv.server_close()
