"""The launcher (roles/install/files/launcher/narwhal_launcher + the planner plugins/module_utils/_plan/container.py):
plan, rejection of managed overrides, hash, argv, the zipapp's CLI (cli.py), docker start (start.py)."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import pytest
from test_support.launcher import (
    GUARD_SHA256,
    MODULES,
    SECRET,
    free_port,
    host_address,
    le,
    patch_planner,
    record,
    role_env,
    standin_docker,
    write_inputs,
    zipapp,
)
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import GPU_ID_PATTERN

KV_033 = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail",' \
         '"kv_connector_extra_config":{"backends":["UCX"]}}'
KV_011 = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{"backends":["UCX"]}}'
UUIDS = ("GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e,GPU-bbf7a241-bf9a-eb90-b2fb-d213294faf48,"
         "GPU-8f75e71c-23dd-a060-d997-4caf592954db,GPU-3181eb56-505c-8214-ba05-c132f68f89b8,"
         "GPU-2aa87d54-d4ff-2900-812b-1a4b7e119583,GPU-39c3a168-9034-0b5a-223a-1042f30a9242,"
         "GPU-d2446f91-171e-1b54-515d-9d9b03484ddf,GPU-1d955959-c95b-4f40-2cac-100d3006ffe2")


# ------------------------------------------------------------------------------------------ role env

def test_read_role_env(tmp_path):
    path = tmp_path / "engine.env"
    path.write_text("# comment\n\nNARWHAL_ENGINE=engine-1\nNARWHAL_SERVED_MODEL_NAME=a=$HOME\n"
                    "  NARWHAL_HTTP_PORT = 8000\n")
    assert le.read_role_env(str(path)) == {
        "NARWHAL_ENGINE": "engine-1", "NARWHAL_SERVED_MODEL_NAME": "a=$HOME", "NARWHAL_HTTP_PORT": " 8000"}
    path.write_text("not a pair\n")
    with pytest.raises(le.LaunchError, match="line 1"):
        le.read_role_env(str(path))
    # keys the launcher does not read (the old NARWHAL_ENGINE_ARGS included) and repeated keys are refused
    path.write_text("NARWHAL_ENGINE=engine-1\nNARWHAL_ENGINE_ARGS=--port 1\n")
    with pytest.raises(le.LaunchError, match="line 2: NARWHAL_ENGINE_ARGS is not a key the launcher reads"):
        le.read_role_env(str(path))
    path.write_text("NARWHAL_ENGINE=engine-1\nNARWHAL_RUN_DIR=/a\nNARWHAL_RUN_DIR=/tmp/evil\n")
    with pytest.raises(le.LaunchError, match="line 3: NARWHAL_RUN_DIR is set twice"):
        le.read_role_env(str(path))
    path.write_bytes(b"NARWHAL_ENGINE=engine-\xff\n")
    with pytest.raises(le.LaunchError, match="is not UTF-8 text"):
        le.read_role_env(str(path))


# ------------------------------------------------------------------------------------------ NVIDIA

def test_nvidia_plan():
    plan = le.build_plan(role_env(), record("engine-1"))
    assert plan["name"] == "narwhal-engine-1"
    assert plan["image"] == "sha256:c261354381582881da50c70a35a35bbe65b52c1b48cb2591b0c97e7291c60d18"
    assert plan["network_mode"] == "host" and plan["ipc_mode"] == "host"
    assert plan["device_requests"] == [{"driver": "nvidia", "device_ids": ["0", "1", "2", "3", "4", "5", "6", "7"],
                                        "capabilities": [["gpu"]]}]
    assert plan["devices"] == []  # ucx_tcp: no transfer devices; GPUs come from the device request
    assert plan["verify_devices"] == ["/dev/nvidia%d" % i for i in range(8)] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert plan["group_add"] == [] and plan["cap_add"] == [] and plan["ulimits"] == []
    assert plan["security_opt"] == []
    assert plan["mounts"] == [{"type": "bind", "source": "/srv/models/tiny-llama", "target": "/models/tiny-llama",
                               "read_only": True},
                              {"type": "bind", "source": "/opt/narwhal/guard", "target": "/narwhal/guard",
                               "read_only": True},
                              {"type": "bind", "source": "/opt/narwhal/secrets", "target": "/narwhal/secrets",
                               "read_only": True}]
    env = plan["environment"]
    assert env["CUDA_VISIBLE_DEVICES"] == UUIDS
    assert env["UCX_NET_DEVICES"] == "eth1"
    assert env["UCX_TLS"] == "tcp,cuda_copy,cuda_ipc,sm,self"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "172.31.241.11"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["VLLM_API_KEY"] == ""  # vLLM's own check off: the guard is the check
    assert env["NARWHAL_GUARD_KEY_FILE"] == "/narwhal/secrets/api-key"  # role env NARWHAL_API_KEY_FILE, mounted
    assert env["NIXL_PLUGIN_DIR"] == "/usr/local/lib/python3.11/dist-packages/nixl_cu12.libs/nixl"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["PYTHONPATH"] == "/narwhal/guard"
    assert plan["entrypoint"] + plan["command"] == [
        "vllm", "serve", "/models/tiny-llama", "--served-model-name", "tiny-llama", "--host", "172.31.241.11",
        "--port", "8000", "--middleware", "narwhal_guard.KeyGuard", "--tensor-parallel-size", "8",
        "--kv-transfer-config", KV_033, "--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--block-size", "16"]
    assert plan["labels"] == {"org.narwhal.engine": "engine-1", "org.narwhal.guard-sha256": GUARD_SHA256}


def test_nvidia_docker_run_argv():
    rec = record("engine-1")
    rec["runtime"]["environment"]["UCX_LOG_LEVEL"] = "info"
    plan = le.build_plan(role_env(), rec)
    argv = le.docker_run_argv(plan)
    assert argv[:11] == ["docker", "run", "-d", "--name", "narwhal-engine-1", "--network", "host", "--ipc", "host",
                         "--restart", "unless-stopped"]
    assert argv[11:13] == ["--gpus", '"device=0,1,2,3,4,5,6,7"']
    assert "--device" not in argv
    assert ["--mount", "type=bind,source=/srv/models/tiny-llama,target=/models/tiny-llama,readonly",
            "--mount", "type=bind,source=/opt/narwhal/guard,target=/narwhal/guard,readonly",
            "--mount", "type=bind,source=/opt/narwhal/secrets,target=/narwhal/secrets,readonly"] == argv[13:19]
    assert "org.narwhal.plan-hash=%s" % le.plan_hash(plan) in argv
    assert "org.narwhal.engine=engine-1" in argv
    assert "VLLM_API_KEY=" in argv and "NARWHAL_GUARD_KEY_FILE=/narwhal/secrets/api-key" in argv
    assert "UCX_LOG_LEVEL=info" in argv
    tail = argv.index("--entrypoint")
    assert argv[tail:tail + 5] == ["--entrypoint", "vllm", plan["image"], "serve", "/models/tiny-llama"]
    assert argv[-6:] == ["--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--block-size", "16"]


def test_kv_transfer_config_by_version():
    rec = record("engine-1")
    assert json.dumps(le.kv_transfer_config(rec), separators=(",", ":")) == KV_033
    rec["runtime"]["vllm_version"] = "0.11.0"
    assert json.dumps(le.kv_transfer_config(rec), separators=(",", ":")) == KV_011
    plan = le.build_plan(role_env(), rec)
    assert plan["command"][plan["command"].index("--kv-transfer-config") + 1] == KV_011
    rec["runtime"]["vllm_version"] = "0.14.0rc1+cu128"
    assert le.kv_transfer_config(rec)["kv_load_failure_policy"] == "fail"
    rec["runtime"]["kv_buffer_device"] = "cpu"
    assert le.kv_transfer_config(rec) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail",
        "kv_buffer_device": "cpu", "kv_connector_extra_config": {"backends": ["UCX"]}}
    rec["runtime"]["kv_load_failure_policy"] = "recompute"
    assert le.kv_transfer_config(rec)["kv_load_failure_policy"] == "recompute"
    rec["runtime"]["vllm_version"] = "0.13.0"
    assert "kv_load_failure_policy" not in le.kv_transfer_config(rec)


def test_nvidia_subset_of_gpus_uses_host_indices():
    rec = record("engine-1")
    rec["gpu_ids"], rec["gpu_host_indices"], rec["tensor_parallel_size"] = ["0", "1"], [4, 5], 2
    rec["accelerator_devices"] = ["/dev/nvidia4", "/dev/nvidia5", "/dev/nvidiactl"]
    plan = le.build_plan(role_env(), rec)
    assert plan["device_requests"][0]["device_ids"] == ["4", "5"]
    assert plan["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert '"device=4,5"' in le.docker_run_argv(plan)


def test_ipv6_bind():
    plan = le.build_plan(role_env(NARWHAL_BIND_FAMILY="ipv6", NARWHAL_ADVERTISED_ADDRESS="fd00:31::11"),
                         record("engine-1"))
    assert plan["command"][plan["command"].index("--host") + 1] == "fd00:31::11"
    assert plan["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "fd00:31::11"
    with pytest.raises(le.LaunchError, match="NARWHAL_BIND_FAMILY"):
        le.build_plan(role_env(NARWHAL_BIND_FAMILY="dual"), record("engine-1"))


# ------------------------------------------------------------------------------------------ who gets in

@pytest.mark.parametrize("bind,host", [("172.31.241.11", "172.31.241.11"), ("0.0.0.0", "0.0.0.0"), ("::", "::"),
                                       ("[fd00:31::11]", "fd00:31::11"), ("10.0.0.9", "10.0.0.9")])
def test_the_engine_binds_the_role_environments_address(bind, host):
    """--host is NARWHAL_BIND_ADDRESS (the advertised address, or NARWHAL_ENGINE_BIND), never a default wildcard."""
    plan = le.build_plan(role_env(NARWHAL_BIND_ADDRESS=bind), record("engine-1"))
    assert plan["command"][plan["command"].index("--host") + 1] == host
    assert plan["command"].count("--host") == 1


@pytest.mark.parametrize("bind", ["", "engine-1.example", "0.0.0.0:8000", "10.0.0"])
def test_an_empty_or_invalid_bind_address_is_refused_by_its_key(bind):
    with pytest.raises(le.LaunchError) as info:
        le.build_plan(role_env(NARWHAL_BIND_ADDRESS=bind), record("engine-1"))
    assert info.value.key == "NARWHAL_BIND_ADDRESS" and "NARWHAL_BIND_ADDRESS" in str(info.value)


def test_tls_serves_the_installed_certificate_and_a_new_one_replaces_the_engine():
    cert = "c" * 64
    env = role_env(NARWHAL_TLS_DIR="/opt/narwhal/tls/engine-1", NARWHAL_TLS_CERT_SHA256=cert)
    plan = le.build_plan(env, record("engine-1"))
    command = plan["command"]
    at = command.index("--middleware")
    assert command[at:at + 6] == ["--middleware", "narwhal_guard.KeyGuard", "--ssl-certfile",
                                  "/narwhal/tls/server.crt", "--ssl-keyfile", "/narwhal/tls/server.key"]
    assert plan["mounts"][1:] == [
        {"type": "bind", "source": "/opt/narwhal/guard", "target": "/narwhal/guard", "read_only": True},
        {"type": "bind", "source": "/opt/narwhal/secrets", "target": "/narwhal/secrets", "read_only": True},
        {"type": "bind", "source": "/opt/narwhal/tls/engine-1", "target": "/narwhal/tls", "read_only": True}]
    assert plan["labels"]["org.narwhal.tls-cert-sha256"] == cert
    off = le.build_plan(role_env(), record("engine-1"))
    assert not [w for w in off["command"] if w.startswith("--ssl")] and len(off["mounts"]) == 3
    assert "org.narwhal.tls-cert-sha256" not in off["labels"]
    digest = le.plan_hash(plan)
    assert le.plan_hash(le.build_plan(dict(env, NARWHAL_TLS_CERT_SHA256="d" * 64), record("engine-1"))) != digest
    assert le.plan_hash(le.build_plan(dict(env, NARWHAL_GUARD_SHA256="e" * 64), record("engine-1"))) != digest
    with pytest.raises(le.LaunchError) as info:
        le.build_plan(dict(env, NARWHAL_TLS_CERT_SHA256=""), record("engine-1"))
    assert info.value.key == "NARWHAL_TLS_CERT_SHA256"
    with pytest.raises(le.LaunchError, match="NARWHAL_TLS_DIR='tls' must be an absolute path"):
        le.build_plan(dict(env, NARWHAL_TLS_DIR="tls"), record("engine-1"))
    with pytest.raises(le.LaunchError, match="NARWHAL_GUARD_DIR is not set"):
        le.build_plan(role_env(NARWHAL_GUARD_DIR=""), record("engine-1"))


def test_the_guard_goes_first_on_the_images_own_pythonpath():
    rec = record("engine-1")
    rec["runtime"]["environment"]["PYTHONPATH"] = "/opt/image/lib:/opt/extra"
    plan = le.build_plan(role_env(), rec)
    assert plan["environment"]["PYTHONPATH"] == "/narwhal/guard:/opt/image/lib:/opt/extra"
    with pytest.raises(le.LaunchError, match="NARWHAL_ENGINE_ENV sets PYTHONPATH, which is launcher-managed"):
        le.parse_env_words("PYTHONPATH=/x", "NARWHAL_ENGINE_ENV")


# ------------------------------------------------------------------------------------------ AMD / RDMA

def test_amd_rdma_plan():
    plan = le.build_plan(role_env("engine-2"), record("engine-2"))
    assert plan["devices"] == [
        "/dev/kfd:/dev/kfd:rwm", "/dev/dri/renderD128:/dev/dri/renderD128:rwm",
        "/dev/dri/card0:/dev/dri/card0:rwm", "/dev/dri/renderD129:/dev/dri/renderD129:rwm",
        "/dev/dri/card1:/dev/dri/card1:rwm", "/dev/infiniband/uverbs4:/dev/infiniband/uverbs4:rwm",
        "/dev/infiniband/uverbs5:/dev/infiniband/uverbs5:rwm", "/dev/infiniband/rdma_cm:/dev/infiniband/rdma_cm:rwm"]
    assert plan["device_requests"] == [] and plan["verify_devices"] == []
    import grp

    host_ids = {}
    for name in ("video", "render"):
        try:
            host_ids[name] = str(grp.getgrnam(name).gr_gid)
        except KeyError:
            pass
    # the plan names the groups (host-independent hash); the launcher maps them to the HOST's numeric IDs
    assert plan["group_add"] == ["video", "render"]
    assert le.host_group_ids(plan["group_add"]) == host_ids
    argv = le.docker_run_argv(plan, host_ids)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--group-add"] == \
        [host_ids.get(g, g) for g in ("video", "render")]
    assert plan["cap_add"] == ["IPC_LOCK"]
    assert plan["ulimits"] == [{"name": "memlock", "soft": -1, "hard": -1}]
    assert plan["security_opt"] == ["seccomp=unconfined"]
    env = plan["environment"]
    assert env["ROCR_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in env
    assert env["UCX_NET_DEVICES"] == "mlx5_6:1,mlx5_7:1"  # one rail per GPU
    assert env["UCX_TLS"] == "rc,ud,rocm_copy,rocm_ipc,sm,self"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "172.31.241.12"
    assert plan["command"][plan["command"].index("--tensor-parallel-size") + 1] == "2"
    assert plan["command"][-4:] == ["--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]
    argv = le.docker_run_argv(plan)
    group_pairs = [["--group-add", gid] for gid in plan["group_add"]]
    other_pairs = [["--cap-add", "IPC_LOCK"], ["--ulimit", "memlock=-1:-1"],
                   ["--security-opt", "seccomp=unconfined"], ["--device", "/dev/kfd:/dev/kfd:rwm"]]
    for pair in group_pairs + other_pairs:
        i = argv.index(pair[0], argv.index(pair[1]) - 1)
        assert argv[i:i + 2] == pair
    assert "--gpus" not in argv


def test_cuda_rdma_tls():
    rec = record("engine-1")
    rec["transfer"] = {"transport": "ucx_rdma", "net_devices": ["mlx5_0:1"],
                       "devices": ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"],
                       "ucx_tls": le.ucx_tls("ucx_rdma", "cuda", "cuda")}
    plan = le.build_plan(role_env(), rec)
    assert plan["environment"]["UCX_TLS"] == "rc,ud,cuda_copy,cuda_ipc,sm,self"
    assert plan["devices"] == ["/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm",
                               "/dev/infiniband/rdma_cm:/dev/infiniband/rdma_cm:rwm"]
    assert plan["cap_add"] == ["IPC_LOCK"]


# ------------------------------------------------------------------------------------------ rejections

MANAGED_FLAG_FORMS = [
    ["--port", "9000"], ["--port=9000"], ["--host", "::"], ["--tensor-parallel-size", "2"], ["-tp", "2"],
    ["-tp=2"], ["--tensor_parallel_size", "2"], ["--tensor-parallel", "2"], ["--kv-transfer-config", "{}"],
    ["--kv_transfer_config={}"], ["--kv-transfer-config.kv_role", "kv_producer"], ["--api-key", "x"],
    ["--api_key=x"], ["--served-model-name", "x"], ["--served_model_name=x"], ["--model", "m"], ["--dtype", "half"],
    ["--kv-cache-dtype", "fp8"], ["--kv_cache_dtype=fp8"], ["--block-size", "32"], ["--block_size=32"],
    ["--data-parallel-size", "2"], ["-dp", "2"], ["--data_parallel_size=2"], ["--pipeline-parallel-size", "2"],
    ["-pp", "2"], ["--pipeline_parallel_size=2"], ["--config", "x.yaml"], ["--uds", "/tmp/s"],
    ["--middleware", "my.Middleware"], ["--middleware=x.y"], ["--ssl-keyfile", "/k"], ["--ssl_certfile=/c"],
    ["--ssl-ca-certs", "/ca"], ["--ssl-cert-reqs", "2"], ["--ssl-ciphers", "ALL"], ["--ssl", "/k"],
]


@pytest.mark.parametrize("args", MANAGED_FLAG_FORMS, ids=lambda a: a[0])
def test_reject_managed_flag_in_extra_args(args):
    rec = record("engine-2")
    rec["runtime"]["extra_args"] = ["--max-model-len", "8192"] + args
    with pytest.raises(le.LaunchError) as info:
        le.build_plan(role_env("engine-2"), rec)
    message = str(info.value)
    shown = args[0].split("=", 1)[0] + "=<redacted>" if args[0].startswith("--api") and "=" in args[0] else args[0]
    assert "runtime.extra_args[2]=%r" % shown in message and "launcher-managed" in message


@pytest.mark.parametrize("args", MANAGED_FLAG_FORMS, ids=lambda a: a[0])
def test_reject_managed_flag_in_an_input(args):
    """The same rule names the .env input when discovery checks it (one owner)."""
    with pytest.raises(le.LaunchError) as info:
        le.check_args(le.split_args(" ".join("'%s'" % a for a in ["--enforce-eager"] + args), "NARWHAL_EXTRA_ARGS"),
                      "NARWHAL_EXTRA_ARGS")
    assert info.value.key == "NARWHAL_EXTRA_ARGS"
    shown = args[0].split("=", 1)[0] + "=<redacted>" if args[0].startswith("--api") and "=" in args[0] else args[0]
    assert "NARWHAL_EXTRA_ARGS[1]=%r overrides launcher-managed" % shown in str(info.value)


def test_trust_remote_code_only_as_derived():
    rec = record("engine-1")
    rec["runtime"]["extra_args"] = ["--trust-remote-code"]
    with pytest.raises(le.LaunchError, match="is derived by discovery from the checkpoint"):
        le.build_plan(role_env(), rec)
    with pytest.raises(le.LaunchError, match=r"NARWHAL_EXTRA_ARGS\[0\]='--trust_remote_code'"):
        le.check_args(["--trust_remote_code"], "NARWHAL_EXTRA_ARGS")


def test_allowed_flags_pass():
    rec = record("engine-1")
    rec["runtime"]["extra_args"] = ["--max-num-seqs", "8", "--hostname-like", "x", "--portable", "-1"]
    plan = le.build_plan(role_env(), rec)
    assert plan["command"][-6:] == ["--max-num-seqs", "8", "--hostname-like", "x", "--portable", "-1"]


@pytest.mark.parametrize("key", ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                 "NVIDIA_VISIBLE_DEVICES", "UCX_NET_DEVICES", "UCX_TLS",
                                 "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_API_KEY",
                                 "VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_HOST_IP", "VLLM_PORT", "PATH"])
def test_reject_managed_env(key):
    with pytest.raises(le.LaunchError, match="NARWHAL_ENGINE_ENV sets %s, which is launcher-managed" % key):
        le.parse_env_words("UCX_LOG_LEVEL=info\n%s=x" % key, "NARWHAL_ENGINE_ENV")
    rec = record("engine-1")
    rec["runtime"]["environment"][key] = "x"
    with pytest.raises(le.LaunchError, match=r"runtime\.environment sets %s, which is launcher-managed" % key):
        le.build_plan(role_env(), rec)


def test_reject_secret_env_in_record():
    rec = record("engine-1")
    rec["runtime"]["environment"]["HF_TOKEN"] = "hf_x"
    with pytest.raises(le.LaunchError, match="sets HF_TOKEN, which looks like a secret"):
        le.build_plan(role_env(), rec)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "localhost", "localhost.", "127.0.0.1", "127.1.2.3", "::1",
                                     "[::1]", "::ffff:127.0.0.1", "fe80::1", "engine-1.example", ""])
def test_reject_side_channel_host(address):
    with pytest.raises(le.LaunchError, match="NARWHAL_ADVERTISED_ADDRESS"):
        le.build_plan(role_env(NARWHAL_ADVERTISED_ADDRESS=address), record("engine-1"))


def test_net_device_substitution():
    rec = record("engine-1")
    with pytest.raises(le.LaunchError, match=r"\$\{NARWHAL_FABRIC_INTERFACE\} is not set"):
        le.build_plan(role_env(NARWHAL_FABRIC_INTERFACE=""), rec)
    rec["transfer"]["net_devices"] = ["${NARWHAL_FABRIC_INTERFACE}:1"]
    with pytest.raises(le.LaunchError, match=r"transfer\.net_devices\[0\]"):
        le.build_plan(role_env(), rec)


def test_engine_mismatch_and_bad_port():
    with pytest.raises(le.LaunchError, match="does not match role env NARWHAL_ENGINE=engine-2"):
        le.build_plan(role_env("engine-2"), record("engine-1"))
    with pytest.raises(le.LaunchError, match="NARWHAL_HTTP_PORT"):
        le.build_plan(role_env(NARWHAL_HTTP_PORT="80a"), record("engine-1"))


def test_derived_settings_kept_with_extras():
    rec = record("engine-1")
    rec["runtime"]["trust_remote_code"] = True
    rec["runtime"]["extra_args"] = ["--trust-remote-code", "--max-model-len", "4096"]
    rec["runtime"]["ssm_conv_state"] = True
    rec["runtime"]["derived_environment"] = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    rec["runtime"]["extra_args"] += ["--enforce-eager", "--max-num-seqs", "4"]
    rec["runtime"]["environment"].update(UCX_LOG_LEVEL="info", NCCL_DEBUG="WARN")
    plan = le.build_plan(role_env(), rec)
    assert plan["command"][plan["command"].index("16") + 1:] == [
        "--trust-remote-code", "--max-model-len", "4096", "--enforce-eager", "--max-num-seqs", "4"]
    env = plan["environment"]
    assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert env["UCX_LOG_LEVEL"] == "info" and env["NCCL_DEBUG"] == "WARN"
    rec["runtime"]["extra_args"] = ["--max-model-len", "4096"]
    with pytest.raises(le.LaunchError, match="lacks --trust-remote-code"):
        le.build_plan(role_env(), rec)


# ------------------------------------------------------------------------------------------ hash

def test_plan_hash_stable_and_sensitive():
    rec = record("engine-1")
    h = le.plan_hash(le.build_plan(role_env(), rec))
    assert len(h) == 64
    shuffled = json.loads(json.dumps(rec))
    shuffled["runtime"]["environment"] = dict(reversed(list(rec["runtime"]["environment"].items())))
    shuffled = dict(reversed(list(shuffled.items())))
    env = dict(reversed(list(role_env().items())))
    assert le.plan_hash(le.build_plan(env, shuffled)) == h
    keyed = [le.build_plan(role_env(), rec) for _plan in range(2)]
    keyed[0]["environment"]["VLLM_API_KEY"], keyed[1]["environment"]["VLLM_API_KEY"] = SECRET, "an-older-key-0123"
    assert le.plan_hash(keyed[0]) == le.plan_hash(keyed[1])  # a key in a plan (as before issue 36) is not hashed
    # the key file's place is planned (its directory is mounted), its content is not (the guard reads it)
    assert le.plan_hash(le.build_plan(role_env(NARWHAL_API_KEY_FILE="/srv/other/secrets/api-key"), rec)) != h
    rec2 = json.loads(json.dumps(rec))
    rec2["runtime"]["extra_args"] = ["--max-num-seqs", "8"]
    assert le.plan_hash(le.build_plan(role_env(), rec2)) != h
    assert le.plan_hash(le.build_plan(role_env(NARWHAL_RUN_ID="r2", NARWHAL_RUN_DIR="/x"), rec)) == h
    assert le.plan_hash(le.build_plan(role_env(NARWHAL_HTTP_PORT="8001"), rec)) != h
    rec["runtime"]["block_size"] = 32
    assert le.plan_hash(le.build_plan(role_env(), rec)) != h


def test_start_creates_the_container_without_the_key(tmp_path, monkeypatch):
    """What the launcher's start sends the daemon (the create body, what `docker inspect` then shows) holds no key,
    although start read the key file: the engine's guard reads it through the mounted secrets directory."""
    from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import plan_body

    env_path, env = write_inputs(tmp_path, record("engine-1"))
    prepared = le.prepare(str(env_path))

    class API:
        body = None

        def plan_config(self, plan, labels, group_ids=None):
            return plan_body(plan, labels, group_ids)

        def create(self, name, body):
            API.body = body
            return {"Id": "c" * 64}

        def start(self, container_id):
            pass

    start = MODULES["start"]
    monkeypatch.setattr(start, "set_aside", lambda api, found, plan: None)
    monkeypatch.setattr(start, "_wait_started", lambda *args: None)
    assert start._create_and_wait(API(), prepared, {}, {}, 10, str(tmp_path), 0.1, SECRET, {}) == ("c" * 64, None)
    assert SECRET not in json.dumps(API.body)
    assert "VLLM_API_KEY=" in API.body["Env"] and "NARWHAL_GUARD_KEY_FILE=/narwhal/secrets/engine-api.key" in \
        API.body["Env"]
    assert {"Target": "/narwhal/secrets", "Source": str(tmp_path / "secrets"), "Type": "bind",
            "ReadOnly": True} in API.body["HostConfig"]["Mounts"]


# ------------------------------------------------------------------------------------------ CLI

def test_cli_plan_writes_plan_without_key(tmp_path):
    env_path, env = write_inputs(tmp_path, record("engine-1"))
    launcher = zipapp(tmp_path)
    # -I -S: no site-packages, so nothing of Ansible or the collection is importable but what the zipapp carries
    proc = subprocess.run([sys.executable, "-I", "-S", str(launcher), "--role-env", str(env_path), "plan"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    plan_file = pathlib.Path(env["NARWHAL_RUN_DIR"]) / "plan.json"
    assert plan_file.stat().st_mode & 0o777 == 0o600
    text = plan_file.read_text()
    assert SECRET not in text and SECRET not in proc.stdout
    data = json.loads(text)
    assert data["plan_hash"] == le.plan_hash(data["plan"])
    assert data["argv"] == le.docker_run_argv(data["plan"], run_id="r1")
    assert "VLLM_API_KEY=" in data["argv"] and not [a for a in data["argv"] if SECRET in a]
    # the creating run is a label of the container, outside the hashed plan
    assert "org.narwhal.run-id=r1" in data["argv"] and "org.narwhal.run-id" not in json.dumps(data["plan"])
    assert data["launcher_sha256"] == hashlib.sha256(launcher.read_bytes()).hexdigest()
    assert zipapp(tmp_path).read_bytes() == launcher.read_bytes()  # deterministic: the digest names the sources
    assert proc.stdout.startswith("docker run -d --name narwhal-engine-1 ")
    assert "--gpus '\"device=0,1,2,3,4,5,6,7\"'" in proc.stdout


def test_cli_errors_exit_2(tmp_path):
    rec = record("engine-1")
    rec["runtime"]["extra_args"] = ["--port=9000"]
    env_path = write_inputs(tmp_path, rec)[0]
    proc = subprocess.run([sys.executable, "-I", "-S", str(zipapp(tmp_path)), "--role-env", str(env_path), "plan"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "runtime.extra_args[0]='--port=9000' overrides launcher-managed --port" in proc.stderr
    env_path, env = write_inputs(tmp_path, record("engine-1"))
    os.chmod(env["NARWHAL_API_KEY_FILE"], 0o644)
    assert le.main(["--role-env", str(env_path), "plan"]) == 2


# Hand edits of the installed record: the launcher runs discovery's record check (_outputs/schemas.py::check_record)
# before it plans, so each is refused naming the record file and the field, and nothing is written.
HAND_EDITS = [
    ("engine-2", lambda r: r["runtime"].update(block_size=-16), "field runtime.block_size: -16 is less than the "
                                                                "minimum of 1"),
    ("engine-2", lambda r: r["runtime"].update(block_size=0), "field runtime.block_size: 0 is less than"),
    ("engine-2", lambda r: r["runtime"].update(block_size=10 ** 12), "field runtime.block_size: 1000000000000 is "
                                                                     "greater than the maximum of 65536"),
    ("engine-2", lambda r: r.update(gpu_ids=["0,1", "1"]), "field gpu_ids[0]: '0,1' does not match"),
    ("engine-2", lambda r: r.update(gpu_ids=["0", "1 "]), "field gpu_ids[1]: '1 ' does not match"),
    ("engine-2", lambda r: r.update(gpu_ids=["-1", "0"]), "field gpu_ids[0]: '-1' does not match"),
    ("engine-2", lambda r: r.update(gpu_ids=["1", "1"]), "field gpu_ids: ['1', '1'] has non-unique elements"),
    ("engine-2", lambda r: r.update(gpu_ids=[0, 1]), "field gpu_ids[0]: 0 is not of type 'string'"),
    ("engine-2", lambda r: r.update(tensor_parallel_size="2"), "field tensor_parallel_size: '2' is not of type"),
    ("engine-2", lambda r: r["runtime"].pop("block_size"), "field runtime: 'block_size' is a required property"),
    ("engine-1", lambda r: r.pop("gpu_ids"), "field (the record): 'gpu_ids' is a required property"),
    ("engine-1", lambda r: r["gpu_ids"].__setitem__(1, "0,1"), "field gpu_ids[1]: '0,1' does not match"),
]


@pytest.mark.parametrize("engine,edit,message", HAND_EDITS, ids=[m.split(":")[0] + str(i)
                                                                 for i, (_e, _f, m) in enumerate(HAND_EDITS)])
def test_launcher_refuses_a_hand_edited_record_by_field_and_file(tmp_path, capsys, engine, edit, message):
    rec = record(engine)
    edit(rec)
    env_path, env = write_inputs(tmp_path, rec)
    for action in ("plan", "start", "preview", "check"):
        assert le.main(["--role-env", str(env_path), action]) == 2
        err = capsys.readouterr().err
        assert err.startswith("launch_engine: error: launch record %s (NARWHAL_RECORD): " % env["NARWHAL_RECORD"])
        assert message in err, err
    assert not (pathlib.Path(env["NARWHAL_RUN_DIR"]) / "plan.json").exists()


def test_the_zipapp_carries_the_record_check(tmp_path):
    rec = record("engine-2")
    rec["runtime"]["block_size"] = -16
    rec["gpu_ids"] = ["0,1", "1"]
    env_path, env = write_inputs(tmp_path, rec)
    proc = subprocess.run([sys.executable, "-I", "-S", str(zipapp(tmp_path)), "--role-env", str(env_path), "plan"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == (
        "launch_engine: error: launch record %s (NARWHAL_RECORD): field gpu_ids[0]: '0,1' does not match %r; "
        "field runtime.block_size: -16 is less than the minimum of 1; the launcher plans only what discovery writes: "
        "rerun discovery\n" % (env["NARWHAL_RECORD"], GPU_ID_PATTERN))


def test_start_refuses_missing_host_inputs(tmp_path):
    env_path, env = write_inputs(tmp_path, record("engine-2"))
    rec = record("engine-2")
    rec["accelerator_devices"] = ["/dev/narwhal-missing-kfd"]
    pathlib.Path(env["NARWHAL_RECORD"]).write_text(json.dumps(rec))
    with pytest.raises(le.LaunchError, match="device /dev/narwhal-missing-kfd .* is not on this host"):
        le.start(str(env_path))
    assert (pathlib.Path(env["NARWHAL_RUN_DIR"]) / "plan.json").exists()  # the plan is recorded first
    rec["accelerator_devices"] = []  # no device to miss: TCP (an RDMA record without devices is refused earlier)
    rec["transfer"].update(transport="ucx_tcp", net_devices=["eth1"], devices=[],
                           ucx_tls=le.ucx_tls("ucx_tcp", "rocm", "cuda"))
    rec["runtime"]["model_path"] = str(tmp_path / "no-model")
    pathlib.Path(env["NARWHAL_RECORD"]).write_text(json.dumps(rec))
    with pytest.raises(le.LaunchError, match="runtime.model_path .* is not a directory"):
        le.start(str(env_path))
    (tmp_path / "no-model").mkdir()
    shutil.rmtree(env["NARWHAL_GUARD_DIR"])
    with pytest.raises(le.LaunchError, match=r"/guard \(mounted at /narwhal/guard\) is not a directory on this "
                                             r"host: install writes it; rerun prepare"):
        le.start(str(env_path))


# ------------------------------------------------------------------------------------------ docker


NEW_SECRET = "n3w-s3cr3t-Key-fedcba9876543210"


def _write_key(path, text):
    """The engine host's key file rewritten as install's copy does: a new file renamed over it."""
    new = path + ".new"
    with open(os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)
    os.replace(new, path)


def _models(address, port, key=SECRET, want=200):
    """The served model name from /v1/models with `key` (the stand-in answers within seconds; a new key file is
    read by the guard within a second); `want`=401: the status once the key is refused."""
    import time
    import urllib.error
    import urllib.request

    request = urllib.request.Request("http://%s:%d/v1/models" % (address, port),
                                     headers={"Authorization": "Bearer " + key})
    for _attempt in range(40):
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                if want == 200:
                    return json.loads(answer.read())["data"][0]["id"]
        except urllib.error.HTTPError as exc:
            if exc.code == want:
                return exc.code
        except OSError:
            pass
        time.sleep(0.25)
    return None


@pytest.mark.skipif(standin_docker()[1] is None, reason="no Docker daemon or stand-in image")
def test_start_standin_container(tmp_path, capsys, monkeypatch):
    docker, client = standin_docker()
    address = host_address()
    ports = [p for p in range(18431, 18499) if free_port(p)][:2]
    if address is None or len(ports) < 2:
        pytest.skip("no routable host address or free 18xxx ports")
    image = client.images.get("narwhal-sim/engine-standin:latest")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text("{}")
    engine = "engine-%d" % (90000 + uuid.uuid4().int % 9999)
    rec = record("engine-1")
    rec.update(engine=engine, accelerator={"vendor": "cpu", "product": "cpu", "count": 0}, gpu_ids=[],
               gpu_host_indices=[], tensor_parallel_size=1, accelerator_devices=[])
    rec["runtime"].update(image_id=image.id, platform="cpu", kv_buffer_device="cpu", model_path=str(model))
    rec["transfer"]["ucx_tls"] = ["tcp"]
    env_path, env = write_inputs(tmp_path, rec, NARWHAL_HTTP_PORT=str(ports[0]),
                                 NARWHAL_SIDE_CHANNEL_PORT=str(ports[1]), NARWHAL_ADVERTISED_ADDRESS=address,
                                 NARWHAL_FABRIC_INTERFACE="lo")
    # the launcher names containers narwhal-<engine>; the test's container is narwhal-launcher-test-*
    test_name = "narwhal-launcher-test-%s" % engine
    original = MODULES["plan"].container_spec

    def container_spec(record_, role_env_):
        plan = original(record_, role_env_)
        plan["name"] = test_name
        return plan

    patch_planner(monkeypatch, "container_spec", container_spec)
    monkeypatch.setattr(MODULES["start"], "STOP_TIMEOUT", 2)
    try:
        assert le.main(["--role-env", str(env_path), "start"]) == 0
        first = json.loads((pathlib.Path(env["NARWHAL_RUN_DIR"]) / "deployment.json").read_text())
        plan_data = json.loads((pathlib.Path(env["NARWHAL_RUN_DIR"]) / "plan.json").read_text())
        plan = plan_data["plan"]
        attrs = client.containers.get(test_name).attrs
        assert attrs["Id"] == first["container_id"] and first["action"] in ("started", "replaced")
        assert attrs["Config"]["Entrypoint"] == plan["entrypoint"] == ["vllm"]
        assert attrs["Config"]["Cmd"] == plan["command"]
        assert attrs["Config"]["Image"] == image.id
        container_env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
        for key, value in plan["environment"].items():
            assert container_env[key] == value, key
        assert container_env["VLLM_API_KEY"] == "" and SECRET not in json.dumps(attrs)  # docker inspect: no key
        assert attrs["Config"]["Labels"]["org.narwhal.plan-hash"] == plan_data["plan_hash"]
        assert attrs["Config"]["Labels"]["org.narwhal.engine"] == engine
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "host" and host["IpcMode"] == "host"
        assert not host.get("Devices") and not host.get("DeviceRequests")
        assert host["RestartPolicy"]["Name"] == "unless-stopped"
        assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [
            (str(model), "/models/tiny-llama", True), (env["NARWHAL_GUARD_DIR"], "/narwhal/guard", True),
            (os.path.dirname(env["NARWHAL_API_KEY_FILE"]), "/narwhal/secrets", True)]
        assert first["launcher_sha256"] == le.launcher_sha256() and first["image_id"] == image.id
        assert SECRET not in (pathlib.Path(env["NARWHAL_RUN_DIR"]) / "deployment.json").read_text()
        assert _models(address, ports[0]) == "tiny-llama", client.containers.get(test_name).logs()[-2000:]
        # a key rotation: the new key on the first line, the old one on the second, replaced by rename as install
        # does; the engine's guard takes both within a second, then the new one alone - no restart
        _write_key(env["NARWHAL_API_KEY_FILE"], "%s\n%s\n" % (NEW_SECRET, SECRET))
        assert _models(address, ports[0], NEW_SECRET) == _models(address, ports[0]) == "tiny-llama"
        _write_key(env["NARWHAL_API_KEY_FILE"], NEW_SECRET + "\n")
        assert _models(address, ports[0], SECRET, want=401) == 401
        assert _models(address, ports[0], NEW_SECRET) == "tiny-llama"
        _write_key(env["NARWHAL_API_KEY_FILE"], SECRET + "\n")
        assert _models(address, ports[0]) == "tiny-llama"
        capsys.readouterr()
        assert le.main(["--role-env", str(env_path), "start"]) == 0
        assert capsys.readouterr().out.strip() == "unchanged"
        again = client.containers.get(test_name).attrs
        assert again["State"]["Running"], client.containers.get(test_name).logs()[-2000:]
        # a different plan replaces the container
        rec["runtime"]["extra_args"] = ["--max-model-len", "2048"]
        pathlib.Path(env["NARWHAL_RECORD"]).write_text(json.dumps(rec))
        assert le.main(["--role-env", str(env_path), "start"]) == 0
        assert capsys.readouterr().out.startswith("replaced %s " % test_name)
        third = json.loads((pathlib.Path(env["NARWHAL_RUN_DIR"]) / "deployment.json").read_text())
        assert third["replaced_container_id"] == first["container_id"] != third["container_id"]
        assert client.containers.get(test_name).attrs["Config"]["Cmd"][-2:] == ["--max-model-len", "2048"]
        assert again["Id"] == first["container_id"] and again["State"]["StartedAt"] == attrs["State"]["StartedAt"]
    finally:
        try:
            client.containers.get(test_name).remove(force=True)
        except docker.errors.NotFound:
            pass
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)


# ------------------------------------------------------------------------------------------ hostile inputs
# (issue 13, class 6: never a hang; class 5: the key never printed)


@pytest.mark.parametrize("which", ["role_env", "record", "api_key"])
@pytest.mark.parametrize("make, needle", [
    (lambda p: os.mkfifo(p, 0o600), "a FIFO, not a regular file"),
    (lambda p: os.symlink(p.name, p), "a symlink loop"),
], ids=["fifo", "symlink-loop"])
def test_launcher_inputs_that_are_fifos_or_loops_are_named(tmp_path, which, make, needle):
    env_path, env = write_inputs(tmp_path, record("engine-1"))
    path = {"role_env": env_path, "record": pathlib.Path(env["NARWHAL_RECORD"]),
            "api_key": pathlib.Path(env["NARWHAL_API_KEY_FILE"])}[which]
    path.unlink()
    make(path)
    with pytest.raises(le.LaunchError) as info:
        le.prepare(str(env_path))  # would block forever on open() of the FIFO
    assert needle in str(info.value) and str(path) in str(info.value)


def test_launcher_deeply_nested_record_is_named(tmp_path):
    env_path, env = write_inputs(tmp_path, record("engine-1"))
    pathlib.Path(env["NARWHAL_RECORD"]).write_text("[" * 100000)
    with pytest.raises(le.LaunchError, match="is not JSON"):
        le.prepare(str(env_path))
    checked = tmp_path / "checked.json"
    checked.write_text("{\"a\":" * 100000)
    assert le.read_json_file(str(checked)) is None


def test_cli_errors_never_print_the_key(tmp_path, capsys, monkeypatch):
    env_path, env = write_inputs(tmp_path, record("engine-1"))

    def leaky(role_env_path, **_kw):
        le.read_api_key(env["NARWHAL_API_KEY_FILE"])  # registers the key for redaction
        raise RuntimeError("daemon said: invalid env VLLM_API_KEY=%s and %s" % (SECRET, SECRET))

    monkeypatch.setattr(MODULES["start"], "start", leaky)
    assert MODULES["cli"].main(["--role-env", str(env_path), "start"]) == 3
    err = capsys.readouterr().err
    assert "unexpected error" in err and "RuntimeError: daemon said" in err
    assert SECRET not in err and "<redacted>" in err

    def refused(role_env_path, **_kw):
        raise le.LaunchError("docker refused: %s" % SECRET)

    monkeypatch.setattr(MODULES["start"], "start", refused)
    assert MODULES["cli"].main(["--role-env", str(env_path), "start"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("launch_engine: error: docker refused: <redacted>") and SECRET not in err


def test_zipapp_carries_everything_the_launcher_imports(tmp_path):
    """The engine host has only the zipapp and the standard library (no Docker SDK): every launcher part imports
    from the artefact alone (no site-packages, so nothing of Ansible or the checkout), the in-image observer is in
    it as data."""
    launcher = zipapp(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import narwhal_launcher.cli, narwhal_launcher.common, narwhal_launcher.image_check, "
            "narwhal_launcher.health, narwhal_launcher.start, narwhal_launcher.stop, narwhal_launcher.status; "
            "print(len(narwhal_launcher.image_check.in_image_script()))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(launcher)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 1000


def test_an_engine_across_hosts_plans_each_host_from_the_one_record(tmp_path):
    """The wide-EP shape's engine-1 (two hosts): each host plans its own container from the one record, the head
    and, with NARWHAL_ENGINE_MEMBER=1, the headless host (its own GPUs, address, start rank)."""
    shape = json.loads((REPO / "docs/examples/shapes/wide-ep-dsv3/engine-launch.json").read_text())
    rec = shape["engines"]["engine-1"]
    plans = {}
    for member in ("", "1"):
        extra = {"NARWHAL_ENGINE_MEMBER": member, "NARWHAL_ADVERTISED_ADDRESS": rec["members"][0]["node"]["address"]} \
            if member else {"NARWHAL_ADVERTISED_ADDRESS": rec["node"]["address"]}
        (tmp_path / ("m" + member)).mkdir()
        env_path, _env = write_inputs(tmp_path / ("m" + member), rec, NARWHAL_SERVED_MODEL_NAME="deepseek-v3",
                                      NARWHAL_MODEL_MOUNT="/models/deepseek-v3", **extra)
        plans[member] = le.prepare(str(env_path)).plan
    assert not le.headless(plans[""]) and le.across_hosts(plans[""])
    assert le.headless(plans["1"])
    command = plans["1"]["command"]
    assert command[command.index("--data-parallel-start-rank") + 1] == "8"
    assert plans["1"]["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == rec["members"][0]["node"]["address"]
