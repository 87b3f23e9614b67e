"""The collection artefact (ansible-galaxy collection build): built from a checkout that holds a demo site's state,
it carries no private file (keys, records, site env, runs, caches) and no checkout-only part (tests, fixtures, the
proving ground, benchmarks, developer scripts), and it states one licence."""
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml
from test_support.paths import REPO

GALAXY = pathlib.Path(sys.executable).parent / "ansible-galaxy"
SECRET = "narwhal-demo-secret-0123456789"

# what a demo or a real site leaves in a working checkout (all git-ignored)
SITE_STATE = {
    ".env": "NARWHAL_FABRIC_INTERFACE=eth1\n",
    "config/engine-api.key": SECRET + "\n",
    "config/engine-launch.local.json": '{"secret": "%s"}' % SECRET,
    "config/engine-launch.demo.json": "{}",
    "config/fleet.json": "[]",
    "config/demo/deployment.env": "NARWHAL_NODE_1_IP=10.0.0.1\n",
    "config/demo/.narwhal-discovery.lock": "1",
    ".cache/narwhal-sim-demo/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n" % SECRET,
    ".cache/narwhal-sim-demo/engine-api.key": SECRET,
    ".cache/images/narwhal-sim_engine-standin_latest.tar": "x" * 1000,
    ".cache/narwhal-sim-demo/runs/run-0123456789ab/manifest.json": "{}",
    "runs/run-0123456789ab/engine-1/engine-1.env": "NARWHAL_API_KEY_FILE=/opt/narwhal/config/engine-api.key\n",
    ".venv/bin/python": "",
    "bench/results/x/bench.json": "{}",
    "tests/output/sanity/log": "",
}


@pytest.fixture(scope="module")
def artefact(tmp_path_factory):
    if not GALAXY.exists() or not shutil.which("git"):
        pytest.skip("needs ansible-galaxy and git")
    checkout = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        source = REPO / name
        if name and source.is_file() and not source.is_symlink():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    for name, text in SITE_STATE.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    out = tmp_path_factory.mktemp("out")
    subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(out), str(checkout)],
                   capture_output=True, check=True)
    (tarball,) = out.glob("narwhal-deploy-*.tar.gz")
    with tarfile.open(tarball) as tar:
        members = {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}
    return tarball, members


def test_no_private_file_enters_the_artefact(artefact):
    _tarball, members = artefact
    for name in SITE_STATE:
        assert name not in members, name
    assert not [n for n in members if n.startswith((".cache", "config", "runs", ".venv", ".env", "collections"))
                and n != ".env.example"]
    assert not [n for n, data in members.items() if SECRET.encode() in data]
    assert not [n for n in members if n.endswith((".key", ".pyc")) or "id_ed25519" in n or "/.narwhal-" in n]


def test_checkout_only_parts_stay_out_and_what_runs_is_in(artefact):
    tarball, members = artefact
    tops = {n.split("/", 1)[0] for n in members}
    assert not tops & {"tests", "bench", "extensions", ".ci", "Makefile", "ansible.cfg"}
    # of the scripts only the fleet resolver, which works installed
    assert sorted(n for n in members if n.startswith("scripts/") and n != "scripts/") == ["scripts/narwhal-fleet"]
    for needed in ("plugins/module_utils/_plan/container.py", "roles/install/files/launcher/__main__.py",
                   "roles/install/files/launcher/narwhal_launcher/in_image.py", "playbooks/site.yml",
                   "playbooks/boilerplate.yml", "roles/inputs/meta/argument_specs.yml",
                   "plugins/inventory/fleet_groups.py", "plugins/lookup/project_dir.py",
                   "meta/runtime.yml", "LICENSE", "README.md", ".env.example", "requirements.txt", "bindep.txt",
                   "meta/execution-environment.yml", "playbooks/monitoring.yml",
                   "roles/monitoring/files/narwhal-pd-dashboard.json"):
        assert needed in members, needed
    assert tarball.stat().st_size < 1024 * 1024  # no fixtures, images or caches


def test_one_licence(artefact):
    _tarball, members = artefact
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    assert b"GNU GENERAL PUBLIC LICENSE" in members["LICENSE"] and b"Version 3" in members["LICENSE"]
    headers = [n for n, data in members.items() if n.endswith(".py") and b"Apache" in data[:400]]
    assert headers == []
