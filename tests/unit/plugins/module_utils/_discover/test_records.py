# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Launch records (plugins/module_utils/_discover/records.py, collect_records of _discover/outputs.py) built
from the real fact producers (GPU / RDMA / image / model facts over
real captures and the simulated sysfs trees), their schema, and the discovery_outputs writer end to end. The parts of
a record are tested with the files that make them: test_gpu_allocation.py, test_transfer.py, test_runtime.py,
test_engine_args.py, test_parallelism.py. The builders: tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
from test_support.paths import REPO
from test_support.records import (
    BASE,
    CUDA_DISTS,
    CUDA_ENV,
    IMAGE_ID,
    V100S_UUIDS,
    build,
    host,
    image,
    interfaces,
    module_args,
    nv_pair,
    nvidia,
    rdma_pair,
    refused,
    snapshot,
    stamped_model,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import (
    KV_POLICY_KEYS,
    check_policy,
    policy_changes,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.records import build_record
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    FLEET_SCHEMA,
    LAUNCH_CONFIG_SCHEMA,
    RECORD_SCHEMA,
    validation_errors,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import role_environment

# ------------------------------------------------------------------------------------------------
# the record as a whole


def test_model_path_with_a_trailing_slash_gives_the_same_records(tmp_path, dev):
    """Issue 24: /srv/models/x/ and /srv/models/x are one checkpoint, one served name, one record."""
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    slashed = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_MODEL_PATH": BASE["NARWHAL_MODEL_PATH"] + "/"},
                    nv_pair(tmp_path))
    assert json.dumps(slashed, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert plain["engine-1"]["runtime"]["served_model_name"] == "Meta-Llama-3.1-8B"


@pytest.mark.parametrize("vllm, extra, shared, engine, span, port, key", [
    # the site's side-channel base on every engine's HTTP port, or on its attestation port
    ("0.33.0", {"NARWHAL_SIDE_CHANNEL_PORT": "8000"}, False, "engine-1", "port 8000", "HTTP port 8000",
     "NARWHAL_ENGINE_PORT"),
    ("0.33.0", {"NARWHAL_SIDE_CHANNEL_PORT": "8010"}, False, "engine-1", "port 8010", "attestation port 8010",
     "NARWHAL_ATTEST_PORT"),
    # vLLM <= 0.11: one port per TP worker, 7998-8001 over the HTTP port
    ("0.11.0", {"NARWHAL_SIDE_CHANNEL_PORT": "7998"}, False, "engine-1", "ports 7998-8001", "HTTP port 8000",
     "NARWHAL_ENGINE_PORT"),
    # the second engine of a shared host takes the side channel after the first's: on its own per-node ports
    ("0.33.0", {"NARWHAL_NODE_2_ENGINE_PORT": "5601"}, True, "engine-2", "port 5601", "HTTP port 5601",
     "NARWHAL_NODE_2_ENGINE_PORT"),
    ("0.33.0", {"NARWHAL_NODE_2_ATTEST_PORT": "5601"}, True, "engine-2", "port 5601", "attestation port 5601",
     "NARWHAL_NODE_2_ATTEST_PORT"),
])
def test_a_side_channel_on_the_engines_own_port_is_refused_at_discovery(tmp_path, dev, vllm, extra, shared, engine,
                                                                        span, port, key):
    """Issue 24, checked once where both ports are first known (issue 34): vLLM binds the NIXL side channel next to
    the engine's HTTP server and attestation sidecar on one host (network_mode host)."""
    hosts = nv_pair(tmp_path, img=image(dict(CUDA_DISTS, vllm=vllm)))
    err = refused(dict({"NARWHAL_GPUS_PER_ENGINE": "4"}, **extra), hosts, shared)
    assert err.key == "NARWHAL_SIDE_CHANNEL_PORT"
    assert str(err) == (
        "NARWHAL_SIDE_CHANNEL_PORT: %s would listen for NIXL's side channel on %s (from NARWHAL_SIDE_CHANNEL_PORT, "
        "the first side-channel port of each host), which holds its own %s (%s); one engine cannot bind both: set "
        "NARWHAL_SIDE_CHANNEL_PORT outside the engines' HTTP and attestation ports, or move the engine's %s port "
        "with %s, then rerun discovery" % (engine, span, port, key, port.split(" ")[0], key))


def test_a_side_channel_next_to_the_engines_own_ports_passes(tmp_path, dev):
    hosts = nv_pair(tmp_path, img=image(dict(CUDA_DISTS, vllm="0.11.0")))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_SIDE_CHANNEL_PORT": "8001", "NARWHAL_ATTEST_PORT": "8005"},
                 hosts, shared=False)
    assert recs["engine-1"]["node"]["engine_port"] == 8000
    assert recs["engine-1"]["node"]["side_channel_ports"] == [8001, 8004]


# ------------------------------------------------------------------------------------------------
# 5. schema


def test_schema_rejects_bad_records(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path))
    good = recs["engine-2"]
    assert validation_errors(good, RECORD_SCHEMA) == []
    bad = copy.deepcopy(good)
    bad["transfer"]["transport"] = "tcp"
    assert any(e.startswith("transfer/transport") for e in validation_errors(bad, RECORD_SCHEMA))
    bad = copy.deepcopy(good)
    bad["transfer"]["devices"] = []
    assert any(e.startswith("transfer/devices") for e in validation_errors(bad, RECORD_SCHEMA))
    bad = copy.deepcopy(good)
    bad["transfer"].update(transport="ucx_tcp")  # TCP with RDMA devices
    assert validation_errors(bad, RECORD_SCHEMA) != []
    for path, value in ((("runtime", "model_dtype"), "float32"), (("runtime", "image_id"), "abc"),
                        (("accelerator_devices",), ["nvidia0"]), (("network_mode",), "bridge"),
                        (("gpu_visibility_env",), "HIP_VISIBLE_DEVICES")):
        bad = copy.deepcopy(good)
        target = bad
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert validation_errors(bad, RECORD_SCHEMA) != [], path
    bad = copy.deepcopy(good)
    del bad["sources"]["policy"]
    assert validation_errors(bad, RECORD_SCHEMA) != []


def test_build_record_alone_lacks_the_file_sources(tmp_path, dev):
    # build_record gives allocation/environment/extra_args/transfer/visibility; the writer adds the file references the
    # schema needs
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4"))
    plan = build_fleet(inputs, ["engine-1", "engine-2"], interfaces(False))
    h = nv_pair(tmp_path)["engine-1"]
    record, span = build_record(plan["nodes"][0], inputs["site"], {}, h, h["image"], h["model"], plan["fleet"][0],
                                {}, 5600)
    assert span == 1
    assert sorted(record["sources"]) == ["allocation", "environment", "extra_args", "shutdown", "transfer",
                                         "ucx_tls", "visibility"]
    assert any("sources" in e for e in validation_errors(record, RECORD_SCHEMA))


def test_the_record_carries_the_images_registry_digest_only_when_it_has_one(tmp_path, dev):
    """runtime.image_digest (the deliver stage's pin, docs/launch-record.md): the RepoDigest of the reference's
    repository, right after image_id; a locally built image (no RepoDigests) or another repository's digest: none."""
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4"))
    plan = build_fleet(inputs, ["engine-1", "engine-2"], interfaces(False))
    h = nv_pair(tmp_path)["engine-1"]
    digest = "vllm/vllm-openai@sha256:" + "1" * 64

    def runtime(repo_digests):
        img = dict(h["image"], repo_digests=repo_digests)
        return build_record(plan["nodes"][0], inputs["site"], {}, h, img, h["model"], plan["fleet"][0], {}, 5600)[0][
            "runtime"]

    with_digest = runtime(["other/image@sha256:" + "2" * 64, digest])
    assert with_digest["image_digest"] == digest
    assert list(with_digest)[list(with_digest).index("image_id") + 1] == "image_digest"
    assert "image_digest" not in runtime([]) and "image_digest" not in runtime(["other/image@sha256:" + "2" * 64])
    assert not list(validation_errors(dict(with_digest), RECORD_SCHEMA["properties"]["runtime"]))
    assert list(validation_errors(dict(with_digest, image_digest="x"), RECORD_SCHEMA["properties"]["runtime"]))


# ------------------------------------------------------------------------------------------------
# 6. the writer module end to end


@pytest.fixture
def run_module(step_runner):
    return lambda args: step_runner("discovery_outputs", args)


EXPECTED_FILES = ["config/deployment.env", "config/engine-launch.engine-1.inspection.json",
                  "config/engine-launch.engine-2.inspection.json", "config/engine-launch.local.json",
                  "config/engine-launch.policy.json", "config/engine-launch.sources.json", "config/fleet.json"]


def resolve_pointer(document, pointer):
    for part in [p for p in pointer.split("/") if p]:
        document = document[part]
    return document


def test_discovery_refuses_a_block_size_the_launcher_would_refuse(tmp_path, dev, run_module):
    """Discovery checks its document with the launcher's record check: a block size the launcher refuses is never
    written."""
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), {"NARWHAL_BLOCK_SIZE": str(2 ** 40)}))
    assert status == "fail"
    assert "launch record engines/engine-1/runtime/block_size: 1099511627776 is greater than the maximum of 65536" \
        in result["msg"] and "nothing was written" in result["msg"]
    assert not (root / "config").exists() or not any((root / "config").iterdir())


def test_the_extract_carries_the_interface_speed_and_no_record_or_fleet_changes(tmp_path, dev, run_module):
    """The interface's nominal speed (narwhal_interface.speed) goes into each inspection extract (/host), where the
    transfer probe's figures read it; the launch config, the fleet and deployment.env are the same bytes with or
    without it."""
    written = {}
    for label, speed in (("without", None), ("with", {"mbps": 100000, "virtual": False, "why": None})):
        root = tmp_path / label
        root.mkdir()
        args = module_args(root, nv_pair(tmp_path / label))
        for facts in args["interfaces"].values():
            facts["speed"] = speed
        status, result = run_module(args)
        assert status == "exit", result
        config = root / "config"
        inspection = json.loads((config / "engine-launch.engine-1.inspection.json").read_text())
        assert inspection["host"]["interface_speed"] == speed
        written[label] = dict((name, (config / name).read_bytes()) for name in
                              ("engine-launch.local.json", "fleet.json", "deployment.env"))
    assert written["with"] == written["without"]


def test_a_stamped_checkpoint_gives_the_record_its_manifest_and_the_extract_its_files(tmp_path, dev, run_module):
    """The deliver stage's STAMP (narwhal_model.manifest): the record's runtime.model_manifest is its digest, the
    inspection extract (sources.model) keeps the files map; without a STAMP the record has no such field and is
    otherwise the same."""
    mdl = stamped_model(tmp_path)
    stamped = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=mdl))
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    for engine in ("engine-1", "engine-2"):
        assert stamped[engine]["runtime"]["model_manifest"] == mdl["manifest"]["digest"]
        assert "model_manifest" not in plain[engine]["runtime"]
        del stamped[engine]["runtime"]["model_manifest"]
    assert json.dumps(stamped, sort_keys=True) == json.dumps(plain, sort_keys=True)
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path, mdl=mdl)))
    assert status == "exit", result
    config = root / "config"
    record = json.loads((config / "engine-launch.local.json").read_text())["engines"]["engine-1"]
    ref = record["sources"]["model"]
    extract = json.loads((config / ref["file"]).read_text())
    found = resolve_pointer(extract, ref["pointer"] + "/manifest")
    assert found == mdl["manifest"] and manifest_digest(found["files"]) == record["runtime"]["model_manifest"]
    assert "model.safetensors" in found["files"]
    bad = dict(record, runtime=dict(record["runtime"], model_manifest="sha256:" + "G" * 64))
    assert any("model_manifest" in e for e in validation_errors(bad, RECORD_SCHEMA))


def test_writer_end_to_end(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    hosts = nv_pair(tmp_path)
    status, result = run_module(module_args(root, hosts))
    assert status == "exit", result
    assert result["changed"] is True
    snap = snapshot(root)
    assert sorted(snap) == EXPECTED_FILES
    assert {mode for _data, _mtime, mode in snap.values()} == {0o600}
    config = root / "config"
    fleet = json.loads((config / "fleet.json").read_text())
    assert validation_errors(fleet, FLEET_SCHEMA) == []
    assert [(f["engine"], f["gpu_count"], f["accelerator"]) for f in fleet] == [
        ("engine-1", 4, {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4}),
        ("engine-2", 4, {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4})]
    launch = json.loads((config / "engine-launch.local.json").read_text())
    assert validation_errors(launch, LAUNCH_CONFIG_SCHEMA) == []
    assert launch["engines"]["engine-2"]["gpu_ids"] == V100S_UUIDS[4:]
    index = json.loads((config / "engine-launch.sources.json").read_text())
    assert index["launch_config"] == str(config / "engine-launch.local.json")
    assert sorted(index["files"]) == ["engine-launch.engine-1.inspection.json",
                                      "engine-launch.engine-2.inspection.json", "engine-launch.policy.json"]
    import hashlib
    for name, digest in index["files"].items():
        assert hashlib.sha256((config / name).read_bytes()).hexdigest() == digest
    assert index["launch_config_sha256"] == hashlib.sha256((config / "engine-launch.local.json")
                                                           .read_bytes()).hexdigest()
    for engine, record in launch["engines"].items():
        assert index["engines"][engine] == dict((k, v) for k, v in record["sources"].items() if isinstance(v, dict))
        for kind in ("host", "image", "model", "policy"):
            ref = record["sources"][kind]
            target = config / ref["file"]
            assert target.exists(), ref
            assert resolve_pointer(json.loads(target.read_text()), ref["pointer"]) is not None
    inspection = json.loads((config / "engine-launch.engine-2.inspection.json").read_text())
    assert inspection["image"]["id"] == IMAGE_ID and len(inspection["host"]["gpus"]["gpus"]) == 8
    policy = json.loads((config / "engine-launch.policy.json").read_text())
    assert policy["site"]["NARWHAL_GPUS_PER_ENGINE"] == 4

    # a second identical run changes nothing
    status, again = run_module(module_args(root, hosts))
    assert status == "exit" and again["changed"] is False
    assert not any(again["files"].values())
    assert snapshot(root) == snap


def test_writer_policy_change_gives_a_fresh_set(tmp_path, dev, run_module):
    hosts = nv_pair(tmp_path)
    root, fresh = tmp_path / "checkout", tmp_path / "fresh"
    root.mkdir()
    fresh.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    before = (root / "config" / "engine-launch.local.json").read_text()
    status, result = run_module(module_args(root, hosts, {"NARWHAL_BLOCK_SIZE": "32"}))
    assert status == "exit" and result["changed"] is True
    after = (root / "config" / "engine-launch.local.json").read_text()
    assert after != before
    launch = json.loads(after)
    assert {r["runtime"]["block_size"] for r in launch["engines"].values()} == {32}
    assert {r["runtime"]["cache_plan"]["block_size"] for r in launch["engines"].values()} == {32}
    assert json.loads((root / "config" / "engine-launch.policy.json").read_text())["site"]["NARWHAL_BLOCK_SIZE"] == 32
    # no stale field: the rerun's launch config equals what a first run with the new input writes
    assert run_module(module_args(fresh, hosts, {"NARWHAL_BLOCK_SIZE": "32"}))[0] == "exit"
    assert after == (fresh / "config" / "engine-launch.local.json").read_text()
    assert sorted(snapshot(root)) == sorted(snapshot(fresh))


def test_writer_removes_extracts_of_an_engine_no_longer_in_the_fleet(tmp_path, dev, run_module):
    hosts = nv_pair(tmp_path)
    root = tmp_path / "checkout"
    root.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    status, result = run_module(module_args(root, hosts, {"NARWHAL_NODE_2_ROLE": "", "NARWHAL_NODE_3_ROLE": "decode",
                                                          "NARWHAL_NODE_3_ENGINE_PORT": "8001",
                                                          "NARWHAL_NODE_3_ATTEST_PORT": "8011",
                                                          "NARWHAL_NODE_2_ENGINE_PORT": "",
                                                          "NARWHAL_NODE_2_ATTEST_PORT": ""},
                                            engines=("engine-1", "engine-3")))
    assert status == "exit", result
    names = sorted(snapshot(root))
    assert "config/engine-launch.engine-2.inspection.json" not in names
    assert "config/engine-launch.engine-3.inspection.json" in names
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert sorted(launch["engines"]) == ["engine-1", "engine-3"]


@pytest.mark.parametrize("extra,key", [
    ({"NARWHAL_NODE_1_GPU_IDS": "8,9,10,11"}, "NARWHAL_NODE_1_GPU_IDS"),
    ({"NARWHAL_GPUS_PER_ENGINE": "5"}, "NARWHAL_GPUS_PER_ENGINE"),
    ({"NARWHAL_TRANSPORT": "ucx_rdma"}, "NARWHAL_TRANSPORT"),
    ({"NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"}, "NARWHAL_KV_CACHE_DTYPE"),
])
def test_writer_failure_leaves_everything_untouched(tmp_path, dev, run_module, extra, key):
    hosts = nv_pair(tmp_path)
    root = tmp_path / "checkout"
    root.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    snap = snapshot(root)
    status, result = run_module(module_args(root, hosts, extra))
    assert status == "fail" and result["input"] == key and "nothing was written" in result["msg"]
    assert snapshot(root) == snap


@pytest.mark.parametrize("key,value,words", [
    ("NARWHAL_EXTRA_ARGS", "--port 9000", "overrides launcher-managed --port"),
    ("NARWHAL_EXTRA_ARGS", "--config x.yaml", "overrides launcher-managed --config"),
    ("NARWHAL_EXTRA_ARGS", "--tensor-parallel 2", "overrides launcher-managed --tensor-parallel-size"),
    ("NARWHAL_EXTRA_ARGS", "--max-model-len '4096", "not valid shell words"),
    ("NARWHAL_ENGINE_ENV", "VLLM_SSM_CONV_STATE_LAYOUT=SD",
     "sets VLLM_SSM_CONV_STATE_LAYOUT, which is launcher-managed"),
    ("NARWHAL_NODE_1_EXTRA_ARGS", "-tp=2", "overrides launcher-managed --tensor-parallel-size"),
])
def test_launcher_refusals_at_the_first_stage(key, value, words):
    """What the launcher would refuse is refused when the inputs are read, in the planner's words."""
    values = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_IMAGE": "i", "NARWHAL_MODEL_PATH": "/m",
              "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode", key: value}
    with pytest.raises(InputError) as err:
        load_inputs(values)
    assert err.value.key == key and words in str(err.value)


def test_writer_check_mode_writes_nothing(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), check=True))
    assert status == "exit" and result["changed"] is True
    assert sorted(os.path.relpath(p, root) for p in result["files"]) == [
        "config/deployment.env", "config/engine-launch.engine-1.inspection.json",
        "config/engine-launch.engine-2.inspection.json", "config/engine-launch.local.json",
        "config/engine-launch.policy.json", "config/engine-launch.sources.json", "config/fleet.json"]
    assert list(root.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# 7. per-engine policy: NARWHAL_NODE_<n>_EXTRA_ARGS and NARWHAL_NODE_<n>_ENGINE_ENV


@pytest.mark.parametrize("key", ["NARWHAL_EXTRA_ARGS", "NARWHAL_NODE_2_EXTRA_ARGS"])
def test_extra_args_that_are_not_shell_words_refused_by_name(key):
    with pytest.raises(InputError) as err:
        load_inputs(dict(BASE, **{key: "--chat-template '/a b.j2"}))
    assert err.value.key == key and "not valid shell words" in str(err.value)


def test_writer_records_the_per_node_policy(tmp_path, dev, run_module):

    root = tmp_path / "checkout"
    root.mkdir()
    extra = {"NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8", "NARWHAL_NODE_1_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG"}
    args = module_args(root, nv_pair(tmp_path), extra)
    status, result = run_module(args)
    assert status == "exit", result
    policy = json.loads((root / "config" / "engine-launch.policy.json").read_text())
    assert policy["nodes"]["engine-2"] == {"ATTEST_PORT": 8011, "ENGINE_PORT": 8001,
                                           "EXTRA_ARGS": "--max-num-seqs 8", "ROLE": "decode"}
    assert policy["nodes"]["engine-1"] == {"ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG", "ROLE": "prefill"}
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert launch["engines"]["engine-2"]["runtime"]["extra_args"] == ["--max-num-seqs", "8"]
    # what prepare compares: the same inputs match the extract, a changed per-node input is named
    assert policy_changes(policy, args["site"]) == []
    changed = copy.deepcopy(args["site"])
    changed["nodes"]["2"]["EXTRA_ARGS"] = "--max-num-seqs 4"
    assert policy_changes(policy, changed) == [("NARWHAL_NODE_2_EXTRA_ARGS", "--max-num-seqs 8", "--max-num-seqs 4")]


# ------------------------------------------------------------------------------------------------
# 8. hostile inputs at the writer (issue 13): refused by name, the previous set byte for byte intact


def first_set(tmp_path, run_module, root=None):
    hosts = nv_pair(tmp_path)
    root = root or tmp_path / "checkout"
    root.mkdir(exist_ok=True)
    status, result = run_module(module_args(root, hosts))
    assert status == "exit", result
    return root, hosts, snapshot(root)


def writer_refuses(run_module, root, args, snap, key, words):
    status, result = run_module(args)
    assert status == "fail" and result["input"] == key, result
    assert "nothing was written" in result["msg"] and words in result["msg"], result["msg"]
    assert snapshot(root) == snap


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.policy.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the policy extract (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.sources.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the sources index (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.engine-2.inspection.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the inspection extract of engine-2"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.engine-7.inspection.json"}, "NARWHAL_LAUNCH_CONFIG",
     "is named like a file discovery owns in NARWHAL_CONFIG_DIR"),
    ({"NARWHAL_FLEET": "config/deployment.env"}, "NARWHAL_FLEET", "which is also deployment.env (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "./config//fleet.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the fleet file (NARWHAL_FLEET)"),
    ({"NARWHAL_FLEET": "config/engine-api.key"}, "NARWHAL_FLEET", "which is also the engine API key file"),
    ({"NARWHAL_FLEET": "config"}, "NARWHAL_FLEET", "which is also the output directory (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_RUNS_DIR": "config"}, "NARWHAL_RUNS_DIR", "which is also the output directory"),
    ({"NARWHAL_FLEET": "runs/fleet.json"}, "NARWHAL_FLEET", "inside the run directory"),
    ({"NARWHAL_CONFIG_DIR": "docs"}, "NARWHAL_CONFIG_DIR",
     "deployment.env would be docs/deployment.env inside the checkout, which is not one of the git-ignored"),
    ({"NARWHAL_FLEET": "fleet.json"}, "NARWHAL_FLEET", "not one of the git-ignored site paths"),
])
def test_writer_refuses_output_paths_that_collide_or_go_public(tmp_path, dev, run_module, extra, key, words):
    """Class 3: every output its own path, none an input, inside the checkout only at git-ignored paths (here
    the checkout is no repository: the shipped .gitignore's site paths decide)."""
    root, hosts, snap = first_set(tmp_path, run_module)
    writer_refuses(run_module, root, module_args(root, hosts, extra), snap, key, words)


def test_writer_compares_resolved_paths(tmp_path, dev, run_module):
    root, hosts, _snap = first_set(tmp_path, run_module)
    os.symlink("deployment.env", root / "config" / "fleet.alias.json")
    snap = snapshot(root)
    writer_refuses(run_module, root, module_args(root, hosts, {"NARWHAL_FLEET": "config/fleet.alias.json"}), snap,
                   "NARWHAL_FLEET", "which is also deployment.env")


def test_writer_refuses_the_env_file_as_an_output(tmp_path, dev, run_module):
    root, hosts, snap = first_set(tmp_path, run_module)
    args = module_args(root, hosts, {"NARWHAL_FLEET": str(tmp_path / "site.env")})
    args["site"]["env_file"] = str(tmp_path / "site.env")
    writer_refuses(run_module, root, args, snap, "NARWHAL_FLEET", "which is also the site inputs (.env)")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_writer_asks_git_inside_a_repository(tmp_path, dev, run_module):
    """Class 3 with git: a tracked file is not ignored even where .gitignore matches; config/<site>/ is."""
    import subprocess

    git = shutil.which("git")
    root = tmp_path / "checkout"
    root.mkdir()
    subprocess.run([git, "init", "-q", str(root)], check=True)
    shutil.copyfile(REPO / ".gitignore", root / ".gitignore")
    root, hosts, snap = first_set(tmp_path, run_module, root)
    writer_refuses(run_module, root, module_args(root, hosts, {"NARWHAL_CONFIG_DIR": "docs"}), snap,
                   "NARWHAL_CONFIG_DIR", "docs/deployment.env inside the checkout, which git does not ignore")
    subprocess.run([git, "-C", str(root), "add", "-f", "config/fleet.json"], check=True)
    writer_refuses(run_module, root, module_args(root, hosts), snapshot(root), "NARWHAL_FLEET",
                   "config/fleet.json inside the checkout, which git does not ignore")
    subprocess.run([git, "-C", str(root), "rm", "-q", "--cached", "config/fleet.json"], check=True)
    status, result = run_module(module_args(root, hosts, {"NARWHAL_CONFIG_DIR": "config/site-a",
                                                          "NARWHAL_FLEET": "config/fleet.site-a.json",
                                                          "NARWHAL_LAUNCH_CONFIG": "config/site-a/launch.json"}))
    assert status == "exit", result


@pytest.mark.parametrize("change,key,words", [
    # values that load_inputs refuses, handed to the writer directly: the writer refuses them on its own
    (lambda a: a["site"]["site"].update(NARWHAL_FABRIC_INTERFACE="eth1\nNARWHAL_RUN_DIR=/tmp/evil"),
     "NARWHAL_NODE_1_FABRIC_INTERFACE", "cannot be written into deployment.env as one plain KEY=VALUE line"),
    (lambda a: a["site"]["nodes"]["1"].update(URL="http://10.0.0.11:8000/$(id)"), "NARWHAL_NODE_1_URL",
     "has a path"),
    (lambda a: a["interfaces"]["engine-2"].update(operstate="DOWN"), "NARWHAL_FABRIC_INTERFACE",
     "interface eth1 on host engine-2 is down"),
    (lambda a: a["site"]["nodes"].update({"3": {"IP": "10.0.0.13"}}), "NARWHAL_NODE_3_IP",
     "no host of the inventory's group engines is engine-3"),
])
def test_writer_refuses_injection_and_unchecked_values(tmp_path, dev, run_module, change, key, words):
    """Classes 1 and 4 at the writer: nothing written, the previous set byte for byte intact."""
    root, hosts, snap = first_set(tmp_path, run_module)
    args = module_args(root, hosts)
    change(args)
    writer_refuses(run_module, root, args, snap, key, words)


def test_writer_removes_only_inspection_extracts_an_edited_index_names(tmp_path, dev, run_module):
    root, hosts, _snap = first_set(tmp_path, run_module)
    other = root / "config" / "engine-launch.other-site.json"
    other.write_text("{}\n")
    index_path = root / "config" / "engine-launch.sources.json"
    index = json.loads(index_path.read_text())
    index["files"]["engine-launch.other-site.json"] = "0" * 64
    index_path.write_text(json.dumps(index))
    assert run_module(module_args(root, hosts))[0] == "exit"
    assert other.read_text() == "{}\n"


# ------------------------------------------------------------------------------------------------
# secrets (issue 13, class 5): a token the image bakes never reaches a written file; its name does

IMAGE_SECRETS = ("hf_bakedTokenValue0123456789abcd", "sk-baked-api-key-0123456789abcdef", "s3cr3t-label-value")


def test_image_secrets_never_reach_the_output_set(tmp_path, dev, run_module):
    attrs = {"Id": IMAGE_ID, "RepoTags": ["vllm/vllm-openai:v0.33.0"], "RepoDigests": [], "Architecture": "amd64",
             "Os": "linux",
             "Config": {"Env": ["CUDA_VERSION=12.9.1", "HF_TOKEN=" + IMAGE_SECRETS[0],
                                "VLLM_API_KEY=" + IMAGE_SECRETS[1]],
                        "Entrypoint": ["vllm", "serve"], "Cmd": ["--hf-token", IMAGE_SECRETS[0],
                                                                 "--api-key=" + IMAGE_SECRETS[1]],
                        "Labels": {"org.example.deploy-token": IMAGE_SECRETS[2], "version": "0.33.0"}}}
    img = _image.build_facts("vllm/vllm-openai:v0.33.0", attrs, CUDA_DISTS, False)
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path, img=img)))
    assert status == "exit", result
    for path, (data, _mtime, _mode) in snapshot(root).items():
        for secret in IMAGE_SECRETS:
            assert secret.encode() not in data, (path, secret)
    inspection = json.loads((root / "config" / "engine-launch.engine-1.inspection.json").read_text())
    assert inspection["image"]["withheld_env"] == ["HF_TOKEN", "VLLM_API_KEY"]
    assert inspection["image"]["cmd"] == ["--hf-token", "<redacted>", "--api-key=<redacted>"]
    assert inspection["image"]["labels"] == {"org.example.deploy-token": "<redacted>", "version": "0.33.0"}
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert "HF_TOKEN" not in launch["engines"]["engine-1"]["runtime"]["environment"]


# ------------------------------------------------------------------------------------------------
# the KV lease and the drain of a stop (NARWHAL_KV_LEASE_SECONDS, NARWHAL_SHUTDOWN_TIMEOUT)

def test_discovery_warns_of_a_prefill_that_stops_before_its_lease(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), {"NARWHAL_SHUTDOWN_TIMEOUT": "10"}))
    assert status == "exit", result
    warnings = [w for w in result["warnings"] if "KV lease" in w]
    assert warnings == ["engine-1 (prefill): NARWHAL_SHUTDOWN_TIMEOUT=10 is shorter than its KV lease of 30 s "
                        "(vLLM's default): a stop may end the drain before every decode has read the KV it was "
                        "promised, and such a decode request fails; set NARWHAL_SHUTDOWN_TIMEOUT >= 30 or a shorter "
                        "NARWHAL_KV_LEASE_SECONDS"]


# ------------------------------------------------------------------------------------------------
# KV events (issue 38): records, fleet and policy extract gain them only while they are on


def _texts(root):
    return dict((path, data) for path, (data, _mtime, _mode) in snapshot(root).items())


def test_a_site_without_kv_events_writes_the_set_it_wrote_before_they_existed(tmp_path, dev, run_module):
    """Events off (the default: auto with a round-robin prefill policy, or off whatever the policy): the KV inputs
    change no byte of the output set (the committed examples, docs/examples/, are the same proof against the code
    before: tests/unit/scripts/test_gen_example_record.py, test_gen_shapes.py)."""
    root, hosts, _snap = first_set(tmp_path, run_module)
    before = _texts(root)
    assert not [path for path, data in before.items()
                if b'"kv_events"' in data or b'"NARWHAL_KV_EVENTS' in data or b'"NARWHAL_KV_HASH_SEED"' in data]
    for extra in ({"NARWHAL_KV_EVENTS": "off", "NARWHAL_ROUTER_DECODE_POLICY": "kv_aware",
                   "NARWHAL_KV_EVENTS_PORT": "6000", "NARWHAL_KV_HASH_SEED": "9"},
                  {"NARWHAL_ROUTER_POLICY": "cache_aware", "NARWHAL_ROUTER_PREFILL_POLICY": "power_of_two"}):
        status, result = run_module(module_args(root, hosts, extra))
        assert status == "exit" and result["changed"] is False, result
        assert _texts(root) == before


def test_kv_events_reach_the_records_the_fleet_and_the_policy_extract(tmp_path, dev, run_module):
    root, hosts, _snap = first_set(tmp_path, run_module)
    args = module_args(root, hosts, {"NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware", "NARWHAL_KV_HASH_SEED": "7",
                                     "NARWHAL_DATA_PARALLEL_SIZE": "2", "NARWHAL_TP_SIZE": "2"})
    status, result = run_module(args)
    assert status == "exit", result
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())["engines"]
    # both engines on one host (box-a): the second takes the ports after the first's two ranks
    assert launch["engine-1"]["kv_events"] == {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "7"}
    assert launch["engine-2"]["kv_events"] == {"endpoint": "tcp://*:5559", "port": 5559, "hash_seed": "7"}
    assert list(launch["engine-1"])[-2:] == ["kv_events", "sources"]
    assert "NARWHAL_KV_EVENTS=auto, port 5557" in launch["engine-1"]["sources"]["kv_events"]
    fleet = json.loads((root / "config" / "fleet.json").read_text())
    assert [e["kv_events"] for e in fleet] == [["tcp://10.0.0.11:5557", "tcp://10.0.0.11:5558"],
                                               ["tcp://10.0.0.11:5559", "tcp://10.0.0.11:5560"]]
    assert validation_errors(fleet, FLEET_SCHEMA) == []
    extract = json.loads((root / "config" / "engine-launch.policy.json").read_text())
    policy = extract["site"]
    assert {k: policy[k] for k in ("NARWHAL_KV_EVENTS", "NARWHAL_KV_EVENTS_PORT", "NARWHAL_KV_HASH_SEED",
                                   "NARWHAL_ROUTER_PREFILL_POLICY")} == {
        "NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_EVENTS_PORT": 5557, "NARWHAL_KV_HASH_SEED": 7,
        "NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware"}
    # prepare names a change of whether events are on, of their seed, and of the prefill policy while on
    assert policy_changes(extract, args["site"]) == []
    off = copy.deepcopy(args["site"])
    off["site"]["NARWHAL_ROUTER_PREFILL_POLICY"] = None
    assert [c[0] for c in policy_changes(extract, off)] == list(KV_POLICY_KEYS)
    with pytest.raises(InputError) as err:
        check_policy(extract, off)
    assert str(err.value).startswith("NARWHAL_KV_EVENTS changed since discovery (records: on, .env now: KV events "
                                     "off); NARWHAL_KV_EVENTS_PORT changed since discovery (records: 5557, .env now: "
                                     "KV events off)")
    seeded = copy.deepcopy(args["site"])
    seeded["site"]["NARWHAL_KV_HASH_SEED"] = 8
    assert policy_changes(extract, seeded) == [("NARWHAL_KV_HASH_SEED", 7, 8)]


def test_the_planner_publishes_the_events_with_the_seed(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_EVENTS": "on"}, nv_pair(tmp_path))
    spec = container_spec(recs["engine-2"], role_environment(recs["engine-2"], "/opt/narwhal", "run-x"))
    at = spec["command"].index("--kv-events-config")
    config = '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5558"}'
    assert spec["command"][at - 2:at + 2] == ["--block-size", "16", "--kv-events-config", config]
    assert spec["environment"]["PYTHONHASHSEED"] == "0"
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    spec = container_spec(plain["engine-2"], role_environment(plain["engine-2"], "/opt/narwhal", "run-x"))
    assert "--kv-events-config" not in spec["command"] and "PYTHONHASHSEED" not in spec["environment"]


@pytest.mark.parametrize("extra, key, words", [
    ({"NARWHAL_BLOCK_SIZE": "32"}, "NARWHAL_BLOCK_SIZE",
     "prefill engine engine-1 uses KV blocks of 32 tokens (runtime.cache_plan.block_size) under the kv_aware prefill "
     "policy, but vllm-router 0.1.17 reads the engines' KV events as 16-token blocks"),
    ({"NARWHAL_KV_EVENTS_PORT": "8000"}, "NARWHAL_KV_EVENTS_PORT",
     "engine-1 would publish its KV events on port 8000 (from NARWHAL_KV_EVENTS_PORT, one port per data-parallel "
     "rank), which overlaps its own HTTP port 8000 (NARWHAL_ENGINE_PORT)"),
    ({"NARWHAL_KV_EVENTS_PORT": "5600", "NARWHAL_NODE_1_ROLE": "decode", "NARWHAL_NODE_2_ROLE": "prefill"},
     "NARWHAL_KV_EVENTS_PORT", "overlaps its own side-channel port 5600"),
])
def test_kv_events_the_engines_cannot_serve_are_refused_at_discovery(tmp_path, dev, extra, key, words):
    err = refused(dict({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware"}, **extra),
                  nv_pair(tmp_path))
    assert err.key == key and words in str(err), str(err)


def test_a_decode_engine_keeps_its_block_size_under_kv_aware(tmp_path, dev):
    """Only prefill engines feed vllm-router's kv_aware prefill policy: a decode engine of other blocks passes."""
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware",
                  "NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8"}, nv_pair(tmp_path))
    assert recs["engine-2"]["kv_events"]["port"] == 5558
    # with events on for another policy no block size is asked of anyone
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_EVENTS": "on", "NARWHAL_BLOCK_SIZE": "32"},
                 nv_pair(tmp_path))
    assert recs["engine-1"]["runtime"]["block_size"] == 32 and recs["engine-1"]["kv_events"]


def test_a_cpu_prefill_engine_cannot_serve_kv_aware(tmp_path):
    img = image({"vllm": "0.32.0+cpu", "nixl": "0.7.1", "torch": "2.9.0+cpu"}, ["PATH=/usr/bin"],
                "vllm/vllm-openai-cpu:v0.32.0")
    h = host(_gpu.empty_facts("none"), tmp_path, img=img)
    err = refused({"NARWHAL_BLOCK_SIZE": "32", "NARWHAL_ROUTER_POLICY": "kv_aware"}, {"engine-1": h, "engine-2": h},
                  shared=False)
    assert err.key == "NARWHAL_ROUTER_POLICY"
    assert "a CPU image's attention backend takes only multiples of 32 tokens" in str(err)
    # cache_aware needs no events and no block size
    assert "kv_events" not in build({"NARWHAL_BLOCK_SIZE": "32", "NARWHAL_ROUTER_POLICY": "cache_aware"},
                                    {"engine-1": h, "engine-2": h}, shared=False)["engine-1"]


def test_an_image_seeding_its_hashes_otherwise_is_refused_naming_the_seed(tmp_path, dev):
    """The image's own PYTHONHASHSEED reaches runtime.environment; with events on the planner refuses a seed other
    than NARWHAL_KV_HASH_SEED (no input set it: the fix is the seed input)."""
    h = host(nvidia(tmp_path / "dev"), tmp_path, img=image(env=CUDA_ENV + ["PYTHONHASHSEED=3"]))
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_EVENTS": "on"}, {"engine-1": h, "engine-2": h})
    assert err.key == "NARWHAL_KV_HASH_SEED" and "sets PYTHONHASHSEED=3 but kv_events.hash_seed is 0" in str(err)
    assert build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_HASH_SEED": "3"},
                 {"engine-1": h, "engine-2": h})["engine-1"]["kv_events"]["hash_seed"] == "3"
