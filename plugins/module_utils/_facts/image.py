# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure helpers of image_facts: env filtering, platform and NIXL choice, script output, cache files.

Nothing here touches Docker, the network or the disk. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_text,
)

__metaclass__ = type

CACHE_FORMAT = 1

# The one list of distributions: what discovery reads from every engine image and records (the inspection
# extracts, the image cache's "requested"; engine_host_facts' default, NARWHAL_EXPECTED_PACKAGES adds to it) ...
DISCOVERY_DISTRIBUTIONS = ["vllm", "nixl", "nixl-cu12", "nixl-cu13", "nixl-rocm", "rixl", "torch", "transformers"]
# ... and image_facts' default, which reports a few more of an image's transfer and kernel packages as well.
DEFAULT_DISTRIBUTIONS = DISCOVERY_DISTRIBUTIONS + ["ucx-py", "ucx-py-cu12", "ucxx", "triton", "pytorch-triton-rocm",
                                                   "flashinfer-python"]


# Image config Env keys kept in the facts: these exact names, or names starting with one of the prefixes.
ENV_EXACT = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "CPATH")

ENV_PREFIXES = (
    "ROCM_",
    "HIP_",
    "HSA_",
    "HCC_",
    "AMD_",
    "MIOPEN_",
    "RCCL_",
    "CUDA_",
    "CUDNN_",
    "NV_",
    "NVIDIA_",
    "NCCL_",
    "UCX_",
    "NIXL_",
    "VLLM_",
    "TORCH_",
    "PYTORCH_",
    "PYTHON",
)

ROCM_ENV_KEYS = ("ROCM_PATH", "ROCM_HOME", "ROCM_VERSION", "HIP_PATH", "HIP_PLATFORM")

CUDA_ENV_KEYS = ("CUDA_VERSION", "CUDA_HOME", "CUDA_PATH", "NV_CUDA_LIB_VERSION", "NVIDIA_REQUIRE_CUDA")

NIXL_ORDER_ROCM = ("nixl-rocm", "rixl", "nixl", "nixl-cu13", "nixl-cu12")

NIXL_ORDER_OTHER = ("nixl", "nixl-cu13", "nixl-cu12")

SCRIPT_MARKER = "NARWHAL_IMAGE_FACTS:"


# Run as `python3 -c VERSION_SCRIPT name...`; prints one marker line with {name: version} for installed ones.
VERSION_SCRIPT = r"""
import json, sys
try:
    from importlib.metadata import version as _v, PackageNotFoundError as _E
except ImportError:
    import pkg_resources
    def _v(name):
        return pkg_resources.get_distribution(name).version
    _E = Exception
out = {}
for name in sys.argv[1:]:
    for cand in (name, name.replace("-", "_")):
        try:
            out[name] = _v(cand)
            break
        except _E:
            pass
        except Exception:
            pass
sys.stdout.write("%s" + json.dumps(out, sort_keys=True) + "\n")
sys.stdout.flush()
""".strip() % SCRIPT_MARKER

_IMAGE_ID_RE = re.compile(r"^(sha256:)?([0-9a-f]{64})$")


class ImageFactsError(Exception):
    """Input that cannot be used (script output, image ID)."""


def normalize_requested(names):
    """Requested distributions without duplicates or blanks, in their given order."""
    seen = []
    for name in names or []:
        name = str(name).strip()
        if name and name not in seen:
            seen.append(name)
    return seen


def env_list_to_dict(env_list):
    """Image config Env (list of 'K=V') as a dict; later entries win, entries without '=' get ''."""
    result = {}
    for item in env_list or []:
        key, sep, value = str(item).partition("=")
        if key:
            result[key] = value if sep else ""
    return result


def is_runtime_env_key(key):
    if is_secret_name(key):  # never returned even when the prefix matches (e.g. VLLM_API_KEY)
        return False
    return key in ENV_EXACT or key.startswith(ENV_PREFIXES)


def filter_env(env_list):
    """Only the runtime-environment fields of an image config Env (see ENV_EXACT / ENV_PREFIXES)."""
    return {k: v for k, v in env_list_to_dict(env_list).items() if is_runtime_env_key(k)}


def is_secret_env_key(key):
    return is_secret_name(key)


def withheld_env(env_list):
    """Names of the image's Env entries whose values look secret (HF_TOKEN, VLLM_API_KEY ...): reported by name
    so the operator knows the image bakes a credential; their values are never returned, cached or recorded."""
    return sorted(k for k in env_list_to_dict(env_list) if is_secret_env_key(k))


def redact_labels(labels):
    """Image labels with the values of secret-looking names (and secret-shaped values) redacted."""
    return dict((k, REDACTED if is_secret_env_key(str(k)) else redact_text(v))
                for k, v in (labels or {}).items())


def parse_script_output(text, requested):
    """The {name: version} dict from VERSION_SCRIPT's stdout, limited to the requested names."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith(SCRIPT_MARKER):
            try:
                data = json.loads(line[len(SCRIPT_MARKER):])
            except (ValueError, RecursionError) as exc:
                raise ImageFactsError("version script printed unreadable JSON: %s" % exc)
            if not isinstance(data, dict):
                raise ImageFactsError("version script printed %s, not an object" % type(data).__name__)
            wanted = set(requested)
            return {str(k): str(v) for k, v in data.items() if k in wanted and v not in (None, "")}
    raise ImageFactsError("version script printed no result line (%r)" % (text or "")[-300:])


def _has_prefix_key(env, prefix):
    return any(k.startswith(prefix) for k in env)


def derive_platform(distributions, env):
    """cuda | rocm | cpu | unknown, from the installed versions and the (filtered) image env."""
    distributions = distributions or {}
    env = env or {}
    vllm = distributions.get("vllm", "").lower()
    torch = distributions.get("torch", "").lower()
    if "cpu" in vllm:
        return "cpu"
    cuda_evidence = (
        "+cu" in vllm
        or "+cu" in torch
        or any(k in env for k in CUDA_ENV_KEYS)
        or _has_prefix_key(env, "NVIDIA_")
        or "nixl-cu12" in distributions
        or "nixl-cu13" in distributions
    )
    rocm_evidence = (
        "rocm" in vllm
        or "+rocm" in torch
        or any(k in env for k in ROCM_ENV_KEYS)
        or _has_prefix_key(env, "HIP_")
        or "nixl-rocm" in distributions
        # PyPI's `rixl` is unrelated; count it only when nothing says CUDA
        or ("rixl" in distributions and not cuda_evidence)
    )
    if rocm_evidence:
        return "rocm"
    if cuda_evidence:
        return "cuda"
    if "+cpu" in torch:
        return "cpu"
    return "unknown"


def choose_nixl(distributions, platform):
    """The NIXL distribution vLLM will use: ROCm builds first on rocm, else the meta `nixl`, else a wheel."""
    order = NIXL_ORDER_ROCM if platform == "rocm" else NIXL_ORDER_OTHER
    for name in order:
        if name in (distributions or {}):
            return name
    return None


def image_id_hex(image_id):
    match = _IMAGE_ID_RE.match(str(image_id or ""))
    if not match:
        raise ImageFactsError("%r is not a full sha256 image ID" % (image_id,))
    return match.group(2)


def cache_file_name(image_id):
    """`<hex>.json` for `sha256:<hex>` (no path parts can come from the image ID)."""
    return image_id_hex(image_id) + ".json"


def build_facts(reference, attrs, distributions, cached):
    """ansible_facts.narwhal_image from `docker image inspect` attrs and the installed versions."""
    config = attrs.get("Config") or {}
    env = filter_env(config.get("Env"))
    distributions = dict(sorted((distributions or {}).items()))
    platform = derive_platform(distributions, env)
    return {
        "image": reference,
        "id": attrs.get("Id"),
        "repo_tags": list(attrs.get("RepoTags") or []),
        "repo_digests": list(attrs.get("RepoDigests") or []),
        "architecture": attrs.get("Architecture"),
        "os": attrs.get("Os"),
        "entrypoint": redact_argv(config.get("Entrypoint")),
        "cmd": redact_argv(config.get("Cmd")),
        "env": env,
        "withheld_env": withheld_env(config.get("Env")),
        "labels": redact_labels(config.get("Labels")),
        "distributions": distributions,
        "platform": platform,
        "nixl_distribution": choose_nixl(distributions, platform),
        "cached": bool(cached),
    }


def cache_document(image_id, requested, distributions):
    return {
        "format": CACHE_FORMAT,
        "id": image_id,
        "requested": sorted(normalize_requested(requested)),
        "distributions": dict(sorted(distributions.items())),
    }


def cached_distributions(document, image_id, requested):
    """The cached {name: version} when the document fits this image ID and request, else None."""
    if not isinstance(document, dict) or document.get("format") != CACHE_FORMAT:
        return None
    if document.get("id") != image_id:
        return None
    if document.get("requested") != sorted(normalize_requested(requested)):
        return None
    dists = document.get("distributions")
    if not isinstance(dists, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in dists.items()):
        return None
    wanted = set(normalize_requested(requested))
    if not set(dists) <= wanted:
        return None
    return dists
