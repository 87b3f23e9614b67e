# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proving ground's registry (tests/harness/registry.sh) against the real distribution registry (Debian's
docker-registry; scripts/bootstrap.sh installs it with apache2-utils): TLS from its test CA, htpasswd with the
credentials of the auth file it writes, a wrong password and an unrelated CA refused, a second `up` reusing the
running registry, `down` stopping it. No image is pushed (that needs the controller's Docker daemon)."""
import base64
import json
import os
import socket
import ssl
import stat
import subprocess
import urllib.error
import urllib.request

import pytest
from test_support.paths import REPO

SCRIPT = str(REPO / "tests" / "harness" / "registry.sh")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _registry(*args):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False)


def _status(url, cafile, auth_file=None):
    """HTTP status of GET url verified against cafile, with the credentials of a Docker config.json auth file."""
    req = urllib.request.Request(url)
    if auth_file:
        with open(auth_file) as fh:
            (entry,) = json.load(fh)["auths"].values()
        req.add_header("Authorization", "Basic " + entry["auth"])
    try:
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=cafile)) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _pid(d):
    return int((d / "registry.pid").read_text())


@pytest.fixture
def registry(tmp_path):
    d, port = tmp_path / "registry", _free_port()
    up = _registry("up", str(d), "127.0.0.1", str(port))
    assert up.returncode == 0, up.stderr
    yield d, "127.0.0.1:%d" % port, up
    _registry("down", str(d))


def test_up_serves_tls_and_htpasswd_with_the_auth_file_it_writes(registry):
    d, hostport, up = registry
    url, ca = "https://%s/v2/" % hostport, str(d / "ca.crt")
    assert "up on https://%s" % hostport in up.stderr
    assert (d / "address").read_text().strip() == hostport
    assert _status(url, ca) == 401
    assert _status(url, ca, d / "auth.json") == 200
    assert _status(url, ca, d / "auth-wrong.json") == 401
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _status(url, str(d / "other-ca.crt"))
    auths = json.loads((d / "auth.json").read_text())["auths"]
    assert list(auths) == [hostport]
    user, password = base64.b64decode(auths[hostport]["auth"]).decode().split(":", 1)
    assert (user, password) == ("narwhal", (d / "password").read_text())
    for secret in ("auth.json", "auth-wrong.json", "password", "htpasswd", "ca.key", "server.key"):
        assert stat.S_IMODE(os.stat(d / secret).st_mode) == 0o600, secret
    assert (d / "htpasswd").read_text().startswith("narwhal:$2y$")  # bcrypt
    # the password is in no process's argv (the registry reads the htpasswd file)
    cmdline = (open("/proc/%d/cmdline" % _pid(d), "rb").read()).decode()
    assert password not in cmdline and "serve" in cmdline


def test_second_up_reuses_the_running_registry_and_down_stops_it(registry):
    d, hostport, _up = registry
    pid, password = _pid(d), (d / "password").read_text()
    again = _registry("up", str(d), *hostport.split(":"))
    assert again.returncode == 0, again.stderr
    assert "already running on %s (pid %d), reused" % (hostport, pid) in again.stderr
    assert _pid(d) == pid
    down = _registry("down", str(d))
    assert down.returncode == 0 and "stopped (pid %d)" % pid in down.stderr
    assert not os.path.exists("/proc/%d" % pid) or "docker-registry" not in os.readlink("/proc/%d/exe" % pid)
    assert not (d / "registry.pid").exists()
    # up after down: a new process, the same CA and credentials
    ca = (d / "ca.crt").read_text()
    back = _registry("up", str(d), *hostport.split(":"))
    assert back.returncode == 0, back.stderr
    assert _pid(d) != pid and (d / "password").read_text() == password and (d / "ca.crt").read_text() == ca
    assert _status("https://%s/v2/" % hostport, str(d / "ca.crt"), d / "auth.json") == 200


def test_bad_arguments_are_refused_by_name(tmp_path):
    bad = _registry("up", str(tmp_path / "r"), "registry.example", "5000")
    assert bad.returncode != 0 and "ADDRESS must be an IPv4 address (got 'registry.example')" in bad.stderr
    nothing = _registry("push", str(tmp_path / "none"), "a=b")
    assert nothing.returncode != 0 and "holds no registry" in nothing.stderr
