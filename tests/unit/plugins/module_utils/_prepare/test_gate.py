# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The P/D gate predicts vLLM's NIXL handshake (plugins/module_utils/_prepare/gate.py): each factor of
compute_nixl_compatibility_hash and each check of _validate_remote_agent_handshake refuses a pair by name with
both values, compatible pairs pass; records come from the hand-shaped launch config (test_support/prepare.py) and
from the real fact producers (test_support/records.py). The stand-in engine's copy of the checks agrees with the
gate."""

from __future__ import annotations

import copy

import pytest
from test_support.paths import STANDIN_SITE, load_file
from test_support.prepare import HAND_LAUNCH, compatible
from test_support.records import ROCM_DISTS, ROCM_ENV, amd, build, host, image, nvidia

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import REGENERATE, InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare import gate as _gate

STANDIN = STANDIN_SITE / "vllm" / "standin" / "handshake.py"


standin = load_file("standin_handshake", STANDIN)


@pytest.fixture
def hand_shaped():
    """The hand-shaped NVIDIA prefill and AMD decode (tests/fixtures/hand-shaped)."""
    return copy.deepcopy(HAND_LAUNCH)["engines"]


@pytest.fixture
def pair():
    """The hand-shaped pair made compatible (test_support.prepare.compatible: TRITON_ATTN on both, TP 2 and 2)."""
    return compatible(copy.deepcopy(HAND_LAUNCH))["engines"]


def refusal(records):
    with pytest.raises(InputError) as err:
        _gate.check_pairs(records)
    return err.value


# ------------------------------------------------------------------------------------------------
# the factors of one engine


def test_factors_of_the_hand_shaped_engines(hand_shaped):
    one, two = _gate.factors(hand_shaped["engine-1"]), _gate.factors(hand_shaped["engine-2"])
    assert one["attention_backend"] == {"label": "attention backend", "value": "FLASH_ATTN",
                                        "input": "NARWHAL_EXTRA_ARGS", "source": "cuda default"}
    assert two["attention_backend"]["value"] == "ROCM_AITER_UNIFIED_ATTN"
    assert one["model"]["value"] == "/models/tiny-llama" and one["model"]["input"] == "NARWHAL_SERVED_MODEL_NAME"
    assert one["vllm_version"]["value"] == "0.33.0" and one["vllm_version"]["input"] == "NARWHAL_IMAGE"
    assert (one["nixl_version"]["value"], two["nixl_version"]["value"]) == ("1.5.1", "1.5.1")
    assert [one[n]["value"] for n in ("num_kv_heads", "head_size", "num_hidden_layers", "sliding_window",
                                      "use_mla")] == [2, 32, 2, None, False]
    assert one["kv_cache_dtype"]["value"] == "auto" and one["kv_cache_dtype"]["input"] == "NARWHAL_KV_CACHE_DTYPE"
    assert one["block_size"] == {"label": "effective KV block size", "value": 16, "input": "NARWHAL_BLOCK_SIZE",
                                 "source": "cache plan"}
    assert one["kv_cache_layout"]["value"] == "HND" and one["hybrid_kv_cache_manager"]["value"] == "on"
    assert one["speculative_config"]["value"] is None and one["tensor_parallel_size"]["value"] == 8


def test_every_factor_names_a_real_input():
    names = set(spec["name"] for spec in INPUTS)
    for name, label, key, fix in _gate.FACTORS:
        assert key in names, name
        assert label and key in fix or "NARWHAL_" in fix, name


def test_record_builder_keeps_the_model_geometry(tmp_path):
    dev = tmp_path / "dev"
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, {"engine-1": host(nvidia(dev), tmp_path),
                                                    "engine-2": host(nvidia(dev), tmp_path)})
    assert recs["engine-1"]["runtime"]["model_geometry"] == {
        "num_kv_heads": 8, "head_size": 128, "num_hidden_layers": 32, "sliding_window": None, "use_mla": False,
        "ssm_state": None}
    _gate.check_pairs(recs)  # one host, one image, TP 4 and 4: compatible


def test_a_record_without_geometry_is_refused(pair):
    del pair["engine-2"]["runtime"]["model_geometry"]
    err = refusal(pair)
    assert err.key == "NARWHAL_LAUNCH_CONFIG" and "engine-2 has no runtime.model_geometry" in str(err)


# ------------------------------------------------------------------------------------------------
# NVIDIA prefill + AMD decode


def test_nvidia_prefill_amd_decode_is_refused_by_the_attention_backend(hand_shaped):
    err = refusal(hand_shaped)
    assert err.key == "NARWHAL_EXTRA_ARGS"
    assert str(err) == (
        "NARWHAL_EXTRA_ARGS: engine-1 (prefill) and engine-2 (decode) would fail vLLM's NIXL handshake: attention "
        "backend differs (FLASH_ATTN on engine-1 (cuda default) vs ROCM_AITER_UNIFIED_ATTN on engine-2 (rocm "
        "default)); set the same --attention-backend in NARWHAL_EXTRA_ARGS or deploy each vendor in its own fleet; "
        + REGENERATE)


def test_real_nvidia_and_amd_records_differ_by_backend_and_pass_with_one_pinned(tmp_path):
    """Records from the real producers: 2 of the V100S (CUDA image 0.33.0) and 2 of the MI100 (ROCm image
    0.33.0+rocm711, whose vllm.__version__ is 0.33.0), Llama 3.1 8B on both."""
    rocm = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    hosts = {"engine-1": host(nvidia(tmp_path / "dev"), tmp_path), "engine-2": rocm}
    extra = {"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_NODE_2_IMAGE": "rocm/vllm:0.33.0"}
    err = refusal(build(extra, hosts, shared=False))
    assert "attention backend differs (FLASH_ATTN on engine-1 (cuda default) vs ROCM_AITER_UNIFIED_ATTN" in str(err)
    pinned = build(dict(extra, NARWHAL_EXTRA_ARGS="--attention-backend TRITON_ATTN"), hosts, shared=False)
    assert _gate.check_pairs(pinned) is None


def test_cpu_and_cuda_engines_differ_by_backend(pair):
    pair["engine-2"]["runtime"].update(platform="cpu", extra_args=[])
    pair["engine-1"]["runtime"]["extra_args"] = []
    assert "(FLASH_ATTN on engine-1 (cuda default) vs CPU_ATTN on engine-2 (cpu default))" in str(refusal(pair))


# ------------------------------------------------------------------------------------------------
# each factor


def _geometry(name, value):
    return lambda r: r["runtime"]["model_geometry"].update({name: value})


def _args(*words):
    return lambda r: r["runtime"]["extra_args"].extend(words)


def _env(name, value):
    return lambda r: r["runtime"]["environment"].update({name: value})


@pytest.mark.parametrize("change, key, detail", [
    (lambda r: r["runtime"].update(vllm_version="0.32.0"), "NARWHAL_IMAGE",
     "vLLM version differs (0.33.0 on engine-1 (image narwhal-sim/engine-standin:latest) vs 0.32.0 on engine-2"),
    (lambda r: r["runtime"]["expected_packages"].update({"nixl-rocm": "1.6.0"}), "NARWHAL_IMAGE",
     "NIXL version differs (1.5.1 on engine-1"),
    (lambda r: r["runtime"].update(served_model_name="other-model"), "NARWHAL_SERVED_MODEL_NAME",
     "model path given to vllm serve differs (/models/tiny-llama on engine-1 (served model name tiny-llama) vs "
     "/models/other-model on engine-2"),
    (lambda r: r["runtime"].update(model_path="/srv/models/tiny-llama-v2"), "NARWHAL_MODEL_PATH",
     "checkpoint differs (/srv/models/tiny-llama on engine-1"),
    (lambda r: r["runtime"].update(model_dtype="float16"), "NARWHAL_MODEL_DTYPE",
     "model dtype differs (bfloat16 on engine-1 (--dtype) vs float16 on engine-2 (--dtype))"),
    (_geometry("num_kv_heads", 4), "NARWHAL_MODEL_PATH", "number of KV heads differs (2 on engine-1"),
    (_geometry("head_size", 64), "NARWHAL_MODEL_PATH", "head size differs (32 on engine-1"),
    (_geometry("num_hidden_layers", 4), "NARWHAL_MODEL_PATH", "number of layers differs (2 on engine-1"),
    (_geometry("sliding_window", 4096), "NARWHAL_MODEL_PATH", "sliding window differs (none on engine-1"),
    (_args("--attention-backend=flashinfer"), "NARWHAL_EXTRA_ARGS",
     "attention backend differs (TRITON_ATTN on engine-1 (--attention-backend) vs FLASHINFER on engine-2 "
     "(--attention-backend))"),
    (lambda r: r["runtime"].update(kv_cache_dtype="fp8"), "NARWHAL_KV_CACHE_DTYPE",
     "KV cache dtype differs (auto on engine-1 (--kv-cache-dtype) vs fp8 on engine-2 (--kv-cache-dtype))"),
    # vLLM hashes the flag as given: auto is not resolved to the model dtype
    (lambda r: r["runtime"].update(kv_cache_dtype="bfloat16"), "NARWHAL_KV_CACHE_DTYPE",
     "KV cache dtype differs (auto on engine-1 (--kv-cache-dtype) vs bfloat16 on engine-2"),
    (_args("--disable-hybrid-kv-cache-manager"), "NARWHAL_EXTRA_ARGS",
     "hybrid KV cache manager differs (on on engine-1 (vLLM's default) vs off on engine-2"),
    (_args("--speculative-config", '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
                                   '"num_speculative_tokens": 3}'), "NARWHAL_EXTRA_ARGS",
     "speculative decoding (EAGLE/MTP draft) differs (none on engine-1"),
    (lambda r: r["runtime"]["cache_plan"].update(block_size=32), "NARWHAL_BLOCK_SIZE",
     "effective KV block size differs (16 on engine-1 (cache plan) vs 32 on engine-2 (cache plan))"),
    (_env("VLLM_KV_CACHE_LAYOUT", "NHD"), "NARWHAL_ENGINE_ENV",
     "KV cache layout differs (HND on engine-1 (NixlConnector's layout) vs NHD on engine-2 (VLLM_KV_CACHE_LAYOUT))"),
])
def test_each_factor_is_refused_by_name_with_both_values(pair, change, key, detail):
    change(pair["engine-2"])
    err = refusal(pair)
    assert err.key == key
    assert str(err).startswith("%s: engine-1 (prefill) and engine-2 (decode) would fail vLLM's NIXL handshake: "
                               % key)
    assert detail in str(err)
    assert str(err).endswith(REGENERATE)


def test_dcp_sizes_that_do_not_divide_are_refused(pair):
    _args("--decode-context-parallel-size", "2")(pair["engine-1"])
    _args("-dcp", "3")(pair["engine-2"])
    err = refusal(pair)
    assert err.key == "NARWHAL_EXTRA_ARGS" and "DCP sizes 2 on engine-1 and 3 on engine-2 do not divide" in str(err)


def test_the_first_factor_is_named_and_the_others_listed(pair):
    pair["engine-2"]["runtime"].update(vllm_version="0.32.0", kv_cache_dtype="fp8")
    err = refusal(pair)
    assert err.key == "NARWHAL_IMAGE" and "; also differ: KV cache dtype;" in str(err)


@pytest.mark.parametrize("change", [
    lambda r: r["runtime"].update(vllm_version="0.33.0+rocm711"),  # vllm.__version__ has no platform tag
    lambda r: r["runtime"]["cache_plan"].update(requested_block_size=32, page_bytes=4096),  # not compared
    lambda r: r["runtime"].update(nixl_distribution="nixl", expected_packages={"vllm": "0.33.0", "nixl": "1.5.1"}),
    _args("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'),  # not an EAGLE draft
    _args("--attention-backend", "FLASHINFER", "--attention-backend", "triton_attn"),  # the last one wins
    _args("--decode-context-parallel-size", "2"),
    _env("VLLM_KV_CACHE_LAYOUT", "LBHNC"),  # 0.33's name of HND
    lambda r: r.update(data_parallel_size=2, enable_expert_parallel=True),  # per rank: TP is what is compared
])
def test_what_vllm_does_not_compare_passes(pair, change):
    change(pair["engine-2"])
    assert _gate.check_pairs(pair) is None


def test_two_prefills_are_not_compared(hand_shaped):
    hand_shaped["engine-2"]["role"] = "prefill"
    assert _gate.check_pairs(hand_shaped) is None


# ------------------------------------------------------------------------------------------------
# tensor parallelism


def _tp(pair, one, two, heads=None):
    pair["engine-1"]["tensor_parallel_size"], pair["engine-2"]["tensor_parallel_size"] = one, two
    for r in pair.values():
        if heads:
            r["runtime"]["model_geometry"]["num_kv_heads"] = heads
    return pair


def test_tp_sizes_that_do_not_divide_are_refused(pair):
    err = refusal(_tp(pair, 3, 2, heads=8))
    assert err.key == "NARWHAL_TP_SIZE" and "TP 3 on engine-1 vs 2 on engine-2: vLLM maps unequal TP only" in str(err)


def test_a_larger_tp_than_the_kv_heads_is_refused(pair):
    err = refusal(_tp(pair, 8, 2))
    assert err.key == "NARWHAL_TP_SIZE"
    assert "TP 8 on engine-1 vs 2 on engine-2 with 2 KV heads: the larger TP replicates the KV heads" in str(err)
    assert "give both engines one TP size (NARWHAL_TP_SIZE" in str(err)


def test_unequal_tp_within_the_kv_heads_passes(pair):
    assert _gate.check_pairs(_tp(pair, 4, 2, heads=8)) is None


def test_unequal_tp_needs_the_head_contiguous_layout(pair):
    for r in _tp(pair, 4, 2, heads=8).values():
        r["runtime"]["environment"]["VLLM_KV_CACHE_LAYOUT"] = "NHD"
    assert "with the NHD KV layout: heterogeneous TP splits KV heads" in str(refusal(pair))


def test_mla_maps_any_dividing_tp(pair):
    for r in _tp(pair, 8, 2).values():
        r["runtime"]["model_geometry"].update(num_kv_heads=1, head_size=576, use_mla=True)
    assert _gate.check_pairs(pair) is None


def _hybrid(pair, version):
    for r in pair.values():
        r["runtime"].update(vllm_version=version, ssm_conv_state=True)
        r["runtime"]["model_geometry"]["ssm_state"] = "mamba2"
    return pair


def test_hybrid_ssm_with_unequal_tp_is_refused_before_vllm_0_22(pair):
    err = refusal(_tp(_hybrid(pair, "0.19.1"), 4, 2, heads=8))
    assert err.key == "NARWHAL_TP_SIZE"
    assert "TP 4 on engine-1 vs 2 on engine-2 with a hybrid SSM model: vLLM 0.19.1 refuses it ('Mamba does not " \
           "support heterogeneous TP yet'" in str(err)


def test_hybrid_ssm_with_equal_tp_passes(pair):
    assert _gate.check_pairs(_hybrid(pair, "0.19.1")) is None


def test_hybrid_ssm_with_unequal_tp_needs_one_block_size_from_vllm_0_22(pair):
    _tp(_hybrid(pair, "0.33.0"), 4, 2, heads=8)
    assert _gate.check_pairs(pair) is None  # the 3-read transfer maps it
    pair["engine-1"]["runtime"]["cache_plan"]["block_size"] = 64  # the cache plan raises it by TP
    assert "effective KV block size differs (64 on engine-1" in str(refusal(pair))


# ------------------------------------------------------------------------------------------------
# the attention backend


@pytest.mark.parametrize("platform, version, mla, env, backend", [
    ("cuda", "0.33.0", False, {}, "FLASH_ATTN"),
    ("cuda", "0.14.0", False, {}, "FLASH_ATTN"),
    ("cuda", "0.33.0", True, {}, "FLASH_ATTN_MLA"),
    ("rocm", "0.14.0", False, {}, "TRITON_ATTN"),
    ("rocm", "0.14.0", False, {"VLLM_ROCM_USE_AITER": "1"}, "ROCM_AITER_FA"),
    ("rocm", "0.19.1", False, {}, "ROCM_ATTN"),
    ("rocm", "0.22.0", False, {"VLLM_ROCM_USE_AITER": "1"}, "ROCM_ATTN"),
    ("rocm", "0.23.0", False, {}, "ROCM_AITER_UNIFIED_ATTN"),
    ("rocm", "0.33.0", False, {"VLLM_ROCM_USE_AITER": "1"}, "ROCM_AITER_FA"),
    ("rocm", "0.33.0", True, {}, "TRITON_MLA"),
    ("rocm", "0.33.0", True, {"VLLM_ROCM_USE_AITER": "true"}, "ROCM_AITER_MLA"),
    ("cpu", "0.32.0", False, {}, "CPU_ATTN"),
])
def test_default_backend_by_platform_and_version_and_the_standin_agrees(platform, version, mla, env, backend):
    assert _gate.default_attention_backend(platform, release_tuple(version), mla, env)[0] == backend
    assert standin.default_attention_backend(platform, version, mla, env) == backend


def test_the_backend_environment_variable_counts_before_vllm_0_19_1(pair):
    for r in pair.values():
        r["runtime"].update(vllm_version="0.14.0", extra_args=[])
    pair["engine-2"]["runtime"]["environment"]["VLLM_ATTENTION_BACKEND"] = "TRITON_ATTN"
    assert "(FLASH_ATTN on engine-1 (cuda default) vs TRITON_ATTN on engine-2 (VLLM_ATTENTION_BACKEND))" \
        in str(refusal(pair))
    for r in pair.values():
        r["runtime"]["vllm_version"] = "0.19.1"
    assert "vs ROCM_ATTN on engine-2 (rocm default)" in str(refusal(pair))  # the variable is gone


def test_the_same_backend_pinned_on_both_vendors_passes_with_unequal_tp_too(pair):
    # TRITON_ATTN on CUDA and ROCm: vLLM's hash factors agree; TP 4/2 within 8 KV heads maps
    assert _gate.check_pairs(_tp(pair, 4, 2, heads=8)) is None


# ------------------------------------------------------------------------------------------------
# the stand-in engine's handshake (tests/harness/images/engine-standin/site/vllm/standin/handshake.py)

TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 128, "torch_dtype": "bfloat16"}


def _standin_hash(platform="cuda", version="0.33.0", backend=None, cache_dtype="auto", model="/models/tiny-llama",
                  dtype="bfloat16", hma=True, speculative=None, config=None):
    config = config or TINY
    geometry = standin.model_geometry(config)
    name = standin.attention_backend(backend, platform, version, geometry["use_mla"], {})
    factors = standin.compatibility_factors(version, model, standin.model_dtype(dtype, config), geometry, name,
                                            cache_dtype, hma, standin.speculative_factors(speculative, cache_dtype))
    return standin.hash_factors(factors)


def test_standin_hash_is_vllms_factor_dictionary():
    geometry = standin.model_geometry(TINY)
    assert geometry == {"num_kv_heads": 2, "head_size": 32, "num_hidden_layers": 2, "use_mla": False}
    factors = standin.compatibility_factors("0.33.0", "/models/tiny-llama", "torch.bfloat16", geometry, "FLASH_ATTN",
                                            "auto", True, None)
    assert factors == {"vllm_version": "0.33.0", "nixl_connector_version": 15, "model": "/models/tiny-llama",
                       "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 32, "num_hidden_layers": 2,
                       "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto", "is_hma_enabled": True,
                       "speculative_config": None, "transfer_mode": "pull"}
    assert "cross_layers_blocks" in standin.compatibility_factors("0.22.0", "m", "d", geometry, "b", "auto", True,
                                                                  None)
    assert "is_hma_enabled" not in standin.compatibility_factors("0.14.0", "m", "d", geometry, "b", "auto", True,
                                                                 None)


@pytest.mark.parametrize("other", [
    dict(platform="rocm"), dict(version="0.32.0"), dict(cache_dtype="fp8"), dict(model="/models/other"),
    dict(dtype="float16"), dict(hma=False), dict(backend="TRITON_ATTN"),
    dict(speculative='{"method": "eagle3", "model": "draft"}'), dict(config=dict(TINY, num_key_value_heads=4)),
])
def test_standin_hash_changes_with_each_factor(other):
    assert _standin_hash(**other) != _standin_hash()


def test_standin_hash_agrees_where_the_gate_passes():
    assert _standin_hash(platform="rocm", backend="triton_attn") == _standin_hash(backend="TRITON_ATTN")
    assert _standin_hash(dtype="auto") == _standin_hash(dtype="bfloat16")
    assert _standin_hash(speculative='{"method": "ngram"}') == _standin_hash()


def test_standin_refuses_a_mismatched_hash_in_vllms_words():
    with pytest.raises(RuntimeError) as err:
        standin.check_hash("aa", "bb")
    assert str(err.value).startswith("NIXL compatibility hash mismatch. Local: aa, Remote: bb. Prefill and decode "
                                     "instances have incompatible configurations.")


def _meta(tp, block=16, layout="HND", heads=2, mla=False, dcp=1):
    return {"engine_id": "e", "tp_size": tp, "block_size": block, "kv_cache_layout": layout, "num_kv_heads": heads,
            "use_mla": mla, "dcp_size": dcp}


@pytest.mark.parametrize("local, remote, message", [
    (_meta(2), _meta(3), "Remote tensor parallel size 3 is not divisible by local tensor parallel size 2."),
    (_meta(2), _meta(8), "is_kv_replicated"),
    (_meta(8), _meta(2), None),  # the consumer reads its heads out of the producer's
    (_meta(2, block=32), _meta(2, block=16), None),
    (_meta(2, block=16), _meta(2, block=32), "Local block size 16 is not divisible by remote block size 32"),
    (_meta(2, layout="NHD"), _meta(2), "Heterogeneous TP expects same kv_cache_layout (local NHD, remote HND)"),
    (_meta(4, heads=8, layout="NHD"), _meta(2, heads=8, layout="NHD"), "requires contiguous heads"),
    (_meta(2, heads=8), _meta(4, heads=8, block=8), "not supported when P TP > D TP"),
    (_meta(2, mla=True, heads=1), _meta(8, mla=True, heads=1), None),
    (_meta(2, dcp=2), _meta(2, dcp=3), "DCP sizes must divide one another"),
])
def test_standin_validates_the_remote_agent_like_vllm(local, remote, message):
    if message is None:
        standin.validate_remote(local, remote)
        return
    with pytest.raises((AssertionError, RuntimeError)) as err:
        standin.validate_remote(local, remote)
    assert message in str(err.value)


def test_flags_read_as_vllm_reads_them(pair):
    """An abbreviated or snake_case flag counts (vLLM's parser takes both); a non-ASCII digit is no DCP size."""
    pair["engine-2"]["runtime"]["extra_args"] = ["--attention_back", "FLASHINFER"]
    assert "attention backend differs" in str(refusal(pair)) and "FLASHINFER" in str(refusal(pair))
    pair["engine-2"]["runtime"]["extra_args"] = ["--attention-backend", "TRITON_ATTN", "-dcp", "\u00b2"]
    _gate.check_pairs(pair)  # no traceback: '²' is not a size (vLLM's own parser refuses it at the check)
