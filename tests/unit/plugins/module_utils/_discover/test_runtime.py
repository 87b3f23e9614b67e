# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime fields discovery derives (plugins/module_utils/_discover/runtime.py), in the records it builds: the
expected packages and NIXL distribution, the model dtype, the KV cache plan (MLA, SSM and attention models), and the
KV lease and the drain of a stop (NARWHAL_KV_LEASE_SECONDS, NARWHAL_SHUTDOWN_TIMEOUT) by the image's vLLM. The
builders: tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import pytest
from test_support.records import (
    BASE,
    IMAGE_ID,
    build,
    host,
    image,
    model,
    nv_pair,
    refused,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import policy_changes
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs


def test_expected_packages_and_environment(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    rt = recs["engine-1"]["runtime"]
    assert rt["expected_packages"] == {"vllm": "0.33.0", "nixl": "0.7.1"}
    assert rt["image_id"] == IMAGE_ID and rt["platform"] == "cuda" and rt["kv_buffer_device"] == "cuda"
    assert rt["model_dtype"] == "bfloat16" and rt["served_model_name"] == "Meta-Llama-3.1-8B"
    assert rt["environment"] == {"CUDA_VERSION": "12.9.1", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
                                 "UCX_HOME": "/usr/local/ucx"}
    assert rt["extra_args"] == [] and rt["derived_environment"] == {}


def test_nixl_wheel_distribution_is_pinned(tmp_path, dev):
    img = image({"vllm": "0.33.0", "nixl-cu13": "0.8.0"})
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=img))
    assert recs["engine-2"]["runtime"]["expected_packages"] == {"vllm": "0.33.0", "nixl-cu13": "0.8.0"}
    assert recs["engine-2"]["runtime"]["nixl_distribution"] == "nixl-cu13"


@pytest.mark.parametrize("dists,needle", [
    ({"nixl": "0.7.1", "nixl-cu12": "0.7.1"}, "no 'vllm' distribution"),
    ({"vllm": "0.33.0+cu129", "torch": "2.9.0"}, "no NIXL distribution"),
])
def test_image_without_vllm_or_nixl(tmp_path, dev, dists, needle):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=image(dists)))
    assert err.key == "NARWHAL_IMAGE" and needle in str(err)


def test_expected_packages_policy(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXPECTED_PACKAGES": "torch"}, nv_pair(tmp_path))
    assert recs["engine-1"]["runtime"]["expected_packages"] == {"vllm": "0.33.0", "nixl": "0.7.1",
                                                                "torch": "2.9.0+cu129"}
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXPECTED_PACKAGES": "torch, flashinfer-python"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXPECTED_PACKAGES" and "flashinfer-python" in str(err)


def test_float32_checkpoint_needs_a_dtype_policy(tmp_path, dev):
    f32 = model(tmp_path, patch={"torch_dtype": "float32"})
    assert f32["dtype"] == "float32"
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=f32))
    assert err.key == "NARWHAL_MODEL_DTYPE" and "float32" in str(err)
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_MODEL_DTYPE": "float16"}, nv_pair(tmp_path, mdl=f32))
    assert recs["engine-1"]["runtime"]["model_dtype"] == "float16"


@pytest.mark.parametrize("src", ["aiconf__meta-llama--Meta-Llama-3.1-8B", "aiconf__Qwen--Qwen2.5-7B",
                                 "aiconf__nvidia--Nemotron-H-56B-Base-8K", "aiconf__mistralai--Mixtral-8x7B-v0.1"])
def test_fp8_ds_mla_cache_for_plain_attention_is_refused(tmp_path, dev, src):
    """Issue 24: vLLM offers the fp8_ds_mla cache only to MLA attention; a plain-attention model is refused by key,
    naming the engine and the model."""
    mdl = model(tmp_path, src)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"}, nv_pair(tmp_path, mdl=mdl))
    assert err.key == "NARWHAL_KV_CACHE_DTYPE", str(err)
    assert "the cache plan for engine-1 (%s, model_type %s) failed" % (mdl["path"], mdl["model_type"]) in str(err)
    assert "only to MLA attention backends" in str(err) and "set NARWHAL_KV_CACHE_DTYPE=auto" in str(err)


@pytest.mark.parametrize("src", ["helpy__DeepSeek-V3", "aiconf__moonshotai--Kimi-K2-Instruct"])
def test_fp8_ds_mla_cache_for_mla_models_is_planned(tmp_path, dev, src):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"},
                 nv_pair(tmp_path, mdl=model(tmp_path, src)))
    rt = recs["engine-1"]["runtime"]
    assert rt["kv_cache_dtype"] == "fp8_ds_mla" and rt["cache_plan"]["bytes_per_token_per_layer"] == 656


# Nemotron-H-56B at TP 4: attention 2 KV heads x 128 x 2 B x (K,V) = 1024 B/token; Mamba2 state per GPU =
# conv 3 x (16384 + 2*8*256)/4 x 2 B = 30720 + SSM 64 heads x 64 x 256 x 2 B = 2097152 -> 2127872 B, so the block
# is raised to 16 * ceil(2127872 / (16 * 1024)) = 2080 tokens (page 2080 * 1024 B). LFM2's short-conv state fits
# one 16-token page, so it keeps 16 but still needs the DS conv-state layout.
@pytest.mark.parametrize("src,block,page", [("aiconf__nvidia--Nemotron-H-56B-Base-8K", 2080, 2129920),
                                            ("fetchwiki__LiquidAI-LFM2-1.2B", 16, 8192)])
def test_conv_ssm_model(tmp_path, dev, src, block, page):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=model(tmp_path, src)))
    rt = recs["engine-2"]["runtime"]
    assert rt["derived_environment"] == {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    assert rt["ssm_conv_state"] is True
    assert rt["block_size"] == 16
    assert (rt["cache_plan"]["block_size"], rt["cache_plan"]["page_bytes"]) == (block, page)
    assert recs["engine-1"]["runtime"]["cache_plan"] == rt["cache_plan"]  # P and D agree


def test_attention_model_keeps_requested_block(tmp_path, dev):
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-2"]["runtime"]
    # Llama-3.1-8B at TP 4: 2 KV heads x 128 x 2 B x 2 = 1024 B/token, 16 tokens
    assert (plain["cache_plan"]["block_size"], plain["cache_plan"]["page_bytes"]) == (16, 16384)
    assert plain["derived_environment"] == {} and plain["ssm_conv_state"] is False


def _cpu_pair(tmp_path, version):
    cpu = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": version + "+cpu", "nixl": "0.7.1"},
                                                             ["PATH=/usr/bin"], "vllm/vllm-openai-cpu:v" + version))
    return {"engine-1": cpu, "engine-2": cpu}


@pytest.mark.parametrize("version,name", [
    ("0.21.0", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT in the environment (vLLM 0.21.0+cpu; its default is 480 s)"),
    ("0.22.0", "kv_connector_extra_config.kv_lease_duration in --kv-transfer-config (vLLM 0.22.0+cpu; its default is "
               "30 s)"),
    ("0.32.0", "kv_connector_extra_config.kv_lease_duration in --kv-transfer-config"),
])
def test_the_lease_is_recorded_with_the_name_of_the_images_vllm(tmp_path, version, name):
    recs = build({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_KV_LEASE_SECONDS": "120"}, _cpu_pair(tmp_path, version),
                 shared=False)
    for record in recs.values():  # every engine, prefill and decode alike
        assert record["runtime"]["kv_lease_seconds"] == 120
        assert record["sources"]["kv_lease"].startswith("NARWHAL_KV_LEASE_SECONDS=120: ")
        assert name in record["sources"]["kv_lease"]


def test_without_the_inputs_only_the_drains_default_is_recorded(tmp_path, dev):
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-1"]
    assert "kv_lease_seconds" not in record["runtime"] and "kv_lease" not in record["sources"]
    assert record["runtime"]["shutdown_timeout"] == 30
    assert record["sources"]["shutdown"] == ("NARWHAL_SHUTDOWN_TIMEOUT unset: 30 (--shutdown-timeout 30: drain "
                                             "in-flight requests); a stop gives 45 s before SIGKILL")


@pytest.mark.parametrize("value,recorded,words", [
    ("0", 0, "NARWHAL_SHUTDOWN_TIMEOUT=0 (--shutdown-timeout 0: abort in-flight requests); a stop gives 15 s"),
    ("300", 300, "NARWHAL_SHUTDOWN_TIMEOUT=300 (--shutdown-timeout 300: drain in-flight requests); a stop gives 315 s"),
])
def test_the_drain_is_recorded(tmp_path, dev, value, recorded, words):
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_SHUTDOWN_TIMEOUT": value}, nv_pair(tmp_path))["engine-2"]
    assert record["runtime"]["shutdown_timeout"] == recorded
    assert record["sources"]["shutdown"].startswith(words)


def test_an_image_older_than_0_18_gets_no_drain_and_refuses_a_set_one(tmp_path):
    recs = build({"NARWHAL_BLOCK_SIZE": "64"}, _cpu_pair(tmp_path, "0.14.0"), shared=False)
    assert "shutdown_timeout" not in recs["engine-1"]["runtime"]
    assert "has no --shutdown-timeout (from 0.18): not written" in recs["engine-1"]["sources"]["shutdown"]
    err = refused({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_SHUTDOWN_TIMEOUT": "30"}, _cpu_pair(tmp_path, "0.17.1"),
                  shared=False)
    assert err.key == "NARWHAL_SHUTDOWN_TIMEOUT"
    assert str(err).startswith("NARWHAL_SHUTDOWN_TIMEOUT: is 30 but the image's vLLM 0.17.1+cpu on engine-1 has no "
                               "--shutdown-timeout (vLLM's graceful drain exists from 0.18)")


@pytest.mark.parametrize("version,env,key,words", [
    ("0.32.0", {"NARWHAL_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_ENGINE_ENV",
     "the image's vLLM 0.32.0 reads the KV lease from kv_connector_extra_config.kv_lease_duration "
     "(--kv-transfer-config), and would ignore VLLM_NIXL_ABORT_REQUEST_TIMEOUT"),
    ("0.22.0", {"NARWHAL_NODE_2_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_NODE_2_ENGINE_ENV",
     "reads the KV lease from kv_connector_extra_config.kv_lease_duration"),
    ("0.21.0", {"NARWHAL_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_ENGINE_ENV",
     "the image's vLLM 0.21.0 reads the KV lease from VLLM_NIXL_ABORT_REQUEST_TIMEOUT (the environment): set "
     "NARWHAL_KV_LEASE_SECONDS=<seconds> instead"),
])
def test_the_lease_set_by_hand_is_refused_with_the_name_the_image_reads(tmp_path, version, env, key, words):
    from ansible_collections.narwhal.deploy.plugins.module_utils._discover.engine_args import site_environment

    # the input stage refuses it without the version (test_validate.py); the record stage names the version's name
    with pytest.raises(InputError) as err:
        site_environment(list(env.values())[0], key, release=tuple(int(p) for p in version.split(".")))
    assert err.value.key == key and words in str(err.value)
    # discovery refuses the site with it at the first stage, before it knows the image (both names there)
    whole = refused(dict(env, NARWHAL_BLOCK_SIZE="64"), _cpu_pair(tmp_path, version), shared=False)
    assert whole.key == key
    assert "vLLM <= 0.21 reads the environment variable VLLM_NIXL_ABORT_REQUEST_TIMEOUT" in str(whole)


def test_prepare_names_the_new_inputs_when_the_records_predate_them(tmp_path, dev):
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_KV_LEASE_SECONDS="60"))
    recorded = {"site": {k: v for k, v in inputs["site"].items()
                         if k not in ("NARWHAL_KV_LEASE_SECONDS", "NARWHAL_SHUTDOWN_TIMEOUT")}, "nodes": {}}
    changed = [key for key, _before, _after in policy_changes(recorded, inputs)]
    assert "NARWHAL_KV_LEASE_SECONDS" in changed and "NARWHAL_SHUTDOWN_TIMEOUT" in changed
