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
from test_support.tempca import CA, https_server

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
    monkeypatch.setattr(http, "_CONTEXTS", {})
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
        assert status == 0 and text.startswith("certificate verify failed: self") and "signed" in text
        assert http.tls_failure((status, text)) == text
    finally:
        srv.shutdown()
        srv.server_close()


# ------------------------------------------------------------- https against the site CA (issue 35)


@pytest.fixture(scope="module")
def site_ca(tmp_path_factory):
    """The site CA's file, another CA's, and HTTPS echo servers on 127.0.0.1: one with a certificate of the site CA
    for 127.0.0.1, one of the other CA, one expired, one for another address -> {name: URL}, {ca, other}."""
    tmp = tmp_path_factory.mktemp("tls")
    ca, other = CA("narwhal site CA"), CA("someone else's CA")
    files = {"ca": str(ca.write(tmp / "ca.crt")), "other": str(other.write(tmp / "other.crt"))}
    servers, urls = [], {}
    for name, issuer, names, kwargs in (("good", ca, ["127.0.0.1", "localhost"], {}),
                                        ("other", other, ["127.0.0.1"], {}),
                                        ("expired", ca, ["127.0.0.1"], {"expired": True}),
                                        ("elsewhere", ca, ["10.0.0.11", "engine-1.example"], {})):
        srv, urls[name] = https_server(Echo, *issuer.write_server(tmp, name, names, **kwargs))
        servers.append(srv)
    yield urls, files
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_the_site_ca_verifies_an_engine_it_signed(site_ca):
    urls, files = site_ca
    assert http.call(urls["good"] + "/v1", "k3y", {"n": 1}, cafile=files["ca"]) == (
        200, {"got": {"n": 1}, "auth": "Bearer k3y"})
    assert http.call(urls["good"] + "/missing", cafile=files["ca"]) == (404, "no such page")
    # the name the certificate gives, too
    assert http.call(urls["good"].replace("127.0.0.1", "localhost") + "/v1", None, {}, cafile=files["ca"])[0] == 200


@pytest.mark.parametrize("server, cafile, why", [
    ("other", "ca", "unable to get local issuer certificate"),  # signed by another CA
    ("good", "other", "unable to get local issuer certificate"),  # the site's engine, another CA trusted
    ("expired", "ca", "certificate has expired"),
    ("elsewhere", "ca", "IP address mismatch"),  # the certificate names other addresses
    ("good", None, "unable to get local issuer certificate"),  # the system's CAs do not know the site CA
])
def test_a_certificate_that_does_not_verify_is_refused_with_the_tls_reason(site_ca, server, cafile, why):
    urls, files = site_ca
    answer = http.call(urls[server] + "/v1", "k3y", {"n": 1}, cafile=files.get(cafile), timeout=5)
    assert answer[0] == 0 and answer[1].startswith("certificate verify failed: ") and why in answer[1], answer
    assert http.tls_failure(answer) == answer[1]
    assert "k3y" not in answer[1]


def test_a_plain_http_server_at_an_https_url_is_a_tls_failure(server, site_ca):
    _urls, files = site_ca
    answer = http.call(server.replace("http://", "https://") + "/v1", cafile=files["ca"], timeout=5)
    assert answer[0] == 0 and answer[1].startswith("TLS handshake failed: ") and http.tls_failure(answer), answer
    assert "_ssl.c" not in answer[1]


def test_other_failures_are_no_tls_failure(server):
    assert http.tls_failure(http.call("http://127.0.0.1:9/none", timeout=2)) is None
    assert http.tls_failure(http.call(server + "/missing")) is None
    assert http.tls_failure((0, "certificate verify failed")) is None  # not tls_reason's text


def test_one_context_per_ca_file(site_ca, monkeypatch):
    _urls, files = site_ca
    built = []
    real = http.make_context
    monkeypatch.setattr(http, "_CONTEXTS", {})
    monkeypatch.setattr(http, "make_context", lambda **kw: built.append(kw) or real(**kw))
    for _attempt in range(3):
        assert http.tls_context(files["ca"]) is http.tls_context(files["ca"])
        http.tls_context(files["other"])
        http.tls_context()
    assert built == [{"cafile": files["ca"], "validate_certs": True},
                     {"cafile": files["other"], "validate_certs": True}, {"validate_certs": True}]
    # the site CA's context trusts that file alone
    assert [c["subject"] for c in http.tls_context(files["ca"]).get_ca_certs()] == [((("commonName",
                                                                                       "narwhal site CA"),),)]


def test_a_ca_file_that_is_no_certificate_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(http, "_CONTEXTS", {})
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(ssl.SSLError):
        http.tls_context(str(tmp_path / "ca.crt"))
    with pytest.raises(OSError):
        http.tls_context(str(tmp_path / "missing.crt"))
