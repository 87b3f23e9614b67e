# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The P/D gate (pure): predict, from two launch records, whether vLLM's NixlConnector handshake between the
engines would succeed, and refuse the pair by the first factor that would make it fail.

What vLLM checks, read from the released wheels 0.14.0, 0.19.1, 0.22.0-0.25.0, 0.28.0, 0.32.0 and 0.33.0
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py, ``nixl_connector.py`` up to 0.19):

* ``compute_nixl_compatibility_hash`` hashes (``hash_factors``: sha256 of the sorted JSON) the vLLM version
  (``vllm.__version__``: without the ``+cu129``/``+rocm711`` platform tag of the distribution version),
  ``NIXL_CONNECTOR_VERSION`` (a constant of the vLLM release), the model as given to ``vllm serve``
  (``model_config.model``: here the container mount ``/models/<served name>``), ``str(model_config.dtype)``,
  total KV heads, head size, hidden layers, the attention backend name, ``str(cache_config.cache_dtype)`` (the
  flag as given: ``auto`` is not resolved), ``is_hma_enabled`` (>= 0.19.1), the EAGLE/MTP draft (>= 0.28), the
  transfer mode (>= 0.28: NixlConnector pulls; the product never selects the push connector) and
  ``cross_layers_blocks`` (0.19.1-0.28, off unless ``kv_connector_extra_config`` enables it, which the product
  never does). The docstring also names the sliding window, the factors dictionary does not; it is compared
  here with the rest of the checkpoint.
  The consumer compares the producer's hash with its own before anything else
  (``BaseNixlWorker._nixl_handshake``: "NIXL compatibility hash mismatch. Local: ..., Remote: ...").
* ``_validate_remote_agent_handshake`` then checks what is left out of the hash: TP sizes must divide each
  other (``TransferTopology.tp_ratio``), a producer with more TP ranks than KV heads (replicated heads) and
  more than the consumer is refused, heterogeneous TP needs the head-contiguous ``HND``/``LBHNC`` KV layout,
  the consumer's block size must be a multiple of the producer's (``block_size_ratio``), layouts must agree
  for non-MLA models, DCP sizes must divide each other, and (< 0.22) models with Mamba state need equal TP.

Data- and expert-parallel engines (read in the installed vLLM 0.32.0 of the project's CPU image and checked in
vLLM's history): neither the hash nor the handshake compares the DP size or expert parallelism. Each DP rank of an
engine is its own NIXL agent (``engine_id`` + ``_dp<rank>``, v1/engine/utils.py:480-489) with its own side channel
(``VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index``, nixl/base_scheduler.py:77-80), and the producer's
``kv_transfer_params`` name that rank's ``remote_port``, so a consumer rank handshakes with exactly one producer
rank; what it compares is that rank's attention TP (``tp_size``: TP, not DP x TP), block size, layout and the hash
above. Expert parallelism shards the MoE weights only, not the KV cache (``NixlAgentMetadata`` has no DP or EP
field, metadata.py:57-80). So a DP 2 + EP prefill pairs with a DP 1 decode of the same TP and checkpoint; the
factors below (TP included) are compared per rank and need no DP/EP factor.

Every engine is ``kv_both`` and the probe moves KV both ways, so each engine is checked as producer and as
consumer of the other: the directional rules then come down to equal block sizes and, for unequal TP, a
larger TP no bigger than the KV heads.

Not in the records, so not predicted: the GPU generation. vLLM also picks the default attention backend by
device capability (cuda.py/rocm.py ``_get_backend_priorities``), and the gate predicts the data-centre default
of each platform (below); fleets mixing GPU generations of one vendor should pin ``--attention-backend``.
The NIXL package version is not in vLLM's hash; the peer's NIXL must read this agent's metadata
(``add_remote_agent``), so the gate requires one NIXL release, as it requires one vLLM build.
"""

from __future__ import annotations

import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import REGENERATE, InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import canonical_flag
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import model_mount

__metaclass__ = type

MODEL_FIX = "use one checkpoint for every engine (NARWHAL_MODEL_PATH)"


# (name, label, .env input, fix). Order: vLLM's hash factors in its own order, then the handshake checks.
FACTORS = [
    ("vllm_version", "vLLM version", "NARWHAL_IMAGE",
     "run one vLLM build on both (NARWHAL_IMAGE / NARWHAL_NODE_<n>_IMAGE), or deploy each in its own fleet"),
    ("nixl_version", "NIXL version", "NARWHAL_IMAGE",
     "use images with one NIXL release (NARWHAL_IMAGE / NARWHAL_NODE_<n>_IMAGE)"),
    ("model", "model path given to vllm serve", "NARWHAL_SERVED_MODEL_NAME",
     "serve the model under one name (NARWHAL_SERVED_MODEL_NAME): vLLM hashes its path /models/<name>"),
    ("checkpoint", "checkpoint", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("model_dtype", "model dtype", "NARWHAL_MODEL_DTYPE", "set NARWHAL_MODEL_DTYPE to one dtype"),
    ("num_kv_heads", "number of KV heads", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("head_size", "head size", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("num_hidden_layers", "number of layers", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("sliding_window", "sliding window", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("attention_backend", "attention backend", "NARWHAL_EXTRA_ARGS",
     "set the same --attention-backend in NARWHAL_EXTRA_ARGS or deploy each vendor in its own fleet"),
    ("kv_cache_dtype", "KV cache dtype", "NARWHAL_KV_CACHE_DTYPE",
     "set one NARWHAL_KV_CACHE_DTYPE (vLLM hashes the flag as given: auto and bfloat16 differ)"),
    ("hybrid_kv_cache_manager", "hybrid KV cache manager", "NARWHAL_EXTRA_ARGS",
     "give both engines the same --disable-hybrid-kv-cache-manager setting (NARWHAL_EXTRA_ARGS)"),
    ("speculative_config", "speculative decoding (EAGLE/MTP draft)", "NARWHAL_EXTRA_ARGS",
     "give both engines the same --speculative-config (NARWHAL_EXTRA_ARGS)"),
    ("use_mla", "MLA", "NARWHAL_MODEL_PATH", MODEL_FIX),
    ("block_size", "effective KV block size", "NARWHAL_BLOCK_SIZE",
     "set one NARWHAL_BLOCK_SIZE (the effective size is the cache plan's: hybrid models raise it, by TP); with "
     "kv_both each engine also consumes the other's blocks, and a consumer's block size must be a multiple of "
     "the producer's"),
    ("kv_cache_layout", "KV cache layout", "NARWHAL_ENGINE_ENV",
     "set the same VLLM_KV_CACHE_LAYOUT on both, or none (NARWHAL_ENGINE_ENV)"),
    ("decode_context_parallel_size", "decode context parallel size", "NARWHAL_EXTRA_ARGS",
     "give both engines DCP sizes that divide each other (--decode-context-parallel-size in NARWHAL_EXTRA_ARGS)"),
    ("tensor_parallel_size", "tensor-parallel size", "NARWHAL_TP_SIZE",
     "give both engines one TP size (NARWHAL_TP_SIZE, NARWHAL_GPUS_PER_ENGINE or NARWHAL_NODE_<n>_GPU_IDS; with "
     "data parallelism TP is the GPUs of one DP rank: GPUs / NARWHAL_DATA_PARALLEL_SIZE)"),
]

_FACTOR = dict((f[0], f) for f in FACTORS)


# Compared for equality; DCP and TP are compared by vLLM's mapping rules (pair_problem).
EQUAL = [f[0] for f in FACTORS if f[0] not in ("decode_context_parallel_size", "tensor_parallel_size")]

GEOMETRY = ("num_kv_heads", "head_size", "num_hidden_layers", "sliding_window", "use_mla")

EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")  # SpeculativeConfig.use_eagle (0.33)


# KVCacheLayout names (0.33) and their legacy aliases (VLLM_KV_CACHE_LAYOUT, vllm/v1/attention/backends/utils.py)
LAYOUT_ALIASES = {"HND": "HND", "LBHNC": "HND", "NHD": "NHD", "LBNHC": "NHD"}

HEAD_CONTIGUOUS = ("HND",)

PLATFORM_TAG = re.compile(r"^(cu|rocm|cpu|xpu|tpu|neuron)[0-9]*$")


def vllm_version(distribution_version):
    """vllm.__version__ of an image from its distribution version: vLLM's setup.py appends the platform tag
    (``+cu129``, ``+rocm711``) to the package version only; other local parts (a dev build's ``+g<commit>``)
    stay."""
    base, _sep, local = str(distribution_version or "").partition("+")
    rest = [part for part in local.split(".") if part and not PLATFORM_TAG.match(part)]
    return base + ("+" + ".".join(rest) if rest else "")


def _args(record):
    return list(record["runtime"].get("extra_args") or [])


def flag_value(args, *names):
    """The value of the last `--name v` / `--name=v` among `names` in vLLM argument words (argparse keeps the
    last occurrence; vLLM also takes --snake_case spellings), or None."""
    wanted = set(n.replace("_", "-") for n in names)
    value = None
    for i, word in enumerate(args):
        flag, eq, rest = word.partition("=")
        if canonical_flag(flag, wanted) in wanted and "." not in flag:
            value = rest if eq else (args[i + 1] if i + 1 < len(args) else "")
    return value


def _switch(args, name):
    """True/False for the last `--name` (`--name=false`) / `--no-name`, None when absent."""
    state = None
    for word in args:
        flag, eq, rest = word.partition("=")
        flag = canonical_flag(flag, (name, "--no-" + name[2:]))
        if flag == name:
            state = rest.strip().lower() not in ("false", "0", "no") if eq else True
        elif flag == "--no-" + name[2:]:
            state = False
    return state


def _environment(record):
    env = dict(record["runtime"].get("environment") or {})
    env.update(record["runtime"].get("derived_environment") or {})
    return env


def default_attention_backend(platform, version, mla, env):
    """-> (backend, why): the backend vLLM selects when neither --attention-backend nor (< 0.19)
    VLLM_ATTENTION_BACKEND names one, for the platform's data-centre GPUs.

    cuda (vllm/platforms/cuda.py ``_get_backend_priorities``, 0.14-0.33): FLASH_ATTN first below SM 10
    (FLASH_ATTN_MLA for MLA on SM 9); Blackwell SM 10.x prefers FLASHINFER, pre-Ampere GPUs fall to TRITON_ATTN.
    rocm (vllm/platforms/rocm.py): 0.14 TRITON_ATTN (ROCM_AITER_FA with VLLM_ROCM_USE_AITER=1); 0.19-0.22
    ROCM_ATTN first; from 0.23 ROCM_ATTN is skipped when a KV connector is configured
    (``use_kv_connector``), so ROCM_AITER_FA with VLLM_ROCM_USE_AITER=1, else ROCM_AITER_UNIFIED_ATTN on
    CDNA3+ with aiter (the ROCm vLLM images ship it), TRITON_ATTN on older AMD GPUs. MLA: ROCM_AITER_MLA with
    aiter enabled, else TRITON_MLA.
    cpu (vllm/platforms/cpu.py): CPU_ATTN (CPU_MLA for MLA)."""
    aiter = str(env.get("VLLM_ROCM_USE_AITER", "")).strip().lower() in ("1", "true")
    why = "%s default" % platform
    if platform == "cpu":
        return ("CPU_MLA" if mla else "CPU_ATTN"), why
    if platform == "rocm":
        if mla:
            return ("ROCM_AITER_MLA" if aiter else "TRITON_MLA"), why
        if version < (0, 19, 0):
            return ("ROCM_AITER_FA" if aiter else "TRITON_ATTN"), why
        if version < (0, 23, 0):
            return "ROCM_ATTN", why
        return ("ROCM_AITER_FA" if aiter else "ROCM_AITER_UNIFIED_ATTN"), why
    if platform == "cuda":
        return ("FLASH_ATTN_MLA" if mla else "FLASH_ATTN"), why
    return None, "platform %s unknown" % platform


def attention_backend(record, mla):
    """-> (backend, why) of one engine: --attention-backend (vLLM >= 0.14, the last one wins), else the
    VLLM_ATTENTION_BACKEND environment variable (gone by 0.19.1), else the platform default."""
    runtime = record["runtime"]
    explicit = flag_value(_args(record), "--attention-backend")
    if explicit:
        return explicit.strip().upper(), "--attention-backend"
    version = release_tuple(runtime.get("vllm_version"))
    env = _environment(record)
    if version < (0, 19, 1) and env.get("VLLM_ATTENTION_BACKEND"):
        return env["VLLM_ATTENTION_BACKEND"].strip().upper(), "VLLM_ATTENTION_BACKEND"
    return default_attention_backend(runtime.get("platform"), version, mla, env)


def speculative_factors(record):
    """The draft factors vLLM hashes (``_get_speculative_compatibility_factors``): None without an
    EAGLE-style draft; the raw text when --speculative-config is not JSON."""
    text = flag_value(_args(record), "--speculative-config", "-sc")
    if not text:
        return None
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if not isinstance(config, dict):
        return text
    method = str(config.get("method") or "")
    if method not in EAGLE_METHODS and not method.endswith("mtp"):
        return None
    keys = ("method", "model", "revision", "code_revision", "parallel_drafting")
    out = dict((k, config.get(k)) for k in keys)
    out["kv_cache_dtype"] = config.get("kv_cache_dtype") or record["runtime"].get("kv_cache_dtype")
    return json.dumps(out, sort_keys=True)


def kv_cache_layout(record, mla):
    """VLLM_KV_CACHE_LAYOUT as the legacy name, else NixlConnector's required HND (LBHNC in 0.33); MLA: n/a."""
    if mla:
        return "n/a (MLA)", "MLA: vLLM does not compare layouts"
    value = _environment(record).get("VLLM_KV_CACHE_LAYOUT")
    if value:
        return LAYOUT_ALIASES.get(value.strip().upper(), value.strip().upper()), "VLLM_KV_CACHE_LAYOUT"
    return "HND", "NixlConnector's layout"


def _nixl_version(runtime):
    dist = runtime.get("nixl_distribution")
    return (runtime.get("expected_packages") or {}).get(dist) if dist else None


def factors(record):
    """-> {name: {"label", "value", "input", "source"}} for one engine: what vLLM puts into its NIXL
    compatibility hash and what its handshake checks. Raises InputError for a record without the model
    geometry (written by an older discovery)."""
    runtime = record["runtime"]
    geometry = runtime.get("model_geometry")
    if not isinstance(geometry, dict):
        raise InputError("NARWHAL_LAUNCH_CONFIG", "the launch record of %s has no runtime.model_geometry (written by "
                                                  "an older discovery), so the P/D gate cannot predict vLLM's NIXL "
                                                  "handshake; %s" % (record["engine"], REGENERATE))
    mla = bool(geometry.get("use_mla"))
    backend, backend_why = attention_backend(record, mla)
    hma = _switch(_args(record), "--disable-hybrid-kv-cache-manager")
    layout, layout_why = kv_cache_layout(record, mla)
    dcp = flag_value(_args(record), "--decode-context-parallel-size", "-dcp")
    values = {
        "vllm_version": (vllm_version(runtime.get("vllm_version")), "image %s" % runtime.get("image")),
        "nixl_version": (_nixl_version(runtime), "%s in image %s" % (runtime.get("nixl_distribution"),
                                                                     runtime.get("image"))),
        "model": (model_mount(record), "served model name %s"
                  % runtime["served_model_name"]),
        "checkpoint": (runtime.get("model_path"), "NARWHAL_MODEL_PATH"),
        "model_dtype": (runtime.get("model_dtype"), "--dtype"),
        "attention_backend": (backend, backend_why),
        "kv_cache_dtype": (runtime.get("kv_cache_dtype"), "--kv-cache-dtype"),
        "hybrid_kv_cache_manager": ("off" if hma else "on", "--disable-hybrid-kv-cache-manager" if hma
                                    else "vLLM's default"),
        "speculative_config": (speculative_factors(record), "--speculative-config"),
        "block_size": ((runtime.get("cache_plan") or {}).get("block_size"), "cache plan"),
        "kv_cache_layout": (layout, layout_why),
        "decode_context_parallel_size": (max(1, int(dcp)) if dcp and re.fullmatch(r"[0-9]+", dcp) else 1,
                                         "--decode-context-parallel-size" if dcp else "vLLM's default"),
        "tensor_parallel_size": (record.get("tensor_parallel_size"), "--tensor-parallel-size"),
    }
    for name in GEOMETRY:
        values[name] = (geometry.get(name), "checkpoint config")
    out = {}
    for name, label, key, _fix in FACTORS:
        value, source = values[name]
        out[name] = {"label": label, "value": value, "input": key, "source": source}
    out["ssm_state"] = {"label": "Mamba/linear-attention state", "input": "NARWHAL_MODEL_PATH",
                        "value": bool(geometry.get("ssm_state") or runtime.get("ssm_conv_state")),
                        "source": "checkpoint config"}
    return out


def pair_problem(a, b, fa, fb):
    """-> None, or (factor name, detail) for the first reason vLLM's handshake between records `a` and `b`
    (each the other's producer and consumer) would fail; `fa`/`fb` are their factors()."""
    for name in EQUAL:
        if fa[name]["value"] != fb[name]["value"]:
            others = [fa[n]["label"] for n in EQUAL if n != name and fa[n]["value"] != fb[n]["value"]]
            return name, "%s differs (%s on %s (%s) vs %s on %s (%s))%s" % (
                fa[name]["label"], _show(fa[name]["value"]), a["engine"], fa[name]["source"],
                _show(fb[name]["value"]), b["engine"], fb[name]["source"],
                "; also differ: %s" % ", ".join(others) if others else "")
    dcp_a, dcp_b = fa["decode_context_parallel_size"]["value"], fb["decode_context_parallel_size"]["value"]
    if max(dcp_a, dcp_b) % min(dcp_a, dcp_b):
        return "decode_context_parallel_size", ("DCP sizes %d on %s and %d on %s do not divide each other (vLLM "
                                                "asserts 'DCP sizes must divide one another')"
                                                % (dcp_a, a["engine"], dcp_b, b["engine"]))
    tp_a, tp_b = a["tensor_parallel_size"], b["tensor_parallel_size"]
    if tp_a == tp_b:
        return None
    where = "TP %d on %s vs %d on %s" % (tp_a, a["engine"], tp_b, b["engine"])
    if max(tp_a, tp_b) % min(tp_a, tp_b):
        return "tensor_parallel_size", ("%s: vLLM maps unequal TP only when one size divides the other "
                                        "(TransferTopology.tp_ratio: 'tensor parallel size ... is not divisible')"
                                        % where)
    mla = fa["use_mla"]["value"]
    ssm = fa["ssm_state"]["value"] or fb["ssm_state"]["value"]
    if ssm and release_tuple(a["runtime"].get("vllm_version")) < (0, 22, 0):
        return "tensor_parallel_size", ("%s with a hybrid SSM model: vLLM %s refuses it ('Mamba does not support "
                                        "heterogeneous TP yet'; the 3-read transfer of 0.22 maps it)"
                                        % (where, a["runtime"].get("vllm_version")))
    heads = fa["num_kv_heads"]["value"]
    if not mla and not ssm and heads and max(tp_a, tp_b) > heads:
        return "tensor_parallel_size", ("%s with %d KV heads: the larger TP replicates the KV heads, and vLLM refuses "
                                        "a producer whose TP exceeds both the consumer's and the KV heads "
                                        "(_validate_remote_agent_handshake); with kv_both each engine is the "
                                        "other's producer" % (where, heads))
    layout = fa["kv_cache_layout"]["value"]
    if not mla and layout not in HEAD_CONTIGUOUS:
        return "tensor_parallel_size", ("%s with the %s KV layout: heterogeneous TP splits KV heads and needs the "
                                        "head-contiguous HND (LBHNC) layout ('Heterogeneous TP head-dimension "
                                        "splitting requires contiguous heads'); remove VLLM_KV_CACHE_LAYOUT"
                                        % (where, layout))
    return None


def _show(value):
    return "none" if value is None else value


def check_pairs(records):
    """The P/D gate: every prefill/decode pair of `records` ({engine: record}) must pass vLLM's NIXL handshake.
    Raises InputError naming both engines, the factor, both values and the input that fixes it."""
    facts = dict((e, factors(r)) for e, r in sorted(records.items()))
    prefill = [r for _e, r in sorted(records.items()) if r["role"] == "prefill"]
    decode = [r for _e, r in sorted(records.items()) if r["role"] == "decode"]
    for p in prefill:
        for d in decode:
            problem = pair_problem(p, d, facts[p["engine"]], facts[d["engine"]])
            if problem:
                name, detail = problem
                _name, _label, key, fix = _FACTOR[name]
                raise InputError(key, "%s (prefill) and %s (decode) would fail vLLM's NIXL handshake: %s; %s; %s"
                                 % (p["engine"], d["engine"], detail, fix, REGENERATE))
