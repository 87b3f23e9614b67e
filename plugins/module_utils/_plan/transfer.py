# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How KV moves between engines, as the planner writes it (pure, standard library only): the UCX transport list
(UCX_TLS, from the record's transfer.transport, runtime.platform and runtime.kv_buffer_device; discovery records it,
the planner checks it) and the NixlConnector configuration (`vllm serve --kv-transfer-config`), which _launch/peers.py
reads too. Every refusal raises PlanError(message, key) naming the record field or input."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import version_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import LEASE_EXTRA_KEY
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import kv_lease

__metaclass__ = type


# UCX transports (UCX_TLS) per (transfer.transport, runtime.platform, runtime.kv_buffer_device).
# - With the KV cache in GPU memory UCX needs its GPU memory transport to register it: without `cuda_copy`
#   (ROCm: `rocm_copy`) UCX classifies VRAM as host memory and NIXL's registerMem fails with
#   NIXL_ERR_BACKEND "VRAM memory is detected as host by UCX" (ai-dynamo/nixl issues 334 and 1628, PRs 1385,
#   1393; PR 1617 fails on a UCX_TLS without GPU support). Issue 1628's working list:
#   cuda_copy,cuda_ipc,sm,tcp,self. `cuda_ipc`/`rocm_ipc` and `sm` act only within one host (co-hosted
#   engines), `self` is the loopback; between hosts only the network transport moves bytes, and it is bound
#   to the recorded fabric by UCX_NET_DEVICES.
# - Host-memory KV (kv_buffer_device cpu: the CPU build) needs no GPU transport: tcp (resp. rc,ud) alone.
# - RDMA: rc (reliable connection, the bulk transport) and ud (connection setup), as UCX's own docs list them.
UCX_TLS_TABLE = {
    ("ucx_tcp", "gpu:cuda"): ["tcp", "cuda_copy", "cuda_ipc", "sm", "self"],
    ("ucx_tcp", "gpu:rocm"): ["tcp", "rocm_copy", "rocm_ipc", "sm", "self"],
    ("ucx_tcp", "host"): ["tcp"],
    ("ucx_rdma", "gpu:cuda"): ["rc", "ud", "cuda_copy", "cuda_ipc", "sm", "self"],
    ("ucx_rdma", "gpu:rocm"): ["rc", "ud", "rocm_copy", "rocm_ipc", "sm", "self"],
    ("ucx_rdma", "host"): ["rc", "ud", "sm", "self"],
}

GPU_MEMORY_TRANSPORT = {"cuda": "cuda_copy", "rocm": "rocm_copy"}

NETWORK_TRANSPORTS = {"ucx_tcp": ("tcp",),
                      "ucx_rdma": ("rc", "rc_v", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_mlx5", "dc", "dc_x",
                                   "dc_mlx5")}

UCX_KNOWN = set(NETWORK_TRANSPORTS["ucx_tcp"] + NETWORK_TRANSPORTS["ucx_rdma"]) | {
    "self", "sm", "shm", "posix", "sysv", "xpmem", "cma", "knem", "mm", "cuda_copy", "cuda_ipc", "gdr_copy",
    "rocm_copy", "rocm_ipc", "rocm_gdr"}

GPU_TRANSPORTS = {"cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"), "rocm": ("rocm_copy", "rocm_ipc", "rocm_gdr")}


def ucx_tls(transport, platform, kv_buffer_device):
    """The UCX transport list of a (transport, platform, KV buffer device); see UCX_TLS_TABLE."""
    memory = "host" if kv_buffer_device == "cpu" or platform == "cpu" else "gpu:%s" % platform
    try:
        return list(UCX_TLS_TABLE[(transport, memory)])
    except KeyError:
        raise PlanError("transport %r with platform %r and kv_buffer_device %r is not supported (ucx_tcp|ucx_rdma "
                        "on cuda|rocm|cpu)" % (transport, platform, kv_buffer_device), "NARWHAL_TRANSPORT")


def check_ucx_tls(tls, transport, platform, kv_buffer_device):
    """Refuse a UCX list that real NIXL/UCX would refuse or that could bypass the fabric."""
    where = "launch record transfer.ucx_tls"
    if not isinstance(tls, list) or not tls or not all(isinstance(t, str) for t in tls):
        raise PlanError("%s must be a non-empty list of UCX transports; %s" % (where, RERUN), where)
    shown = ",".join(tls)
    unknown = [t for t in tls if t not in UCX_KNOWN]
    if unknown:
        raise PlanError("%s=%s: %s is not a UCX transport; %s" % (where, shown, ",".join(unknown), RERUN), where)
    if not any(t in NETWORK_TRANSPORTS.get(transport, ()) for t in tls):
        raise PlanError("%s=%s has no %s network transport (%s): nothing would carry KV between hosts; %s"
                        % (where, shown, transport, "|".join(NETWORK_TRANSPORTS.get(transport, ())), RERUN), where)
    other = [t for t in tls if t in NETWORK_TRANSPORTS["ucx_rdma" if transport == "ucx_tcp" else "ucx_tcp"]]
    if other:
        raise PlanError("%s=%s mixes in %s, which is not the recorded transfer.transport %s; %s"
                        % (where, shown, ",".join(other), transport, RERUN), where)
    gpu = GPU_MEMORY_TRANSPORT.get(platform)
    if gpu and kv_buffer_device != "cpu" and gpu not in tls:
        raise PlanError("%s=%s lacks %s: the KV cache is in GPU memory (runtime.kv_buffer_device=%s on %s), and UCX "
                        "without its GPU memory transport classifies VRAM as host memory, so NIXL refuses to register "
                        "it (NIXL_ERR_BACKEND: VRAM memory is detected as host by UCX); %s (the list is derived from "
                        "NARWHAL_TRANSPORT and the image's platform)"
                        % (where, shown, gpu, kv_buffer_device, platform, RERUN), where)
    foreign = [t for t in tls for p, names in GPU_TRANSPORTS.items() if p != platform and t in names]
    if foreign:
        raise PlanError("%s=%s names %s, a GPU transport of another platform than %s; %s"
                        % (where, shown, ",".join(foreign), platform, RERUN), where)
    return tls


def kv_transfer_config(record):
    """NixlConnector, kv_both, UCX, failure propagation where the image's vLLM knows the field (>= 0.14), and the KV
    lease where the image's vLLM reads it from the connector's extra config (>= 0.22)."""
    runtime = record.get("runtime") or {}
    version = version_tuple(runtime.get("vllm_version", ""))
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if version >= (0, 14):
        # the image's own KVTransferConfig validates the value (the image check)
        config["kv_load_failure_policy"] = runtime.get("kv_load_failure_policy") or "fail"
    if runtime.get("kv_buffer_device") == "cpu":
        config["kv_buffer_device"] = "cpu"
    config["kv_connector_extra_config"] = {"backends": ["UCX"]}
    lease = kv_lease(record)
    if lease is not None and lease[0] == LEASE_EXTRA_KEY:
        config["kv_connector_extra_config"][LEASE_EXTRA_KEY] = lease[1]
    return config
