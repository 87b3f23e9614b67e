"""tls_material, the step (plugins/module_utils/_tls/material.py, documented in plugins/modules/tls_material.py), run as
its action plugin runs it: site mode makes the site CA and the hosts' certificates that Python's ssl accepts, writes
only what must change (a second run changes nothing; a changed name, a near expiry or a foreign CA issues one
again), check mode writes nothing; operator mode refuses each bad file by name; no private key in any result."""
import datetime
import json
import os
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ansible_collections.narwhal.deploy.plugins.module_utils._tls import material
from ansible_collections.narwhal.deploy.plugins.module_utils._tls.material import make_ca, make_leaf

HOSTS = [{"host": "engine-1", "names": ["10.0.0.11"]},
         {"host": "engine-2", "names": ["[FD00:0::12]", "engine-2.fabric.example"]}]
DAY = datetime.timedelta(days=1)


def _pem(cert=None, key=None):
    if cert is not None:
        return cert.public_bytes(serialization.Encoding.PEM)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _snapshot(root):
    """{relative path: (bytes, mode, mtime_ns)} of every file under root."""
    found = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            st = os.stat(path)
            with open(path, "rb") as fh:
                found[os.path.relpath(path, root)] = (fh.read(), st.st_mode & 0o7777, st.st_mtime_ns)
    return found


def _no_private_key(result, root):
    """No private key's text (nor a line of it) is in the result."""
    text = json.dumps(result)
    assert "PRIVATE KEY" not in text
    for base, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".key"):
                with open(os.path.join(base, name)) as fh:
                    body = [line for line in fh.read().splitlines() if line and "-----" not in line]
                assert not [line for line in body if line in text]


def _handshake(ca, cert, key, server_name):
    """A TLS handshake in memory: a server with cert and key, a client verifying against ca (Python 3.13's strict
    X.509 checks where this ssl has them) and checking server_name; -> the client's view of the peer certificate."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=ca)
    client.verify_flags |= getattr(ssl, "VERIFY_X509_STRICT", 0)
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [client.wrap_bio(c_in, c_out, server_hostname=server_name), server.wrap_bio(s_in, s_out, server_side=True)]
    done = [False, False]
    for _round in range(10):
        for i, end in enumerate(ends):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done):
            return ends[0].getpeercert()
    raise AssertionError("the handshake did not finish")


@pytest.fixture
def tls(step_runner, tmp_path):
    """tls_material over tmp_path/tls: tls(mode, hosts=HOSTS, check_mode=False, **args) -> (status, result)."""
    root = tmp_path / "tls"

    def run(mode="site", hosts=None, check_mode=False, diff=False, **args):
        args = dict({"mode": mode, "dir": str(root), "hosts": HOSTS if hosts is None else hosts}, **args)
        status, result = step_runner("tls_material", args, check_mode=check_mode, diff=diff)
        _no_private_key(result, root)
        return status, result

    run.root = root
    return run


@pytest.fixture
def clock(monkeypatch):
    """Move this controller's clock: clock(days) runs the step that many days from now."""
    now = material._now()

    def move(days):
        monkeypatch.setattr(material, "_now", lambda: now + days * DAY)

    return move


# site mode


def test_site_mode_makes_a_ca_and_each_hosts_certificate_that_tls_clients_accept(tls):
    status, result = tls()
    assert status == "exit" and result["changed"] is True, result
    root = tls.root
    assert result["mode"] == "site" and result["ca"] == str(root / "ca.crt")
    assert sorted(result["hosts"]) == ["engine-1", "engine-2"]
    files = _snapshot(root)
    modes = {path: mode for path, (_data, mode, _mtime) in files.items() if not path.startswith(".narwhal")}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "hosts/engine-1.crt": 0o644, "hosts/engine-1.key": 0o600,
                     "hosts/engine-2.crt": 0o644, "hosts/engine-2.key": 0o600}
    two = result["hosts"]["engine-2"]
    cert = x509.load_pem_x509_certificate(files["hosts/engine-2.crt"][0])
    assert set(two) == {"cert", "key", "sha256", "not_after", "days_left", "names"}
    assert two["cert"] == str(root / "hosts" / "engine-2.crt") and two["key"] == str(root / "hosts" / "engine-2.key")
    assert two["names"] == ["fd00::12", "engine-2.fabric.example"] and two["days_left"] == 365
    assert two["sha256"] == cert.fingerprint(material.hashes.SHA256()).hex()
    assert two["not_after"] == cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    ca = x509.load_pem_x509_certificate(files["ca.crt"][0])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert 3649 <= (ca.not_valid_after_utc - ca.not_valid_before_utc).days <= 3651
    # Python's ssl verifies each host by the address (or name) clients use
    seen = _handshake(result["ca"], two["cert"], str(root / "hosts" / "engine-2.key"), "fd00::12")
    assert ("IP Address", "FD00:0:0:0:0:0:0:12") in seen["subjectAltName"]
    _handshake(result["ca"], two["cert"], two["key"], "engine-2.fabric.example")
    _handshake(result["ca"], result["hosts"]["engine-1"]["cert"], result["hosts"]["engine-1"]["key"], "10.0.0.11")
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        _handshake(result["ca"], two["cert"], two["key"], "10.0.0.11")


def test_site_mode_check_mode_writes_nothing_and_says_it_would_change(tls):
    status, result = tls(check_mode=True)
    assert status == "exit" and result["changed"] is True and not tls.root.exists()
    assert tls()[1]["changed"] is True
    before = _snapshot(tls.root)
    status, result = tls(check_mode=True, hosts=[{"host": "engine-1", "names": ["10.0.0.99"]}])
    assert result["changed"] is True and _snapshot(tls.root) == before


def test_a_second_site_run_with_the_same_hosts_changes_nothing(tls):
    first = tls()[1]
    before = _snapshot(tls.root)
    status, again = tls(hosts=list(reversed([{"host": h["host"], "names": list(reversed(h["names"]))}
                                             for h in HOSTS])))
    assert status == "exit" and again["changed"] is False, again
    assert _snapshot(tls.root) == before  # not rewritten: the same bytes, modes and times
    assert again["hosts"]["engine-2"]["sha256"] == first["hosts"]["engine-2"]["sha256"]
    assert tls(check_mode=True)[1]["changed"] is False


def test_a_changed_name_issues_that_hosts_certificate_again_and_only_it(tls):
    first = tls()[1]
    before = _snapshot(tls.root)
    hosts = [HOSTS[0], {"host": "engine-2", "names": ["fd00::99"]}]
    status, result = tls(hosts=hosts, diff=True)
    assert status == "exit" and result["changed"] is True
    after = _snapshot(tls.root)
    assert after["hosts/engine-2.crt"] != before["hosts/engine-2.crt"]
    assert after["hosts/engine-2.key"][0] != before["hosts/engine-2.key"][0]  # a new key with the new certificate
    for kept in ("ca.crt", "ca.key", "hosts/engine-1.crt", "hosts/engine-1.key"):
        assert after[kept] == before[kept], kept
    assert result["hosts"]["engine-2"]["names"] == ["fd00::99"]
    assert result["hosts"]["engine-2"]["sha256"] != first["hosts"]["engine-2"]["sha256"]
    assert "its names changed (fd00::12, engine-2.fabric.example -> fd00::99)" in result["diff"]["prepared"]
    assert "engine-1" not in result["diff"]["prepared"]


def test_a_certificate_near_its_expiry_is_issued_again(tls, clock):
    tls(cert_days=60)
    before = _snapshot(tls.root)
    clock(60 - 30)  # 30 days left: kept
    status, result = tls(cert_days=60)
    assert result["changed"] is False and result["hosts"]["engine-1"]["days_left"] == 30
    clock(60 - 29)
    status, result = tls(cert_days=60, diff=True)
    assert status == "exit" and result["changed"] is True
    assert "29 days left (fewer than 30)" in result["diff"]["prepared"]
    assert result["hosts"]["engine-1"]["days_left"] == 60
    after = _snapshot(tls.root)
    assert after["ca.crt"] == before["ca.crt"] and after["hosts/engine-1.crt"] != before["hosts/engine-1.crt"]


def test_a_certificate_of_another_ca_is_issued_again_by_the_site_ca(tls):
    tls()
    now = material._now()
    other_key, other_ca = make_ca(now)
    key, cert = make_leaf(other_key, other_ca, "engine-1", ["10.0.0.11"], now, 365)
    (tls.root / "hosts" / "engine-1.crt").write_bytes(_pem(cert=cert))
    (tls.root / "hosts" / "engine-1.key").write_bytes(_pem(key=key))
    status, result = tls(diff=True)
    assert status == "exit" and result["changed"] is True and "not signed by the site CA" in result["diff"]["prepared"]
    site_ca = x509.load_pem_x509_certificate((tls.root / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((tls.root / "hosts" / "engine-1.crt").read_bytes())
    leaf.verify_directly_issued_by(site_ca)


def test_a_certificate_lasts_at_most_as_long_as_the_site_ca(tls):
    status, result = tls(cert_days=10 ** 7)
    ca = x509.load_pem_x509_certificate((tls.root / "ca.crt").read_bytes())
    assert status == "exit" and result["hosts"]["engine-1"]["not_after"] == ca.not_valid_after_utc.strftime(
        "%Y-%m-%dT%H:%M:%SZ"), result
    assert tls(cert_days=10 ** 7)[1]["changed"] is False


def test_a_key_left_readable_by_others_is_set_back_to_0600_unchanged(tls):
    tls()
    key = tls.root / "hosts" / "engine-1.key"
    text = key.read_bytes()
    key.chmod(0o644)
    status, result = tls(diff=True)
    assert status == "exit" and result["changed"] is True
    assert key.read_bytes() == text and key.stat().st_mode & 0o777 == 0o600
    assert result["diff"]["prepared"] == "mode 0600: %s" % key


@pytest.mark.parametrize("damage, path, words", [
    ("other key", "ca.key", "the site CA's key %s is not the key of"),
    ("no key", "ca.key", "is there but %s is missing"),
    ("no cert", "ca.crt", "is there but %s is missing"),
    ("expired", "ca.crt", "the site CA %s expired on"),
    ("not pem", "ca.crt", "the site CA %s is not a PEM certificate"),
])
def test_site_mode_refuses_a_site_ca_it_cannot_use_naming_the_file(tls, damage, path, words):
    tls()
    now = material._now()
    if damage == "other key":
        (tls.root / "ca.key").write_bytes(_pem(key=make_ca(now)[0]))
    elif damage == "no key":
        (tls.root / "ca.key").unlink()
    elif damage == "no cert":
        (tls.root / "ca.crt").unlink()
    elif damage == "expired":
        key, ca = make_ca(now - 400 * DAY, days=365)
        (tls.root / "ca.crt").write_bytes(_pem(cert=ca))
        (tls.root / "ca.key").write_bytes(_pem(key=key))
    else:
        (tls.root / "ca.crt").write_text("not a certificate\n")
    before = _snapshot(tls.root)
    status, result = tls()
    assert status == "fail" and result["path"] == str(tls.root / path), result
    assert words % (tls.root / path) in result["msg"]
    assert "move ca.crt and ca.key away and rerun" in result["msg"]
    assert _snapshot(tls.root) == before


@pytest.mark.parametrize("args, key, words", [
    ({"cert_days": 30}, "input", "NARWHAL_TLS_CERT_DAYS=30: a site certificate is issued again when fewer than 30"),
    ({"dir": "config/tls"}, "input", "dir 'config/tls' must be an absolute path"),
    ({"hosts": [{"host": "../evil", "names": ["10.0.0.1"]}]}, "host", "inventory host '../evil' cannot name its files"),
    ({"hosts": [{"host": "engine-1", "names": []}]}, "host", "host engine-1 has no name it is reached at"),
    ({"hosts": [{"host": "engine-1", "names": ["http://10.0.0.1:8000"]}]}, "host",
     "a name of host engine-1: 'http://10.0.0.1:8000' is neither an IP address nor a DNS name"),
    ({"hosts": HOSTS + [HOSTS[0]]}, "host", "hosts names engine-1 twice"),
])
def test_bad_arguments_are_refused_by_name_before_anything_is_written(tls, args, key, words):
    status, result = tls(**args)
    assert status == "fail" and key in result and words in result["msg"], result
    assert not tls.root.exists()


def test_mode_off_does_nothing(step_runner):
    status, result = step_runner("tls_material", {"mode": "off", "hosts": HOSTS})
    assert status == "exit" and result == {"changed": False, "mode": "off", "ca": "", "hosts": {}}


# operator mode


@pytest.fixture
def operator(tls):
    """An operator's TLS directory (the site CA's files, its ca.key taken away) and the step in operator mode."""
    tls()
    (tls.root / "ca.key").unlink()

    def run(hosts=None):
        return tls("operator", hosts=hosts)

    run.root = tls.root
    return run


def test_operator_mode_checks_and_returns_the_operators_files_and_writes_nothing(operator):
    before = _snapshot(operator.root)
    status, result = operator()
    assert status == "exit" and result["changed"] is False and result["mode"] == "operator", result
    assert result["ca"] == str(operator.root / "ca.crt")
    assert result["hosts"]["engine-2"]["names"] == ["fd00::12", "engine-2.fabric.example"]
    assert _snapshot(operator.root) == before


def test_operator_mode_takes_a_ca_bundle(operator):
    """ca.crt may hold several CA certificates (clients trust each): a host's certificate is checked against the one
    whose name and key signed it."""
    ca = operator.root / "ca.crt"
    ca.write_bytes(_pem(cert=make_ca(material._now())[1]) + ca.read_bytes())
    status, result = operator()
    assert status == "exit" and sorted(result["hosts"]) == ["engine-1", "engine-2"], result


def _replace(root, path, data, mode=None):
    target = root / path
    target.write_bytes(data)
    if mode is not None:
        target.chmod(mode)


def _operator_damage(root, damage):
    """Spoil one file of the operator's directory; -> the file the refusal must name."""
    now = material._now()
    other_key, other_ca = make_ca(now)
    if damage in ("missing ca", "missing cert", "missing key"):
        path = {"missing ca": "ca.crt", "missing cert": "hosts/engine-1.crt", "missing key": "hosts/engine-1.key"}
        (root / path[damage]).unlink()
        return path[damage]
    if damage == "cert not pem":
        _replace(root, "hosts/engine-1.crt", b"garbage\n")
        return "hosts/engine-1.crt"
    if damage == "key not pem":
        _replace(root, "hosts/engine-1.key", b"garbage\n", 0o600)
        return "hosts/engine-1.key"
    if damage == "key of another":
        _replace(root, "hosts/engine-1.key", (root / "hosts" / "engine-2.key").read_bytes())
        return "hosts/engine-1.key"
    if damage == "key readable":
        (root / "hosts" / "engine-1.key").chmod(0o640)
        return "hosts/engine-1.key"
    if damage == "foreign ca":
        key, cert = make_leaf(other_key, other_ca, "engine-1", ["10.0.0.11"], now, 365)
    elif damage == "same name, other key":  # the issuer name is right, the signature is not
        impostor = x509.load_pem_x509_certificate((root / "ca.crt").read_bytes())
        key, cert = make_leaf(other_key, impostor, "engine-1", ["10.0.0.11"], now, 365)
    else:
        raise AssertionError(damage)
    _replace(root, "hosts/engine-1.crt", _pem(cert=cert))
    _replace(root, "hosts/engine-1.key", _pem(key=key), 0o600)
    return "hosts/engine-1.crt"


@pytest.mark.parametrize("damage, words", [
    ("missing ca", "is missing; put the PEM certificate of the CA that signed the hosts' certificates there"),
    ("missing cert", "is missing; issue engine-1 a certificate from the CA of"),
    ("missing key", "is missing; put the unencrypted PEM private key of"),
    ("cert not pem", "is not a PEM certificate; issue engine-1 a certificate"),
    ("key not pem", "is not an unencrypted PEM private key"),
    ("key of another", "is not the key of"),
    ("key readable", "has mode 0640; a private key must be readable by its owner only; chmod 600"),
    ("foreign ca", "is not signed by"),
    ("same name, other key", "is not signed by"),
])
def test_operator_mode_refuses_each_bad_file_naming_it_and_the_fix(operator, damage, words):
    path = str(operator.root / _operator_damage(operator.root, damage))
    before = _snapshot(operator.root)
    status, result = operator()
    assert status == "fail" and result["path"] == path, result
    assert result["msg"].startswith("NARWHAL_TLS=operator: %s " % path) and words in result["msg"], result["msg"]
    assert _snapshot(operator.root) == before


def _operator_leaf(root, host, names, not_before, days):
    """An operator's certificate for host from the CA of root (the site CA's key, kept aside by the fixture)."""
    ca_key = serialization.load_pem_private_key((root.parent / "ca.key.kept").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((root / "ca.crt").read_bytes())
    key, cert = make_leaf(ca_key, ca, host, names, not_before, days)
    _replace(root, "hosts/%s.crt" % host, _pem(cert=cert))
    _replace(root, "hosts/%s.key" % host, _pem(key=key), 0o600)


@pytest.fixture
def signer(tls):
    """An operator's directory whose CA key is kept beside it (to issue certificates the tests spoil)."""
    tls()
    os.replace(tls.root / "ca.key", tls.root.parent / "ca.key.kept")
    return tls


@pytest.mark.parametrize("names, not_before, days, words", [
    (["10.0.0.11"], -400, 365, "expired on"),
    (["10.0.0.11"], 2, 365, "is not valid before"),
    (["10.0.0.12"], 0, 365, "does not hold 10.0.0.11 in its subjectAltName (it holds 10.0.0.12)"),
])
def test_operator_mode_refuses_a_certificate_out_of_date_or_without_the_hosts_name(signer, names, not_before, days,
                                                                                   words):
    now = material._now()
    _operator_leaf(signer.root, "engine-1", names, now + not_before * DAY + material.BACKDATE, days)
    status, result = signer("operator")
    path = str(signer.root / "hosts" / "engine-1.crt")
    assert status == "fail" and result["path"] == path and words in result["msg"], result


def test_operator_mode_warns_of_a_certificate_with_fewer_than_30_days(signer):
    now = material._now() - datetime.timedelta(hours=1)
    _operator_leaf(signer.root, "engine-1", ["10.0.0.11"], now, 20)
    status, result = signer("operator")
    assert status == "exit" and result["hosts"]["engine-1"]["days_left"] == 19, result
    assert result["warnings"] == ["%s expires on %s (19 days left); issue engine-1 a new certificate and rerun"
                                  % (signer.root / "hosts" / "engine-1.crt", result["hosts"]["engine-1"]["not_after"])]


def test_operator_mode_refuses_an_expired_ca(signer):
    now = material._now()
    key, ca = make_ca(now - 400 * DAY, days=365)
    (signer.root / "ca.crt").write_bytes(_pem(cert=ca))
    status, result = signer("operator")
    assert status == "fail" and result["path"] == str(signer.root / "ca.crt") and "expired on" in result["msg"]
