# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proving ground's recorded host inputs, read as discovery's fact modules read them on a simulated host, and
discovery's planning over them: the readers shared by the generators of the docs' examples
(scripts/gen-example-record.py: the default site's launch config; scripts/gen-shapes.py: the shapes operators
deploy, docs/shapes.md).

A simulated host is a hardware profile of tests/harness/profiles/<profile>:
- GPUs: the capture the profile's bin/nvidia-smi (or bin/rocm-smi) replays, from tests/fixtures/real, with the
  profile's sysfs tree and device nodes (tests/harness/profiles/<profile>/{sys,devices});
- RDMA: the profile's sysfs HCAs and device nodes;
- interface: the fabric interface carrying the host's fabric addresses;
- image: the stand-in image as tests/harness/images/engine-standin/Dockerfile builds it (its ENV, ENTRYPOINT, and
  the distributions make_dists.py writes at the Dockerfile's ARG versions).
Two values depend on the machine and are made stable (docs/launch-record.md): runtime.image_id is "sha256:" + the
sha256 of the image reference, node.host_id the value host_id() returns on a host of the given name without a
machine-id.
"""

import hashlib
import json
import os
import pathlib
import re
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT / "collections") not in sys.path:
    sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.outputs import (  # noqa: E402
    collect_records,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu_reader as _gpu_reader  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma_reader as _rdma_reader  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (  # noqa: E402
    interface_addresses,
    interface_facts,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (  # noqa: E402
    launch_config_errors,
)

HARNESS = ROOT / "tests" / "harness"
REAL = ROOT / "tests" / "fixtures" / "real"
# the GPU tools in read_gpus' order, with the parser each one's output goes through there
GPU_TOOLS = (("nvidia-smi", _gpu.parse_nvidia_smi_xml, "nvidia-smi -q -x"),
             ("rocm-smi", _gpu.parse_rocm_smi_json, "rocm-smi " + " ".join(_gpu_reader.ROCM_SMI_ARGS)))
STANDIN_IMAGES = {"narwhal-sim/engine-standin:latest": "Dockerfile",
                  "narwhal-sim/engine-standin-rocm:latest": "Dockerfile.rocm"}


class SiteError(Exception):
    """The simulated site cannot be read (a file missing or not in the shape the harness uses)."""


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
                return _gpu_reader.nvidia_facts(parsed, str(sysfs), str(dev_root), source)
            return _gpu_reader.amd_facts(parsed, str(sysfs), source)
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


def requested_packages(site):
    """The distributions image_facts is asked for: discovery's own and NARWHAL_EXPECTED_PACKAGES."""
    return list(_image.DISCOVERY_DISTRIBUTIONS) + [
        x.strip() for x in (site.get("NARWHAL_EXPECTED_PACKAGES") or "").split(",") if x.strip()]


def host_facts(profile, dev_root, image, requested, model, sysfs=None):
    """{"gpus", "rdma", "image", "model"} of one engine on a simulated host of `profile` (its device nodes made below
    dev_root, once per host; its sysfs tree `sysfs`, by default the profile's), as engine_host_facts gathers them
    there."""
    sysfs = sysfs or HARNESS / "profiles" / profile / "sys"
    if not dev_root.exists():
        make_devices(profile, dev_root)
    return {"gpus": gpu_facts(profile, sysfs, dev_root),
            "rdma": _rdma_reader.rdma_facts(_rdma_reader.read_sysfs_hcas(str(sysfs)), str(dev_root),
                                            os.path.join(str(sysfs), "class", "infiniband")),
            "image": image_facts(image, requested),
            "model": model}


def launch_config(inputs, engines, interfaces, hosts, members=None):
    """discovery_outputs' planning (build_fleet, collect_records: build_record for each engine, with the other hosts
    of an engine across hosts in `members`) and its record check (launch_config_errors): -> (the launch config
    document, build_fleet's plan)."""
    plan = build_fleet(inputs, engines, interfaces)
    document, _extracts = collect_records(plan, inputs, hosts, members)
    errors = launch_config_errors(document)
    if errors:
        raise SiteError("the generated launch config fails the record check: %s" % "; ".join(errors))
    return document, plan
