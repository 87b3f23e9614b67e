# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tls_material, the step (_common/step.py; plugins/modules/tls_material.py documents it, plugins/action/tls_material.py
runs it in the controller's process): the TLS material of NARWHAL_TLS_DIR (docs/tls.md).

    <dir>/ca.crt            the CA certificate, 0644
    <dir>/ca.key            the site CA's private key, 0600 (site mode only)
    <dir>/hosts/<host>.crt  the leaf certificate of inventory host <host>, 0644
    <dir>/hosts/<host>.key  its private key (PEM, unencrypted), 0600

site: makes the site CA (EC P-256, CA:TRUE pathlen 0, CA_DAYS) and each host's leaf (EC P-256, ECDSA with SHA-256,
the host's names in its subjectAltName, serverAuth, CA:FALSE, `cert_days`), writing only what must change through one
OutputSet (_outputs/writer.py): all or nothing, a second run with the same hosts changes nothing. operator: reads and
checks the operator's files, writes nothing. The edge of _tls/: it reads the files and parses them with
`cryptography` (pinned in requirements.txt); the rules are _tls/certs.py's. No private key reaches a result or a
message.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import NotRegularFileError, open_regular
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.writer import OutputError, OutputSet
from ansible_collections.narwhal.deploy.plugins.module_utils._tls.certs import (
    CA_DAYS,
    HOST_FILE_NAME,
    MODES,
    RENEW_DAYS,
    ca_problem,
    days_left,
    iso_utc,
    leaf_problem,
    normal_name,
    normal_names,
    renew_reason,
    san_names,
)

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - ansible-core itself needs it
    x509 = None

__metaclass__ = type

CERT_MODE = 0o644
KEY_MODE = 0o600
BACKDATE = datetime.timedelta(hours=1)  # a new certificate is valid from an hour ago: hosts' clocks differ a little
SITE_FIX = "move ca.crt and ca.key away and rerun to make a new site CA (every host certificate is then issued again)"


def module_spec():
    """The argument spec of tls_material (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=list(MODES)),
            dir=dict(type="path"),
            cert_days=dict(type="int", default=365),
            hosts=dict(type="list", elements="dict", default=[],
                       options=dict(host=dict(type="str", required=True),
                                    names=dict(type="list", elements="str", required=True))),
        ),
        supports_check_mode=True,
    )


def _now():
    """This controller's time (UTC, whole seconds, as certificates hold it)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


# ------------------------------------------------------------------------------------------------
# reading and parsing


def read_file(path):
    """(bytes, mode) of a regular file, (None, None) when it is absent; StepError naming anything else."""
    try:
        with open_regular(path) as fh:
            return fh.read(), stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
    except FileNotFoundError:
        return None, None
    except (OSError, NotRegularFileError) as exc:
        raise StepError("cannot read %s: %s; it must be a regular file this user can read"
                        % (path, exc.strerror or exc), path=path)


def cert_facts(cert):
    """What _tls/certs.py judges of a parsed certificate (see its module doc); ValueError for a malformed
    extension."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)
               if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address))]
        dns = [name.lower().rstrip(".") for name in san.get_values_for_type(x509.DNSName)]
    except x509.ExtensionNotFound:
        ips, dns = [], []
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    try:
        server_auth = ExtendedKeyUsageOID.SERVER_AUTH in cert.extensions.get_extension_for_class(
            x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        server_auth = None
    return {"not_before": cert.not_valid_before_utc, "not_after": cert.not_valid_after_utc, "ips": ips, "dns": dns,
            "is_ca": is_ca, "server_auth": server_auth}


def parse_certs(data):
    """The certificates of PEM bytes, in their order; ValueError when there is none or one is malformed."""
    certs = x509.load_pem_x509_certificates(data)
    for cert in certs:
        cert_facts(cert)
    return certs


def parse_key(data):
    """The private key of PEM bytes; ValueError when it is not one, TypeError when it is encrypted."""
    return serialization.load_pem_private_key(data, password=None)


def key_matches(key, cert):
    """Whether `key` is the private key of `cert`'s public key."""
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def issued_by(cert, ca):
    """Whether `ca` issued `cert`: the issuer name is the CA's subject and the signature verifies with its key."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def sha256(cert):
    """The hex sha256 of the certificate's DER (what a TLS client sees)."""
    return cert.fingerprint(hashes.SHA256()).hex()


# ------------------------------------------------------------------------------------------------
# making


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(now, days=CA_DAYS):
    """(key, certificate) of a new site CA: EC P-256, self-signed with ECDSA SHA-256, CA:TRUE pathlen 0 (critical),
    keyCertSign and cRLSign, valid `days` from now."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "narwhal.deploy"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "narwhal.deploy site CA %s" % ski.digest.hex()[:12])])
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _general_name(name):
    kind, value = normal_name(name)
    return x509.IPAddress(ipaddress.ip_address(value)) if kind == "ip" else x509.DNSName(value)


def make_leaf(ca_key, ca_cert, host, names, now, days):
    """(key, certificate) of a host: EC P-256, signed by the CA with ECDSA SHA-256, CN the inventory host, its names
    in the subjectAltName (addresses as iPAddress, names as dNSName), serverAuth, CA:FALSE; valid `days` from now,
    at most as long as the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    ca_after = ca_cert.not_valid_after_utc
    not_after = ca_after if days >= (ca_after - now).days else now + datetime.timedelta(days=days)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


# ------------------------------------------------------------------------------------------------
# the step


def _paths(directory, host):
    return os.path.join(directory, "hosts", host + ".crt"), os.path.join(directory, "hosts", host + ".key")


def _hosts(params):
    """{host: its normalised names} of the task's hosts, refusing a host named twice, a host that is not a file
    name, a host without a name and a name that is neither an address nor a DNS name."""
    hosts = {}
    for entry in params["hosts"]:
        host = entry["host"]
        if not HOST_FILE_NAME.match(host) or len(host) > 200:
            raise StepError("tls_material: inventory host %r cannot name its files %s.crt and %s.key; give the host a "
                            "name of letters, digits, '.', '_', ':' and '-'" % (host, host, host), host=host)
        if host in hosts:
            raise StepError("tls_material: hosts names %s twice; give each inventory host once" % host, host=host)
        try:
            names = normal_names(entry["names"])
        except ValueError as exc:
            raise StepError("tls_material: a name of host %s: %s; give the addresses and DNS names it is reached at"
                            % (host, exc), host=host)
        if not names:
            raise StepError("tls_material: host %s has no name it is reached at (no fleet URL and no address in its "
                            "launch record); rerun discovery so that the fleet names its engine" % host, host=host)
        hosts[host] = names
    return hosts


def _entry(cert, key_path, cert_path, now):
    return {"cert": cert_path, "key": key_path, "sha256": sha256(cert), "not_after": iso_utc(cert.not_valid_after_utc),
            "days_left": days_left(cert.not_valid_after_utc, now), "names": san_names(cert_facts(cert))}


def tls_material(run):
    params = run.params
    if params["mode"] == "off":
        return {"changed": False, "mode": "off", "ca": "", "hosts": {}}
    if x509 is None:
        raise StepError(missing_required_lib("cryptography"))
    directory = params.get("dir")
    if not directory or not os.path.isabs(directory):
        raise StepError("tls_material: dir %r must be an absolute path (NARWHAL_TLS_DIR resolved against the project "
                        "directory: narwhal_site.paths.tls_dir)" % (directory,), input="NARWHAL_TLS_DIR")
    hosts = _hosts(params)
    directory = os.path.normpath(directory)
    if params["mode"] == "operator":
        return _operator(run, directory, hosts, _now())
    if params["cert_days"] <= RENEW_DAYS:
        raise StepError("NARWHAL_TLS_CERT_DAYS=%d: a site certificate is issued again when fewer than %d days are "
                        "left, so it must be valid for more; set NARWHAL_TLS_CERT_DAYS to %d or more (the default is "
                        "365)" % (params["cert_days"], RENEW_DAYS, RENEW_DAYS + 1), input="NARWHAL_TLS_CERT_DAYS")
    try:
        with OutputSet(directory, "tls", check_mode=run.check_mode, who="tls_material") as out:
            return _site(run, out, directory, hosts, _now())
    except OutputError as exc:
        raise StepError("tls_material: %s" % exc, path=exc.path)


# ------------------------------------------------------------------------------------------------
# site mode


def _site_ca(out, directory, now):
    """(ca key, ca cert, {path: (bytes, mode)} to hold, what was made or []) of the site CA: read and checked, or made
    when neither file exists."""
    crt_path, key_path = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    crt, key = out.read(crt_path), out.read(key_path)
    if crt is None and key is None:
        ca_key, ca_cert = make_ca(now)
        files = {crt_path: (_pem_cert(ca_cert), CERT_MODE), key_path: (_pem_key(ca_key), KEY_MODE)}
        return ca_key, ca_cert, files, ["the site CA %s and %s" % (crt_path, key_path)]
    if crt is None or key is None:
        there, absent = (key_path, crt_path) if crt is None else (crt_path, key_path)
        raise StepError("NARWHAL_TLS=site: %s is there but %s is missing; the site CA needs both. Put it back, or %s; "
                        "for a CA of your own without its key, set NARWHAL_TLS=operator" % (there, absent, SITE_FIX),
                        path=absent)
    try:
        ca_cert = x509.load_pem_x509_certificate(crt)
        problem = ca_problem(cert_facts(ca_cert), now, site=True)
    except ValueError:
        problem = "is not a PEM certificate"
    if problem:
        raise StepError("NARWHAL_TLS=site: the site CA %s %s; %s" % (crt_path, problem, SITE_FIX), path=crt_path)
    try:
        ca_key = parse_key(key)
    except (ValueError, TypeError):
        raise StepError("NARWHAL_TLS=site: the site CA's key %s is not an unencrypted PEM private key; %s"
                        % (key_path, SITE_FIX), path=key_path) from None
    if not key_matches(ca_key, ca_cert):
        raise StepError("NARWHAL_TLS=site: the site CA's key %s is not the key of %s; put the matching ca.key back, or "
                        "%s" % (key_path, crt_path, SITE_FIX), path=key_path)
    return ca_key, ca_cert, {crt_path: (crt, CERT_MODE), key_path: (key, KEY_MODE)}, []


def _site_leaf(out, ca_cert, cert_path, key_path, names, now):
    """(certificate, its bytes, the key's bytes) of a host as the files hold them, and why the site CA must issue them
    again (None to keep them)."""
    crt, key = out.read(cert_path), out.read(key_path)
    cert = facts = None
    matches = issued = False
    if crt is not None and key is not None:
        try:
            cert = x509.load_pem_x509_certificate(crt)
            facts = cert_facts(cert)
            matches = key_matches(parse_key(key), cert)
            issued = issued_by(cert, ca_cert)
        except (ValueError, TypeError):
            facts = None
    return cert, crt, key, renew_reason(facts, names, now, issued, matches)


def _site(run, out, directory, hosts, now):
    ca_key, ca_cert, files, made = _site_ca(out, directory, now)
    entries = {}
    for host, names in sorted(hosts.items()):
        cert_path, key_path = _paths(directory, host)
        cert, crt, key, reason = _site_leaf(out, ca_cert, cert_path, key_path, names, now)
        if reason:
            new_key, cert = make_leaf(ca_key, ca_cert, host, names, now, run.params["cert_days"])
            crt, key = _pem_cert(cert), _pem_key(new_key)
            made.append("%s and %s (%s)" % (cert_path, key_path, reason))
        files[cert_path], files[key_path] = (crt, CERT_MODE), (key, KEY_MODE)
        entries[host] = _entry(cert, key_path, cert_path, now)
    changes = out.plan(files)
    if changes and not run.check_mode:
        out.apply(changes, kept="the TLS material is as it was")
    result = {"changed": bool(changes), "mode": "site", "ca": os.path.join(directory, "ca.crt"), "hosts": entries}
    if run.diff and changes:  # what is made and why, and modes set right; never the files' text (private keys)
        made_text = "\n".join(made)
        result["diff"] = {"prepared": "\n".join(["made %s" % m for m in made] + [
            "mode %04o: %s" % (c[3], c[0]) for c in changes if c[0] not in made_text])}
    return result


# ------------------------------------------------------------------------------------------------
# operator mode


def _operator_refusal(path, problem, fix):
    return StepError("NARWHAL_TLS=operator: %s %s; %s" % (path, problem, fix), path=path)


def _operator_ca(directory, now):
    path = os.path.join(directory, "ca.crt")
    data, _mode = read_file(path)
    fix = "put the PEM certificate of the CA that signed the hosts' certificates there (or set NARWHAL_TLS=site)"
    if data is None:
        raise _operator_refusal(path, "is missing", fix)
    try:
        cas = parse_certs(data)
    except ValueError:
        raise _operator_refusal(path, "is not a PEM certificate", fix) from None
    for ca in cas:
        problem = ca_problem(cert_facts(ca), now, site=False)
        if problem:
            raise _operator_refusal(path, "(%s) %s" % (ca.subject.rfc4514_string(), problem),
                                    "put a valid CA certificate there and the host certificates it signs")
    return path, cas


def _operator_key(key_path, cert_path, cert):
    data, mode = read_file(key_path)
    fix = "put the unencrypted PEM private key of %s there (mode 0600)" % cert_path
    if data is None:
        raise _operator_refusal(key_path, "is missing", fix)
    if mode & 0o077:
        raise _operator_refusal(key_path, "has mode %04o; a private key must be readable by its owner only"
                                % mode, "chmod 600 %s" % key_path)
    try:
        key = parse_key(data)
    except (ValueError, TypeError):
        raise _operator_refusal(key_path, "is not an unencrypted PEM private key", fix) from None
    if not key_matches(key, cert):
        raise _operator_refusal(key_path, "is not the key of %s" % cert_path,
                                "put the key %s was issued for there" % cert_path)


def _operator_leaf(run, ca_path, cas, host, names, cert_path, key_path, now):
    data, _mode = read_file(cert_path)
    fix = "issue %s a certificate from the CA of %s holding %s in its subjectAltName and put it there (PEM)" % (
        host, ca_path, ", ".join(names))
    if data is None:
        raise _operator_refusal(cert_path, "is missing", fix)
    try:
        cert = parse_certs(data)[0]
        facts = cert_facts(cert)
    except ValueError:
        raise _operator_refusal(cert_path, "is not a PEM certificate", fix) from None
    if not any(issued_by(cert, ca) for ca in cas):
        raise _operator_refusal(cert_path, "is not signed by %s (issuer %s)" % (ca_path, cert.issuer.rfc4514_string()),
                                fix)
    problem = leaf_problem(facts, names, now)
    if problem:
        raise _operator_refusal(cert_path, problem, fix)
    _operator_key(key_path, cert_path, cert)
    left = days_left(facts["not_after"], now)
    if left < RENEW_DAYS:
        run.warnings.append("%s expires on %s (%d days left); issue %s a new certificate and rerun"
                            % (cert_path, iso_utc(facts["not_after"]), left, host))
    return cert


def _operator(run, directory, hosts, now):
    ca_path, cas = _operator_ca(directory, now)
    entries = {}
    for host, names in sorted(hosts.items()):
        cert_path, key_path = _paths(directory, host)
        cert = _operator_leaf(run, ca_path, cas, host, names, cert_path, key_path, now)
        entries[host] = _entry(cert, key_path, cert_path, now)
    return {"changed": False, "mode": "operator", "ca": ca_path, "hosts": entries}
