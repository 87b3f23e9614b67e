# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What prepare's tests build: the hand-shaped launch config (tests/fixtures/hand-shaped, HAND_LAUNCH_CONFIG)
and its P/D-compatible variant, a host inspection matching a record, a checkout as discovery leaves it, and
prepare_run's arguments."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil

from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import INSPECTION_FILE, MODEL_MANIFEST_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover import outputs as _discovery_outputs
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import launch_policy
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.paths import POLICY_FILE, SOURCES_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.launcher import PLANNER_FILES
from test_support.paths import HAND_LAUNCH_CONFIG, REPO

HAND_LAUNCH = json.loads(HAND_LAUNCH_CONFIG.read_text())
CHECKOUT = "/srv/narwhal"
API_KEY = "sk-narwhal-very-secret-key-0123456789"


def inspection(record):
    """The current inspection of a record's host, built by hand so that it matches the record."""
    vendor = record["accelerator"]["vendor"]
    uuids = record["gpu_ids"] if record["gpu_ids"][0].startswith("GPU-") else [None] * len(record["gpu_ids"])
    gpus = [{"index": i, "name": record["accelerator"]["product"], "uuid": u}
            for i, u in zip(record["gpu_host_indices"], uuids, strict=True)]
    return {"gpus": {"vendor": vendor, "gpus": gpus},
            "interface": {"name": record["node"]["fabric_interface"],
                          "addresses": [{"address": "fe80::1"}, {"address": record["node"]["address"]}]},
            "image_id": record["runtime"]["image_id"],
            "model_manifest": record["runtime"].get("model_manifest"),
            "missing_devices": []}


def compatible(launch):
    """The hand-shaped launch config made a pair that vLLM's NIXL handshake accepts. As shaped, its NVIDIA prefill
    (8x V100S, TP 8) and AMD decode (TP 2) fail it: their default attention backends differ (cuda FLASH_ATTN, rocm
    ROCM_AITER_UNIFIED_ATTN), and TP 8 replicates tiny-llama's 2 KV heads. So both pin TRITON_ATTN, which both
    platforms have, and engine-1 keeps 2 of its GPUs."""
    one = launch["engines"]["engine-1"]
    one.update(gpu_ids=one["gpu_ids"][:2], gpu_host_indices=one["gpu_host_indices"][:2], tensor_parallel_size=2,
               accelerator_devices=["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                    "/dev/nvidia-uvm-tools"])
    one["accelerator"]["count"] = 2
    one["runtime"]["cache_plan"]["notes"] = []
    for record in launch["engines"].values():
        record["runtime"]["extra_args"] = record["runtime"]["extra_args"] + ["--attention-backend", "TRITON_ATTN"]
    return launch


SITE = {"NARWHAL_FLEET": "config/fleet.json", "NARWHAL_LAUNCH_CONFIG": "config/engine-launch.local.json",
        "NARWHAL_ENGINE_CHECKOUT": CHECKOUT, "NARWHAL_API_KEY_FILE": "config/engine-api.key",
        "NARWHAL_RUNS_DIR": "runs", "NARWHAL_CONFIG_DIR": "config",
        # launch policy (what discovery recorded in engine-launch.policy.json)
        "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_KV_CACHE_DTYPE": "auto", "NARWHAL_BLOCK_SIZE": 16,
        "NARWHAL_EXTRA_ARGS": "", "NARWHAL_TP_SIZE": None,
        # the hand-shaped fleet's URLs are http: discovery recorded TLS off
        "NARWHAL_TLS": "off"}
NODES = {"1": {"ROLE": "prefill"}, "2": {"ROLE": "decode", "GPU_IDS": [0, 1], "RDMA_DEVICES": "mlx5_6:1"}}


def fleet_for(records):
    return [{"iid": r["iid"], "engine": r["engine"], "url": "http://%s:8000" % r["node"]["address"],
             "attestation_url": "http://%s:8010" % r["node"]["address"], "role": r["role"],
             "accelerator": copy.deepcopy(r["accelerator"])} for r in records.values()]


def write_policy(root, site=None, nodes=None):
    """The policy extract and the sources index as discovery writes them (the discovery_outputs step)."""
    config = root / "config"
    inputs = {"site": dict(SITE, **(site or {})), "nodes": copy.deepcopy(NODES if nodes is None else nodes)}
    text = _discovery_outputs.dump(launch_policy(inputs, ["engine-1", "engine-2"]))
    (config / POLICY_FILE).write_text(text)
    launch_text = (config / "engine-launch.local.json").read_bytes()
    index = {"launch_config": str(config / "engine-launch.local.json"),
             "files": {POLICY_FILE: hashlib.sha256(text.encode()).hexdigest()}, "engines": {},
             "launch_config_sha256": hashlib.sha256(launch_text).hexdigest()}
    (config / SOURCES_FILE).write_text(_discovery_outputs.dump(index))
    return index


def make_checkout(tmp_path, launch):
    """A checkout as discovery leaves it (fleet, launch config, policy extract, index), with the API key file and a
    copy of the collection's launcher parts and key guard."""
    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "config" / "fleet.json").write_text(json.dumps(fleet_for(launch["engines"]), indent=2))
    (tmp_path / "config" / "engine-launch.local.json").write_text(json.dumps(launch, indent=2))
    write_policy(tmp_path)
    key = tmp_path / "config" / "engine-api.key"
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    # a copy of the collection's launcher parts and planner: prepare builds the zipapp from them
    collection = tmp_path / "collection"
    shutil.copytree(REPO / "roles" / "install" / "files" / "launcher", collection / "roles" / "install" / "files" /
                    "launcher", ignore=shutil.ignore_patterns("__pycache__"))
    for name in PLANNER_FILES:
        (collection / "plugins" / "module_utils" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "plugins" / "module_utils" / name, collection / "plugins" / "module_utils" / name)
    shutil.copy(REPO / "galaxy.yml", collection / "galaxy.yml")  # its version (prepare records it)
    guard = collection / "roles" / "install" / "files" / "guard"  # the key guard (its sha256 is in every plan)
    guard.mkdir(parents=True)
    shutil.copy(REPO / "roles" / "install" / "files" / "guard" / "narwhal_guard.py", guard)
    return tmp_path


def prep_args(root, stage="validate", hosts=None, engines=("engine-1", "engine-2"), check=False, site=None, nodes=None):
    """prepare_run's arguments; `site` / `nodes` change the current inputs (as site_inputs passes them)."""
    args = {"site": {"site": dict(SITE, **(site or {})), "nodes": copy.deepcopy(NODES if nodes is None else nodes),
                     "env_sha256": "x", "env_file": "/x/.env"},
            "engines": list(engines), "root": str(root), "collection": str(root / "collection"), "stage": stage,
            "hosts": hosts if hosts is not None else {}}
    if check:
        args["_ansible_check_mode"] = True
    return args


def good_hosts():
    return dict((e, inspection(r)) for e, r in compatible(copy.deepcopy(HAND_LAUNCH))["engines"].items())


def files_map(*shards):
    """A checkpoint's files map (canonical manifest entries) of config.json and the shards (name, bytes)."""
    files = {"config.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}}
    for name, data in shards:
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return files


def with_manifest(root, launch, engine, files):
    """Give `engine`'s record the manifest of `files` (runtime.model_manifest) and its inspection extract in the
    checkout's config the files map (/model/manifest), as discovery writes them; the launch config is rewritten."""
    digest = manifest_digest(files)
    launch["engines"][engine]["runtime"]["model_manifest"] = digest
    (root / "config" / "engine-launch.local.json").write_text(json.dumps(launch, indent=2))
    (root / "config" / (INSPECTION_FILE % engine)).write_text(json.dumps(
        {"engine": engine, "model": {"path": "/srv/models/tiny-llama",
                                     "manifest": {"digest": digest, "files": files}}}))
    return digest


def write_source_manifest(root, files, digest=None):
    """<config>/model-manifest.json as the deliver stage writes it (NARWHAL_MODEL_SOURCE's manifest)."""
    document = {"source": "/srv/source/tiny-llama", "version": 1, "digest": digest or manifest_digest(files),
                "files": files, "seen": dict((rel, [e["size"], 1]) for rel, e in files.items())}
    (root / "config" / MODEL_MANIFEST_FILE).write_text(json.dumps(document))
    return document["digest"]
