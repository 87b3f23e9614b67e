# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model facts: every real config.json (copied into a checkpoint dir, read by
plugins/module_utils/_facts/checkpoint.py), the geometry rules (plugins/module_utils/_facts/model.py), and the module
(plugins/modules/model_facts.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from test_support.model import MODELS, checkpoint

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import checkpoint as _checkpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import model as _model
from ansible_collections.narwhal.deploy.plugins.modules import model_facts

# src: (dtype, model_type, trust_remote_code, auto_map_sources, ssm_conv_state, quantization,
#       (num_layers, num_attention_layers, num_kv_heads, head_dim, mla, kv_lora_rank, qk_rope_head_dim),
#       mamba kind or None)
EXPECTED = {
    "YouZiSoftware__lzlv_70b_fp16_hf": (
        "float16",
        "llama",
        False,
        [],
        False,
        None,
        (80, 80, 8, 128, False, None, None),
        None,
    ),
    "aiconf__Qwen--Qwen2.5-7B": (
        "bfloat16",
        "qwen2",
        False,
        [],
        False,
        None,
        (28, 28, 4, 128, False, None, None),
        None,
    ),
    "aiconf__Qwen--Qwen3-Next-80B-A3B-Thinking": (
        "bfloat16",
        "qwen3_next",
        False,
        [],
        True,
        None,
        (48, 12, 2, 256, False, None, None),  # full_attention_interval 4
        "gated_delta_net",
    ),
    "aiconf__deepseek-ai--DeepSeek-R1-Distill-Qwen-32B": (
        "bfloat16",
        "qwen2",
        False,
        [],
        False,
        None,
        (64, 64, 8, 128, False, None, None),
        None,
    ),
    "aiconf__meta-llama--Meta-Llama-3.1-8B": (
        "bfloat16",
        "llama",
        False,
        [],
        False,
        None,
        (32, 32, 8, 128, False, None, None),
        None,
    ),
    "aiconf__mistralai--Mixtral-8x7B-v0.1": (
        "bfloat16",
        "mixtral",
        False,
        [],
        False,
        None,
        (32, 32, 8, 128, False, None, None),
        None,
    ),
    "aiconf__moonshotai--Kimi-K2-Instruct": (
        "bfloat16",
        "kimi_k2",
        True,
        ["config.json"],
        False,
        "fp8",
        (61, 61, 1, 576, True, 512, 64),  # MLA: one latent head of 512 + 64
        None,
    ),
    "aiconf__nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (
        "bfloat16",
        "nemotron_h",
        True,
        ["config.json"],
        True,
        None,
        (52, 6, 2, 128, False, None, None),  # 6 '*' in hybrid_override_pattern
        "mamba2",
    ),
    "aiconf__nvidia--Nemotron-H-56B-Base-8K": (
        "bfloat16",
        "nemotron_h",
        True,
        ["config.json"],
        True,
        None,
        (118, 10, 8, 128, False, None, None),  # 10 '*'; head_dim from attention_head_dim
        "mamba2",
    ),
    "aiconf__openai--gpt-oss-20b": (
        None,  # no torch_dtype / dtype at all
        "gpt_oss",
        False,
        [],
        False,
        "mxfp4",
        (24, 24, 8, 64, False, None, None),  # sliding and full layers both hold KV
        None,
    ),
    "fetchwiki__LiquidAI-LFM2-1.2B": (
        "bfloat16",
        "lfm2",
        False,
        [],
        True,
        None,
        (16, 6, 8, 64, False, None, None),  # full_attn_idxs has 6 entries; head_dim 2048 / 32
        "short_conv",
    ),
    "fetchwiki__mistralai-Devstral-Small-2507": (
        "bfloat16",
        "mistral",
        False,
        [],
        False,
        None,
        (40, 40, 8, 128, False, None, None),
        None,
    ),
    "helpy__DeepSeek-V3": (
        "bfloat16",
        "deepseek_v3",
        True,
        ["config.json"],
        False,
        "fp8",
        (61, 61, 1, 576, True, 512, 64),
        None,
    ),
    "jeevanchaps__Llama-3.1-8B-Instruct-bnb8bit": (
        "float16",
        "llama",
        False,
        [],
        False,
        "bitsandbytes",
        (32, 32, 8, 128, False, None, None),
        None,
    ),
    "stvlynn__Qwen-7B-Chat-Cantonese": (
        "float16",
        "qwen",
        True,
        ["config.json", "tokenizer_config.json"],
        False,
        None,
        (32, 32, 32, 128, False, None, None),  # no kv-head key: MHA; head_dim from kv_channels
        None,
    ),
    "syjjhl__chatglm2-6b": (
        "float16",
        "chatglm",
        True,
        ["config.json", "tokenizer_config.json"],
        False,
        None,
        (28, 28, 2, 128, False, None, None),  # num_layers, multi_query_group_num, kv_channels
        None,
    ),
    "troy12x__quasar-kimi__Kimi-Linear": (
        "bfloat16",  # the new "dtype" key
        "kimi_linear",
        True,
        ["config.json"],
        True,  # linear_attn_config.short_conv_kernel_size
        None,
        (27, 7, 1, 576, True, 512, 64),  # 7 full_attn_layers (MLA), 20 KDA layers
        "kda",
    ),
}


def test_every_model_config_has_expectations():
    sources = sorted(p.name[: -len("__config.json")] for p in MODELS.glob("*__config.json"))
    assert sources == sorted(list(EXPECTED) + ["Zyphra__Zamba2__native-non-HF"])


@pytest.mark.parametrize("src", sorted(EXPECTED))
def test_read_checkpoint(tmp_path, src):
    dtype, model_type, trust, sources, ssm, quant, geometry, mamba_kind = EXPECTED[src]
    path = checkpoint(tmp_path, src)
    facts = _checkpoint.read_checkpoint(str(path))
    assert facts["path"] == str(path)
    assert facts["dtype"] == dtype
    assert facts["model_type"] == model_type
    assert facts["trust_remote_code"] is trust
    assert facts["auto_map_sources"] == sources
    assert facts["ssm_conv_state"] is ssm
    assert facts["quantization"] == quant
    assert facts["config_sha256"] == hashlib.sha256((MODELS / (f"{src}__config.json")).read_bytes()).hexdigest()
    geo = facts["kv_geometry"]
    got = (
        geo["num_layers"],
        geo["num_attention_layers"],
        geo["num_kv_heads"],
        geo["head_dim"],
        geo["mla"],
        geo["kv_lora_rank"],
        geo["qk_rope_head_dim"],
    )
    assert got == geometry
    assert (geo["mamba"] or {}).get("kind") == mamba_kind
    assert isinstance(facts["architectures"], list) and facts["architectures"]


def test_mamba_details(tmp_path):
    nano = _checkpoint.read_checkpoint(str(checkpoint(tmp_path, "aiconf__nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")))
    assert nano["kv_geometry"]["mamba"] == {
        "kind": "mamba2",
        "d_conv": 4,
        "d_state": 128,
        "n_heads": 64,
        "head_dim": 64,
        "n_groups": 8,
        "expand": 2,
        "intermediate_size": 4096,  # mamba_num_heads * mamba_head_dim, not expand * hidden_size (5376)
        "num_layers": 23,
        "ssm_cache_dtype": "float32",
    }
    big = _model.kv_geometry(json.loads((MODELS / "aiconf__nvidia--Nemotron-H-56B-Base-8K__config.json").read_text()))
    assert (big["mamba"]["intermediate_size"], big["mamba"]["num_layers"], big["mamba"]["d_state"]) == (16384, 54, 256)
    qwen = _model.kv_geometry(
        json.loads((MODELS / "aiconf__Qwen--Qwen3-Next-80B-A3B-Thinking__config.json").read_text())
    )
    mamba = qwen["mamba"]
    assert (mamba["d_conv"], mamba["n_heads"], mamba["head_dim"], mamba["n_k_heads"], mamba["head_k_dim"]) == (
        4,
        32,
        128,
        16,
        128,
    )
    assert mamba["num_layers"] == 36
    lfm = _model.kv_geometry(json.loads((MODELS / "fetchwiki__LiquidAI-LFM2-1.2B__config.json").read_text()))
    assert (lfm["mamba"]["d_conv"], lfm["mamba"]["intermediate_size"], lfm["mamba"]["num_layers"]) == (3, 2048, 10)
    kimi = _model.kv_geometry(json.loads((MODELS / "troy12x__quasar-kimi__Kimi-Linear__config.json").read_text()))
    assert (
        kimi["mamba"]["d_conv"],
        kimi["mamba"]["n_heads"],
        kimi["mamba"]["head_dim"],
        kimi["mamba"]["num_layers"],
    ) == (
        4,
        32,
        128,
        20,
    )


def test_tokenizer_files(tmp_path):
    path = checkpoint(
        tmp_path, "jeevanchaps__Llama-3.1-8B-Instruct-bnb8bit", ["tokenizer.json", "special_tokens_map.json"]
    )
    (path / "model.safetensors").write_text("")
    assert _checkpoint.read_checkpoint(str(path))["tokenizer_files"] == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    qwen = checkpoint(tmp_path, "stvlynn__Qwen-7B-Chat-Cantonese", ["qwen.tiktoken"])
    assert _checkpoint.read_checkpoint(str(qwen))["tokenizer_files"] == ["qwen.tiktoken", "tokenizer_config.json"]


def test_auto_map_only_in_tokenizer_config(tmp_path):
    path = checkpoint(tmp_path, "aiconf__meta-llama--Meta-Llama-3.1-8B")
    shutil.copyfile(MODELS / "syjjhl__chatglm2-6b__tokenizer_config.json", path / "tokenizer_config.json")
    facts = _checkpoint.read_checkpoint(str(path))
    assert (facts["trust_remote_code"], facts["auto_map_sources"]) == (True, ["tokenizer_config.json"])


@pytest.mark.parametrize(
    "value, expected",
    [
        ("bfloat16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("float16", "float16"),
        ("torch.float16", "float16"),
        ("fp16", "float16"),
        ("half", "float16"),
        ("float32", "float32"),
        ("fp32", "float32"),
        ("float", "float32"),
        ("float8_e4m3fn", "float8_e4m3fn"),
        (None, None),
        ("", None),
        (True, None),
    ],
)
def test_normalize_dtype(value, expected):
    assert _model.normalize_dtype(value) == expected


def test_nested_text_config():
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "torch_dtype": "torch.bfloat16",
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_conv_kernel_dim": 4,
            "layer_types": ["linear_attention"] * 3
            + ["full_attention"]
            + ["linear_attention"] * 3
            + ["full_attention"],
        },
    }
    assert _model.find_dtype(config) == "bfloat16"
    assert _model.ssm_conv_state(config) is True
    geo = _model.kv_geometry(config)
    assert (geo["num_layers"], geo["num_attention_layers"], geo["num_kv_heads"], geo["head_dim"]) == (8, 2, 2, 256)
    assert geo["mamba"]["kind"] == "gated_delta_net"


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": 2, "mamba_d_conv": 4}, 2),  # Jamba
        ({"num_hidden_layers": 6, "layers_block_type": ["mamba", "mamba", "hybrid"] * 2}, 2),  # Zamba2 (HF)
        ({"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "attention"]}, 2),  # Granite-4.0-H
        ({"num_hidden_layers": 5, "attn_layer_indices": [2]}, 1),  # Bamba
        ({"num_hidden_layers": 4, "attn_type_list": [0, 0, 0, 1]}, 1),  # MiniMax lightning attention
        ({"num_hidden_layers": 3}, 3),
    ],
)
def test_attention_layer_rules(config, expected):
    assert _model.kv_geometry(dict(config, model_type="x"))["num_attention_layers"] == expected


def test_conv_kernel_none_is_not_ssm():
    assert _model.ssm_conv_state({"model_type": "x", "conv_kernel": None}) is False


def test_qwen_v1_flags_without_dtype():
    assert _model.find_dtype({"bf16": True, "fp16": False}) == "bfloat16"
    assert _model.find_dtype({"bf16": True, "fp16": True}) is None


# ------------------------------------------------------------------------------------------------
# errors


def test_non_hf_config(tmp_path):
    path = checkpoint(tmp_path, "Zyphra__Zamba2__native-non-HF")
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(path))
    assert str(path / "config.json") in str(info.value)
    assert "not a Hugging Face config" in str(info.value)


def test_missing_directory(tmp_path):
    with pytest.raises(_model.ModelConfigError, match="does not exist"):
        _checkpoint.read_checkpoint(str(tmp_path / "nope"))


def test_path_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(_model.ModelConfigError, match="not a directory"):
        _checkpoint.read_checkpoint(str(tmp_path / "file"))


def test_missing_config(tmp_path):
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(tmp_path))
    assert str(tmp_path / "config.json") in str(info.value)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
def test_invalid_json(tmp_path, name):
    path = checkpoint(tmp_path, "aiconf__Qwen--Qwen2.5-7B")
    (path / name).write_text('{"model_type": "qwen2",')
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(path))
    assert str(path / name) in str(info.value) and "not valid JSON" in str(info.value)


def test_config_that_is_a_list(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(_model.ModelConfigError, match="not a Hugging Face config"):
        _checkpoint.read_checkpoint(str(tmp_path))


# ------------------------------------------------------------------------------------------------
# the module


@pytest.fixture
def run_module(module_runner):
    return lambda args: module_runner(model_facts.main, args)


def test_module(run_module, tmp_path):
    path = checkpoint(tmp_path, "syjjhl__chatglm2-6b")
    how, result = run_module({"path": str(path)})
    assert how == "exit", result
    assert result["changed"] is False
    facts = result["ansible_facts"]["narwhal_model"]
    assert facts["path"] == str(path)
    assert (facts["dtype"], facts["model_type"], facts["architectures"]) == ("float16", "chatglm", ["ChatGLMModel"])
    assert facts["trust_remote_code"] is True
    assert facts["kv_geometry"]["num_kv_heads"] == 2


def test_module_non_hf(run_module, tmp_path):
    path = checkpoint(tmp_path, "Zyphra__Zamba2__native-non-HF")
    how, result = run_module({"path": str(path)})
    assert how == "fail"
    assert "is not a Hugging Face config" in result["msg"] and str(path) in result["msg"]


def test_module_missing_path(run_module, tmp_path):
    how, result = run_module({"path": str(tmp_path / "missing")})
    assert how == "fail"
    assert str(tmp_path / "missing") in result["msg"]


def test_module_requires_path(run_module):
    how, result = run_module({})
    assert how == "fail"
    assert "path" in result["msg"]


@pytest.mark.parametrize("patch,where", [
    ({"num_key_value_heads": -8}, "num_key_value_heads is -8"),
    ({"num_attention_heads": 0}, "num_attention_heads is 0"),
    ({"num_hidden_layers": 1.5}, "num_hidden_layers is 1.5"),
    ({"head_dim": float("inf")}, "head_dim is inf"),
    ({"text_config": {"num_key_value_heads": -1}}, "text_config.num_key_value_heads is -1"),
    ({"qk_rope_head_dim": -64}, "qk_rope_head_dim is -64"),
])
def test_negative_or_zero_counts_are_refused_naming_file_and_key(tmp_path, patch, where):
    """Issue 13, class 4: a damaged config.json never reaches the cache plan or the P/D gate."""
    path = checkpoint(tmp_path, "YouZiSoftware__lzlv_70b_fp16_hf")
    config = json.loads((path / "config.json").read_text())
    config.update(patch)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(_model.ModelConfigError) as err:
        _checkpoint.read_checkpoint(str(path))
    assert str(err.value).startswith("%s: %s" % (path / "config.json", where))
    assert "must be a whole number of at least" in str(err.value)


# ------------------------------------------------------------------------------------------------
# hostile paths and files: named errors, never a hang or "does not exist" (issue 13, class 6)


def _fifo(path):
    os.mkfifo(path)
    return path


def _loop(path):
    os.symlink(path.name, path)  # a link to itself
    return path


@pytest.mark.parametrize(
    "make, needle",
    [
        (_fifo, "is a FIFO, not a checkpoint directory"),
        (_loop, "is a symlink loop"),
        (lambda p: (os.symlink(p.parent / "gone", p), p)[1], "is a symlink to"),
    ],
    ids=["fifo", "symlink-loop", "dangling-link"],
)
def test_model_path_that_is_no_directory_is_named(tmp_path, make, needle):
    path = make(tmp_path / "model")
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(path))
    assert needle in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("make, needle", [(_fifo, "is a FIFO, not a regular file"), (_loop, "is a symlink loop")],
                         ids=["fifo", "symlink-loop"])
def test_checkpoint_file_that_is_a_fifo_or_loop_is_named(tmp_path, name, make, needle):
    path = checkpoint(tmp_path, "aiconf__Qwen--Qwen2.5-7B")
    (path / name).unlink(missing_ok=True)
    make(path / name)
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(path))  # would block forever if it opened the FIFO
    assert needle in str(info.value) and str(path / name) in str(info.value)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deeply_nested_json_is_named(tmp_path, name, opener):
    path = checkpoint(tmp_path, "aiconf__Qwen--Qwen2.5-7B")
    (path / name).write_text(opener * 200000)
    with pytest.raises(_model.ModelConfigError) as info:
        _checkpoint.read_checkpoint(str(path))
    assert str(path / name) in str(info.value) and "is nested too deeply to be a model configuration" in str(info.value)


def test_module_fifo_model_path(run_module, tmp_path):
    path = _fifo(tmp_path / "model")
    how, result = run_module({"path": str(path)})
    assert how == "fail"
    assert result["msg"] == (f"model path {path} is a FIFO, not a checkpoint directory; point the model path at the "
                             "checkpoint directory that holds config.json")


@pytest.mark.parametrize("patch,where,kind", [
    ({"num_attention_heads": "32"}, "num_attention_heads is '32'", "a string"),
    ({"num_key_value_heads": "8"}, "num_key_value_heads is '8'", "a string"),
    ({"num_hidden_layers": True}, "num_hidden_layers is True", "true/false"),
    ({"head_dim": [128]}, "head_dim is [128]", "a list"),
    ({"hidden_size": {"value": 8192}}, "hidden_size is {'value': 8192}", "an object"),
    ({"text_config": {"num_attention_heads": "64"}}, "text_config.num_attention_heads is '64'", "a string"),
    ({"qk_rope_head_dim": "64"}, "qk_rope_head_dim is '64'", "a string"),
])
def test_geometry_that_is_no_json_number_is_refused_by_field(tmp_path, patch, where, kind):
    """Issue 24: a config.json whose sizes are strings (or true/false, lists, objects) never reaches the cache plan
    or the P/D gate; the refusal names the file and the field."""
    path = checkpoint(tmp_path, "YouZiSoftware__lzlv_70b_fp16_hf")
    config = json.loads((path / "config.json").read_text())
    config.update(patch)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(_model.ModelConfigError) as err:
        _checkpoint.read_checkpoint(str(path))
    assert str(err.value).startswith("%s: %s (%s)" % (path / "config.json", where, kind)), str(err.value)
    assert "must be a JSON number" in str(err.value) and "restore config.json" in str(err.value)


@pytest.mark.parametrize("patch", [{"head_dim": None}, {"num_key_value_heads": 8.0}, {"text_config": None}])
def test_geometry_null_or_integral_float_still_passes(tmp_path, patch):
    """null is what save_pretrained writes for an unset attribute; 8.0 is a whole number."""
    path = checkpoint(tmp_path, "YouZiSoftware__lzlv_70b_fp16_hf")
    config = json.loads((path / "config.json").read_text())
    config.update(patch)
    (path / "config.json").write_text(json.dumps(config))
    facts = _checkpoint.read_checkpoint(str(path))
    assert facts["kv_geometry"]["num_kv_heads"] == 8


# The checkpoint's own bound on a sequence (_facts/model.py::config_max_len): the smallest of the config's length keys
# and the tokenizer's model_max_length, read from each real config (and its tokenizer_config where captured)
MAX_LEN_EXPECTED = {
    "YouZiSoftware__lzlv_70b_fp16_hf": 4096,
    "aiconf__Qwen--Qwen2.5-7B": 131072,
    "aiconf__Qwen--Qwen3-Next-80B-A3B-Thinking": 262144,
    "aiconf__deepseek-ai--DeepSeek-R1-Distill-Qwen-32B": 131072,
    "aiconf__meta-llama--Meta-Llama-3.1-8B": 131072,
    "aiconf__mistralai--Mixtral-8x7B-v0.1": 32768,
    "aiconf__moonshotai--Kimi-K2-Instruct": 131072,
    "aiconf__nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 262144,
    "aiconf__nvidia--Nemotron-H-56B-Base-8K": 8192,
    "aiconf__openai--gpt-oss-20b": 131072,
    "fetchwiki__LiquidAI-LFM2-1.2B": 128000,  # the tokenizer's 1e30 "no limit" does not lower it
    "fetchwiki__mistralai-Devstral-Small-2507": 131072,
    "helpy__DeepSeek-V3": 131072,  # max_position_embeddings 163840, the tokenizer's model_max_length 131072
    "jeevanchaps__Llama-3.1-8B-Instruct-bnb8bit": 131072,
    "stvlynn__Qwen-7B-Chat-Cantonese": 8192,  # max_position_embeddings 32768 but seq_length 8192
    "syjjhl__chatglm2-6b": 32768,  # seq_length only; the tokenizer names no model_max_length
    "troy12x__quasar-kimi__Kimi-Linear": None,  # no length key at all
}


def test_every_model_config_has_a_length_expectation():
    assert sorted(MAX_LEN_EXPECTED) == sorted(EXPECTED)


@pytest.mark.parametrize("src", sorted(MAX_LEN_EXPECTED))
def test_max_model_len_of_the_real_configs(tmp_path, src):
    assert _checkpoint.read_checkpoint(str(checkpoint(tmp_path, src)))["max_model_len"] == MAX_LEN_EXPECTED[src]


def test_max_model_len_of_a_nested_text_config_and_odd_values():
    assert _model.config_max_len({"text_config": {"max_position_embeddings": 4096}, "max_position_embeddings": 1})\
        == 4096
    assert _model.config_max_len({"max_position_embeddings": True, "n_positions": -1, "seq_len": "2048"}) is None
    assert _model.config_max_len({"max_position_embeddings": 4096}, {"model_max_length": 1024}) == 1024
