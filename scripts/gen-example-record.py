#!/usr/bin/env python3
"""Generate docs/examples/engine-launch.example.json: the launch config that discovery writes for the proving
ground's default site, produced by discovery's own code from that site's recorded inputs.

The site is the molecule scenario extensions/molecule/default: its engine hosts (molecule.yml, group engines: name,
hardware profile, fabric addresses) and its .env (site.env). Each host is read as engine_host_facts reads it there,
with the same parsers over the same recorded outputs (scripts/proving_ground.py, shared with scripts/gen-shapes.py:
GPUs, RDMA, the stand-in image); interface: eth1 carrying the host's fabric addresses of molecule.yml; model: the
checkpoint the harness copies to /srv/models/<name> (tests/harness/defaults.yml, sim_models).
Then discovery_outputs' planning (build_fleet, collect_records: build_record for each engine) and its record check
(launch_config_errors) make the document, dumped as discovery dumps it.

Two values depend on the machine the site runs on and are made stable here (docs/launch-record.md says so):
- runtime.image_id: the ID of the image scripts/build-images.sh builds differs per machine (its base layer is
  built there); the example carries "sha256:" + the sha256 of the image reference instead;
- node.host_id: host_id() hashes /etc/machine-id and the host name; the example carries the value it returns on
  a host named after the engine without a machine-id (sha256 of "/engine-<n>", first 16 hex digits).

`--check` exits 1 when the file is out of date; `--output PATH` writes (or checks) PATH instead. A unit test
compares the checked-in file with a fresh generation (tests/unit/scripts/test_gen_example_record.py).
"""

import os
import pathlib
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # proving_ground, also when loaded by a test

import proving_ground as pg  # noqa: E402  pylint: disable=wrong-import-position
from proving_ground import HARNESS, ROOT, SiteError  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.outputs import dump  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_checkpoint  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import read_dotenv  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs  # noqa: E402

OUTPUT = ROOT / "docs" / "examples" / "engine-launch.example.json"
SCENARIO = ROOT / "extensions" / "molecule" / "default"
# where the harness puts the checkout's profiles on a simulated host (tests/harness/tasks/up.yml); its
# tests/fixtures/real goes to /opt/narwhal-sim/fixtures/real, where the profiles' replay scripts read captures
SIM_PROFILES = "/opt/narwhal-sim/profiles/"
MODELS_DIR = "/srv/models/"


def engine_hosts(scenario):
    """[(name, profile, sysfs root in this checkout, [(family, fabric address, subnet)])] of the scenario's group
    engines."""
    config = yaml.safe_load((scenario / "molecule.yml").read_text())
    host_vars = config["provisioner"]["inventory"].get("host_vars") or {}
    group_vars = config["provisioner"]["inventory"]["group_vars"]["all"]
    hosts = []
    for platform in config["platforms"]:
        if "engines" not in platform.get("groups", []):
            continue
        name, profile = platform["name"], platform["profile"]
        sysfs = (host_vars.get(name) or {}).get("narwhal_sysfs_root", "")
        if not sysfs.startswith(SIM_PROFILES):
            raise SiteError("%s: narwhal_sysfs_root %r is not below %s" % (name, sysfs, SIM_PROFILES))
        addresses = [("inet", platform["fabric_ipv4"], group_vars["sim_fabric_subnet4"]),
                     ("inet6", platform["fabric_ipv6"], group_vars["sim_fabric_subnet6"])]
        hosts.append((name, profile, HARNESS / "profiles" / sysfs[len(SIM_PROFILES):], addresses))
    return hosts


def model_facts(model_path):
    """narwhal_model of the checkpoint the harness places at /srv/models/<name>."""
    models = yaml.safe_load((HARNESS / "defaults.yml").read_text())["sim_models"]
    name = model_path.rstrip("/")[len(MODELS_DIR):] if model_path.startswith(MODELS_DIR) else None
    found = [m for m in models if os.path.basename(m) == name]
    if not found:
        raise SiteError("NARWHAL_MODEL_PATH %s is not one of the harness's checkpoints (%s)"
                        % (model_path, ", ".join(MODELS_DIR + os.path.basename(m) for m in models)))
    return read_checkpoint(str(ROOT / found[0]))


def generate(scenario=SCENARIO):
    """The example's text: discovery's launch config for the scenario's site."""
    inputs = load_inputs(read_dotenv(str(scenario / "site.env")))
    site = inputs["site"]
    requested = pg.requested_packages(site)
    hosts, interfaces, engines = {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name, profile, sysfs, addresses in engine_hosts(scenario):
            n = int(name.rsplit("-", 1)[1])
            settings = node_settings(site, inputs["nodes"].get(n), n)
            interfaces[name] = pg.interface(settings["fabric_interface"], addresses, name)
            hosts[name] = pg.host_facts(profile, pathlib.Path(tmp) / name, settings["image"], requested,
                                        model_facts(site["NARWHAL_MODEL_PATH"]), sysfs)
            engines.append(name)
    document, _plan = pg.launch_config(inputs, engines, interfaces, hosts)
    return dump(document)


def main():
    argv = sys.argv[1:]
    output = OUTPUT
    if "--output" in argv:
        output = pathlib.Path(argv[argv.index("--output") + 1])
    try:
        text = generate()
    except (SiteError, InputError) as exc:
        print("cannot generate %s from the default site: %s" % (output, exc), file=sys.stderr)
        return 2
    if "--check" in argv:
        current = output.read_text() if output.exists() else None
        if current != text:
            print("%s is out of date: run scripts/gen-example-record.py to regenerate it" % output)
            return 1
        return 0
    output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
