# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TLS for the engine-side tests, on the one temporary CA of the tests (test_support.tempca): a CA and the leaf
certificates it signs as (key, certificate) pairs, an engine's TLS directory as install writes it (ca.crt,
server.crt, server.key), an HTTPS server on 127.0.0.1 serving such a directory's certificate and the engine it
serves (VersionEngine: /health and /version)."""
import json
from http.server import BaseHTTPRequestHandler

from cryptography.hazmat.primitives import serialization

from test_support import tempca


def make_ca(common="narwhal test CA"):
    """(key, certificate) of a self-signed CA."""
    ca = tempca.CA(common)
    return ca.key, ca.cert


def make_leaf(ca, names=("127.0.0.1",), days=365, start_days=-1):
    """(key, certificate) of a server certificate for `names` (IP addresses or DNS names) signed by `ca` ((key,
    certificate)), valid from `start_days` to `start_days + days` days from now."""
    signer = tempca.CA.__new__(tempca.CA)
    signer.key, signer.cert = ca
    start = tempca._now() + start_days * tempca.DAY
    return signer.leaf(names, start, start + days * tempca.DAY)


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def der(cert):
    return cert.public_bytes(serialization.Encoding.DER)


def write_tls_dir(folder, ca_cert, leaf):
    """An engine's TLS directory as install writes it: ca.crt, server.crt and server.key (0600) -> the folder."""
    key, cert = leaf
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(pem(ca_cert))
    (folder / "server.crt").write_bytes(pem(cert))
    (folder / "server.key").write_bytes(tempca._pem(key))
    (folder / "server.key").chmod(0o600)
    return folder


def https_server(handler, folder, host="127.0.0.1"):
    """A threaded HTTPS server of `handler` on host:<free port>, serving the certificate of the TLS directory
    `folder` (as uvicorn wraps vLLM's socket); started. Call .shutdown() and .server_close()."""
    return tempca.https_server(handler, folder / "server.crt", folder / "server.key", host)[0]


class VersionEngine(BaseHTTPRequestHandler):
    """What the launcher's probes ask of an engine: GET /health (empty 200) and /version ({"version": version})."""
    version = "0.33.0"

    def do_GET(self):  # noqa: N802
        body = b"" if self.path == "/health" else json.dumps({"version": self.version}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass
