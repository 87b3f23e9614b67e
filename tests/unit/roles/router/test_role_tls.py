"""The router role's TLS wiring (roles/router/vars/main.yml and the plan filter as tasks/main.yml calls them), run by a
real ansible-playbook against a faked tls_material result (the step's interface: {changed, mode, ca, hosts: {<host>:
{cert, key, sha256, not_after, days_left, names}}}): what the held read asks the router host to hold, the CA its
checks use, the local URL and the controller directory the step is given; with NARWHAL_TLS=off none of it."""
import json
import os
import pathlib
import subprocess
import sys

import yaml
from test_support.paths import REPO

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "https://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "https://10.0.0.12:8000"}]
SITE = {"NARWHAL_ROUTER_IMAGE": "narwhal/vllm-router:0.1.17", "NARWHAL_ROUTER_PORT": 30000,
        "NARWHAL_ROUTER_METRICS_PORT": 29000, "NARWHAL_ROUTER_BIND": "", "NARWHAL_ROUTER_POLICY": "round_robin",
        "NARWHAL_ROUTER_READY_TIMEOUT": 300, "NARWHAL_ROUTER_DIR": "/opt/narwhal-router", "NARWHAL_TLS": "site",
        "NARWHAL_TLS_DIR": "config/tls", "NARWHAL_TLS_CERT_DAYS": 365}
STEP = {"changed": False, "mode": "site", "ca": "/p/config/tls/ca.crt",
        "hosts": {"router-1": {"cert": "/p/config/tls/hosts/router-1.crt", "key": "/p/config/tls/hosts/router-1.key",
                               "sha256": "ab" * 32, "not_after": "2027-01-01T00:00:00Z", "days_left": 300,
                               "names": ["10.0.0.21"]}}}


def _run(tmp_path, site, step):
    play = [{
        "hosts": "router-1", "connection": "local", "gather_facts": False,
        "vars_files": [str(REPO / "roles" / "router" / "vars" / "main.yml")],
        "vars": {"narwhal_site": {"site": site, "project_dir": "/p",
                                  "paths": {"api_key_file": "/p/config/engine-api.key", "runs_dir": "/p/runs",
                                            "tls_dir": "/p/config/tls"}},
                 "router_address": "10.0.0.21", "role_path": str(REPO / "roles" / "router"),
                 "__fleet": FLEET, "__step": step},
        "tasks": [
            {"name": "the step's result, as registered", "ansible.builtin.set_fact": {"__router_tls": "{{ __step }}"}},
            {"name": "the names the step is given",
             "ansible.builtin.set_fact": {"__names": "{{ narwhal_site | narwhal.deploy.router_tls_names("
                                                     "router_address) }}"}},
            {"name": "the plan, as tasks/main.yml makes it", "ansible.builtin.set_fact": {"__router_plan": (
                "{{ narwhal_site | narwhal.deploy.router_plan(__fleet, 'sha256:aa', '0.1.17', 'c1', router_address, "
                "__router_tls.hosts[inventory_hostname] | default(none)) }}")}},
            {"name": "what the role derives", "ansible.builtin.copy": {"dest": str(tmp_path / "out.json"), "content": (
                "{{ {'files': __router_files, 'ca': __router_ca, 'local_url': __router_local_url, 'names': __names,"
                " 'tls_dir': __router_tls_dir, 'hash': __router_plan.hash, 'plan_local': __router_plan.local_url}"
                " | to_json }}")}},
        ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"routers": {"hosts": {"router-1": {}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return json.loads((tmp_path / "out.json").read_text())


def test_with_tls_the_router_host_holds_its_certificate_key_and_ca(tmp_path):
    got = _run(tmp_path, SITE, STEP)
    tls = dict((f["path"], f) for f in got["files"] if "/tls" in f["path"])
    assert tls == {
        "/opt/narwhal-router/tls": {"path": "/opt/narwhal-router/tls", "state": "directory", "mode": "0700",
                                    "owner": "root", "group": "root"},
        "/opt/narwhal-router/tls/server.crt": {"path": "/opt/narwhal-router/tls/server.crt", "mode": "0644",
                                               "src": "/p/config/tls/hosts/router-1.crt", "owner": "root",
                                               "group": "root"},
        "/opt/narwhal-router/tls/server.key": {"path": "/opt/narwhal-router/tls/server.key", "mode": "0600",
                                               "src": "/p/config/tls/hosts/router-1.key", "owner": "root",
                                               "group": "root"},
        "/opt/narwhal-router/tls/ca.crt": {"path": "/opt/narwhal-router/tls/ca.crt", "mode": "0644",
                                           "src": "/p/config/tls/ca.crt", "owner": "root", "group": "root"}}
    assert [f["path"] for f in got["files"]][:5] == [
        "/opt/narwhal-router", "/opt/narwhal-router/narwhal_router.py", "/opt/narwhal-router/api.key",
        "/opt/narwhal-router/router.json", "/opt/narwhal-router/workers.json"]
    assert got["ca"] == "/opt/narwhal-router/tls/ca.crt"
    assert got["local_url"] == got["plan_local"] == "https://10.0.0.21:30000"
    assert got["names"] == ["10.0.0.21"] and got["tls_dir"] == "/p/config/tls"
    renewed = _run(tmp_path, SITE, dict(STEP, hosts={"router-1": dict(STEP["hosts"]["router-1"], sha256="cd" * 32)}))
    assert renewed["hash"] != got["hash"]


def test_without_tls_nothing_of_it(tmp_path):
    got = _run(tmp_path, dict(SITE, NARWHAL_TLS="off"), {"changed": False, "mode": "off", "ca": "", "hosts": {}})
    assert not [f for f in got["files"] if "/tls" in f["path"]] and len(got["files"]) == 5
    assert got["ca"] == "" and got["local_url"] == "http://10.0.0.21:30000"
