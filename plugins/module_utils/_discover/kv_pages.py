# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KV-cache page planning (pure): the token-block size vLLM will use and the padded page bytes.

Rules (docs/vllm-requirements.md, "KV page size", which names the vLLM files they are read from):

* plain attention, per layer per token: ``2 * kv_heads_per_gpu * head_dim * dtype_bytes`` with
  ``kv_heads_per_gpu = max(1, num_kv_heads // tp)``;
* MLA: one latent head of ``kv_lora_rank + qk_rope_head_dim``, no V, not split by TP
  (``fp8_ds_mla``: 656 bytes per token);
* hybrid attention + Mamba/linear attention: the attention block grows until one attention page holds one
  Mamba state page, ``attn_block = align * ceil(mamba_page / (align * attn_bytes_per_token))`` (align 16,
  64 for MLA), the block size becomes ``max(requested, attn_block)`` and the Mamba page is padded to
  ``block_size * attn_bytes_per_token``.
"""

from __future__ import annotations

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
}

FP8_DS_MLA_BYTES_PER_TOKEN = 656

ATTENTION_ALIGN = 16

MLA_ATTENTION_ALIGN = 64


# Cache dtypes that are a layout of MLA's latent record, not an element type: vLLM lists fp8_ds_mla only in the
# kv-cache dtypes of MLA attention backends (vllm/v1/attention/backends/mla/flashmla_sparse.py,
# FlashMLASparseBackend.supported_kv_cache_dtypes; read at vLLM main, 2026). Every backend of plain attention
# leaves it out, so vLLM's backend selection (AttentionBackend.validate_configuration in
# vllm/v1/attention/backend.py) reports "kv_cache_dtype not supported" for it and the engine does not start.
MLA_ONLY_CACHE_DTYPES = ("fp8_ds_mla",)


def check_cache_dtype(geometry, kv_cache_dtype):
    """Refuse a cache dtype the model's attention cannot take (ValueError saying why and the fix)."""
    name = _dtype_name(kv_cache_dtype)
    if name in MLA_ONLY_CACHE_DTYPES and not geometry.get("mla"):
        raise ValueError(
            f"the KV cache dtype {name} is the latent-cache layout of MLA attention (DeepSeek-V2/V3, Kimi-K2: a "
            "kv_lora_rank in config.json), and vLLM offers it only to MLA attention backends (a backend of plain "
            "attention refuses it with 'kv_cache_dtype not supported'); this model has plain attention (no "
            "kv_lora_rank): set NARWHAL_KV_CACHE_DTYPE=auto, or fp8 for an 8-bit KV cache, then rerun discovery"
        )


def _cdiv(a, b):
    return -(-a // b)


def _dtype_name(value):
    if value is None:
        return None
    text = str(value).strip().lower()
    if text.startswith("torch."):
        text = text[len("torch.") :]
    return _DTYPE_ALIASES.get(text, text)


def dtype_bytes(kv_cache_dtype, model_dtype):
    """Bytes per element: ``auto`` -> the model dtype; ``fp8*`` -> 1; bf16/fp16 -> 2; fp32 -> 4."""
    name = _dtype_name(kv_cache_dtype) or "auto"
    if name == "auto":
        name = _dtype_name(model_dtype)
        if name is None:
            raise ValueError(
                "kv_cache_dtype is 'auto' but the model dtype is unknown; set the KV cache dtype explicitly"
            )
    if name.startswith("fp8"):
        return 1
    if name in DTYPE_BYTES:
        return DTYPE_BYTES[name]
    raise ValueError(
        f"unsupported dtype {name!r} for the KV cache (use auto, bfloat16, float16, float32 or an fp8 variant)"
    )


def _state_bytes(dtype, model_dtype):
    return DTYPE_BYTES.get(_dtype_name(dtype) or _dtype_name(model_dtype) or "bfloat16", 2)


def mamba_page_bytes(mamba, tp, model_dtype):
    """Bytes of one sequence's SSM/linear-attention state in one layer on one GPU; None when not derivable.

    Shapes follow vLLM's ``MambaStateShapeCalculator`` (conv state in the model dtype, the temporal/SSM
    state in ``ssm_cache_dtype`` when the config sets it).
    """
    if not mamba:
        return None
    kind = mamba.get("kind")
    conv_bytes = _state_bytes(None, model_dtype)
    ssm_bytes = _state_bytes(mamba.get("ssm_cache_dtype"), model_dtype)
    d_conv = mamba.get("d_conv")
    try:
        if kind == "mamba2":
            n_groups = mamba["n_groups"] or 1
            if n_groups % tp:
                n_groups = tp  # vLLM replicates the (single) group up to TP
            conv_dim = mamba["intermediate_size"] + 2 * n_groups * mamba["d_state"]
            conv = (conv_dim // tp) * (d_conv - 1)
            ssm = (mamba["n_heads"] // tp) * mamba["head_dim"] * mamba["d_state"]
            return conv * conv_bytes + ssm * ssm_bytes
        if kind == "mamba1":
            inner = mamba["intermediate_size"] // tp
            return inner * (d_conv - 1) * conv_bytes + inner * mamba["d_state"] * ssm_bytes
        if kind == "gated_delta_net":
            conv_dim = mamba["head_k_dim"] * mamba["n_k_heads"] * 2 + mamba["head_dim"] * mamba["n_heads"]
            conv = (conv_dim // tp) * (d_conv - 1)
            temporal = (mamba["n_heads"] // tp) * mamba["head_k_dim"] * mamba["head_dim"]
            return conv * conv_bytes + temporal * ssm_bytes
        if kind == "short_conv":
            return (mamba["intermediate_size"] // tp) * (d_conv - 1) * conv_bytes
        if kind == "kda":
            proj = (mamba["n_heads"] * mamba["head_dim"]) // tp
            conv = 3 * proj * (d_conv - 1)  # q, k and v conv states
            recurrent = (mamba["n_heads"] // tp) * mamba["head_dim"] * mamba["head_dim"]
            return conv * conv_bytes + recurrent * 4  # recurrent state kept in float32
    except (KeyError, TypeError):
        return None
    return None


def kv_cache_pages(geometry, tp, block_size, kv_cache_dtype, model_dtype):
    """Plan one engine's KV cache pages.

    Returns ``bytes_per_token_per_layer``, ``requested_block_size``, ``block_size`` (adjusted),
    ``page_bytes`` (padded page of one block in one layer on one GPU), ``kv_heads_per_gpu``, ``notes`` and,
    for reference, ``dtype_bytes``, ``attention_align``, ``mamba_page_bytes`` and ``mamba_page_bytes_padded``.
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor parallel size must be a positive integer, got {tp!r}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block size must be a positive integer, got {block_size!r}")
    notes = []
    if _dtype_name(kv_cache_dtype) in (None, "auto") and _dtype_name(model_dtype) is None:
        model_dtype = "bfloat16"
        notes.append("model dtype unknown: vLLM's 'auto' resolves it to bfloat16 on current GPUs; assumed bfloat16")
    check_cache_dtype(geometry, kv_cache_dtype)
    elem = dtype_bytes(kv_cache_dtype, model_dtype)
    mla = bool(geometry.get("mla"))
    mamba = geometry.get("mamba")
    attention_layers = geometry.get("num_attention_layers")
    if attention_layers is None:
        attention_layers = geometry.get("num_layers")

    if mla:
        per_token, kv_heads_per_gpu, align = _mla_attention(geometry, kv_cache_dtype, elem, notes)
    else:
        per_token, kv_heads_per_gpu, align = _plain_attention(geometry, tp, elem, notes)

    result = {
        "bytes_per_token_per_layer": per_token,
        "requested_block_size": block_size,
        "block_size": block_size,
        "page_bytes": block_size * per_token,
        "kv_heads_per_gpu": kv_heads_per_gpu,
        "dtype_bytes": elem,
        "attention_align": align,
        "mamba_page_bytes": None,
        "mamba_page_bytes_padded": None,
        "notes": notes,
    }
    if not mamba:
        return result
    return _pad_for_mamba(result, mamba, tp, model_dtype, attention_layers, mla)


def _mla_attention(geometry, kv_cache_dtype, elem, notes):
    """MLA's (bytes per token per layer, KV heads per GPU, block alignment): one latent head, not split by TP."""
    kv_heads_per_gpu = 1
    latent = (geometry.get("kv_lora_rank") or 0) + (geometry.get("qk_rope_head_dim") or 0)
    if latent <= 0:
        raise ValueError("MLA geometry needs kv_lora_rank and qk_rope_head_dim")
    if _dtype_name(kv_cache_dtype) == "fp8_ds_mla":
        per_token = FP8_DS_MLA_BYTES_PER_TOKEN
        notes.append("fp8_ds_mla: 656 bytes per token (512 fp8 latent + scales + 64 bf16 rope)")
    else:
        per_token = latent * elem
    notes.append(f"MLA: one latent KV head of {latent}, shared by all TP ranks (not split by TP)")
    return per_token, kv_heads_per_gpu, MLA_ATTENTION_ALIGN


def _plain_attention(geometry, tp, elem, notes):
    """Plain attention's (bytes per token per layer, KV heads per GPU, block alignment): K and V of the KV heads
    one GPU holds."""
    num_kv_heads = geometry.get("num_kv_heads")
    head_dim = geometry.get("head_dim")
    if not num_kv_heads or not head_dim:
        raise ValueError("geometry needs num_kv_heads and head_dim")
    kv_heads_per_gpu = max(1, num_kv_heads // tp)
    if num_kv_heads < tp:
        notes.append(f"{num_kv_heads} KV heads < TP {tp}: each KV head is replicated on {tp // num_kv_heads} GPUs")
    elif num_kv_heads % tp:
        notes.append(f"{num_kv_heads} KV heads are not divisible by TP {tp}; vLLM will refuse this TP size")
    per_token = 2 * kv_heads_per_gpu * head_dim * elem
    return per_token, kv_heads_per_gpu, ATTENTION_ALIGN


def _pad_for_mamba(result, mamba, tp, model_dtype, attention_layers, mla):
    """A hybrid attention + Mamba model: `result` (kv_cache_pages's plan of the attention pages) with the block
    size raised until one attention page holds one Mamba state page, and the Mamba page padded to it (the block size
    left as requested when the state shape is not derivable; one state page per sequence without attention)."""
    notes, align = result["notes"], result["attention_align"]
    per_token, block_size = result["bytes_per_token_per_layer"], result["requested_block_size"]
    mamba_page = mamba_page_bytes(mamba, tp, model_dtype)
    result["mamba_page_bytes"] = mamba_page
    if mamba_page is None:
        notes.append(
            f"Mamba state shape of kind {mamba.get('kind')!r} not derivable from the config; "
            "block size left as requested"
        )
        return result
    if not attention_layers:
        result.update(bytes_per_token_per_layer=0, page_bytes=mamba_page, mamba_page_bytes_padded=mamba_page)
        notes.append("attention-free model: one state page per sequence; vLLM sizes the block to max_model_len")
        return result
    attn_block = align * _cdiv(mamba_page, align * per_token)
    if mla:
        notes.append(f"MLA hybrid: alignment {align} assumed; vLLM >= 0.33 takes it from the attention backend")
    adjusted = max(block_size, attn_block)
    if adjusted != block_size:
        notes.append(
            f"hybrid attention+Mamba: block size raised from {block_size} to {adjusted} tokens so one attention "
            f"page ({per_token} B/token) holds one Mamba state page ({mamba_page} B); P and D must use the same "
            "block size"
        )
    result["block_size"] = adjusted
    result["page_bytes"] = adjusted * per_token
    result["mamba_page_bytes_padded"] = adjusted * per_token
    return result
