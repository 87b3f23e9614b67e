# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of record -> container (docs/architecture.md, "One planner"): pure, standard library only.

`container_spec(record, role_env)` turns a launch record and an engine's role environment into the complete
container the engine runs (image, entrypoint, command, environment, devices, device requests, groups,
capabilities, ulimits, mounts, labels, restart policy). Discovery calls it on every record it writes (so it
refuses at once what the launcher would refuse, in the launcher's words), prepare records its environment,
command and hash in the manifest, and the launcher snapshot (a zipapp that carries this package) starts
exactly that. The rules it applies have no other copy: the launcher-managed flags and variables
(_plan/args.py), the UCX transport table, the role environment (_plan/role_env.py), the ${NAME} resolution
of record values (_plan/subst.py).

Every refusal raises PlanError(message, key): `key` names the input or record field to correct.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME, local_host_reason
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import API_KEY_ENV, REDACTED
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import version_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import (
    DERIVED_ENV,
    DERIVED_FLAGS,
    LEASE_ENV,
    LEASE_EXTRA_KEY,
    LEASE_INPUT,
    LEASE_KEY_VERSION,
    SSM_LAYOUT_ENV,
    VISIBILITY_BY_VENDOR,
    check_args,
    check_env,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import model_mount
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import SubstitutionError, resolve_values

__metaclass__ = type

PLAN_HASH_LABEL = "org.narwhal.plan-hash"

ENGINE_LABEL = "org.narwhal.engine"


# The run that created the container: set at create time next to the plan hash, never part of the plan (so the
# hash stays run-independent and an unchanged engine survives a new run); `status` reads it to say which run serves.
RUN_ID_LABEL = "org.narwhal.run-id"


# Engines come back after a daemon restart or host reboot, not after a stop. The launch record carries no restart
# policy (no input sets it), so the plan's is this constant.
RESTART_POLICY = "unless-stopped"


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

BIND_HOSTS = {"ipv4": "0.0.0.0", "ipv6": "::"}


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


def side_channel_host(address):
    """VLLM_NIXL_SIDE_CHANNEL_HOST: advertised to the peers, so never unspecified or loopback."""
    if not address:
        raise PlanError("role env NARWHAL_ADVERTISED_ADDRESS is not set; it must be the node's fabric address",
                        "NARWHAL_ADVERTISED_ADDRESS")
    name = address.strip("[]")
    bad = local_host_reason(name) is not None
    try:
        ipaddress.ip_address(name)
    except ValueError:
        bad = True  # the side channel is advertised by address: a name is refused too
    if bad:
        raise PlanError("role env NARWHAL_ADVERTISED_ADDRESS=%s cannot be VLLM_NIXL_SIDE_CHANNEL_HOST: it is "
                        "advertised to the other engines, so use the node's global fabric address (record "
                        "node.address)" % address, "NARWHAL_ADVERTISED_ADDRESS")
    return name


# ------------------------------------------------------------------------------ KV lease and graceful stop

LEASE_MAX = 86400  # seconds; NARWHAL_KV_LEASE_SECONDS is 1..LEASE_MAX

SHUTDOWN_TIMEOUT_MAX = 3600  # seconds; NARWHAL_SHUTDOWN_TIMEOUT is 0..SHUTDOWN_TIMEOUT_MAX


# The lease vLLM applies when nothing sets it: 30 s from 0.22 (get_from_extra_config("kv_lease_duration", 30),
# 0.22.0 nixl/scheduler.py:72-76, 0.32.0 nixl/base_scheduler.py:82-88); 480 s up to 0.21 (0.21.0 vllm/envs.py:205,
# 1472-1474: VLLM_NIXL_ABORT_REQUEST_TIMEOUT, "480"); 120 before vLLM PR 25897 of 2025-09-29 (taken here as from
# 0.11; the release that first had 480 was not checked).
def default_lease(release):
    if tuple(release)[:2] >= LEASE_KEY_VERSION:
        return 30
    return 480 if tuple(release)[:2] >= (0, 11) else 120


# `vllm serve --shutdown-timeout N` ("Shutdown timeout in seconds. 0 = abort, >0 = wait", vLLM 0.32.0
# engine/arg_utils.py:1901-1906; present in 0.21.0 arg_utils.py:1472, added by vLLM PRs 34730/36666 for 0.18.0): on
# SIGTERM the API server asks EngineCore to drain, which keeps stepping until no request is left or N seconds
# passed, then aborts the rest (0.32.0 entrypoints/launchers/launcher.py:257-289, v1/engine/core.py:1625-1664).
SHUTDOWN_FLAG = "--shutdown-timeout"
SHUTDOWN_FLAG_VERSION = (0, 18)
DEFAULT_SHUTDOWN_TIMEOUT = 30  # NARWHAL_SHUTDOWN_TIMEOUT unset, on vLLM >= 0.18 (docs/inputs.md says why)

# After the drain, vLLM's worker processes get VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5, 0.32.0
# envs.py:253,1875-1878) to exit; the stop then waits STOP_MARGIN more before Docker's SIGKILL.
WORKER_SHUTDOWN_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
WORKER_SHUTDOWN_DEFAULT = 5
STOP_MARGIN = 10
LEGACY_STOP_GRACE = 30  # a container started without --shutdown-timeout: the grace every stop gave before


def _seconds(value, where, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError("%s=%r must be a whole number of seconds from %d to %d; %s" % (where, value, low, high, RERUN),
                        where)
    return value


def kv_lease(record):
    """-> None (vLLM's own lease: nothing written), or (name, seconds) with name `kv_lease_duration` (vLLM >= 0.22,
    in kv_connector_extra_config) or VLLM_NIXL_ABORT_REQUEST_TIMEOUT (<= 0.21, in the environment)."""
    runtime = record.get("runtime") or {}
    if runtime.get("kv_lease_seconds") is None:
        return None
    seconds = _seconds(runtime["kv_lease_seconds"], "launch record runtime.kv_lease_seconds", 1, LEASE_MAX)
    version = version_tuple(runtime.get("vllm_version", ""))
    return (LEASE_EXTRA_KEY if version[:2] >= LEASE_KEY_VERSION else LEASE_ENV), seconds


def effective_lease(record):
    """The seconds a prefill keeps unread KV: the record's lease, else the default of the image's vLLM."""
    lease = kv_lease(record)
    if lease is not None:
        return lease[1]
    return default_lease(version_tuple((record.get("runtime") or {}).get("vllm_version", "")))


def shutdown_timeout(record):
    """The record's runtime.shutdown_timeout (None: a record from before the input, no flag written). A vLLM
    older than 0.18 has no --shutdown-timeout: refused by name."""
    runtime = record.get("runtime") or {}
    if runtime.get("shutdown_timeout") is None:
        return None
    seconds = _seconds(runtime["shutdown_timeout"], "launch record runtime.shutdown_timeout", 0,
                       SHUTDOWN_TIMEOUT_MAX)
    version = version_tuple(runtime.get("vllm_version", ""))
    if version[:2] < SHUTDOWN_FLAG_VERSION:
        raise PlanError("launch record runtime.shutdown_timeout=%d but the image's vLLM %s has no %s (it exists from "
                        "vLLM 0.18); unset NARWHAL_SHUTDOWN_TIMEOUT or use an image with vLLM >= 0.18, then %s"
                        % (seconds, runtime.get("vllm_version"), SHUTDOWN_FLAG, RERUN), "NARWHAL_SHUTDOWN_TIMEOUT")
    return seconds


def stop_grace(command, environment=None):
    """The seconds between Docker's SIGTERM and SIGKILL for a container running `command` (its vllm serve
    arguments) with `environment` ({name: value}): --shutdown-timeout N + VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5
    unless set) + STOP_MARGIN; LEGACY_STOP_GRACE for a command without the flag (vLLM's default 0 aborts)."""
    drain = None
    words = [str(w) for w in command or []]
    for index, word in enumerate(words):
        value = words[index + 1] if word == SHUTDOWN_FLAG and index + 1 < len(words) else \
            word[len(SHUTDOWN_FLAG) + 1:] if word.startswith(SHUTDOWN_FLAG + "=") else None
        if value is not None and value.isdigit():
            drain = int(value)
    if drain is None:
        return LEGACY_STOP_GRACE
    worker = str((environment or {}).get(WORKER_SHUTDOWN_ENV, ""))
    return drain + (int(worker) if worker.isdigit() else WORKER_SHUTDOWN_DEFAULT) + STOP_MARGIN


def drain_warning(record):
    """For a prefill engine whose drain is shorter than its KV lease: the warning line, else None. Such a stop can
    end before every decode read the KV it was promised (a decode reading after that fails its request, HTTP 500
    with kv_load_failure_policy=fail); a warning, not a refusal: vLLM 0.21's 480 s lease would otherwise make every
    stop wait eight minutes."""
    if record.get("role") != "prefill":
        return None
    drain = shutdown_timeout(record)
    if drain is None:
        return None
    lease = effective_lease(record)
    if drain >= lease:
        return None
    source = "NARWHAL_KV_LEASE_SECONDS" if kv_lease(record) else "vLLM's default"
    return ("%s (prefill): NARWHAL_SHUTDOWN_TIMEOUT=%d is shorter than its KV lease of %d s (%s): a stop may end the "
            "drain before every decode has read the KV it was promised, and such a decode request fails; set "
            "NARWHAL_SHUTDOWN_TIMEOUT >= %d or a shorter %s"
            % (record.get("engine"), drain, lease, source, lease, LEASE_INPUT))


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


# ------------------------------------------------------------------------------------------------- plan

def record_field(record, dotted, kind, allow_empty=True):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise PlanError("launch record field %s is missing; %s" % (dotted, RERUN), dotted)
        value = value[part]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise PlanError("launch record field %s must be %s, got %r; %s"
                        % (dotted, getattr(kind, "__name__", kind), value, RERUN), dotted)
    if not allow_empty and not value and value != 0:
        raise PlanError("launch record field %s is empty; %s" % (dotted, RERUN), dotted)
    return value


def role_value(role_env, key):
    value = role_env.get(key, "")
    if not value:
        raise PlanError("role env %s is not set; rerun install (prepare a new run) to write the engine's role "
                        "environment" % key, key)
    return value


def role_port(role_env, key):
    value = role_value(role_env, key)
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) < 65536:
        raise PlanError("role env %s=%r is not a TCP port (1-65535)" % (key, value), key)
    return int(value)


def _device(path, where):
    parts = path.split("/") if isinstance(path, str) else []
    if not isinstance(path, str) or not path.startswith("/dev/") or ":" in path or "," in path \
            or any(p in ("..", ".") for p in parts) or "//" in path:
        raise PlanError("launch record %s entry %r is not a /dev path; %s" % (where, path, RERUN), where)
    return "%s:%s:rwm" % (path, path)


def _abs_path(path, where):
    if not isinstance(path, str) or not path.startswith("/") or "," in path or ".." in path.split("/") \
            or any(ch in path for ch in "\r\n\x00"):
        raise PlanError("%s=%r must be an absolute path without commas or '..'" % (where, path), where)
    return path


def parallelism(record):
    """(data-parallel size, expert parallelism) of a record: `data_parallel_size` (present only above 1) and
    `enable_expert_parallel` (present only when true); a record without them is DP 1 without EP."""
    dp = record.get("data_parallel_size", 1)
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise PlanError("launch record data_parallel_size=%r must be a whole number >= 1; %s" % (dp, RERUN),
                        "data_parallel_size")
    ep = record.get("enable_expert_parallel", False)
    if not isinstance(ep, bool):
        raise PlanError("launch record enable_expert_parallel=%r must be true or false; %s" % (ep, RERUN),
                        "enable_expert_parallel")
    return dp, ep


def parallel_flags(record):
    """The vllm serve flags of data and expert parallelism, after --tensor-parallel-size: `--data-parallel-size N`
    for DP > 1 (vLLM starts N engine cores behind the one API port, each on TP consecutive GPUs of the visibility
    list: v1/engine/utils.py get_physical_gpu_ids_for_local_dp_rank) and `--enable-expert-parallel`; nothing for
    DP 1 without EP, so those commands (and plan hashes) stay as they were.

    A host of an engine across hosts (a member view, `member` set: member_record) adds where its ranks are and where
    they meet (vLLM docs/serving/data_parallel_deployment.md, "Multi-node"): `--data-parallel-size-local L
    --data-parallel-address <head> --data-parallel-rpc-port P` on every host, and on the hosts after the head
    `--data-parallel-start-rank k*L --headless` (engine cores only, no API server: 0.32.0 entrypoints/cli/serve.py
    run_headless)."""
    dp, ep = parallelism(record)
    flags = ["--data-parallel-size", str(dp)] if dp > 1 else []
    member = record.get("member")
    if member is not None:
        flags += ["--data-parallel-size-local", str(record["data_parallel_size_local"]),
                  "--data-parallel-address", member["head_address"],
                  "--data-parallel-rpc-port", str(record["data_parallel_rpc_port"])]
        if member["rank"]:
            flags += ["--data-parallel-start-rank", str(member["start_rank"]), "--headless"]
    return flags + (["--enable-expert-parallel"] if ep else [])


MEMBER_ENV = "NARWHAL_ENGINE_MEMBER"
# the fields of a record that a host after the head of an engine across hosts has of its own (`members[]`; the rest is
# the head's, the same on every host: _discover/members.py)
MEMBER_FIELDS = ("gpu_ids", "gpu_host_indices", "accelerator_devices", "transfer")
MEMBER_NODE_FIELDS = ("address", "fabric_interface", "side_channel_ports", "host_id")


def member_view(record, rank):
    """The record as host `rank` of its engine runs it: the head's record for rank 0 (or an engine on one host),
    else the head's record with that member's own fields (MEMBER_FIELDS, MEMBER_NODE_FIELDS) in their places and
    `member` = {rank, start_rank, head_address}; `members` is dropped from the view. Raises KeyError for a rank the
    record does not have."""
    members = record.get("members") or []
    view = dict((k, v) for k, v in record.items() if k != "members")
    if not rank:
        if members or "data_parallel_size_local" in record:
            view["member"] = {"rank": 0, "start_rank": 0, "head_address": record["node"]["address"]}
        return view
    entry = next((m for m in members if m.get("member") == rank), None)
    if entry is None:
        raise KeyError(rank)
    for field in MEMBER_FIELDS:
        view[field] = entry[field]
    view["node"] = dict(record["node"])
    for field in MEMBER_NODE_FIELDS:
        view["node"][field] = entry["node"][field]
    view["member"] = {"rank": rank, "start_rank": entry["data_parallel_start_rank"],
                      "head_address": record["node"]["address"]}
    return view


def member_record(record, role_env):
    """The record as this host runs it: for an engine across hosts (`members` in the record) the view of the host
    the role environment names (NARWHAL_ENGINE_MEMBER=k for the k-th host after the head, unset for the head:
    _discover/members.py::member_view); any other record as it is. A member the record does not have, or a member
    for a record of one host, is refused."""
    raw = role_env.get(MEMBER_ENV)
    if raw in (None, "") and not record.get("members") and "data_parallel_size_local" not in record:
        return record
    if raw not in (None, "") and not re.match(r"^[1-9][0-9]?\Z", str(raw)):
        raise PlanError("role env %s=%r must be the host's narwhal_rank 1 .. 99 (unset for the head); prepare a new "
                        "run" % (MEMBER_ENV, raw), MEMBER_ENV)
    rank = int(raw) if raw not in (None, "") else 0
    try:
        return member_view(record, rank)
    except KeyError:
        raise PlanError("role env %s=%d names host %d of %s but its launch record has %s; the record and the role "
                        "environment come from different runs or inventories: prepare a new run"
                        % (MEMBER_ENV, rank, rank, record.get("engine"),
                           "members 1 .. %d" % len(record.get("members") or []) if record.get("members")
                           else "no members (an engine on one host)"), MEMBER_ENV)


def local_parallel(record):
    """The DP ranks this host runs: data_parallel_size_local of a member view, else the record's DP size."""
    return record["data_parallel_size_local"] if record.get("member") is not None else parallelism(record)[0]


def _gpu_fields(record, vendor):
    """(gpu_ids, gpu_host_indices, TP) of a record, checked against each other (DP x TP GPUs)."""
    gpu_ids = [str(g) for g in record_field(record, "gpu_ids", list)]
    host_indices = record_field(record, "gpu_host_indices", list)
    tp = record_field(record, "tensor_parallel_size", int)
    if tp < 1:
        raise PlanError("launch record tensor_parallel_size=%d must be >= 1" % tp, "tensor_parallel_size")
    dp = local_parallel(record)
    if gpu_ids and len(gpu_ids) != tp * dp:
        raise PlanError("launch record gpu_ids has %d entries but tensor_parallel_size is %d%s; %s"
                        % (len(gpu_ids), tp, " and %s %d (DP x TP GPUs)"
                           % ("data_parallel_size_local" if record.get("member") else "data_parallel_size", dp)
                           if dp > 1 else "", RERUN), "gpu_ids")
    if len(host_indices) != len(gpu_ids) or len(set(gpu_ids)) != len(gpu_ids) \
            or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in host_indices) \
            or len(set(host_indices)) != len(host_indices):
        raise PlanError("launch record gpu_host_indices %r and gpu_ids %r must be distinct, non-negative and of the "
                        "same length; %s" % (host_indices, gpu_ids, RERUN), "gpu_host_indices")
    if vendor in ("nvidia", "amd") and not gpu_ids:
        raise PlanError("launch record accelerator.vendor=%s but gpu_ids is empty; %s" % (vendor, RERUN), "gpu_ids")
    return gpu_ids, host_indices, tp


def _runtime_fields(record):
    """(environment, derived environment, extra args) of a record's runtime, checked against the managed rules."""
    runtime = record["runtime"]
    release = version_tuple(runtime.get("vllm_version", ""))
    runtime_env = check_env(record_field(record, "runtime.environment", dict), "launch record runtime.environment",
                            release=release)
    derived_env = check_env(record_field(record, "runtime.derived_environment", dict),
                            "launch record runtime.derived_environment", allowed=DERIVED_ENV)
    trust = runtime.get("trust_remote_code") is True
    extra_args = check_args(record_field(record, "runtime.extra_args", list), "launch record runtime.extra_args",
                            allowed=DERIVED_FLAGS if trust else ())
    if trust and "--trust-remote-code" not in extra_args:
        raise PlanError("launch record runtime.trust_remote_code is true but runtime.extra_args lacks "
                        "--trust-remote-code; %s" % RERUN, "runtime.extra_args")
    if runtime.get("ssm_conv_state") and derived_env.get(SSM_LAYOUT_ENV) != "DS":
        raise PlanError("launch record runtime.ssm_conv_state is true but runtime.derived_environment lacks "
                        "%s=DS; %s" % (SSM_LAYOUT_ENV, RERUN), "runtime.derived_environment")
    return runtime_env, derived_env, extra_args


def _net_devices(record, role_env):
    """transfer.net_devices resolved from the role environment: the one place ${NARWHAL_FABRIC_INTERFACE} is
    resolved (docs/vllm-requirements.md, "Allocation and transport fields")."""
    try:
        net_devices = resolve_values(record_field(record, "transfer.net_devices", list, allow_empty=False),
                                     dict((k, v) for k, v in role_env.items() if v),
                                     "launch record transfer.net_devices")
    except SubstitutionError as exc:
        raise PlanError("%s; the role env provides NARWHAL_FABRIC_INTERFACE (prepare a new run)" % exc,
                        "transfer.net_devices")
    for index, dev in enumerate(net_devices):
        if not isinstance(dev, str) or not re.match(r"^[A-Za-z0-9_.@-]+(:[0-9]+)?\Z", dev):
            raise PlanError("launch record transfer.net_devices[%d]=%r is not an interface or HCA:port; %s"
                            % (index, dev, RERUN), "transfer.net_devices")
    return net_devices


def _device_mappings(vendor, host_indices, accel_devices, transfer_devices):
    """(devices, device_requests, verify_devices) of the container."""
    devices, device_requests, verify_devices = [], [], []
    if vendor == "nvidia":
        # GPUs through the NVIDIA runtime's device request (it also brings the driver libraries); the recorded
        # /dev/nvidia* nodes are checked on the host, not mapped.
        verify_devices = [_device(d, "accelerator_devices").split(":", 1)[0] for d in accel_devices]
        device_requests = [{"driver": "nvidia", "device_ids": [str(i) for i in host_indices],
                            "capabilities": [["gpu"]]}]
    else:
        devices = [_device(d, "accelerator_devices") for d in accel_devices]
    devices += [_device(d, "transfer.devices") for d in transfer_devices]
    return devices, device_requests, verify_devices


def container_spec(record, role_env):
    """The container the engine runs, as data (pure). The API key is a placeholder (REDACTED). Every refusal names
    the record field or role-environment key; they come in the order of the fields below. For an engine across
    hosts it is the container of the host the role environment names (member_record)."""
    record = member_record(record, role_env)
    engine = role_value(role_env, "NARWHAL_ENGINE")
    if not ENGINE_NAME.match(engine):
        raise PlanError("role env NARWHAL_ENGINE=%r must be engine-<n>" % engine, "NARWHAL_ENGINE")
    if record.get("engine") != engine:
        raise PlanError("launch record engine=%r does not match role env NARWHAL_ENGINE=%s; install the engine's own "
                        "record" % (record.get("engine"), engine), "engine")
    vendor = record_field(record, "accelerator.vendor", str)
    image_id = record_field(record, "runtime.image_id", str, allow_empty=False)
    platform = record_field(record, "runtime.platform", str)
    transport = record_field(record, "transfer.transport", str)
    kv_buffer_device = record_field(record, "runtime.kv_buffer_device", str, allow_empty=False)
    if platform not in ("cuda", "rocm", "cpu") or transport not in NETWORK_TRANSPORTS:
        raise PlanError("launch record transfer.transport=%r / runtime.platform=%r is not supported (ucx_tcp|ucx_rdma "
                        "on cuda|rocm|cpu)" % (transport, platform), "transfer.transport")
    if {"cuda": "nvidia", "rocm": "amd", "cpu": "cpu"}[platform] != vendor:
        raise PlanError("launch record runtime.platform=%s does not fit accelerator.vendor=%s; %s"
                        % (platform, vendor, RERUN), "runtime.platform")
    tls = check_ucx_tls(record_field(record, "transfer.ucx_tls", list), transport, platform, kv_buffer_device)
    if record_field(record, "network_mode", str) != "host":
        raise PlanError("launch record network_mode must be host; %s" % RERUN, "network_mode")
    gpu_ids, host_indices, tp = _gpu_fields(record, vendor)
    accel_devices = record_field(record, "accelerator_devices", list)
    transfer_devices = record_field(record, "transfer.devices", list)
    runtime = record["runtime"]
    runtime_env, derived_env, extra_args = _runtime_fields(record)

    mount = _abs_path(role_value(role_env, "NARWHAL_MODEL_MOUNT"), "role env NARWHAL_MODEL_MOUNT")
    model_path = _abs_path(record_field(record, "runtime.model_path", str, allow_empty=False),
                           "launch record runtime.model_path")
    served = role_value(role_env, "NARWHAL_SERVED_MODEL_NAME")
    if served != runtime.get("served_model_name") or mount != model_mount(record):
        raise PlanError("role env NARWHAL_SERVED_MODEL_NAME=%s / NARWHAL_MODEL_MOUNT=%s do not match the record's "
                        "runtime.served_model_name %s; prepare a new run"
                        % (served, mount, runtime.get("served_model_name")), "NARWHAL_SERVED_MODEL_NAME")
    family = role_value(role_env, "NARWHAL_BIND_FAMILY")
    if family not in BIND_HOSTS:
        raise PlanError("role env NARWHAL_BIND_FAMILY=%r must be ipv4 or ipv6" % family, "NARWHAL_BIND_FAMILY")
    http_port = role_port(role_env, "NARWHAL_HTTP_PORT")
    side_port = role_port(role_env, "NARWHAL_SIDE_CHANNEL_PORT")
    side_host = side_channel_host(role_env.get("NARWHAL_ADVERTISED_ADDRESS", ""))
    net_devices = _net_devices(record, role_env)
    devices, device_requests, verify_devices = _device_mappings(vendor, host_indices, accel_devices,
                                                                transfer_devices)

    environment = dict(runtime_env)
    environment.update(derived_env)
    if gpu_ids:
        visibility = record_field(record, "gpu_visibility_env", str)
        if visibility != VISIBILITY_BY_VENDOR.get(vendor):
            raise PlanError("launch record gpu_visibility_env=%r is not the visibility variable of %s GPUs (%s); %s"
                            % (visibility, vendor, VISIBILITY_BY_VENDOR.get(vendor), RERUN), "gpu_visibility_env")
        environment[visibility] = ",".join(gpu_ids)
    environment["UCX_NET_DEVICES"] = ",".join(net_devices)
    environment["UCX_TLS"] = ",".join(tls)
    environment["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_host
    environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_port)
    environment[API_KEY_ENV] = REDACTED
    lease = kv_lease(record)
    if lease is not None and lease[0] == LEASE_ENV:
        environment[LEASE_ENV] = str(lease[1])
    drain = shutdown_timeout(record)

    command = [
        "serve", mount,
        "--served-model-name", served,
        "--host", BIND_HOSTS[family],
        "--port", str(http_port),
        "--tensor-parallel-size", str(tp),
    ] + parallel_flags(record) + [
        "--kv-transfer-config", json.dumps(kv_transfer_config(record), separators=(",", ":")),
        "--dtype", record_field(record, "runtime.model_dtype", str, allow_empty=False),
        "--kv-cache-dtype", record_field(record, "runtime.kv_cache_dtype", str, allow_empty=False),
        "--block-size", str(record_field(record, "runtime.block_size", int)),
    ] + ([SHUTDOWN_FLAG, str(drain)] if drain is not None else []) + [str(a) for a in extra_args]

    rdma = transport == "ucx_rdma"
    return {
        "engine": engine,
        "name": "narwhal-%s" % engine,
        "image": image_id,
        "image_ref": runtime.get("image", ""),
        "entrypoint": ["vllm"],
        "command": command,
        "environment": dict(sorted(environment.items())),
        "network_mode": "host",
        "ipc_mode": "host",
        "devices": devices,
        "device_requests": device_requests,
        "verify_devices": verify_devices,
        "group_add": ["video", "render"] if vendor == "amd" else [],
        "cap_add": ["IPC_LOCK"] if rdma else [],
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}] if rdma else [],
        "security_opt": ["seccomp=unconfined"] if vendor == "amd" else [],
        "mounts": [{"type": "bind", "source": model_path, "target": mount, "read_only": True}],
        "labels": {ENGINE_LABEL: engine},
        "restart_policy": {"name": RESTART_POLICY},
    }


def redacted(plan):
    plan = copy.deepcopy(plan)
    if API_KEY_ENV in plan.get("environment", {}):
        plan["environment"][API_KEY_ENV] = REDACTED
    return plan


def plan_hash(plan):
    """sha256 of the canonical JSON of the plan, the API key excluded: the same on the controller and host."""
    canonical = json.dumps(redacted(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def create_labels(plan, run_id=None, digest=None):
    """The container's labels: the plan's, the plan hash (`digest` when the caller has it), and the run that
    creates it (RUN_ID_LABEL, when given). The last two are added at create time, outside the hashed plan."""
    labels = dict(plan["labels"])
    labels[PLAN_HASH_LABEL] = digest or plan_hash(plan)
    if run_id:
        labels[RUN_ID_LABEL] = run_id
    return labels


def docker_run_argv(plan, group_ids=None, run_id=None):
    """The complete container command as `docker run` reads it (API key redacted). `group_ids` maps the plan's
    group names to the host's numeric IDs (the launcher passes them; see its start); `run_id` is the creating
    run's label."""
    plan = redacted(plan)
    argv = ["docker", "run", "-d", "--name", plan["name"], "--network", plan["network_mode"],
            "--ipc", plan["ipc_mode"], "--restart", plan["restart_policy"]["name"]]
    for device in plan["devices"]:
        argv += ["--device", device]
    for request in plan["device_requests"]:
        argv += ["--gpus", '"device=%s"' % ",".join(request["device_ids"])]
    for group in plan["group_add"]:
        argv += ["--group-add", (group_ids or {}).get(group, group)]
    for cap in plan["cap_add"]:
        argv += ["--cap-add", cap]
    for ulimit in plan["ulimits"]:
        argv += ["--ulimit", "%s=%d:%d" % (ulimit["name"], ulimit["soft"], ulimit["hard"])]
    for opt in plan["security_opt"]:
        argv += ["--security-opt", opt]
    for mount in plan["mounts"]:
        argv += ["--mount", "type=%s,source=%s,target=%s%s" % (mount["type"], mount["source"], mount["target"],
                                                               ",readonly" if mount["read_only"] else "")]
    labels = create_labels(plan, run_id)
    for key in sorted(labels):
        argv += ["--label", "%s=%s" % (key, labels[key])]
    for key in sorted(plan["environment"]):
        argv += ["-e", "%s=%s" % (key, plan["environment"][key])]
    argv += ["--entrypoint", plan["entrypoint"][0], plan["image"]] + plan["entrypoint"][1:] + plan["command"]
    return argv
