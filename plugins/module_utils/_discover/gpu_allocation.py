# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's GPU allocation (pure): which of a host's GPUs an engine gets (NARWHAL_NODE_<n>_GPU_IDS, else
NARWHAL_GPUS_PER_ENGINE of the free ones), its tensor-parallel size (the GPUs over the DP ranks, or NARWHAL_TP_SIZE),
its device paths, and the value of its GPU visibility variable.

GPU numbering rule: the launcher gives a container only its engine's GPUs (NVIDIA: a device request for
those GPUs; ROCm: only their render/card nodes), and the runtime numbers them from 0 inside, so host indices
in the visibility variable would pick the wrong GPUs or none. `gpu_ids` (the value of the visibility
variable) are therefore:
- NVIDIA: the GPUs' UUIDs (GPU-...) when every allocated GPU has a unique, unmasked UUID -- valid in
  CUDA_VISIBLE_DEVICES whatever the numbering -- otherwise the container-relative indices 0..n-1;
- AMD: the container-relative indices 0..n-1 (ROCr enumerates only the GPUs whose render nodes the
  container has, in host order; the unique-ID spelling ROCR_VISIBLE_DEVICES accepts differs between the
  tools and ROCm releases, so it is not relied on).
`gpu_host_indices` keep the host indices that the device request / device mapping uses.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings

__metaclass__ = type


def _masked(uuid):
    hexdigits = "".join(ch for ch in (uuid or "") if ch in "0123456789abcdefABCDEF")
    return not hexdigits.strip("0")


def visibility_ids(vendor, gpus, host_gpus):
    """-> (gpu_ids, reason). UUIDs when unique and unmasked on the host, else container-relative indices."""
    all_uuids = [g.get("uuid") for g in host_gpus]
    chosen = [g.get("uuid") for g in gpus]
    relative = [str(i) for i in range(len(gpus))]
    if vendor == "amd":
        return relative, ("container-relative indices 0..%d: the container has only the render nodes of its %d "
                          "GPU(s), which ROCr numbers from 0 in host order" % (len(gpus) - 1, len(gpus)))
    if all(u and str(u).startswith("GPU-") and not _masked(u[4:]) and all_uuids.count(u) == 1 for u in chosen):
        return chosen, "GPU UUIDs: every allocated GPU has a unique UUID, valid whatever the container numbering"
    return relative, (
        "container-relative indices 0..%d: UUIDs are missing, masked or duplicated on this host, and the "
        "container sees only its %d GPU(s), numbered from 0" % (len(gpus) - 1, len(gpus)))


def allocate_gpus(engine, n, node_policy, site, host_gpus, taken):
    """-> (gpus, reason). `taken` maps host index -> engine for engines already placed on this host."""
    key_ids = "NARWHAL_NODE_%d_GPU_IDS" % n
    by_index = dict((g["index"], g) for g in host_gpus)
    if not host_gpus:
        raise InputError(engine, "no GPU was found on %s (nvidia-smi / amd-smi / rocm-smi report none); check "
                                 "the driver and tools on the host, or use a CPU image" % engine)
    explicit = node_policy.get("GPU_IDS")
    if explicit:
        missing = [i for i in explicit if i not in by_index]
        if missing:
            raise InputError(key_ids, "GPU index %s does not exist on %s (it has %s); correct %s"
                             % (",".join(map(str, missing)), engine, ",".join(map(str, sorted(by_index))), key_ids))
        clash = [i for i in explicit if i in taken]
        if clash:
            raise InputError(key_ids, "GPU %s of %s is already given to %s on the same host; give each engine its "
                                      "own GPUs" % (",".join(map(str, clash)), engine, taken[clash[0]]))
        return [by_index[i] for i in explicit], "%s=%s" % (key_ids, ",".join(map(str, explicit)))
    free = [g for g in sorted(host_gpus, key=lambda g: g["index"]) if g["index"] not in taken]
    want = site["NARWHAL_GPUS_PER_ENGINE"]
    if want == "all":
        if not free:
            raise InputError("NARWHAL_GPUS_PER_ENGINE", "no free GPU left on %s's host (all given to %s); set "
                                                        "NARWHAL_GPUS_PER_ENGINE or NARWHAL_NODE_<n>_GPU_IDS"
                             % (engine, ", ".join(sorted(set(taken.values())))))
        return free, "NARWHAL_GPUS_PER_ENGINE=all: every free GPU of the host"
    if len(free) < want:
        raise InputError("NARWHAL_GPUS_PER_ENGINE", "%s needs %d GPU(s) but its host has only %d free (%d in all%s); "
                                                    "lower NARWHAL_GPUS_PER_ENGINE or set %s"
                         % (engine, want, len(free), len(host_gpus),
                            ", others taken by " + ", ".join(sorted(set(taken.values()))) if taken else "", key_ids))
    return free[:want], "NARWHAL_GPUS_PER_ENGINE=%d: the lowest free indices of the host" % want


def engine_allocation(engine, n, node_policy, site, host, image, image_key, taken, sources):
    """GPUs, vendor, visibility ids, TP and device paths of one engine (`taken` is mutated)."""
    platform = image.get("platform")
    gpus_facts = host.get("gpus") or {"vendor": "none", "gpus": [], "devices": []}
    if platform == "cpu":
        gpus, vendor, gpu_ids, reason_vis = [], "cpu", [], "CPU image: no GPU"
        sources["allocation"] = "CPU image (%s): no GPUs allocated" % image.get("distributions", {}).get("vllm")
    else:
        vendor = gpus_facts.get("vendor")
        gpus, sources["allocation"] = allocate_gpus(engine, n, node_policy, site, gpus_facts.get("gpus", []), taken)
        names = sorted(set(g.get("name") or "unknown" for g in gpus))
        if len(names) > 1:
            raise InputError(engine, "the GPUs allocated to %s are of different products (%s); one engine needs "
                                     "identical GPUs: set NARWHAL_NODE_%d_GPU_IDS" % (engine, ", ".join(names), n))
        if platform in ("cuda", "rocm") and {"cuda": "nvidia", "rocm": "amd"}[platform] != vendor:
            raise InputError(image_key, "%s is a %s image but %s has %s GPUs; use a %s image for this host"
                             % (image.get("image"), platform.upper(), engine, vendor.upper(),
                                "ROCm" if vendor == "amd" else "CUDA"))
        gpu_ids, reason_vis = visibility_ids(vendor, gpus, gpus_facts.get("gpus", []))
    for g in gpus:
        taken[g["index"]] = engine
    settings = node_settings(site, node_policy, n)
    dp, dp_key = settings.get("data_parallel_size") or 1, settings["inputs"]["data_parallel_size"]
    hosts = settings.get("hosts") or 1
    # an engine across hosts has the same GPUs on each of its hosts (members are checked against the head)
    total = len(gpus) * hosts
    across = " on each of its %d hosts (%d in all)" % (hosts, total) if hosts > 1 else ""
    if gpus and not site.get("NARWHAL_TP_SIZE") and total % dp:
        raise InputError(dp_key, "is %d but %s has %d GPU(s)%s, which %d data-parallel ranks cannot share equally "
                                 "(an engine's GPU count must equal TP x DP); change %s, NARWHAL_GPUS_PER_ENGINE or "
                                 "NARWHAL_NODE_%d_GPU_IDS" % (dp, engine, len(gpus), across, dp, dp_key, n))
    tp = site.get("NARWHAL_TP_SIZE") or max(1, total // dp)
    if gpus and tp * dp != total:
        raise InputError("NARWHAL_TP_SIZE", "is %d but %s has %d GPU(s)%s%s; an engine's GPU count must equal TP x DP: "
                                            "change NARWHAL_TP_SIZE or NARWHAL_GPUS_PER_ENGINE%s"
                         % (tp, engine, len(gpus), across, " and %s is %d" % (dp_key, dp) if dp > 1 else "",
                            " or %s" % dp_key if dp > 1 else ""))
    accelerator_devices = []
    if vendor == "amd":
        accelerator_devices = list(gpus_facts.get("devices") or ["/dev/kfd"])
        for g in gpus:
            accelerator_devices += [d for d in g.get("devices", []) if d not in accelerator_devices]
    elif vendor == "nvidia":
        for g in gpus:
            accelerator_devices += g.get("devices", [])
        accelerator_devices += list(gpus_facts.get("devices") or [])
    return vendor, gpus, gpu_ids, reason_vis, tp, accelerator_devices
