"""The contract of the one planner: for every record the tests build, what prepare records in the manifest
(derive: environment, vllm_args, container, plan hash) is exactly what the launcher snapshot plans and starts
on the host (plan.json written by the zipapp), and the record discovery writes is one the launcher accepts."""
import json
import subprocess
import sys

import pytest
from test_support.launcher import write_inputs, zipapp
from test_support.paths import HAND_LAUNCH_CONFIG, REPO
from test_support.records import amd, build, host, image, model, nv_pair, rdma_pair

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import derive

CHECKOUT = "/opt/narwhal"


def _records(tmp_path):
    yield "hand-shaped", json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"]
    # the docs' example: discovery's records of the proving ground's default site (scripts/gen-example-record.py)
    yield "docs-example", json.loads((REPO / "docs" / "examples" / "engine-launch.example.json").read_text())["engines"]
    yield "nvidia-tcp", build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    yield "nvidia-rdma", build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_TRANSPORT": "ucx_rdma"},
                               rdma_pair(tmp_path))
    yield "nvidia-extras", build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096",
                                  "NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8",
                                  "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG"}, nv_pair(tmp_path))
    yield "remote-code", build({"NARWHAL_GPUS_PER_ENGINE": "2"},
                               nv_pair(tmp_path, mdl=model(tmp_path, "syjjhl__chatglm2-6b")))
    yield "ssm", build({"NARWHAL_GPUS_PER_ENGINE": "4"},
                       nv_pair(tmp_path, mdl=model(tmp_path, "fetchwiki__LiquidAI-LFM2-1.2B")))
    cpu = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": "0.32.0+cpu", "nixl": "0.7.1"}, ["PATH=/usr/bin"],
                                                             "vllm/vllm-openai-cpu:v0.32.0"))
    yield "cpu", build({"NARWHAL_BLOCK_SIZE": "64"}, {"engine-1": cpu, "engine-2": cpu}, shared=False)
    amd_host = host(amd(), tmp_path)
    amd_host["image"] = dict(amd_host["image"], platform="rocm", nixl_distribution="nixl-rocm",
                             distributions={"vllm": "0.33.0", "nixl-rocm": "1.5.1"})
    yield "amd-tcp", build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_IMAGE": "rocm"},
                           {"engine-1": amd_host, "engine-2": amd_host})


def test_manifest_equals_the_launchers_plan_for_every_record(tmp_path):
    # the device nodes the records name (as the dev fixture of _discover/test_records.py makes them)
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (root / name).write_text("")
    launcher = zipapp(tmp_path)
    compared = 0
    for name, records in _records(tmp_path):
        for engine, record in sorted(records.items()):
            derived = derive(record, CHECKOUT, "run-0123456789ab")
            where = tmp_path / name / engine
            where.mkdir(parents=True)
            env_path, env = write_inputs(where, record)
            # the launcher is given the role environment prepare writes (run paths aside)
            role_env = dict(derived["role_env"], NARWHAL_RECORD=env["NARWHAL_RECORD"],
                            NARWHAL_API_KEY_FILE=env["NARWHAL_API_KEY_FILE"], NARWHAL_RUN_DIR=env["NARWHAL_RUN_DIR"])
            env_path.write_text("".join("%s=%s\n" % kv for kv in sorted(role_env.items())))
            proc = subprocess.run([sys.executable, "-I", "-S", str(launcher), "--role-env", str(env_path), "plan"],
                                  capture_output=True, text=True, check=False)
            assert proc.returncode == 0, (name, engine, proc.stderr)
            host_plan = json.loads((where / "runs" / "r1" / "plan.json").read_text())
            assert host_plan["plan_hash"] == derived["plan_hash"], (name, engine)
            assert host_plan["plan"] == derived["container"], (name, engine)
            assert host_plan["plan"]["environment"] == derived["environment"], (name, engine)
            assert host_plan["plan"]["command"][2:] == derived["vllm_args"], (name, engine)
            compared += 1
    assert compared >= 16


@pytest.mark.parametrize("broken,words", [
    ({"transfer": {"ucx_tls": ["tcp"]}}, "lacks cuda_copy: the KV cache is in GPU memory"),
    ({"transfer": {"ucx_tls": ["tcp", "rocm_copy", "cuda_copy"]}}, "a GPU transport of another platform"),
    ({"transfer": {"ucx_tls": ["tcp", "rc", "cuda_copy"]}}, "mixes in rc"),
    ({"transfer": {"ucx_tls": ["tcp", "cuda_copy", "warp"]}}, "warp is not a UCX transport"),
    ({"accelerator_devices": ["/dev/../etc/shadow"]}, "is not a /dev path"),
    ({"gpu_host_indices": [0, 0, 1, 2, 3, 4, 5, 6]}, "must be distinct"),
])
def test_hand_broken_records_refused_by_the_planner(broken, words):
    from test_support.launcher import le, record, role_env

    rec = record("engine-1")
    for key, value in broken.items():
        if isinstance(value, dict):
            rec[key].update(value)
        else:
            rec[key] = value
    with pytest.raises(le.LaunchError, match=words):
        le.build_plan(role_env(), rec)
