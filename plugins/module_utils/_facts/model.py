# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint metadata from a Hugging Face config: dtype, remote-code need, SSM conv state, KV geometry.
Pure functions over parsed JSON; the checkpoint directory is read by _facts/checkpoint.py.
"""

from __future__ import annotations

import hashlib
import math
import os

TOKENIZER_FILE_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tokenizer.tiktoken",
    "tekken.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "qwen.tiktoken",
    "ice_text.model",
)

_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


class ModelConfigError(ValueError):
    """Raised for a checkpoint that cannot be described; the message names the file and the fix."""


# Counts and sizes of the model's layers, heads and caches that the KV geometry is computed from: when present
# (not null) they must be JSON numbers, whole and at least 1 (a string, 0 or a negative value would give a
# nonsensical cache plan and P/D gate), qk_rope_head_dim at least 0.
POSITIVE_GEOMETRY_KEYS = (
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_attention_heads", "n_head", "n_heads",
    "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "head_dim", "attention_head_dim",
    "kv_channels", "hidden_size", "d_model", "n_embd", "kv_lora_rank", "linear_num_value_heads",
    "linear_value_head_dim", "linear_num_key_heads", "linear_key_head_dim", "mamba_n_heads", "mamba_num_heads",
    "mamba_d_head", "mamba_head_dim",
)

NON_NEGATIVE_GEOMETRY_KEYS = ("qk_rope_head_dim",)


# --------------------------------------------------------------------------------------------------
# small helpers


def normalize_dtype(value):
    """``torch.bfloat16`` / ``bf16`` / ``BFloat16`` -> ``bfloat16``; ``half`` -> ``float16``; None stays None.

    Unknown spellings are returned lower-cased without a ``torch.`` prefix.
    """
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text.startswith("torch."):
        text = text[len("torch.") :]
    if not text:
        return None
    return _DTYPE_ALIASES.get(text, text)


def _text_config(config):
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else {}


def _merged(config):
    """The text model's view: nested ``text_config`` values over the top level."""
    merged = dict(config)
    merged.update(_text_config(config))
    return merged


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _first_int(config, *keys):
    for key in keys:
        value = _int(config.get(key))
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------------------------------
# facts


def find_dtype(config):
    """Weights dtype from ``dtype``/``torch_dtype`` (top level, then ``text_config``), normalised."""
    for source in (config, _text_config(config)):
        for key in ("dtype", "torch_dtype"):
            value = normalize_dtype(source.get(key))
            if value is not None:
                return value
    # original Qwen (remote code) also records bf16/fp16/fp32 booleans
    flags = [
        name
        for name, key in (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"))
        if config.get(key) is True
    ]
    if len(flags) == 1:
        return flags[0]
    return None


def has_auto_map(document):
    """True when a parsed config/tokenizer_config carries a non-empty ``auto_map``."""
    return isinstance(document, dict) and bool(document.get("auto_map"))


def ssm_conv_state(config):
    """True when the (text) config has a convolutional SSM state key (docs/vllm-requirements.md, "Convolutional SSM
    state")."""
    for source in (config, _text_config(config)):
        for key in ("conv_kernel", "mamba_d_conv", "conv_L_cache", "linear_conv_kernel_dim"):
            if source.get(key) is not None:
                return True
        linear = source.get("linear_attn_config")
        if isinstance(linear, dict) and linear.get("short_conv_kernel_size") is not None:
            return True
    return False


def is_hf_config(config):
    return isinstance(config, dict) and (bool(config.get("model_type")) or bool(config.get("architectures")))


def quantization_method(config):
    for source in (config, _text_config(config)):
        quant = source.get("quantization_config")
        if isinstance(quant, dict) and quant.get("quant_method"):
            return str(quant["quant_method"])
    return None


# --------------------------------------------------------------------------------------------------
# KV geometry

_NON_KV_LAYER_TYPES = ("linear_attention", "mamba", "conv", "short_conv", "ssm", "moe", "mlp")


def _is_attention_layer_type(value):
    """``full_attention``/``sliding_attention``/``attention``/``hybrid`` hold a KV cache; linear/mamba/conv do not."""
    if not isinstance(value, str):
        return False
    text = value.lower()
    if "linear" in text or text in _NON_KV_LAYER_TYPES:
        return False
    return "attention" in text or text in ("hybrid", "global", "local", "full", "sliding")


def attention_layer_count(config, num_layers):
    """Layers that hold a KV cache, and the rule that decided it."""
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return sum(1 for item in layer_types if _is_attention_layer_type(item)), "layer_types"
    block_types = config.get("layers_block_type")
    if isinstance(block_types, list) and block_types:
        return sum(1 for item in block_types if _is_attention_layer_type(item)), "layers_block_type"
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*"), "hybrid_override_pattern"
    full_idxs = config.get("full_attn_idxs")
    if isinstance(full_idxs, list):
        return len(full_idxs), "full_attn_idxs"
    linear = config.get("linear_attn_config")
    if isinstance(linear, dict) and isinstance(linear.get("full_attn_layers"), list):
        return len(linear["full_attn_layers"]), "linear_attn_config.full_attn_layers"
    interval = _int(config.get("full_attention_interval"))
    if interval and num_layers:
        return sum(1 for i in range(num_layers) if (i + 1) % interval == 0), "full_attention_interval"
    attn_indices = config.get("attn_layer_indices")
    if isinstance(attn_indices, list):
        return len(attn_indices), "attn_layer_indices"
    period = _int(config.get("attn_layer_period"))
    if period and num_layers:
        offset = _int(config.get("attn_layer_offset")) or 0
        return sum(1 for i in range(num_layers) if i % period == offset), "attn_layer_period"
    attn_types = config.get("attn_type_list")
    if isinstance(attn_types, list) and attn_types:
        return sum(1 for item in attn_types if item == 1), "attn_type_list"
    return num_layers, "all layers"


# The shape of every state layout, in this key order; n_k_heads and head_k_dim only where a layout has them.
_STATE_KEYS = ("kind", "d_conv", "d_state", "n_heads", "head_dim", "n_k_heads", "head_k_dim", "n_groups", "expand",
               "intermediate_size", "num_layers")
_STATE_OPTIONAL = ("n_k_heads", "head_k_dim")


def _state(**values):
    """One layout's state inputs: every key of the shape in its order, None where the layout has no value."""
    return dict((k, values.get(k)) for k in _STATE_KEYS if k in values or k not in _STATE_OPTIONAL)


def _kda_state(config, num_layers, mamba_layers):
    """Kimi Delta Attention (``linear_attn_config`` with a short convolution)."""
    linear = config.get("linear_attn_config")
    if not isinstance(linear, dict) or linear.get("short_conv_kernel_size") is None:
        return None
    kda_layers = linear.get("kda_layers")
    heads = _int(linear.get("num_heads"))
    head_dim = _int(linear.get("head_dim"))
    return _state(kind="kda", d_conv=_int(linear.get("short_conv_kernel_size")), d_state=head_dim, n_heads=heads,
                  head_dim=head_dim, intermediate_size=heads * head_dim if heads and head_dim else None,
                  num_layers=len(kda_layers) if isinstance(kda_layers, list) else mamba_layers)


def _gated_delta_net_state(config, num_layers, mamba_layers):
    """Gated DeltaNet linear attention (``linear_conv_kernel_dim``)."""
    if config.get("linear_conv_kernel_dim") is None:
        return None
    return _state(kind="gated_delta_net", d_conv=_int(config.get("linear_conv_kernel_dim")),
                  n_heads=_int(config.get("linear_num_value_heads")),
                  head_dim=_int(config.get("linear_value_head_dim")),
                  n_k_heads=_int(config.get("linear_num_key_heads")),
                  head_k_dim=_int(config.get("linear_key_head_dim")), num_layers=mamba_layers)


def _short_conv_state(config, num_layers, mamba_layers):
    """Short convolution layers (``conv_L_cache``)."""
    if config.get("conv_L_cache") is None:
        return None
    return _state(kind="short_conv", d_conv=_int(config.get("conv_L_cache")),
                  intermediate_size=_first_int(config, "conv_dim", "hidden_size"), num_layers=mamba_layers)


def _mamba_prefixed_state(config, num_layers, mamba_layers):
    """Mamba layers described by ``mamba_*`` keys (``mamba_d_conv``); Falcon-H1 has mamba in every layer."""
    if config.get("mamba_d_conv") is None:
        return None
    n_heads = _first_int(config, "mamba_n_heads", "mamba_num_heads")
    head_dim = _first_int(config, "mamba_d_head", "mamba_head_dim")
    expand = _first_int(config, "mamba_expand")
    hidden = _first_int(config, "hidden_size")
    intermediate = _first_int(config, "mamba_intermediate_size")
    if intermediate is None:
        intermediate = (
            n_heads * head_dim if n_heads and head_dim else (expand * hidden if expand and hidden else None)
        )
    if str(config.get("model_type") or "") == "falcon_h1":
        mamba_layers = num_layers  # parallel hybrid: every layer has attention and mamba
    return _state(kind="mamba2" if n_heads else "mamba1", d_conv=_int(config.get("mamba_d_conv")),
                  d_state=_first_int(config, "mamba_d_state", "mamba_state_size"), n_heads=n_heads, head_dim=head_dim,
                  n_groups=_first_int(config, "mamba_n_groups", "mamba_ngroups"), expand=expand,
                  intermediate_size=intermediate, num_layers=mamba_layers)


def _conv_kernel_state(config, num_layers, mamba_layers):
    """Mamba layers described by plain keys (``conv_kernel``); a ``hybrid_override_pattern`` counts them (``M``)."""
    if config.get("conv_kernel") is None:
        return None
    n_heads = _first_int(config, "mamba_num_heads", "num_heads")
    head_dim = _first_int(config, "mamba_head_dim", "head_dim") if n_heads else None
    expand = _first_int(config, "expand")
    hidden = _first_int(config, "hidden_size")
    if n_heads and head_dim:
        intermediate = n_heads * head_dim
    else:
        intermediate = _first_int(config, "intermediate_size") or (expand * hidden if expand and hidden else None)
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        mamba_layers = pattern.count("M")
    return _state(kind="mamba2" if n_heads else "mamba1", d_conv=_int(config.get("conv_kernel")),
                  d_state=_first_int(config, "ssm_state_size", "state_size"), n_heads=n_heads, head_dim=head_dim,
                  n_groups=_first_int(config, "n_groups") if n_heads else None, expand=expand,
                  intermediate_size=intermediate, num_layers=mamba_layers)


# The state layouts of SSM / linear-attention layers, in the order they are tried: the first whose key the config
# has describes the model.
_STATE_READERS = (_kda_state, _gated_delta_net_state, _short_conv_state, _mamba_prefixed_state, _conv_kernel_state)


def _mamba_geometry(config, num_layers, num_attention_layers):
    """State-shape inputs of the SSM / linear-attention layers, or None for a pure-attention model."""
    mamba_layers = None
    if num_layers is not None and num_attention_layers is not None:
        mamba_layers = num_layers - num_attention_layers
    for reader in _STATE_READERS:
        state = reader(config, num_layers, mamba_layers)
        if state is not None:
            state["ssm_cache_dtype"] = normalize_dtype(config.get("mamba_ssm_cache_dtype"))
            return state
    return None


def kv_geometry(config):
    """KV-cache geometry of the text model (handles ``text_config`` nesting and ChatGLM's key names)."""
    merged = _merged(config)
    num_layers = _first_int(merged, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
    num_heads = _first_int(merged, "num_attention_heads", "n_head", "n_heads")
    num_kv_heads = _first_int(merged, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    if num_kv_heads is None and merged.get("multi_query_attention") and _int(merged.get("multi_query_group_num")):
        num_kv_heads = _int(merged.get("multi_query_group_num"))  # ChatGLM2/3
    if num_kv_heads is None and merged.get("multi_query") is True:
        num_kv_heads = 1  # Falcon-style MQA
    if num_kv_heads is None:
        num_kv_heads = num_heads
    head_dim = _first_int(merged, "head_dim", "attention_head_dim", "kv_channels")
    hidden = _first_int(merged, "hidden_size", "d_model", "n_embd")
    if head_dim is None and hidden and num_heads:
        head_dim = hidden // num_heads
    kv_lora_rank = _int(merged.get("kv_lora_rank"))
    qk_rope_head_dim = _int(merged.get("qk_rope_head_dim"))
    mla = kv_lora_rank is not None and kv_lora_rank > 0
    if mla:
        # MLA caches one latent "head" of kv_lora_rank + qk_rope_head_dim per token, shared by all heads
        num_kv_heads = 1
        head_dim = kv_lora_rank + (qk_rope_head_dim or 0)
    num_attention_layers, rule = attention_layer_count(merged, num_layers)
    mamba = _mamba_geometry(merged, num_layers, num_attention_layers)
    return {
        "num_layers": num_layers,
        "num_attention_layers": num_attention_layers,
        "attention_layer_rule": rule,
        "num_attention_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "mla": mla,
        "kv_lora_rank": kv_lora_rank if mla else None,
        "qk_rope_head_dim": qk_rope_head_dim if mla else None,
        "sliding_window": _int(merged.get("sliding_window")),
        "mamba": mamba,
    }


def check_geometry_numbers(config, file_path):
    """Refuse a layer, head or size count that is not a whole number >= 1 (>= 0 for qk_rope_head_dim), naming the
    file and the key (top level or text_config). A JSON string ("32"), true/false, a list or an object is no count:
    transformers would keep it as it is and vLLM fail on it, so it is refused too. null is what save_pretrained
    writes for an unset attribute (head_dim: null): the key then counts as absent."""
    for prefix, source in (("", config), ("text_config.", _text_config(config))):
        for key in POSITIVE_GEOMETRY_KEYS + NON_NEGATIVE_GEOMETRY_KEYS:
            value = source.get(key)
            least = 0 if key in NON_NEGATIVE_GEOMETRY_KEYS else 1
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                kind = "true/false" if isinstance(value, bool) else {
                    str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
                raise ModelConfigError(
                    f"{file_path}: {prefix}{key} is {shown} ({kind}), but it counts layers, heads or elements of "
                    f"the model and must be a JSON number, a whole number of at least {least} written without "
                    "quotes; the checkpoint's config is damaged or hand-edited: restore config.json from the "
                    "model's repository (or point the model path at an intact checkpoint)"
                )
            if math.isnan(value) or value < least or (isinstance(value, float) and not value.is_integer()):
                raise ModelConfigError(
                    f"{file_path}: {prefix}{key} is {value!r}, but it counts layers, heads or elements of the "
                    f"model and must be a whole number of at least {least}; the checkpoint's config is damaged or "
                    "not for this model: restore config.json from the model's repository (or point the model path "
                    "at an intact checkpoint)"
                )


# The keys vLLM reads the expert count from, in its order (vLLM 0.32.0
# transformers_utils/model_arch_config_convertor.py:189-205, get_num_experts: num_experts (Jamba, Qwen-MoE),
# moe_num_experts (Dbrx), n_routed_experts (DeepSeek-V2/V3, Kimi-K2), num_local_experts (Mixtral); a list takes its
# first entry; else the largest n_routed_experts of the "moe" block_configs, lines 168-187). ModelConfig.is_moe is
# "more than 0 experts" (config/model.py:2276-2277).
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


def num_experts(config):
    """The routed experts of the text model as vLLM counts them (EXPERT_KEYS); 0 for a dense model."""
    merged = _merged(config if isinstance(config, dict) else {})
    for key in EXPERT_KEYS:
        value = merged.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        value = _int(value)
        if value:
            return max(0, value)
    largest = 0
    for block in merged.get("block_configs") or []:
        if isinstance(block, dict) and block.get("block_type") == "moe":
            largest = max(largest, _int(block.get("n_routed_experts")) or 0)
    return largest


# The config keys vLLM derives its default max_model_len from, the smallest present winning (vllm/config/model.py,
# _get_and_verify_max_len, `possible_keys`; the stand-in engine reads the same: tests/harness/images/engine-standin,
# vllm/standin/server.py MAX_LEN_KEYS), before a RoPE scaling factor (which can only raise it).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                "max_sequence_length", "max_seq_length", "seq_len")


def config_max_len(config, tokenizer_config=None):
    """The longest sequence (prompt and output tokens) the checkpoint allows, as far as its documents say: the smallest
    of the text config's MAX_LEN_KEYS and of the tokenizer's model_max_length (which only shortens it); None when none
    names one. Errs short of the engine's own default rather than past it: vLLM's can only be longer (RoPE scaling)."""
    merged = _merged(config)
    found = [_int(merged.get(key)) for key in MAX_LEN_KEYS]
    if isinstance(tokenizer_config, dict):
        found.append(_int(tokenizer_config.get("model_max_length")))
    found = [value for value in found if value and value > 0]
    return min(found) if found else None


def record_geometry(geometry):
    """The part of :func:`kv_geometry` a launch record keeps (``runtime.model_geometry``) for the P/D gate, named
    as vLLM's ModelConfig reports it to ``compute_nixl_compatibility_hash``: total KV heads, head size (MLA: the
    latent ``kv_lora_rank + qk_rope_head_dim``), hidden layers, sliding window, MLA, and the kind of Mamba /
    linear-attention state (None for a pure-attention model)."""
    geometry = geometry or {}
    return {
        "num_kv_heads": geometry.get("num_kv_heads"),
        "head_size": geometry.get("head_dim"),
        "num_hidden_layers": geometry.get("num_layers"),
        "sliding_window": geometry.get("sliding_window"),
        "use_mla": bool(geometry.get("mla")),
        "ssm_state": (geometry.get("mamba") or {}).get("kind"),
    }


def model_facts(path, config_bytes, config, tokenizer_config, tokenizer_files, config_name="config.json"):
    """``narwhal_model`` facts from already-read documents. Raises ModelConfigError for a non-HF config."""
    if not isinstance(config, dict):
        raise ModelConfigError(
            f"{os.path.join(path, config_name)} is not a Hugging Face config: "
            f"the top level is a {type(config).__name__}, not a JSON object"
        )
    if not is_hf_config(config):
        keys = ", ".join(sorted(config)[:12]) or "none"
        raise ModelConfigError(
            f"{os.path.join(path, config_name)} is not a Hugging Face config: it has neither 'model_type' nor "
            f"'architectures' (keys: {keys}); point the model path at a checkpoint saved in Hugging Face format "
            "(config.json from save_pretrained or the Hub repository)"
        )
    check_geometry_numbers(config, os.path.join(path, config_name))
    sources = []
    if has_auto_map(config):
        sources.append("config.json")
    if has_auto_map(tokenizer_config):
        sources.append("tokenizer_config.json")
    architectures = config.get("architectures") or _text_config(config).get("architectures") or []
    if isinstance(architectures, str):
        architectures = [architectures]
    facts = {
        "path": path,
        "dtype": find_dtype(config),
        "model_type": config.get("model_type") or _text_config(config).get("model_type"),
        "architectures": list(architectures),
        "trust_remote_code": bool(sources),
        "auto_map_sources": sources,
        "ssm_conv_state": ssm_conv_state(config),
        "quantization": quantization_method(config),
        "config_sha256": hashlib.sha256(config_bytes).hexdigest(),
        "tokenizer_files": sorted(tokenizer_files),
        "kv_geometry": kv_geometry(config),
        "max_model_len": config_max_len(config, tokenizer_config),
    }
    experts = num_experts(config)
    if experts:
        # only for a MoE checkpoint, so that the facts (and discovery's inspection extract) of a dense one stay as
        # they were before expert parallelism was an input
        facts["num_experts"] = experts
    return facts
