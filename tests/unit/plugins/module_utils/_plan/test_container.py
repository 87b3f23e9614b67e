"""The contract of the one planner: for every record the tests build, what prepare records in the manifest
(derive: environment, vllm_args, container, plan hash) is exactly what the launcher snapshot plans and starts
on the host (plan.json written by the zipapp), and the record discovery writes is one the launcher accepts."""
import copy
import json
import posixpath
import subprocess
import sys

import pytest
from test_support.launcher import write_inputs, zipapp
from test_support.paths import HAND_LAUNCH_CONFIG, REPO
from test_support.records import amd, build, host, image, model, nv_pair, rdma_pair, stamped_model

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import SECRETS_TARGET
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import plan_hash
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
    # a checkpoint the deliver stage stamped: runtime.model_manifest, the container's org.narwhal.model-manifest
    yield "model-manifest", build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=stamped_model(tmp_path)))
    yield "remote-code", build({"NARWHAL_GPUS_PER_ENGINE": "2"},
                               nv_pair(tmp_path, mdl=model(tmp_path, "syjjhl__chatglm2-6b")))
    yield "ssm", build({"NARWHAL_GPUS_PER_ENGINE": "4"},
                       nv_pair(tmp_path, mdl=model(tmp_path, "fetchwiki__LiquidAI-LFM2-1.2B")))
    cpu = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": "0.32.0+cpu", "nixl": "0.7.1"}, ["PATH=/usr/bin"],
                                                             "vllm/vllm-openai-cpu:v0.32.0"))
    yield "cpu", build({"NARWHAL_BLOCK_SIZE": "64"}, {"engine-1": cpu, "engine-2": cpu}, shared=False)
    yield "dp-ep", build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2",
                          "NARWHAL_ENABLE_EXPERT_PARALLEL": "true", "NARWHAL_NODE_2_DATA_PARALLEL_SIZE": "4"},
                         nv_pair(tmp_path, mdl=model(tmp_path, "aiconf__mistralai--Mixtral-8x7B-v0.1")))
    # KV events (issue 38): --kv-events-config and PYTHONHASHSEED, planned alike by the launcher (which then carries
    # _common/kv_events.py)
    yield "kv-events", build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware",
                              "NARWHAL_KV_HASH_SEED": "11", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, nv_pair(tmp_path))
    amd_host = host(amd(), tmp_path)
    amd_host["image"] = dict(amd_host["image"], platform="rocm", nixl_distribution="nixl-rocm",
                             distributions={"vllm": "0.33.0", "nixl-rocm": "1.5.1"})
    yield "amd-tcp", build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_IMAGE": "rocm"},
                           {"engine-1": amd_host, "engine-2": amd_host})


def _host_plans(tmp_path, sites, access=None):
    """(site, engine, prepare's derivation, the launcher's plan.json) for every record of `sites`: the launcher
    zipapp plans each from the role environment prepare writes (run paths aside); `access`: derive's (who gets in)."""
    # the device nodes the records name (as the dev fixture of _discover/test_records.py makes them)
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (root / name).write_text("")
    launcher = zipapp(tmp_path)
    for name, records in sites:
        for engine, record in sorted(records.items()):
            derived = derive(record, CHECKOUT, "run-0123456789ab", access)
            where = tmp_path / name / engine
            where.mkdir(parents=True)
            env_path, env = write_inputs(where, record)
            role_env = dict(derived["role_env"], NARWHAL_RECORD=env["NARWHAL_RECORD"],
                            NARWHAL_API_KEY_FILE=env["NARWHAL_API_KEY_FILE"], NARWHAL_RUN_DIR=env["NARWHAL_RUN_DIR"])
            env_path.write_text("".join("%s=%s\n" % kv for kv in sorted(role_env.items())))
            proc = subprocess.run([sys.executable, "-I", "-S", str(launcher), "--role-env", str(env_path), "plan"],
                                  capture_output=True, text=True, check=False)
            assert proc.returncode == 0, (name, engine, proc.stderr)
            host_plan = json.loads((where / "runs" / "r1" / "plan.json").read_text())
            # the one difference: the key file's directory (the test's, not <checkout>/secrets), which is mounted
            expected = _with_key_dir(derived["container"], posixpath.dirname(env["NARWHAL_API_KEY_FILE"]))
            assert derived["plan_hash"] == plan_hash(derived["container"]), (name, engine)
            assert host_plan["plan_hash"] == plan_hash(expected), (name, engine)
            assert host_plan["plan"] == expected, (name, engine)
            yield name, engine, derived, host_plan


def _with_key_dir(plan, folder):
    """`plan` with the key file's directory mounted from `folder`."""
    plan = copy.deepcopy(plan)
    [mount] = [m for m in plan["mounts"] if m["target"] == SECRETS_TARGET]
    assert mount["source"] == CHECKOUT + "/secrets" and mount["read_only"]
    mount["source"] = folder
    return plan


def test_manifest_equals_the_launchers_plan_for_every_record(tmp_path):
    compared = 0
    for name, engine, derived, host_plan in _host_plans(tmp_path, _records(tmp_path)):
        assert host_plan["plan"]["environment"] == derived["environment"], (name, engine)
        assert host_plan["plan"]["command"][2:] == derived["vllm_args"], (name, engine)
        compared += 1
    assert compared >= 16


def test_who_gets_in_is_planned_alike_by_prepare_and_the_launcher(tmp_path):
    """A bind input, TLS and the guard's digest: the launcher's plan from the role environment prepare writes is
    prepare's, with the guard and the TLS directory mounted and their digests in the hashed plan."""
    tls = {"cert": "/p/tls/hosts/engine-1.crt", "key": "/p/tls/hosts/engine-1.key", "sha256": "c" * 64}
    sites = [("tls", build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path)))]
    plans = list(_host_plans(tmp_path, sites, {"bind": "::", "tls": tls, "guard_sha256": "a" * 64}))
    assert len(plans) == 2
    for _name, engine, _derived, host_plan in plans:
        command = host_plan["plan"]["command"]
        assert command[command.index("--host") + 1] == "::"
        assert command[command.index("--ssl-keyfile") + 1] == "/narwhal/tls/server.key"
        assert [m["target"] for m in host_plan["plan"]["mounts"]][1:] == ["/narwhal/guard", "/narwhal/secrets",
                                                                          "/narwhal/tls"]
        assert host_plan["plan"]["mounts"][3]["source"] == "%s/tls/%s" % (CHECKOUT, engine)
        assert host_plan["plan"]["labels"]["org.narwhal.tls-cert-sha256"] == "c" * 64


@pytest.mark.parametrize("broken,words", [
    ({"transfer": {"ucx_tls": ["tcp"]}}, "lacks cuda_copy: the KV cache is in GPU memory"),
    ({"transfer": {"ucx_tls": ["tcp", "rocm_copy", "cuda_copy"]}}, "a GPU transport of another platform"),
    ({"transfer": {"ucx_tls": ["tcp", "rc", "cuda_copy"]}}, "mixes in rc"),
    ({"transfer": {"ucx_tls": ["tcp", "cuda_copy", "warp"]}}, "warp is not a UCX transport"),
    ({"accelerator_devices": ["/dev/../etc/shadow"]}, "is not a /dev path"),
    ({"gpu_host_indices": [0, 0, 1, 2, 3, 4, 5, 6]}, "must be distinct"),
    ({"data_parallel_size": 2}, "tensor_parallel_size is 8 and data_parallel_size 2"),
    ({"data_parallel_size": 0}, "data_parallel_size=0 must be a whole number >= 1"),
    ({"enable_expert_parallel": "yes"}, "enable_expert_parallel='yes' must be true or false"),
    # KV events whose seed the record's environment contradicts (the fields themselves: test_schemas.py)
    ({"kv_events": {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "0"},
      "runtime": {"environment": {"PYTHONHASHSEED": "5"}}},
     "runtime.environment sets PYTHONHASHSEED=5 but kv_events.hash_seed is 0"),
])
def test_hand_broken_records_refused_by_the_planner(broken, words):
    from test_support.launcher import le, record, role_env

    rec = record("engine-1")
    for key, value in broken.items():
        if isinstance(value, dict) and key in rec:
            rec[key].update(value)
        else:
            rec[key] = value
    with pytest.raises(le.LaunchError, match=words):
        le.build_plan(role_env(), rec)


def test_the_kv_events_endpoint_is_planned_from_the_port_alone():
    """The planner binds the record's port on every interface whatever `kv_events.endpoint` says: a hand-edited
    address would make vLLM connect to it and push the prompts' token IDs there (the record check refuses it too)."""
    from test_support.launcher import le, record, role_env

    rec = dict(record("engine-1"), kv_events={"endpoint": "tcp://203.0.113.9:5557", "port": 5557, "hash_seed": "3"})
    plan = le.build_plan(role_env(), rec)
    config = plan["command"][plan["command"].index("--kv-events-config") + 1]
    assert json.loads(config) == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    assert plan["environment"]["PYTHONHASHSEED"] == "3"


@pytest.mark.parametrize("role,scale_out", [("prefill", True), ("decode", False)])
def test_a_prefill_engine_with_kv_events_serves_the_render_routes(role, scale_out):
    """vllm-router's kv_aware prefill policy renders each request on a prefill engine (POST /v1/completions/render),
    which vLLM 0.32.0 serves only with --enable-scale-out; a decode engine is never asked, and an engine without
    events gets neither flag."""
    from test_support.launcher import le, record, role_env

    rec = dict(record("engine-1"), role=role, kv_events={"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "0"})
    assert ("--enable-scale-out" in le.build_plan(role_env(), rec)["command"]) is scale_out
    assert "--enable-scale-out" not in le.build_plan(role_env(), dict(rec, kv_events=None))["command"]


# ------------------------------------------------------------------------------ KV lease and graceful stop

def _lease_records(tmp_path):
    yield "lease-0.33", build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_LEASE_SECONDS": "90",
                               "NARWHAL_SHUTDOWN_TIMEOUT": "120"}, nv_pair(tmp_path))
    old = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": "0.21.0+cpu", "nixl": "0.7.1"}, ["PATH=/usr/bin"],
                                                             "vllm/vllm-openai-cpu:v0.21.0"))
    yield "lease-0.21", build({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_KV_LEASE_SECONDS": "600",
                               "NARWHAL_SHUTDOWN_TIMEOUT": "0"}, {"engine-1": old, "engine-2": old}, shared=False)


def test_the_lease_takes_the_name_of_the_images_vllm_and_the_manifest_equals_the_launchers_plan(tmp_path):
    seen = dict((name, host_plan["plan"]) for name, _engine, _derived, host_plan
                in _host_plans(tmp_path, _lease_records(tmp_path)))
    new, old = seen["lease-0.33"], seen["lease-0.21"]
    config = json.loads(new["command"][new["command"].index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"] == {"backends": ["UCX"], "kv_lease_duration": 90}
    assert "VLLM_NIXL_ABORT_REQUEST_TIMEOUT" not in new["environment"]
    assert new["command"][new["command"].index("--shutdown-timeout") + 1] == "120"
    config = json.loads(old["command"][old["command"].index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"] == {"backends": ["UCX"]}
    assert old["environment"]["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] == "600"
    assert old["command"][old["command"].index("--shutdown-timeout") + 1] == "0"


def test_without_the_lease_input_nothing_of_it_is_written_and_the_drain_defaults_to_30(tmp_path):
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-1"]
    plan = derive(record, CHECKOUT, "run-0123456789ab")["container"]
    assert "kv_lease_seconds" not in record["runtime"]
    assert json.loads(plan["command"][plan["command"].index("--kv-transfer-config") + 1]) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert not [k for k in plan["environment"] if "ABORT_REQUEST_TIMEOUT" in k]
    # the one intended change for a site that sets neither input: the drain's default after --block-size
    assert plan["command"][-4:] == ["--block-size", "16", "--shutdown-timeout", "30"]


# ------------------------------------------------------------------------------ data- and expert-parallel engines

def test_dp_and_ep_engines_get_their_flags_after_tp_and_every_gpu(tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    records = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2",
                     "NARWHAL_ENABLE_EXPERT_PARALLEL": "true", "NARWHAL_NODE_2_DATA_PARALLEL_SIZE": "4"},
                    nv_pair(built, mdl=model(built, "aiconf__mistralai--Mixtral-8x7B-v0.1")))
    plans = dict((engine, (derived, host_plan["plan"])) for _name, engine, derived, host_plan
                 in _host_plans(tmp_path, [("dp-ep", records)]))
    one, two = plans["engine-1"][1], plans["engine-2"][1]
    at = one["command"].index("--tensor-parallel-size")
    assert one["command"][at:at + 5] == ["--tensor-parallel-size", "2", "--data-parallel-size", "2",
                                         "--enable-expert-parallel"]
    assert two["command"][at:at + 5] == ["--tensor-parallel-size", "1", "--data-parallel-size", "4",
                                         "--enable-expert-parallel"]
    assert one["device_requests"][0]["device_ids"] == ["0", "1", "2", "3"]
    assert len(one["environment"]["CUDA_VISIBLE_DEVICES"].split(",")) == 4
    # one side-channel base per engine: vLLM adds the DP rank (engine-2 starts after engine-1's two ranks)
    assert (one["environment"]["VLLM_NIXL_SIDE_CHANNEL_PORT"], two["environment"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == \
        ("5600", "5602")


@pytest.mark.parametrize("words,flag,owner", [
    (["--data-parallel-size", "2"], "--data-parallel-size", "set NARWHAL_DATA_PARALLEL_SIZE instead"),
    (["-dp=2"], "--data-parallel-size", "set NARWHAL_DATA_PARALLEL_SIZE instead"),
    (["--enable-expert-parallel"], "--enable-expert-parallel", "set NARWHAL_ENABLE_EXPERT_PARALLEL instead"),
    (["--no-enable-expert-parallel"], "--enable-expert-parallel", "NARWHAL_ENABLE_EXPERT_PARALLEL"),
    (["-ep"], "--enable-expert-parallel", "NARWHAL_ENABLE_EXPERT_PARALLEL"),
    (["--data-parallel-size-local", "1"], "--data-parallel-size-local", "launcher-managed"),
    (["--data_parallel_start_rank=1"], "--data-parallel-start-rank", "launcher-managed"),
    (["-dpa", "10.0.0.1"], "--data-parallel-address", "launcher-managed"),
    (["--data-parallel-rpc-port", "13345"], "--data-parallel-rpc-port", "launcher-managed"),
    (["--headless"], "--headless", "launcher-managed"),
    (["--kv-events-config", '{"enable_kv_cache_events":true}'], "--kv-events-config", "NARWHAL_KV_EVENTS"),
    (["--kv_events_config.endpoint=tcp://*:9"], "--kv-events-config", "NARWHAL_KV_EVENTS"),
    (["--data-parallel-hybrid-lb"], "--data-parallel-hybrid-lb", "launcher-managed"),
])
def test_data_and_expert_parallel_flags_are_refused_in_extra_arguments(words, flag, owner):
    from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
    from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import check_args

    with pytest.raises(PlanError) as err:
        check_args(words, "NARWHAL_EXTRA_ARGS")
    assert "launcher-managed %s" % flag in str(err.value) and owner in str(err.value)


# ------------------------------------------------------------------------------ bounded logs (issue 36)

def test_the_log_inputs_are_the_records_runtime_log_and_the_containers_log_config(tmp_path):
    """NARWHAL_LOG_* -> runtime.log -> HostConfig.LogConfig, alike in prepare's plan and the launcher's (_host_plans
    compares them), in the create body and in the docker run form."""
    from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import plan_body
    from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import docker_run_argv

    default = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-1"]
    assert default["runtime"]["log"] == {"driver": "json-file", "max_size": "100m", "max_file": 5}
    built = tmp_path / "built"
    built.mkdir()
    records = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_LOG_DRIVER": "local", "NARWHAL_LOG_MAX_SIZE": "20m",
                     "NARWHAL_LOG_MAX_FILE": "3"}, nv_pair(built))
    plans = [host_plan["plan"] for _n, _e, _d, host_plan in _host_plans(tmp_path, [("logs", records)])]
    assert len(plans) == 2
    for plan in plans:
        assert plan["log_config"] == {"Type": "local", "Config": {"max-size": "20m", "max-file": "3"}}
        assert plan_body(plan, {})["HostConfig"]["LogConfig"] == plan["log_config"]
        argv = docker_run_argv(plan)
        at = argv.index("--log-driver")
        assert argv[at:at + 6] == ["--log-driver", "local", "--log-opt", "max-file=3", "--log-opt", "max-size=20m"]


# The plan hashes of the hand-shaped records (no runtime.log): an engine started from such a record is not replaced
# by a launcher that knows runtime.log. Change them only on purpose: at ee6dc23, before runtime.log existed, they
# were be0c0c01... and 26ec3053...; issue 36's key rotation changed them (the key left the environment: VLLM_API_KEY
# empty, NARWHAL_GUARD_KEY_FILE and the key file's directory mounted), one replace of every engine on upgrade.
OLD_HASHES = {"engine-1": "18b4a68a6ce1e449b642fd7277e1ec77fd7a7e7465e03d7010c53387d826dcf6",
              "engine-2": "e9088b8ca483810f2f4d0f0f2684b751fc9b6caa3c1428f4b409cd6b04b9feaa"}


@pytest.mark.parametrize("engine", sorted(OLD_HASHES))
def test_a_record_without_runtime_log_plans_no_log_config_and_keeps_its_hash(engine):
    from test_support.launcher import le, record, role_env

    from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import plan_body

    rec = record(engine)
    assert "log" not in rec["runtime"]
    plan = le.build_plan(role_env(engine, NARWHAL_GUARD_SHA256="a" * 64), rec)
    assert "log_config" not in plan and "LogConfig" not in plan_body(plan, {})["HostConfig"]
    assert "--log-driver" not in le.docker_run_argv(plan)
    assert le.plan_hash(plan) == OLD_HASHES[engine]
    rec["runtime"]["log"] = {"driver": "json-file", "max_size": "100m", "max_file": 5}
    hashes = {le.plan_hash(le.build_plan(role_env(engine, NARWHAL_GUARD_SHA256="a" * 64), rec))}
    for field, value in (("driver", "local"), ("max_size", "101m"), ("max_file", 4)):
        changed = dict(rec, runtime=dict(rec["runtime"], log=dict(rec["runtime"]["log"], **{field: value})))
        hashes.add(le.plan_hash(le.build_plan(role_env(engine, NARWHAL_GUARD_SHA256="a" * 64), changed)))
    assert len(hashes | {OLD_HASHES[engine]}) == 5  # each log setting is part of the plan hash


@pytest.mark.parametrize("log,field,words", [
    ("100m", "runtime.log", "must be an object {driver, max_size, max_file}"),
    ({"driver": "syslog", "max_size": "100m", "max_file": 5}, "runtime.log.driver",
     "'syslog' is not one of json-file, local (NARWHAL_LOG_DRIVER)"),
    ({"driver": "local", "max_size": "100MB", "max_file": 5}, "runtime.log.max_size",
     "'100MB' is not a log size"),
    ({"driver": "local", "max_size": 100, "max_file": 5}, "runtime.log.max_size", "NARWHAL_LOG_MAX_SIZE"),
    ({"driver": "local", "max_size": "1g", "max_file": 0}, "runtime.log.max_file", "max_file=0 is not a positive"),
    ({"driver": "local", "max_size": "1g", "max_file": "5"}, "runtime.log.max_file", "NARWHAL_LOG_MAX_FILE"),
    ({"driver": "local", "max_size": "1g"}, "runtime.log.max_file", "max_file=None"),
])
def test_a_hand_broken_runtime_log_is_refused_by_field(log, field, words):
    from test_support.launcher import record, role_env

    from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
    from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec

    rec = record("engine-1")
    rec["runtime"]["log"] = log
    with pytest.raises(PlanError) as err:
        container_spec(rec, role_env())
    assert err.value.key == field and words in str(err.value) and "rerun discovery" in str(err.value)


# ------------------------------------------------------------------------------ the checkpoint's manifest

def test_the_checkpoints_manifest_is_a_label_of_the_plan_and_a_record_without_it_keeps_its_hash(tmp_path):
    """runtime.model_manifest (the deliver stage's STAMP) labels the container org.narwhal.model-manifest, so new
    weights change the plan hash and the engine rolls; a record without it has no such label and its old hash."""
    from test_support.launcher import le, record, role_env

    for engine in sorted(OLD_HASHES):
        rec = record(engine)
        assert "model_manifest" not in rec["runtime"]
        plan = le.build_plan(role_env(engine, NARWHAL_GUARD_SHA256="a" * 64), rec)
        assert "org.narwhal.model-manifest" not in plan["labels"]
        assert le.plan_hash(plan) == OLD_HASHES[engine]
        hashes = set()
        for digest in ("sha256:" + "1" * 64, "sha256:" + "2" * 64):
            rec["runtime"]["model_manifest"] = digest
            plan = le.build_plan(role_env(engine, NARWHAL_GUARD_SHA256="a" * 64), rec)
            assert plan["labels"]["org.narwhal.model-manifest"] == digest
            assert "--label" in le.docker_run_argv(plan) and "org.narwhal.model-manifest=%s" % digest in \
                le.docker_run_argv(plan)
            hashes.add(le.plan_hash(plan))
        assert len(hashes | {OLD_HASHES[engine]}) == 3
    stamped = [(derived, host_plan) for _n, _e, derived, host_plan in _host_plans(
        tmp_path, [("stamped", build({"NARWHAL_GPUS_PER_ENGINE": "4"},
                                     nv_pair(tmp_path, mdl=stamped_model(tmp_path))))])]
    assert len(stamped) == 2
    for derived, host_plan in stamped:
        assert host_plan["plan"]["labels"]["org.narwhal.model-manifest"].startswith("sha256:")
        assert derived["container"]["labels"] == host_plan["plan"]["labels"]


@pytest.mark.parametrize("digest", ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 64, "", 7, None])
def test_a_hand_broken_model_manifest_is_refused_by_field(digest):
    from test_support.launcher import record, role_env

    from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
    from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec

    rec = record("engine-1")
    rec["runtime"]["model_manifest"] = digest
    with pytest.raises(PlanError) as err:
        container_spec(rec, role_env())
    assert err.value.key == "runtime.model_manifest" and "rerun discovery" in str(err.value)
