# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime fields discovery derives from the image, the checkpoint and the inputs (pure): the expected packages
and the NIXL distribution, the model dtype, the KV cache plan (_discover/kv_pages.py), and the lifecycle settings
(the KV lease and the drain of a stop: _plan/lifecycle.py) and the container's log rotation (_plan/container.py,
log_config)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.kv_pages import kv_cache_pages
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import LEASE_INPUT, lease_names
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    SHUTDOWN_FLAG,
    SHUTDOWN_FLAG_VERSION,
    default_lease,
    stop_grace,
)

__metaclass__ = type


# vLLM's CPU attention backend (CPU_ATTN) supports block sizes that are multiples of 32 (seen in 0.32.0).
CPU_BLOCK_MULTIPLE = 32


def expected_packages(engine, site, image, image_key):
    """(expected_packages, the NIXL distribution) of the image: vllm, its NIXL and NARWHAL_EXPECTED_PACKAGES."""
    dists = image.get("distributions") or {}
    if "vllm" not in dists:
        raise InputError(image_key, "image %s (%s) on %s has no 'vllm' distribution installed; use a vLLM image"
                         % (image.get("image"), image.get("id"), engine))
    nixl = image.get("nixl_distribution")
    if not nixl:
        raise InputError(image_key, "image %s on %s has no NIXL distribution (nixl, nixl-cu12, nixl-cu13, "
                                    "nixl-rocm or rixl); NixlConnector needs one: use an image with NIXL"
                         % (image.get("image"), engine))
    expected = {"vllm": dists["vllm"], nixl: dists[nixl]}
    for name in [x.strip() for x in (site.get("NARWHAL_EXPECTED_PACKAGES") or "").split(",") if x.strip()]:
        if name not in dists:
            raise InputError("NARWHAL_EXPECTED_PACKAGES", "%s is not installed in image %s on %s; remove it or use "
                                                          "an image that has it" % (name, image.get("image"), engine))
        expected[name] = dists[name]
    return expected, nixl


def resolve_dtype(site, model):
    model_dtype = site["NARWHAL_MODEL_DTYPE"]
    if model_dtype == "auto":
        model_dtype = model.get("dtype")
        if model_dtype not in ("bfloat16", "float16"):
            raise InputError("NARWHAL_MODEL_DTYPE", "the checkpoint %s has dtype %s; set NARWHAL_MODEL_DTYPE to "
                                                    "bfloat16 or float16" % (model.get("path"), model_dtype or "unset"))
    return model_dtype


def cache_pages(engine, site, image, model, tp, model_dtype):
    block = site["NARWHAL_BLOCK_SIZE"]
    if image.get("platform") == "cpu" and block % CPU_BLOCK_MULTIPLE:
        # vLLM's CPU attention backend takes only multiples of 32; with NixlConnector the engine dies at start
        # ("No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"), so refuse it here by name.
        raise InputError("NARWHAL_BLOCK_SIZE", "is %d but %s runs the CPU image %s, whose attention backend needs a "
                                               "multiple of %d; set NARWHAL_BLOCK_SIZE=%d"
                         % (block, engine, image.get("image"), CPU_BLOCK_MULTIPLE,
                            -(-block // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE))
    try:
        return kv_cache_pages(model["kv_geometry"], tp, site["NARWHAL_BLOCK_SIZE"], site["NARWHAL_KV_CACHE_DTYPE"],
                              model_dtype)
    except ValueError as exc:
        which = ", ".join(x for x in (model.get("path"), model.get("model_type") and "model_type %s"
                                      % model["model_type"]) if x)
        raise InputError("NARWHAL_KV_CACHE_DTYPE", "the cache plan for %s%s failed: %s"
                         % (engine, " (%s)" % which if which else "", exc))


def lifecycle_fields(engine, site, vllm_version, sources):
    """-> {runtime fields}: the KV lease (runtime.kv_lease_seconds, only when NARWHAL_KV_LEASE_SECONDS is set) and
    the drain of a stop (runtime.shutdown_timeout: NARWHAL_SHUTDOWN_TIMEOUT, else 30 s from vLLM 0.18, nothing
    before)."""
    release = release_tuple(vllm_version)
    fields = {}
    lease = site.get(LEASE_INPUT)
    if lease is not None:
        name, place = lease_names(release)
        fields["kv_lease_seconds"] = lease
        sources["kv_lease"] = "%s=%d: %s in %s (vLLM %s; its default is %d s)" % (
            LEASE_INPUT, lease, name, place, vllm_version, default_lease(release))
    drain = site.get("NARWHAL_SHUTDOWN_TIMEOUT")
    if release[:2] < SHUTDOWN_FLAG_VERSION:
        if drain is not None:
            raise InputError("NARWHAL_SHUTDOWN_TIMEOUT", "is %d but the image's vLLM %s on %s has no %s (vLLM's "
                                                         "graceful drain exists from 0.18); unset it or use an image "
                                                         "with vLLM >= 0.18"
                             % (drain, vllm_version, engine, SHUTDOWN_FLAG))
        sources["shutdown"] = ("NARWHAL_SHUTDOWN_TIMEOUT unset and vLLM %s has no %s (from 0.18): not written; a stop "
                               "gives %d s before SIGKILL" % (vllm_version, SHUTDOWN_FLAG, stop_grace([])))
        return fields
    how = "NARWHAL_SHUTDOWN_TIMEOUT=%d" % drain if drain is not None else \
        "NARWHAL_SHUTDOWN_TIMEOUT unset: %d" % DEFAULT_SHUTDOWN_TIMEOUT
    drain = DEFAULT_SHUTDOWN_TIMEOUT if drain is None else drain
    fields["shutdown_timeout"] = drain
    sources["shutdown"] = "%s (%s %d: %s); a stop gives %d s before SIGKILL" % (
        how, SHUTDOWN_FLAG, drain, "abort in-flight requests" if drain == 0 else "drain in-flight requests",
        stop_grace([SHUTDOWN_FLAG, str(drain)]))
    return fields


def log_fields(site):
    """runtime.log: the container's log driver and rotation from NARWHAL_LOG_DRIVER, NARWHAL_LOG_MAX_SIZE and
    NARWHAL_LOG_MAX_FILE (checked when the inputs are read); the planner writes it as HostConfig.LogConfig."""
    return {"driver": site["NARWHAL_LOG_DRIVER"], "max_size": site["NARWHAL_LOG_MAX_SIZE"],
            "max_file": site["NARWHAL_LOG_MAX_FILE"]}
