#!/usr/bin/env python3
"""Generate docs/examples/engine-launch.example.json: the launch config that discovery writes for the proving
ground's default site, produced by discovery's own code from that site's recorded inputs.

The site is the molecule scenario extensions/molecule/default: its engine hosts (molecule.yml, group engines: name,
hardware profile, fabric addresses) and its .env (site.env). Each host is read as engine_host_facts reads it there,
with the same parsers over the same recorded outputs:
- GPUs: the capture the profile's bin/nvidia-smi (or bin/rocm-smi) replays, from tests/fixtures/real, with the
  profile's sysfs tree and device nodes (tests/harness/profiles/<profile>/{sys,devices});
- RDMA: the profile's sysfs HCAs and device nodes;
- interface: eth1 carrying the host's fabric addresses of molecule.yml;
- image: the stand-in image as tests/harness/images/engine-standin/Dockerfile builds it (its ENV, ENTRYPOINT, and
  the distributions make_dists.py writes at the Dockerfile's ARG versions);
- model: the checkpoint the harness copies to /srv/models/<name> (tests/harness/defaults.yml, sim_models).
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

import hashlib
import json
import os
import pathlib
import re
import shlex
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import host as _host  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_checkpoint  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (  # noqa: E402
    interface_addresses,
    interface_facts,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import read_dotenv  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (  # noqa: E402
    launch_config_errors,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._steps.discovery_outputs import (  # noqa: E402
    collect_records,
    dump,
)

OUTPUT = ROOT / "docs" / "examples" / "engine-launch.example.json"
SCENARIO = ROOT / "extensions" / "molecule" / "default"
HARNESS = ROOT / "tests" / "harness"
REAL = ROOT / "tests" / "fixtures" / "real"
# where the harness puts the checkout's profiles on a simulated host (tests/harness/tasks/up.yml); its
# tests/fixtures/real goes to /opt/narwhal-sim/fixtures/real, where the profiles' replay scripts read captures
SIM_PROFILES = "/opt/narwhal-sim/profiles/"
MODELS_DIR = "/srv/models/"
# the GPU tools in read_gpus' order, with the parser each one's output goes through there
GPU_TOOLS = (("nvidia-smi", _gpu.parse_nvidia_smi_xml, "nvidia-smi -q -x"),
             ("rocm-smi", _gpu.parse_rocm_smi_json, "rocm-smi " + " ".join(_host.ROCM_SMI_ARGS)))
STANDIN_IMAGES = {"narwhal-sim/engine-standin:latest": "Dockerfile",
                  "narwhal-sim/engine-standin-rocm:latest": "Dockerfile.rocm"}


class SiteError(Exception):
    """The simulated site cannot be read (a file missing or not in the shape the harness uses)."""


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


def make_devices(profile, dev_root):
    """The profile's device nodes (tests/harness/profiles/<profile>/devices: 'c MAJOR MINOR /dev/PATH') as empty
    files below dev_root: the fact readers only ask whether each exists."""
    for line in (HARNESS / "profiles" / profile / "devices").read_text().splitlines():
        words = line.split()
        if len(words) == 4 and not line.startswith("#") and words[3].startswith("/dev/"):
            path = dev_root / words[3][len("/dev/"):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")


def replayed_capture(script):
    """The recorded output a profile's bin/<tool> replays (its `exec .../replay TOOL FIXTURE ...` line)."""
    for line in script.read_text().replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if len(words) > 3 and words[0] == "exec" and words[1].endswith("/lib/replay"):
            return REAL / words[3]
    raise SiteError("%s replays no recorded output" % script)


def gpu_facts(profile, sysfs, dev_root):
    """narwhal_gpus as read_gpus reads it on the simulated host: the first GPU tool the profile has."""
    for tool, parser, source in GPU_TOOLS:
        script = HARNESS / "profiles" / profile / "bin" / tool
        if script.exists():
            parsed = parser(replayed_capture(script).read_text())
            if tool == "nvidia-smi":
                return _host.nvidia_facts(parsed, str(sysfs), str(dev_root), source)
            return _host.amd_facts(parsed, str(sysfs), source)
    return _gpu.empty_facts()


def interface(name, addresses, host_name):
    """narwhal_interface for `name` carrying `addresses`, as `ip -j addr show` prints the simulated host's link."""
    info = [{"family": family, "local": address, "prefixlen": int(subnet.rsplit("/", 1)[1]), "scope": "global",
             "valid_life_time": 4294967295, "preferred_life_time": 4294967295}
            for family, address, subnet in addresses]
    link, classified = interface_addresses([{"ifname": name, "operstate": "UP", "mtu": 1500,
                                             "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                                             "addr_info": info}], name)
    # host_id() on a host named `host_name` without /etc/machine-id (the stable stand-in, see the docstring)
    host_id = hashlib.sha256(("/%s" % host_name).encode()).hexdigest()[:16]
    return interface_facts(name, link, classified, "any", host_id)


def dockerfile(path):
    """(ENV words, ENTRYPOINT, make_dists.py's arguments) of a stand-in Dockerfile: continuation lines joined,
    ${ARG} replaced by the ARG's default."""
    args, env, entrypoint, dists = {}, [], None, None
    for line in path.read_text().replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        words = [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), w) for w in words]
        if words[:1] == ["ARG"] and "=" in words[1]:
            key, _sep, value = words[1].partition("=")
            args[key] = value
        elif words[:1] == ["ENV"]:
            env += words[1:]
        elif words[:1] == ["ENTRYPOINT"]:
            entrypoint = json.loads(line.split(None, 1)[1])
        elif words[:1] == ["RUN"] and any(w.endswith("/make_dists.py") for w in words):
            start = next(i for i, w in enumerate(words) if w.endswith("/make_dists.py")) + 1
            end = words.index("&&", start) if "&&" in words[start:] else len(words)
            dists = words[start:end]
    if dists is None:
        raise SiteError("%s does not run make_dists.py" % path)
    return env, entrypoint, dists


def image_facts(reference, requested):
    """narwhal_image of a stand-in engine image as image_facts reads it from the built image."""
    if reference not in STANDIN_IMAGES:
        raise SiteError("%s is not a stand-in image of tests/harness/images/engine-standin" % reference)
    env, entrypoint, dists = dockerfile(HARNESS / "images" / "engine-standin" / STANDIN_IMAGES[reference])
    # the distributions make_dists.py writes (VLLM_VERSION NIXL_VERSION [PLATFORM], cuda by default)
    vllm, nixl, platform = (dists + ["cuda"])[:3]
    if platform == "rocm":
        installed = {"vllm": vllm, "nixl-rocm": nixl}
    else:
        installed = {"vllm": vllm, "nixl": nixl, "nixl-cu12": nixl}
    image_id = "sha256:" + hashlib.sha256(reference.encode()).hexdigest()
    attrs = {"Id": image_id, "RepoTags": [reference], "RepoDigests": [], "Architecture": "amd64", "Os": "linux",
             "Config": {"Env": env, "Entrypoint": entrypoint, "Cmd": None, "Labels": {}}}
    return _image.build_facts(reference, attrs, dict((k, v) for k, v in installed.items() if k in requested), False)


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
    requested = list(_image.DISCOVERY_DISTRIBUTIONS) + [
        x.strip() for x in (site.get("NARWHAL_EXPECTED_PACKAGES") or "").split(",") if x.strip()]
    hosts, interfaces, engines = {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name, profile, sysfs, addresses in engine_hosts(scenario):
            n = int(name.rsplit("-", 1)[1])
            settings = node_settings(site, inputs["nodes"].get(n), n)
            dev_root = pathlib.Path(tmp) / name
            make_devices(profile, dev_root)
            interfaces[name] = interface(settings["fabric_interface"], addresses, name)
            hosts[name] = {"gpus": gpu_facts(profile, sysfs, dev_root),
                           "rdma": _host.rdma_facts(_host.read_sysfs_hcas(str(sysfs)), str(dev_root),
                                                    os.path.join(str(sysfs), "class", "infiniband")),
                           "image": image_facts(settings["image"], requested),
                           "model": model_facts(site["NARWHAL_MODEL_PATH"])}
            engines.append(name)
    plan = build_fleet(inputs, engines, interfaces)
    document, _extracts = collect_records(plan, inputs, hosts)
    errors = launch_config_errors(document)
    if errors:
        raise SiteError("the generated launch config fails the record check: %s" % "; ".join(errors))
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
