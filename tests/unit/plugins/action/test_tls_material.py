"""narwhal.deploy.tls_material as the prepare role calls it (roles/prepare/tasks/main.yml): once for the play on the
controller, its hosts from the filter tls_hosts, registered with run_once as narwhal_tls on every host of the play,
in the controller's process (no module run), writing nothing in check mode and nothing on a second run."""
import json
import os
import pathlib
import subprocess
import sys

import yaml
from test_support.paths import REPO

ENGINES = {"gpu-a": "engine-1", "gpu-b": "engine-2"}
FLEET = [{"engine": "engine-1", "url": "https://10.0.0.11:8000"}, {"engine": "engine-2", "url": "https://[fd00::12]:8000"}]


def _play(where, tls_dir, *args):
    """ansible-playbook over gpu-a and gpu-b (local connections, a Python that logs each module it runs) -> (rc,
    output, {host: narwhal_tls as that host sees it}, the modules run)."""
    modules = where / "modules.log"
    python = where / "python"
    python.write_text('#!/bin/sh\necho "$@" >> "%s"\nexec "%s" "$@"\n' % (modules, sys.executable))
    python.chmod(0o755)
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(python)}
    (where / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": dict(local)}, "children": {
        "engines": {"hosts": {host: dict(local) for host in ENGINES}}}}}))
    tls = {"name": "TLS material", "narwhal.deploy.tls_material": {
        "mode": "site", "dir": str(tls_dir), "cert_days": 90,
        "hosts": "{{ ansible_play_hosts_all | narwhal.deploy.tls_hosts(engines, members, fleet) }}"},
        "delegate_to": "localhost", "run_once": True, "register": "narwhal_tls"}
    keep = {"name": "Keep what each host sees", "ansible.builtin.copy": {
        "dest": str(where / "{{ inventory_hostname }}.json"), "content": "{{ narwhal_tls | to_json }}", "mode": "0600"},
        "delegate_to": "localhost", "check_mode": False}
    book = [{"name": "TLS", "hosts": "engines", "gather_facts": False,
             "vars": {"engines": ENGINES, "members": {e: [h] for h, e in ENGINES.items()}, "fleet": FLEET},
             "tasks": [tls, keep]}]
    (where / "play.yml").write_text(yaml.safe_dump(book, sort_keys=False))
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_")))
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PIPELINING="False")
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", str(where / "hosts.yml"),
                          str(where / "play.yml")] + list(args), capture_output=True, text=True, env=env, cwd=where,
                         timeout=300, check=False)
    seen = dict((h, json.loads((where / ("%s.json" % h)).read_text())) for h in ENGINES
                if (where / ("%s.json" % h)).exists())
    return out.returncode, out.stdout + out.stderr, seen, modules.read_text() if modules.exists() else ""


def test_the_play_keeps_the_material_as_narwhal_tls_on_every_host(tmp_path):
    tls_dir = tmp_path / "project" / "config" / "tls"
    rc, out, seen, modules = _play(tmp_path, tls_dir, "--check")
    assert rc == 0, out
    assert not tls_dir.exists() and seen["gpu-a"]["changed"] is True
    rc, out, seen, modules = _play(tmp_path, tls_dir)
    assert rc == 0, out
    assert seen["gpu-a"] == seen["gpu-b"] and seen["gpu-a"]["changed"] is True and seen["gpu-a"]["mode"] == "site"
    hosts = seen["gpu-b"]["hosts"]
    assert hosts["gpu-a"]["names"] == ["10.0.0.11"] and hosts["gpu-b"]["names"] == ["fd00::12"]
    assert hosts["gpu-b"]["cert"] == str(tls_dir / "hosts" / "gpu-b.crt") and os.path.isfile(hosts["gpu-b"]["cert"])
    assert (tls_dir / "hosts" / "gpu-b.key").stat().st_mode & 0o777 == 0o600
    assert "PRIVATE KEY" not in out and "AnsiballZ_tls_material" not in modules
    rc, out, again, _modules = _play(tmp_path, tls_dir)
    assert rc == 0 and again["gpu-a"]["changed"] is False, out
    assert again["gpu-a"]["hosts"]["gpu-b"]["sha256"] == hosts["gpu-b"]["sha256"]
