# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TLS for the engine-side tests: a CA and the leaf certificates it signs (EC P-256, made with `cryptography`, as
the collection's site CA makes them), an engine's TLS directory as install writes it (ca.crt, server.crt,
server.key) and an HTTPS server on 127.0.0.1 serving such a certificate."""
import datetime
import ipaddress
import ssl
import threading
from http.server import ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common="narwhal test CA"):
    """(key, certificate) of a self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca, names=("127.0.0.1",), days=365, start_days=-1):
    """(key, certificate) of a server certificate for `names` (IP addresses or DNS names) signed by `ca` ((key,
    certificate)), valid from `start_days` to `start_days + days` days from now."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    alt = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=start_days))
            .not_valid_after(now + datetime.timedelta(days=start_days + days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


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
    (folder / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    (folder / "server.key").chmod(0o600)
    return folder


def https_server(handler, folder, host="127.0.0.1"):
    """A threaded HTTPS server of `handler` on host:<free port>, serving the certificate of the TLS directory
    `folder` (as uvicorn wraps vLLM's socket: an SSLContext(PROTOCOL_TLS_SERVER) with load_cert_chain); started.
    Call .shutdown() and .server_close()."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(folder / "server.crt"), str(folder / "server.key"))
    server = ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
