# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kv_cache_pages (plugins/module_utils/_discover/kv_pages.py): expected numbers computed by hand in the comments
(the page-size rules in the module's docstring)."""

from __future__ import annotations

import json

import pytest
from test_support.model import MODELS

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.kv_pages import (
    dtype_bytes,
    kv_cache_pages,
    mamba_page_bytes,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import kv_geometry


def geometry(src):
    return kv_geometry(json.loads((MODELS / (f"{src}__config.json")).read_text()))


LLAMA = "aiconf__meta-llama--Meta-Llama-3.1-8B"  # 8 KV heads, head_dim 4096/32 = 128, bfloat16
DEEPSEEK = "helpy__DeepSeek-V3"  # MLA kv_lora_rank 512 + qk_rope_head_dim 64
NEMOTRON_H = "aiconf__nvidia--Nemotron-H-56B-Base-8K"
NEMOTRON_NANO = "aiconf__nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
QWEN3_NEXT = "aiconf__Qwen--Qwen3-Next-80B-A3B-Thinking"


# ------------------------------------------------------------------------------------------------
# plain GQA: 2 * kv_heads_per_gpu * 128 * 2 bytes


@pytest.mark.parametrize(
    "tp, kv_per_gpu, per_token",
    [
        (1, 8, 4096),  # 2 * 8 * 128 * 2
        (2, 4, 2048),  # 2 * 4 * 128 * 2
        (8, 1, 512),  # 2 * 1 * 128 * 2
    ],
)
def test_llama_gqa(tp, kv_per_gpu, per_token):
    plan = kv_cache_pages(geometry(LLAMA), tp, 16, "auto", "bfloat16")
    assert plan["kv_heads_per_gpu"] == kv_per_gpu
    assert plan["bytes_per_token_per_layer"] == per_token
    assert (plan["requested_block_size"], plan["block_size"]) == (16, 16)
    assert plan["page_bytes"] == 16 * per_token  # 65536 / 32768 / 8192
    assert plan["notes"] == []


def test_llama_fp8_cache():
    plan = kv_cache_pages(geometry(LLAMA), 2, 32, "fp8_e4m3", "bfloat16")
    assert plan["bytes_per_token_per_layer"] == 1024  # 2 * 4 * 128 * 1
    assert plan["page_bytes"] == 32768  # 32 * 1024


def test_llama_float32_and_tp16_replication():
    plan = kv_cache_pages(geometry(LLAMA), 16, 16, "float32", "bfloat16")
    assert plan["kv_heads_per_gpu"] == 1  # max(1, 8 // 16)
    assert plan["bytes_per_token_per_layer"] == 1024  # 2 * 1 * 128 * 4
    assert any("replicated on 2 GPUs" in note for note in plan["notes"])


def test_kv_heads_not_divisible_by_tp():
    plan = kv_cache_pages({"num_kv_heads": 8, "head_dim": 128}, 3, 16, "auto", "float16")
    assert plan["kv_heads_per_gpu"] == 2
    assert any("not divisible" in note for note in plan["notes"])


# ------------------------------------------------------------------------------------------------
# MLA: one latent head of 576, not split by TP


@pytest.mark.parametrize("tp", [1, 8])
def test_deepseek_v3_mla_bf16(tp):
    plan = kv_cache_pages(geometry(DEEPSEEK), tp, 64, "auto", "bfloat16")
    assert plan["kv_heads_per_gpu"] == 1
    assert plan["bytes_per_token_per_layer"] == 1152  # 576 * 2
    assert plan["block_size"] == 64
    assert plan["page_bytes"] == 73728  # 64 * 1152


def test_deepseek_v3_mla_fp8():
    plan = kv_cache_pages(geometry(DEEPSEEK), 8, 64, "fp8", "bfloat16")
    assert plan["bytes_per_token_per_layer"] == 576  # 576 * 1
    assert plan["page_bytes"] == 36864  # 64 * 576


def test_deepseek_v3_fp8_ds_mla():
    plan = kv_cache_pages(geometry(DEEPSEEK), 8, 64, "fp8_ds_mla", "bfloat16")
    assert plan["bytes_per_token_per_layer"] == 656
    assert plan["page_bytes"] == 41984  # 64 * 656


@pytest.mark.parametrize("src", [LLAMA, NEMOTRON_H, QWEN3_NEXT, "aiconf__mistralai--Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("kv", ["fp8_ds_mla", "FP8_DS_MLA"])
def test_fp8_ds_mla_needs_mla_attention(src, kv):
    """vLLM lists fp8_ds_mla only among the cache dtypes of MLA attention backends (issue 24)."""
    with pytest.raises(ValueError, match="latent-cache layout of MLA attention .* this model has plain attention"):
        kv_cache_pages(geometry(src), 1, 16, kv, "bfloat16")


# ------------------------------------------------------------------------------------------------
# hybrid attention + Mamba2 (Nemotron-H-56B: intermediate 256*64 = 16384, n_groups 8, d_state 256, d_conv 4,
# 256 Mamba heads of 64; attention 8 KV heads of 128; bfloat16 everywhere)


def test_nemotron_h_tp1():
    # conv: (16384 + 2*8*256) * (4-1) = 20480 * 3 = 61440 elements * 2 B = 122880 B
    # ssm:  256 * 64 * 256 = 4194304 elements * 2 B = 8388608 B      -> mamba page 8511488 B
    # attention per token: 2 * 8 * 128 * 2 = 4096 B
    # attn_block = 16 * ceil(8511488 / (16 * 4096)) = 16 * ceil(129.875) = 16 * 130 = 2080
    plan = kv_cache_pages(geometry(NEMOTRON_H), 1, 16, "auto", "bfloat16")
    assert plan["mamba_page_bytes"] == 8511488
    assert plan["bytes_per_token_per_layer"] == 4096
    assert (plan["requested_block_size"], plan["block_size"]) == (16, 2080)
    assert plan["page_bytes"] == 8519680  # 2080 * 4096, the Mamba page padded up to it
    assert plan["mamba_page_bytes_padded"] == 8519680
    assert any("raised from 16 to 2080" in note for note in plan["notes"])


def test_nemotron_h_tp8():
    # conv: (20480 / 8) * 3 = 7680 elements * 2 = 15360 B; ssm: (256/8) * 64 * 256 = 524288 * 2 = 1048576 B
    # mamba page 1063936 B; attention per token 2 * 1 * 128 * 2 = 512 B
    # attn_block = 16 * ceil(1063936 / 8192) = 16 * 130 = 2080; page 2080 * 512 = 1064960
    plan = kv_cache_pages(geometry(NEMOTRON_H), 8, 16, "auto", "bfloat16")
    assert (plan["mamba_page_bytes"], plan["kv_heads_per_gpu"], plan["bytes_per_token_per_layer"]) == (1063936, 1, 512)
    assert (plan["block_size"], plan["page_bytes"]) == (2080, 1064960)


def test_nemotron_h_requested_block_larger_than_needed_is_kept():
    plan = kv_cache_pages(geometry(NEMOTRON_H), 1, 4096, "auto", "bfloat16")
    assert (plan["block_size"], plan["page_bytes"]) == (4096, 16777216)  # 4096 * 4096


def test_nemotron_nano_float32_ssm_state():
    # ssm state in float32 (mamba_ssm_cache_dtype): conv (4096 + 2*8*128) * 3 = 18432 * 2 = 36864 B,
    # ssm 64 * 64 * 128 = 524288 * 4 = 2097152 B -> 2134016 B; attention 2 * 2 * 128 * 2 = 1024 B/token
    # attn_block = 16 * ceil(2134016 / 16384) = 16 * 131 = 2096; page 2096 * 1024 = 2146304
    plan = kv_cache_pages(geometry(NEMOTRON_NANO), 1, 16, "auto", "bfloat16")
    assert plan["mamba_page_bytes"] == 2134016
    assert (plan["block_size"], plan["page_bytes"]) == (2096, 2146304)


def test_qwen3_next_gated_delta_net():
    # conv: (128*16*2 + 128*32) * 3 = 8192 * 3 = 24576; temporal 32 * 128 * 128 = 524288; (24576+524288) * 2 = 1097728
    # attention 2 * 2 * 256 * 2 = 2048 B/token; 16 * ceil(1097728 / 32768) = 16 * 34 = 544
    plan = kv_cache_pages(geometry(QWEN3_NEXT), 1, 16, "auto", "bfloat16")
    assert (plan["mamba_page_bytes"], plan["block_size"], plan["page_bytes"]) == (1097728, 544, 1114112)


def test_lfm2_short_conv_fits_default_block():
    # conv state (2048) * (3-1) * 2 = 8192 B; attention 2 * 8 * 64 * 2 = 2048 B/token; 16 * ceil(8192/32768) = 16
    plan = kv_cache_pages(geometry("fetchwiki__LiquidAI-LFM2-1.2B"), 1, 16, "auto", "bfloat16")
    assert (plan["mamba_page_bytes"], plan["block_size"], plan["page_bytes"]) == (8192, 16, 32768)
    assert plan["mamba_page_bytes_padded"] == 32768


# ------------------------------------------------------------------------------------------------
# dtypes and bad input


@pytest.mark.parametrize(
    "kv, model, expected",
    [
        ("auto", "bfloat16", 2),
        ("auto", "float16", 2),
        ("auto", "float32", 4),
        ("auto", "torch.bfloat16", 2),
        ("fp8", "bfloat16", 1),
        ("fp8_e5m2", "bfloat16", 1),
        ("bfloat16", "float32", 2),
        ("float16", None, 2),
        ("float32", "bfloat16", 4),
    ],
)
def test_dtype_bytes(kv, model, expected):
    assert dtype_bytes(kv, model) == expected


def test_unknown_model_dtype_with_auto_assumes_bfloat16():
    plan = kv_cache_pages(geometry("aiconf__openai--gpt-oss-20b"), 1, 16, "auto", None)
    assert plan["bytes_per_token_per_layer"] == 2048  # 2 * 8 * 64 * 2
    assert any("assumed bfloat16" in note for note in plan["notes"])


@pytest.mark.parametrize(
    "tp, block, kv",
    [(0, 16, "auto"), (1, 0, "auto"), ("2", 16, "auto"), (True, 16, "auto"), (1, 16, "int4")],
)
def test_bad_input(tp, block, kv):
    with pytest.raises(ValueError):
        kv_cache_pages(geometry(LLAMA), tp, block, kv, "bfloat16")


def test_underivable_mamba_state_keeps_block():
    geo = dict(geometry(LLAMA), mamba={"kind": "mamba2", "d_conv": 4})
    plan = kv_cache_pages(geo, 1, 16, "auto", "bfloat16")
    assert plan["block_size"] == 16
    assert any("not derivable" in note for note in plan["notes"])


def test_mamba_page_bytes_none_for_attention_models():
    assert mamba_page_bytes(None, 1, "bfloat16") is None
