# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A temporary certificate authority for the TLS client tests (`cryptography`, a dependency of ansible-core): a CA,
server certificates it signs for the names a server is reached at (IP addresses as iPAddress, names as dNSName, EC
P-256, serverAuth, as the collection's site CA issues them), expired ones, and HTTPS servers on loopback that present
them (http.server wrapped with ssl, as uvicorn wraps its socket)."""
import datetime
import ipaddress
import ssl
import threading
from http.server import ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


def _now():
    return datetime.datetime.now(datetime.UTC)


def _pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CA:
    """A self-signed EC P-256 CA (CA:true, pathlen 0) named `name`."""

    def __init__(self, name="narwhal test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(_now() - DAY).not_valid_after(_now() + 3650 * DAY)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False, encipher_only=False,
                                                  decipher_only=False), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
                     .sign(self.key, hashes.SHA256()))

    @property
    def pem(self):
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path):
        """The CA certificate (PEM) at `path` -> `path`."""
        path.write_bytes(self.pem)
        return path

    def issue(self, names, days=30, expired=False):
        """-> (certificate PEM, key PEM) of a server reached at `names` (addresses and DNS names), serverAuth,
        CA:false; `expired`: its validity ended yesterday."""
        start, end = (_now() - 10 * DAY, _now() - DAY) if expired else (_now() - DAY, _now() + days * DAY)
        key, cert = self.leaf(names, start, end)
        return cert.public_bytes(serialization.Encoding.PEM), _pem(key)

    def leaf(self, names, start, end):
        """-> (key, certificate) objects of a server reached at `names`, valid from `start` to `end`."""
        key = ec.generate_private_key(ec.SECP256R1())
        alt = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(names[0]))]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        return key, cert

    def write_server(self, where, stem, names, **kwargs):
        """The server certificate and key of `names` as where/<stem>.crt and where/<stem>.key (0600) -> (crt, key)."""
        cert, key = self.issue(names, **kwargs)
        crt_path, key_path = where / ("%s.crt" % stem), where / ("%s.key" % stem)
        crt_path.write_bytes(cert)
        key_path.write_bytes(key)
        key_path.chmod(0o600)
        return crt_path, key_path


def https_server(handler, cert_file, key_file, host="127.0.0.1"):
    """A ThreadingHTTPServer of `handler` on a free port of `host`, its socket wrapped with TLS presenting
    `cert_file`; serving in a daemon thread -> (server, https URL). The caller shuts it down."""
    srv = ThreadingHTTPServer((host, 0), handler)
    srv.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert_file), str(key_file))
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    shown = "[%s]" % host if ":" in host else host
    return srv, "https://%s:%d" % (shown, srv.server_address[1])
