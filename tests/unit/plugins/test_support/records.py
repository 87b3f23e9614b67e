# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Launch records built from the real fact producers (GPU / RDMA / image / model facts over real
captures and the simulated sysfs trees) through discovery's own planning, and the discovery_outputs module's
arguments: the builders of the discover tests (tests/unit/plugins/module_utils/_discover/test_records.py,
test_gpu_allocation.py, test_transfer.py, test_runtime.py, test_engine_args.py, test_parallelism.py), shared with the
gate, the planner contract, the output-set and the action plugin tests."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover import outputs as _discovery_outputs
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import checkpoint as _checkpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu_reader as _gpu_reader
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma_reader as _rdma_reader
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import interface_addresses
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    LAUNCH_CONFIG_SCHEMA,
    RECORD_SCHEMA,
    validation_errors,
)
from test_support.model import stamp
from test_support.paths import PROFILES, REAL

NVIDIA_SYS = PROFILES / "nvidia-8gpu-rdma" / "sys"

# the AMD profile (amd-4gpu, renamed amd-4gpu-rdma): 4x MI100, render nodes renderD128-131 / card0-3
AMD_SYS = next((p for p in (PROFILES / name / "sys"
                            for name in ("amd-4gpu-rdma", "amd-4gpu")) if p.is_dir()), None)

IMAGE_ID = "sha256:" + "ab" * 32
CUDA_DISTS = {"vllm": "0.33.0", "nixl": "0.7.1", "nixl-cu12": "0.7.1", "torch": "2.9.0+cu129"}
ROCM_DISTS = {"vllm": "0.33.0+rocm711", "nixl": "0.7.1", "torch": "2.9.0+rocm7.1"}
CUDA_ENV = ["PATH=/usr/bin", "CUDA_VERSION=12.9.1", "NVIDIA_VISIBLE_DEVICES=all", "UCX_HOME=/usr/local/ucx",
            "HF_TOKEN=hf_secret", "LD_LIBRARY_PATH=/usr/local/cuda/lib64"]
ROCM_ENV = ["PATH=/usr/bin", "ROCM_PATH=/opt/rocm", "HIP_PLATFORM=amd", "LD_LIBRARY_PATH=/opt/rocm/lib"]
LLAMA = "aiconf__meta-llama--Meta-Llama-3.1-8B"
BASE = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode",
        "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_MODEL_PATH": "/srv/models/Meta-Llama-3.1-8B"}

# the GPU UUIDs of the default NVIDIA capture (nvidia(): datakit__gtx-8card.xml, 8x Tesla V100S)
V100S_UUIDS = [
    "GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e",
    "GPU-bbf7a241-bf9a-eb90-b2fb-d213294faf48",
    "GPU-8f75e71c-23dd-a060-d997-4caf592954db",
    "GPU-3181eb56-505c-8214-ba05-c132f68f89b8",
    "GPU-2aa87d54-d4ff-2900-812b-1a4b7e119583",
    "GPU-39c3a168-9034-0b5a-223a-1042f30a9242",
    "GPU-d2446f91-171e-1b54-515d-9d9b03484ddf",
    "GPU-1d955959-c95b-4f40-2cac-100d3006ffe2",
]


# two engines on one physical host need their own ports
SHARED = {"NARWHAL_NODE_2_ENGINE_PORT": "8001", "NARWHAL_NODE_2_ATTEST_PORT": "8011"}


def nvidia(dev_root, capture="datakit__gtx-8card.xml", sysfs=NVIDIA_SYS):
    text = (REAL / "nvidia" / capture).read_text()
    parsed = _gpu.parse_nvidia_smi_xml(text) if capture.endswith(".xml") else _gpu.parse_nvidia_smi_text(text)
    return _gpu_reader.nvidia_facts(parsed, str(sysfs), str(dev_root), "nvidia-smi")


def amd():
    parsed = _gpu.parse_rocm_smi_json((REAL / "amd" / "telegraf__mi100_rocm602.json").read_text())
    return _gpu_reader.amd_facts(parsed, str(AMD_SYS), "rocm-smi")


def rdma(dev_root, sysfs=NVIDIA_SYS):
    ib = dev_root / "infiniband"
    ib.mkdir(parents=True, exist_ok=True)
    for name in ["uverbs%d" % i for i in range(9)] + ["rdma_cm"]:
        (ib / name).write_text("")
    return _rdma_reader.rdma_facts(_rdma_reader.read_sysfs_hcas(str(sysfs)), str(dev_root), "sysfs")


def image(dists=None, env=None, ref="vllm/vllm-openai:v0.33.0"):
    attrs = {"Id": IMAGE_ID, "RepoTags": [ref], "RepoDigests": [], "Architecture": "amd64", "Os": "linux",
             "Config": {"Env": CUDA_ENV if env is None else env}}
    return _image.build_facts(ref, attrs, CUDA_DISTS if dists is None else dists, False)


def model(tmp_path, src=LLAMA, patch=None):
    path = tmp_path / ("model-" + src)
    path.mkdir(exist_ok=True)
    config = json.loads((REAL / "models" / (src + "__config.json")).read_text())
    config.update(patch or {})
    (path / "config.json").write_text(json.dumps(config))
    tok = REAL / "models" / (src + "__tokenizer_config.json")
    if tok.exists():
        shutil.copyfile(tok, path / "tokenizer_config.json")
    return _checkpoint.read_checkpoint(str(path))


def stamped_model(tmp_path, shard=b"weights", src=LLAMA, name="stamped"):
    """model() of a checkpoint with one shard (`shard`) that the deliver stage stamped (test_support/model.py::stamp):
    its facts carry the manifest {digest, files}."""
    base = tmp_path / name
    base.mkdir(exist_ok=True)
    model(base, src)
    path = base / ("model-" + src)
    (path / "model.safetensors").write_bytes(shard)
    stamp(path)
    return _checkpoint.read_checkpoint(str(path))


def iface(address, host_id=None):
    info = [{"family": "inet", "local": address, "prefixlen": 24, "scope": "global",
             "preferred_life_time": 4294967295}]
    _link, addresses = interface_addresses([{"ifname": "eth1", "addr_info": info}], "eth1")
    return {"addresses": addresses, "host_id": host_id}


def interfaces(shared):
    if shared:
        return {"engine-1": iface("10.0.0.11", "box-a"), "engine-2": iface("10.0.0.11", "box-a")}
    return {"engine-1": iface("10.0.0.11"), "engine-2": iface("10.0.0.12")}


def build(extra, hosts, shared=True):
    """-> {engine: record} via the writer's planning (build_fleet + collect_records)."""
    values = dict(BASE, **(SHARED if shared else {}))
    values.update(extra)
    inputs = load_inputs(values)
    plan = build_fleet(inputs, ["engine-1", "engine-2"], interfaces(shared))
    document, _extracts = _discovery_outputs.collect_records(plan, inputs, hosts)
    assert validation_errors(document, LAUNCH_CONFIG_SCHEMA) == []
    for record in document["engines"].values():
        assert validation_errors(record, RECORD_SCHEMA) == []
    return document["engines"]


def refused(extra, hosts, shared=True):
    """The InputError with which build refuses the site `extra` over `hosts`."""
    with pytest.raises(InputError) as err:
        build(extra, hosts, shared)
    return err.value


def host(gpus, tmp_path, img=None, mdl=None, rd=None):
    return {"gpus": gpus, "rdma": rd, "image": img or image(), "model": mdl or model(tmp_path)}


def nv_pair(tmp_path, **kw):
    """Both engines on the one 8x V100S host (same facts)."""
    h = host(nvidia(tmp_path / "dev"), tmp_path, **kw)
    return {"engine-1": h, "engine-2": h}


def rdma_pair(tmp_path, rd=None):
    rd = rd or rdma(tmp_path / "dev")
    h = host(nvidia(tmp_path / "dev"), tmp_path, rd=rd)
    return {"engine-1": h, "engine-2": h}


def module_args(root, hosts, extra=None, engines=("engine-1", "engine-2"), check=False):
    values = dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_CONFIG_DIR="config", NARWHAL_FLEET="config/fleet.json",
                  NARWHAL_LAUNCH_CONFIG="config/engine-launch.local.json", **SHARED)
    values.update(extra or {})
    inputs = load_inputs(values)
    ifs = {e: iface("10.0.0.11", "box-a") for e in engines}
    args = {"site": {"site": inputs["site"], "nodes": {str(k): v for k, v in inputs["nodes"].items()}},
            "engines": list(engines), "interfaces": ifs, "root": str(root),
            "hosts": dict((e, hosts["engine-1"]) for e in engines)}
    if check:
        args["_ansible_check_mode"] = True
    return args


def snapshot(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (pathlib.Path(path).read_bytes(), st.st_mtime_ns, st.st_mode & 0o777)
    return out
