"""Stand-in of vLLM's NIXL handshake checks (narwhal.deploy test harness): pure functions, stdlib only.

Mirrors, from the released vLLM wheels (0.33.0 unless said otherwise):
- ``compute_nixl_compatibility_hash`` and ``hash_factors`` (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
  metadata.py, vllm/config/utils.py): sha256 of the sorted JSON of the factors; which factors exist depends
  on the version (is_hma_enabled and cross_layers_blocks from 0.19.1, the EAGLE draft and the transfer mode
  from 0.28, cross_layers_blocks gone in 0.32);
- the hash comparison in ``BaseNixlWorker._nixl_handshake`` (base_worker.py) and its message;
- the TP / block-size / layout checks of ``_validate_remote_agent_handshake`` and
  ``TransferTopology.tp_ratio`` / ``block_size_ratio`` (kv_connector/utils.py);
- the default attention backend of each platform (vllm/platforms/{cuda,rocm,cpu}.py), for the data-centre
  GPUs of each platform (the stand-in has no GPU whose capability it could read).
Each side computes its hash from its own command line, environment, platform and mounted model config."""
import hashlib
import json

# NIXL_CONNECTOR_VERSION of the releases read; a release in between takes the closest older one.
CONNECTOR_VERSIONS = [((0, 14, 0), 2), ((0, 22, 0), 4), ((0, 28, 0), 7), ((0, 32, 0), 14), ((0, 33, 0), 15)]
EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")
LAYOUT_ALIASES = {"HND": "HND", "LBHNC": "HND", "NHD": "NHD", "LBNHC": "NHD"}
DTYPES = {"bfloat16": "torch.bfloat16", "bf16": "torch.bfloat16", "float16": "torch.float16",
          "half": "torch.float16", "fp16": "torch.float16", "float32": "torch.float32", "float": "torch.float32"}


def release(version):
    out = []
    for part in str(version).split("+", 1)[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out + [0] * (3 - len(out)))


def connector_version(version):
    found = CONNECTOR_VERSIONS[0][1]
    for since, number in CONNECTOR_VERSIONS:
        if release(version) >= since:
            found = number
    return found


def default_attention_backend(platform, version, mla, env):
    """The backend vLLM selects without --attention-backend (see module docstring)."""
    aiter = str(env.get("VLLM_ROCM_USE_AITER", "")).strip().lower() in ("1", "true")
    rel = release(version)
    if platform == "cpu":
        return "CPU_MLA" if mla else "CPU_ATTN"
    if platform == "rocm":
        if mla:
            return "ROCM_AITER_MLA" if aiter else "TRITON_MLA"
        if rel < (0, 19, 0):
            return "ROCM_AITER_FA" if aiter else "TRITON_ATTN"
        if rel < (0, 23, 0):
            return "ROCM_ATTN"
        # rocm.py: "Keep ROCM_ATTN disabled for KV connectors" (use_kv_connector), then aiter / Triton
        return "ROCM_AITER_FA" if aiter else "ROCM_AITER_UNIFIED_ATTN"
    return "FLASH_ATTN_MLA" if mla else "FLASH_ATTN"


def attention_backend(selected, platform, version, mla, env):
    if selected:
        return selected.strip().upper()
    if release(version) < (0, 19, 1) and env.get("VLLM_ATTENTION_BACKEND"):
        return env["VLLM_ATTENTION_BACKEND"].strip().upper()
    return default_attention_backend(platform, version, mla, env)


def model_geometry(config):
    """ModelConfig's view of a Hugging Face config.json: total KV heads, head size, hidden layers, MLA."""
    text = dict(config)
    text.update(config.get("text_config") or {})
    heads = text.get("num_attention_heads")
    layers = text.get("num_hidden_layers")
    kv_heads = text.get("num_key_value_heads", heads)
    head_size = text.get("head_dim") or (text["hidden_size"] // heads if heads and text.get("hidden_size") else None)
    mla = bool(text.get("kv_lora_rank"))
    if mla:
        head_size = text["kv_lora_rank"] + (text.get("qk_rope_head_dim") or 0)
    return {"num_kv_heads": kv_heads, "head_size": head_size, "num_hidden_layers": layers, "use_mla": mla}


def model_dtype(flag, config):
    """str(model_config.dtype): --dtype, or with auto the checkpoint's dtype (torch_dtype / dtype)."""
    name = (flag or "auto").lower()
    if name == "auto":
        name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower().replace("torch.", "")
    return DTYPES.get(name, "torch." + name)


def speculative_factors(text, cache_dtype):
    """_get_speculative_compatibility_factors: only EAGLE-style drafts count."""
    if not text:
        return None
    config = text if isinstance(text, dict) else json.loads(text)  # the strict parser gives it parsed
    method = str(config.get("method") or "")
    if method not in EAGLE_METHODS and not method.endswith("mtp"):
        return None
    return {"method": method, "model": config.get("model"), "revision": config.get("revision"),
            "code_revision": config.get("code_revision"), "parallel_drafting": config.get("parallel_drafting", False),
            "kv_cache_dtype": str(config.get("kv_cache_dtype") or cache_dtype), "auxiliary_layer_ids": None}


def compatibility_factors(version, model, dtype, geometry, backend, cache_dtype, hma, speculative):
    """The factors dictionary of compute_nixl_compatibility_hash for this vLLM version."""
    rel = release(version)
    factors = {
        "vllm_version": str(version).split("+", 1)[0],
        "nixl_connector_version": connector_version(version),
        "model": model,
        "dtype": dtype,
        "num_kv_heads": geometry["num_kv_heads"],
        "head_size": geometry["head_size"],
        "num_hidden_layers": geometry["num_hidden_layers"],
        "attn_backend_name": backend,
        "cache_dtype": str(cache_dtype),
    }
    if rel >= (0, 19, 1):
        factors["is_hma_enabled"] = bool(hma)
        if rel < (0, 32, 0):
            factors["cross_layers_blocks"] = False
    if rel >= (0, 28, 0):
        factors["speculative_config"] = speculative
        factors["transfer_mode"] = "pull"
    return factors


def hash_factors(factors):
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()


def kv_cache_layout(env, mla):
    """NixlConnector.get_required_kvcache_layout (HND; None for MLA) unless VLLM_KV_CACHE_LAYOUT sets one."""
    if env.get("VLLM_KV_CACHE_LAYOUT"):
        value = env["VLLM_KV_CACHE_LAYOUT"].strip().upper()
        return LAYOUT_ALIASES.get(value, value)
    return "NHD" if mla else "HND"


def check_hash(local, remote):
    """BaseNixlWorker._nixl_handshake: the hash is compared before the agent metadata is decoded."""
    if local != remote:
        raise RuntimeError(
            f"NIXL compatibility hash mismatch. Local: {local}, Remote: {remote}. Prefill and decode instances "
            "have incompatible configurations. This may be due to: different vLLM versions, models, dtypes, KV "
            "cache layouts, attention backends, etc. Both instances must use identical configurations.Disable "
            "this check using --kv-transfer-config '{\"kv_connector_extra_config\": {\"enforce_handshake_compat\": "
            "false}}'")


def validate_remote(local, remote):
    """_validate_remote_agent_handshake, consumer side (`local`) against the producer's agent metadata."""
    dcp, remote_dcp = local.get("dcp_size", 1), remote.get("dcp_size", 1)
    if dcp % remote_dcp and remote_dcp % dcp:
        raise AssertionError(f"DCP sizes must divide one another: local={dcp}, remote={remote_dcp} "
                             f"(engine {remote['engine_id']}).")
    tp, remote_tp = local["tp_size"], remote["tp_size"]
    # TransferTopology.tp_ratio
    if tp >= remote_tp:
        if tp % remote_tp:
            raise AssertionError(f"Local tensor parallel size {tp} is not divisible by remote tensor parallel "
                                 f"size {remote_tp}.")
        tp_ratio = tp // remote_tp
    else:
        if remote_tp % tp:
            raise AssertionError(f"Remote tensor parallel size {remote_tp} is not divisible by local tensor "
                                 f"parallel size {tp}.")
        tp_ratio = -(remote_tp // tp)
    # TransferTopology.block_size_ratio
    if local["block_size"] % remote["block_size"]:
        raise AssertionError(f"Local block size {local['block_size']} is not divisible by remote block size "
                             f"{remote['block_size']} or vice versa.")
    # a config without head counts (HF would apply its model class defaults): no replication known
    replicated = local["num_kv_heads"] is not None and remote_tp > local["num_kv_heads"]
    if not local["use_mla"]:
        if tp_ratio < 0 and replicated:
            raise AssertionError("assert not (tp_ratio < 0 and self.transfer_topo.is_kv_replicated(remote_engine_id))")
        if remote["kv_cache_layout"] != local["kv_cache_layout"]:
            raise RuntimeError(f"Heterogeneous TP expects same kv_cache_layout (local {local['kv_cache_layout']}, "
                               f"remote {remote['kv_cache_layout']}). Or enable experimental feature to receive "
                               "LBHNC into a local LBNHC cache by setting 'enable_permute_local_kv'=True in "
                               "--kv-transfer-config.")
        if abs(tp_ratio) != 1 and not replicated and local["kv_cache_layout"] != "HND":
            raise RuntimeError("Heterogeneous TP head-dimension splitting requires contiguous heads. Use a "
                               "block-contiguous layout (e.g. LBHNC) on the prefill side.")
        if tp_ratio < 0 and local["block_size"] != remote["block_size"]:
            raise AssertionError("Different local/remote block sizes are not supported when P TP > D TP.")
    return tp_ratio
