# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery part 2, pure planning: one launch record per engine from host, image and model inspection
plus the launch policy in .env (docs/vllm-requirements.md, "Launch records" and "The runtime object").

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

import shlex

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import is_secret_name
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import check_own_ports
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.kv_pages import kv_cache_pages
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.members import (
    check_member,
    member_address,
    member_entry,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import record_geometry
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import (
    LEASE_INPUT,
    MANAGED_ENV,
    VISIBILITY_BY_VENDOR,
    check_args,
    lease_like,
    lease_names,
    parse_env_words,
    split_args,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    SHUTDOWN_FLAG,
    SHUTDOWN_FLAG_VERSION,
    container_spec,
    default_lease,
    stop_grace,
    ucx_tls,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import role_environment

__metaclass__ = type

VISIBILITY_ENV = VISIBILITY_BY_VENDOR


# vLLM's default --data-parallel-rpc-port (ParallelConfig.data_parallel_rpc_port), the catalogue's default too
DP_RPC_PORT = 29550

# vLLM's CPU attention backend (CPU_ATTN) supports block sizes that are multiples of 32 (seen in 0.32.0).
CPU_BLOCK_MULTIPLE = 32


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


def choose_rdma(engine, n, node_policy, site, rdma, gpus):
    """-> (net_devices, devices, reason) for ucx_rdma.

    auto: every rail the engine's GPUs are nearest to (see :func:`nearest_rails`); an explicit
    NARWHAL_RDMA_DEVICES / NARWHAL_NODE_<n>_RDMA_DEVICES list is taken as given, each port checked active."""
    settings = node_settings(site, node_policy, n)
    key = settings["inputs"]["rdma_devices"]
    wanted = settings["rdma_devices"] or "auto"
    hcas = dict((h["name"], h) for h in (rdma or {}).get("hcas", []))
    active = [(h, p) for h in hcas.values() for p in h.get("ports", []) if p.get("active")]
    if not active:
        raise InputError("NARWHAL_TRANSPORT", "ucx_rdma needs an active HCA port, but %s has none (%s); bring a "
                                              "port up or use NARWHAL_TRANSPORT=ucx_tcp"
                         % (engine, ", ".join(sorted(hcas)) or "no HCA found"))
    if wanted == "auto":
        picked, reason = nearest_rails(active, gpus)
        reason = "%s=auto, %s" % (key, reason)
    else:
        picked = []
        for item in [x.strip() for x in wanted.split(",") if x.strip()]:
            name, _sep, port_s = item.partition(":")
            hca = hcas.get(name)
            port = None
            if hca and port_s.isdigit():
                port = next((p for p in hca.get("ports", []) if p["port"] == int(port_s)), None)
            if port is None:
                raise InputError(key, "%s is not an HCA:port of %s (it has %s); correct %s" % (
                    item, engine, ", ".join("%s:%d" % (h["name"], p["port"]) for h, p in active) or "none", key))
            if not port.get("active"):
                raise InputError(key, "%s on %s is %s, not active; choose an active port"
                                 % (item, engine, port.get("state")))
            picked.append((hca, port))
        reason = "%s=%s" % (key, wanted)
    devices = []
    for hca, _port in picked:
        if not hca.get("uverbs"):
            raise InputError(key, "the uverbs device of %s on %s is unknown (no /sys/class/infiniband_verbs entry); "
                                  "check the RDMA drivers (ib_uverbs) on the host" % (hca["name"], engine))
        if hca["uverbs"] not in devices:
            devices.append(hca["uverbs"])
    if not (rdma or {}).get("rdma_cm"):
        raise InputError("NARWHAL_TRANSPORT", "%s has no /dev/infiniband/rdma_cm; load rdma_ucm on the host or use "
                                              "ucx_tcp" % engine)
    devices.append(rdma["rdma_cm"])
    return ["%s:%d" % (h["name"], p["port"]) for h, p in picked], devices, reason


def _natural(name):
    import re
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _pci_shared(a, b):
    """How many leading elements two PCI paths (root bus, root port, switch ports...) share; 0 if one is unknown."""
    a, b = a or [], b or []
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return shared


def _rail_rank(hca, port, path, numa, served):
    """Sort key of an active (HCA, port) for one GPU: nearest first (see nearest_rails)."""
    return (-_pci_shared(path, hca.get("pci_path")),
            0 if numa is not None and hca.get("numa_node") == numa else 1,
            0 if port.get("link_layer") == "InfiniBand" else 1,
            len(served.get("%s:%d" % (hca["name"], port["port"]), [])),
            _natural(hca["name"]), port["port"])


def _rail_why(gpu, hca, numa):
    """Why a port is the nearest one of a GPU, in words."""
    path = gpu.get("pci_path")
    shared = _pci_shared(path, hca.get("pci_path"))
    if shared >= 3:
        return "same PCIe switch %s" % path[shared - 1]
    if shared == 2:
        return "same PCIe root port %s" % path[1]
    if numa is not None and hca.get("numa_node") == numa:
        return "NUMA node %s (%s)" % (numa, "PCIe path unknown" if not path
                                      else "PCIe path of %s unknown" % hca["name"] if not hca.get("pci_path")
                                      else "no active port shares its PCIe switch")
    if shared == 1:
        return "same PCIe root complex %s" % path[0]
    return ("no active port on NUMA node %s or below its PCIe switch" % numa if numa is not None
            else "NUMA node and PCIe path unknown")


def nearest_rails(active, gpus):
    """NARWHAL_RDMA_DEVICES=auto -> ([(hca, port)] deduplicated in GPU order, reason).

    For each allocated GPU, in order, the nearest active port: the one behind the deepest PCIe switch it shares
    with the GPU (longest common prefix of their sysfs PCI paths: switch, then root port, then root complex),
    then on the GPU's NUMA node, then InfiniBand before Ethernet, then the one serving the fewest of the
    engine's GPUs so far (equally near GPUs spread over equally near rails), then natural name order. GPUs
    share a port when there are fewer rails than GPUs. Without PCI paths this is the NUMA rule, per GPU; a GPU
    of unknown NUMA node counts as on the node most of the engine's GPUs are on."""
    numas = [g.get("numa_node") for g in gpus if g.get("numa_node") is not None]
    engine_numa = sorted(set(numas), key=lambda x: (-numas.count(x), x))[0] if numas else None
    if not gpus:
        hca, port = min(active, key=lambda hp: _rail_rank(hp[0], hp[1], None, None, {}))
        return [(hca, port)], "the engine has no GPU: %s:%d, the first active port (InfiniBand first)" % (
            hca["name"], port["port"])
    served, picked, lines = {}, [], []
    for gpu in gpus:
        numa = gpu.get("numa_node") if gpu.get("numa_node") is not None else engine_numa
        path = gpu.get("pci_path")
        hca, port = min(active, key=lambda hp: _rail_rank(hp[0], hp[1], path, numa, served))
        name = "%s:%d" % (hca["name"], port["port"])
        why = _rail_why(gpu, hca, numa)
        if port.get("link_layer") != "InfiniBand":
            why += ", %s (no InfiniBand port as near)" % (port.get("link_layer") or "link layer unknown")
        if served.get(name):
            why += ", shared with GPU %s" % ", ".join(str(i) for i in served[name])
        else:
            picked.append((hca, port))
        served.setdefault(name, []).append(gpu.get("index"))
        label = "GPU %s (%s)" % (gpu.get("index"), gpu["pci_bus_id"]) if gpu.get("pci_bus_id") else \
            "GPU %s" % gpu.get("index")
        lines.append("%s -> %s: %s" % (label, name, why))
    return picked, "the nearest active port of each GPU: " + "; ".join(lines)


def check_extra_args(key, words):
    """Refuse launcher-managed flags in an extra-arguments input, in the planner's words, naming `key`."""
    try:
        return check_args(words, key)
    except PlanError as exc:
        raise InputError(key, str(exc))


def site_environment(text, key="NARWHAL_ENGINE_ENV", release=None):
    """NARWHAL_ENGINE_ENV -> {name: value}; launcher-managed and secret-looking names refused (the planner's
    rule, naming `key`; `release`: the image's vLLM, for the KV lease's name)."""
    try:
        return parse_env_words(text, key, release)
    except PlanError as exc:
        raise InputError(key, str(exc))


def _checked_args(key, text):
    try:
        return check_extra_args(key, split_args(text, key))
    except PlanError as exc:
        raise InputError(key, str(exc))


def _words(words):
    return " ".join(shlex.quote(w) for w in words)


def _flags(words):
    return [w.split("=", 1)[0].replace("_", "-") for w in words if w.startswith("--")]


def _engine_args(n, node_policy, site, model):
    """-> (extra_args, source): derived flags + NARWHAL_EXTRA_ARGS + NARWHAL_ENGINE_ARGS +
    NARWHAL_NODE_<n>_EXTRA_ARGS, in that order, so that vLLM's parser (the last occurrence wins) gives the
    node's value of a flag the site also sets, and the derived flags are kept whatever the extras say."""
    node_key = "NARWHAL_NODE_%d_EXTRA_ARGS" % n
    site_parts = [(key, _checked_args(key, site.get(key))) for key in ("NARWHAL_EXTRA_ARGS", "NARWHAL_ENGINE_ARGS")]
    site_args = [word for _key, words in site_parts for word in words]
    node_args = _checked_args(node_key, node_policy.get("EXTRA_ARGS"))
    derived = ["--trust-remote-code"] if model.get("trust_remote_code") else []
    parts = []
    if derived:
        parts.append("derived --trust-remote-code (auto_map in the checkpoint's model or tokenizer config)")
    parts += ["%s (%s)" % (key, _words(words)) for key, words in site_parts if words]
    if node_args:
        repeated = sorted(set(_flags(site_args)) & set(_flags(node_args)))
        parts.append("%s (%s)%s" % (node_key, _words(node_args),
                                    "; the node's %s wins over the site's (vLLM takes the last)" % ", ".join(repeated)
                                    if repeated else ""))
    source = " + ".join(parts) if parts else (
        "none (no derived flag, NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and %s unset)" % node_key)
    return derived + site_args + node_args, source


def _allocation(engine, n, node_policy, site, host, image, image_key, taken, sources):
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


def _transfer(engine, n, node, node_policy, site, host, gpus, platform, image_key, sources):
    """The record's transfer object: net devices, transfer devices, UCX_TLS (and the KV buffer device)."""
    if site["NARWHAL_TRANSPORT"] == "ucx_rdma":
        net_devices, transfer_devices, sources["transfer"] = choose_rdma(engine, n, node_policy, site,
                                                                         host.get("rdma"), gpus)
    else:
        # the literal the specification records (docs/vllm-requirements.md, "Allocation and transport fields"); the
        # planner resolves it from the role environment, in one place (_plan/container.py::_net_devices)
        net_devices, transfer_devices = ["${NARWHAL_FABRIC_INTERFACE}"], []
        sources["transfer"] = "ucx_tcp over the fabric interface (%s on this node)" % node["interface"]
    kv_buffer_device = "cpu" if platform == "cpu" else "cuda"  # vLLM: cuda on CUDA *and* ROCm
    try:
        ucx_list = ucx_tls(site["NARWHAL_TRANSPORT"], platform, kv_buffer_device)
    except PlanError as exc:
        raise InputError(image_key, "%s: %s" % (engine, exc))
    sources["ucx_tls"] = "UCX_TLS %s for %s KV memory on %s (GPU memory needs the GPU copy transport)" % (
        ",".join(ucx_list), "host" if kv_buffer_device == "cpu" else "GPU", platform)
    transfer = {"transport": site["NARWHAL_TRANSPORT"], "net_devices": net_devices, "devices": transfer_devices,
                "ucx_tls": ucx_list}
    return transfer, kv_buffer_device


def _packages(engine, site, image, image_key):
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


def _model_dtype(site, model):
    model_dtype = site["NARWHAL_MODEL_DTYPE"]
    if model_dtype == "auto":
        model_dtype = model.get("dtype")
        if model_dtype not in ("bfloat16", "float16"):
            raise InputError("NARWHAL_MODEL_DTYPE", "the checkpoint %s has dtype %s; set NARWHAL_MODEL_DTYPE to "
                                                    "bfloat16 or float16" % (model.get("path"), model_dtype or "unset"))
    return model_dtype


def _cache_pages(engine, site, image, model, tp, model_dtype):
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


def _environment(n, node_policy, site, image, sources):
    """The record's runtime.environment: the image's runtime variables, then NARWHAL_ENGINE_ENV, then the node's."""
    release = release_tuple(image["distributions"]["vllm"])
    environment = dict((k, v) for k, v in sorted((image.get("env") or {}).items())
                       if not is_secret_name(k) and k not in MANAGED_ENV and not lease_like(k))
    site_env = site_environment(site.get("NARWHAL_ENGINE_ENV"), release=release)
    node_key = "NARWHAL_NODE_%d_ENGINE_ENV" % n
    node_env = site_environment(node_policy.get("ENGINE_ENV"), node_key, release)
    environment.update(site_env)
    environment.update(node_env)  # the node's value wins
    over = sorted(set(site_env) & set(node_env))
    sources["environment"] = "image %s env (secret-looking and launcher-managed names dropped)%s%s" % (
        image.get("image"), " + NARWHAL_ENGINE_ENV (%s)" % ", ".join(sorted(site_env)) if site_env else "",
        " + %s (%s%s)" % (node_key, ", ".join(sorted(node_env)),
                          "; over the site's %s" % ", ".join(over) if over else "") if node_env else "")
    return environment


def _lifecycle(engine, site, vllm_version, sources):
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


def _parallelism(engine, n, node_policy, site, model, tp, gpus, sources):
    """-> (DP, EP) of one engine from NARWHAL_DATA_PARALLEL_SIZE / NARWHAL_ENABLE_EXPERT_PARALLEL (or the node's),
    EP refused for a dense checkpoint; `sources["parallelism"]` only when either is set, so the records of engines
    without them stay as they were."""
    settings = node_settings(site, node_policy, n)
    dp, ep = settings.get("data_parallel_size") or 1, bool(settings.get("enable_expert_parallel"))
    dp_key, ep_key = settings["inputs"]["data_parallel_size"], settings["inputs"]["enable_expert_parallel"]
    experts = model.get("num_experts") or 0
    if ep and not experts:
        raise InputError(ep_key, "is true but %s serves %s, a dense model (its config.json has no n_routed_experts, "
                                 "num_local_experts, num_experts or moe_num_experts): expert parallelism shards MoE "
                                 "experts only; set %s=false%s"
                         % (engine, model.get("path") or "the checkpoint", ep_key,
                            " (and NARWHAL_NODE_%d_ENABLE_EXPERT_PARALLEL=false if the site sets it)" % n
                            if ep_key == "NARWHAL_ENABLE_EXPERT_PARALLEL" else ""))
    if dp > 1 or ep:
        ranks = "%s=%d: %d data-parallel rank(s) of TP %d%s" % (
            dp_key, dp, dp, tp, " (%d GPUs: rank r on the r-th %d of gpu_ids)" % (len(gpus), tp) if gpus else "")
        sources["parallelism"] = ranks + ("; %s=true: expert parallelism over the %d routed experts of the "
                                          "checkpoint" % (ep_key, experts) if ep else "")
    return dp, ep


def side_channel_span(vllm_version, dp, tp):
    """How many consecutive side-channel ports an engine of `dp` ranks of TP `tp` listens on from
    VLLM_NIXL_SIDE_CHANNEL_PORT: from vLLM 0.14 one per DP rank (base + data_parallel_index, the global DP rank:
    0.32.0 nixl/base_scheduler.py:77-80, config/parallel.py:1029, v1/engine/core.py:1472); up to 0.11 one per
    worker (base + dp_rank * tp_size + tp_rank: vLLM PR 24249's nixl_connector_usage.md, the scheduler's
    base + data_parallel_rank * tensor_parallel_size)."""
    return dp if release_tuple(vllm_version) >= (0, 14, 0) else dp * tp


def local_ranks(site, node_policy, n):
    """(hosts, DP ranks per host) of node `n`: NARWHAL_NODE_<n>_HOSTS and the DP size / hosts (validate.py refuses
    a DP size that is not a multiple of the hosts)."""
    settings = node_settings(site, node_policy, n)
    hosts = settings.get("hosts") or 1
    return hosts, (settings.get("data_parallel_size") or 1) // hosts


def build_record(node, site, node_policy, host, image, model, fleet_entry, taken, side_port):
    """One engine's launch record. `host` = {"gpus": narwhal_gpus, "rdma": narwhal_rdma}; `taken` = GPUs of
    engines already placed on this physical host (mutated). The refusals come in this order: allocation,
    transfer, packages, dtype, cache pages, extra arguments, environment, then the planner's own."""
    engine, n = node["engine"], node["n"]
    platform = image.get("platform")
    image_key = node_settings(site, node_policy, n)["inputs"]["image"]
    sources = {}
    vendor, gpus, gpu_ids, reason_vis, tp, accelerator_devices = _allocation(
        engine, n, node_policy, site, host, image, image_key, taken, sources)
    transfer, kv_buffer_device = _transfer(engine, n, node, node_policy, site, host, gpus, platform, image_key,
                                           sources)
    expected, nixl = _packages(engine, site, image, image_key)
    dp, ep = _parallelism(engine, n, node_policy, site, model, tp, gpus, sources)
    model_dtype = _model_dtype(site, model)
    pages = _cache_pages(engine, site, image, model, tp, model_dtype)
    extra_args, sources["extra_args"] = _engine_args(n, node_policy, site, model)
    environment = _environment(n, node_policy, site, image, sources)
    derived_env = {}
    if model.get("ssm_conv_state"):
        derived_env["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
    vllm_version = image["distributions"]["vllm"]
    lifecycle = _lifecycle(engine, site, vllm_version, sources)
    hosts, local = local_ranks(site, node_policy, n)
    span = side_channel_span(vllm_version, local, tp)  # the head's own ranks (all of them on one host)
    served = site.get("NARWHAL_SERVED_MODEL_NAME") or site["NARWHAL_MODEL_PATH"].rstrip("/").rsplit("/", 1)[-1]
    record = {
        "engine": engine,
        "iid": fleet_entry["iid"],
        "role": node["role"],
        "accelerator": {"vendor": vendor, "product": gpus[0].get("name") if gpus else "cpu", "count": len(gpus)},
        "gpu_ids": gpu_ids,
        "gpu_host_indices": [g["index"] for g in gpus],
        "tensor_parallel_size": tp,
        "gpu_visibility_env": VISIBILITY_ENV.get(vendor),
        "accelerator_devices": accelerator_devices,
        "network_mode": "host",
        "transfer": transfer,
        "node": {"address": node["address"], "bind_family": site["NARWHAL_BIND_FAMILY"],
                 "engine_port": node["engine_port"], "attest_port": node["attest_port"],
                 "fabric_interface": node["interface"], "side_channel_port": side_port,
                 "side_channel_ports": [side_port, side_port + span - 1], "host_id": node["host_id"]},
        "runtime": {
            "image": image.get("image"),
            "image_id": image.get("id"),
            "platform": platform,
            "vllm_version": vllm_version,
            "nixl_distribution": nixl,
            "kv_buffer_device": kv_buffer_device,
            "kv_load_failure_policy": site.get("NARWHAL_KV_LOAD_FAILURE_POLICY") or "fail",
            "expected_packages": expected,
            "model_path": site["NARWHAL_MODEL_PATH"],
            "served_model_name": served,
            "model_dtype": model_dtype,
            "kv_cache_dtype": site["NARWHAL_KV_CACHE_DTYPE"],
            "block_size": site["NARWHAL_BLOCK_SIZE"],
            "cache_plan": pages,
            "environment": environment,
            "derived_environment": derived_env,
            "extra_args": extra_args,
            "trust_remote_code": bool(model.get("trust_remote_code")),
            "ssm_conv_state": bool(model.get("ssm_conv_state")),
            "model_geometry": record_geometry(model.get("kv_geometry")),
        },
        "sources": dict(sources, visibility=reason_vis),
    }
    record["runtime"].update(lifecycle)
    if dp > 1 or ep:
        # only then, and in this place (after tensor_parallel_size), so that other records stay byte for byte
        extra = ([("data_parallel_size", dp)] if dp > 1 else []) + ([("enable_expert_parallel", True)] if ep else [])
        if hosts > 1:  # an engine across hosts: the ranks of each host and where they meet the head
            rpc = site.get("NARWHAL_DATA_PARALLEL_RPC_PORT") or DP_RPC_PORT
            extra[1:1] = [("data_parallel_size_local", local), ("data_parallel_rpc_port", rpc)]
            record["sources"]["parallelism"] += (
                "; NARWHAL_NODE_%d_HOSTS=%d: %d rank(s) on each host, the head (%s) serving the HTTP API and meeting "
                "the others on %s:%d (NARWHAL_DATA_PARALLEL_RPC_PORT)"
                % (n, hosts, local, node["address"], node["address"], rpc))
        items = list(record.items())
        at = [k for k, _v in items].index("tensor_parallel_size") + 1
        record = dict(items[:at] + extra + items[at:])
    check_own_ports(record, node_settings(site, node_policy, n)["inputs"])  # its side channel and RPC port on its own
    # Refuse now what the launcher would refuse at start: the same planner, on a provisional role environment.
    # (The launcher's record check, _outputs/schemas.py::check_record, runs on the finished document in
    # _discover/outputs.py, once `sources` is complete.)
    try:
        container_spec(record, role_environment(
            record, site.get("NARWHAL_ENGINE_CHECKOUT") or "/opt/narwhal", "run-discovery"))
    except PlanError as exc:
        raise InputError(exc.key if str(exc.key).startswith("NARWHAL_") else engine,
                         "the launcher would refuse the record of %s: %s" % (engine, exc))
    return record, span


def build_members(node, site, node_policy, record, head, spread, taken_on, span):
    """The `members` of the record of an engine across hosts: one entry per host after the head, in narwhal_rank
    order (`spread`: [{host, interface, inspection}] as discovery gathered them; `head`: the head's inspection;
    `taken_on(host_id)`: the GPUs already given on that host, {index: engine}, mutated; `span`: the side-channel
    ports of one host's ranks). The image, GPUs and checkpoint of each host are checked against the head's."""
    engine, n = node["engine"], node["n"]
    settings = node_settings(site, node_policy, n)
    image_key, interface_key = settings["inputs"]["image"], settings["inputs"]["fabric_interface"]
    image = head.get("image") or {}
    local = local_ranks(site, node_policy, n)[1]
    entries = []
    for rank, found in enumerate(spread, 1):
        host, facts = found["host"], found.get("inspection") or {}
        check_member(engine, engine, head, host, facts, image_key)
        interface = settings["fabric_interface"]
        interface_facts = found.get("interface") or {}
        address = member_address(n, host, interface, interface_facts, site["NARWHAL_BIND_FAMILY"], interface_key)
        sources = {}
        taken = taken_on(interface_facts.get("host_id") or host)
        allocation = _allocation(engine, n, node_policy, site, facts, image, image_key, taken, sources)
        transfer, _device = _transfer(engine, n, {"interface": interface}, node_policy, site, facts, allocation[1],
                                      image.get("platform"), image_key, sources)
        entries.append(member_entry(engine, n, rank, local, record, host,
                                    (address, interface, interface_facts.get("host_id") or host), allocation,
                                    transfer, span, sources))
    return entries
