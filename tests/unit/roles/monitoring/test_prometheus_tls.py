"""The monitoring stage with TLS (NARWHAL_TLS=site, issue 35) against a real Prometheus (Debian's `prometheus`
package): the role, run by a real ansible-playbook, refuses to write a scrape configuration whose CA certificate is
missing (naming the file), then writes the targets (`__scheme__` https) and the scrape-config fragment whose
tls_config names the controller's CA; a Prometheus that takes the fragment's job scrapes an engine whose certificate
the site CA signed and refuses one whose certificate another CA signed, with the TLS reason.

The engines are two HTTPS servers of /metrics on loopback (their certificates from a temporary CA made with
`cryptography`, as the site CA makes them: the address in the SAN); no fixed sleeps."""
import json
import os
import pathlib
import subprocess
import sys
from http.server import BaseHTTPRequestHandler

import pytest
import yaml
from test_support.paths import REPO
from test_support.prometheus import PROMETHEUS, get, until
from test_support.prometheus import start as start_prometheus
from test_support.tempca import CA, https_server

from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd, scrape_config


class Metrics(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b"# TYPE narwhal_tls_test gauge\nnarwhal_tls_test 1\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _playbook(project):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    return subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                           str(project / "inventory"), "narwhal.deploy.monitoring"], capture_output=True, text=True,
                          env=env, cwd=project, timeout=300, check=False)


def _project(where, engines):
    """.env (NARWHAL_TLS at its default, site), the fleet of ${NAME} values, deployment.env with the engines' https
    URLs, an inventory of the engines (no routers)."""
    (where / "config").mkdir(parents=True)
    (where / "inventory").mkdir()
    (where / ".env").write_text("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_NODE_1_ROLE=prefill\n"
                                "NARWHAL_NODE_2_ROLE=decode\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
                                "NARWHAL_MODEL_PATH=/srv/models/tiny\n")
    fleet = [{"engine": e["engine"], "iid": "n%d" % n, "role": e["role"], "url": "${NARWHAL_NODE_%d_URL}" % n,
              "attestation_url": "${NARWHAL_NODE_%d_ATTESTATION_URL}" % n} for n, e in enumerate(engines, 1)]
    (where / "config" / "fleet.json").write_text(json.dumps(fleet, indent=2))
    (where / "config" / "deployment.env").write_text("".join(
        "NARWHAL_NODE_%d_URL=%s\nNARWHAL_NODE_%d_ATTESTATION_URL=http://127.0.0.1:9/v1/attestation\n"
        % (n, e["url"], n) for n, e in enumerate(engines, 1)))
    (where / "inventory" / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"engines": {"hosts": {
        e["engine"]: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for e in engines}}}}}))


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    assert os.access(PROMETHEUS, os.X_OK), "no prometheus binary (%s): scripts/bootstrap.sh installs it" % PROMETHEUS
    tmp = tmp_path_factory.mktemp("monitoring-tls")
    site, other = CA("narwhal site CA"), CA("another CA")
    servers, procs = [], []
    try:
        engines = []
        for n, role, issuer in ((1, "prefill", site), (2, "decode", other)):
            srv, url = https_server(Metrics, *issuer.write_server(tmp, "engine-%d" % n, ["127.0.0.1"]))
            servers.append(srv)
            engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
        project = tmp / "project"
        _project(project, engines)
        refused = _playbook(project)  # no CA certificate yet
        (project / "config" / "tls").mkdir()
        site.write(project / "config" / "tls" / "ca.crt")
        written = _playbook(project)
        assert written.returncode == 0, written.stdout[-4000:] + written.stderr[-2000:]
        url, prom = start_prometheus(tmp, project / "config" / "prometheus" / "narwhal-scrape.yml")
        procs.append(prom)

        def both_scraped():
            active = get(url + "/api/v1/targets?state=active")["data"]["activeTargets"]
            return len(active) == 2 and all(t["health"] != "unknown" for t in active), active
        active = until("both engines scraped once", both_scraped)
        yield {"project": project, "engines": engines, "refused": refused,
               "active": {t["labels"]["engine"]: t for t in active}}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def test_without_the_ca_certificate_the_stage_refuses_naming_it_and_writes_no_scrape_configuration(scraped):
    refused = scraped["refused"]
    ca = scraped["project"] / "config" / "tls" / "ca.crt"
    assert refused.returncode != 0
    assert "NARWHAL_TLS is site but the CA certificate %s is missing" % ca in refused.stdout, refused.stdout[-3000:]
    assert "run prepare (ansible-playbook narwhal.deploy.prepare), which makes the site CA" in refused.stdout


def test_the_fragment_names_the_targets_and_the_controllers_ca_and_the_targets_are_https(scraped):
    project = scraped["project"]
    targets = project / "config" / "prometheus" / "narwhal-targets.json"
    scrape = project / "config" / "prometheus" / "narwhal-scrape.yml"
    assert yaml.safe_load(scrape.read_text()) == scrape_config(str(targets), str(project / "config" / "tls" /
                                                                                 "ca.crt"))
    written = json.loads(targets.read_text())
    assert written == file_sd(scraped["engines"], [], "fleet")
    assert [g["labels"]["__scheme__"] for g in written] == ["https", "https"]


def test_prometheus_scrapes_the_engine_the_site_ca_signed_and_refuses_the_other(scraped):
    good, bad = scraped["active"]["engine-1"], scraped["active"]["engine-2"]
    assert good["health"] == "up" and good["scrapeUrl"] == scraped["engines"][0]["url"] + "/metrics", good
    assert bad["health"] == "down" and "x509: certificate signed by unknown authority" in bad["lastError"], bad
