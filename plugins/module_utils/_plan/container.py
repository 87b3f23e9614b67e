# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of record -> container (docs/architecture.md, "One planner"): pure, standard library only.

`container_spec(record, role_env)` turns a launch record and an engine's role environment into the complete
container the engine runs (image, entrypoint, command, environment, devices, device requests, groups,
capabilities, ulimits, mounts, labels, restart policy, log driver and rotation); `docker_run_argv` writes it as
`docker run` reads it.
Discovery calls container_spec on every record it writes (so it refuses at once what the launcher would refuse, in
the launcher's words), prepare records its environment, command and hash in the manifest, and the launcher snapshot
(a zipapp that carries this package) starts exactly that. The rules it applies have no other copy: the
launcher-managed flags and variables (_plan/args.py), the UCX transports and the connector config
(_plan/transfer.py), the KV lease and the drain (_plan/lifecycle.py), data and expert parallelism and the hosts of
an engine across hosts (_plan/parallel.py), the record fields and role-environment keys (_plan/fields.py), the plan
hash and labels (_plan/labels.py), the role environment (_plan/role_env.py), the ${NAME} resolution of record
values (_plan/subst.py); who gets in (the bind address, the key guard, TLS) is _access and bind_address here.

Every refusal raises PlanError(message, key): `key` names the input or record field to correct.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import HASH_SEED_ENV, bind_endpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME, local_host_reason
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import API_KEY_ENV
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import version_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import (
    DERIVED_ENV,
    DERIVED_FLAGS,
    LEASE_ENV,
    PREFIXED_ENV,
    SSM_LAYOUT_ENV,
    VISIBILITY_BY_VENDOR,
    check_args,
    check_env,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.fields import record_field, role_port, role_value
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import (
    ENGINE_LABEL,
    GUARD_LABEL,
    MODEL_MANIFEST_LABEL,
    TLS_CERT_LABEL,
    create_labels,
    redacted,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import (
    SHUTDOWN_FLAG,
    kv_lease,
    shutdown_timeout,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import (
    local_parallel,
    member_record,
    parallel_flags,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import SECRETS_DIR, TLS_FILES, model_mount
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import SubstitutionError, resolve_values
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.transfer import (
    NETWORK_TRANSPORTS,
    check_ucx_tls,
    kv_transfer_config,
)

__metaclass__ = type


# Engines come back after a daemon restart or host reboot, not after a stop. The launch record carries no restart
# policy (no input sets it), so the plan's is this constant.
RESTART_POLICY = "unless-stopped"

# Bounded logs (issue 36): the record's runtime.log (NARWHAL_LOG_DRIVER, NARWHAL_LOG_MAX_SIZE, NARWHAL_LOG_MAX_FILE)
# is the container's HostConfig.LogConfig. Both drivers rotate by max-size and keep max-file files (Docker's
# json-file and local drivers take the same two options) and both serve `docker logs`.
LOG_DRIVERS = ("json-file", "local")
LOG_SIZE = re.compile(r"^[1-9][0-9]{0,5}[kmg]$")  # a whole number and k, m or g (Docker's max-size), e.g. 100m

BIND_FAMILIES = ("ipv4", "ipv6")
WILDCARDS = ("0.0.0.0", "::")

# Who gets in (issue 35): every engine runs the key guard through vLLM's own --middleware option
# (roles/install/files/guard/narwhal_guard.py says why), mounted read-only and first on PYTHONPATH, and with TLS
# serves its certificate from its TLS directory, mounted read-only (vllm serve --ssl-certfile/--ssl-keyfile).
GUARD_TARGET = "/narwhal/guard"
GUARD_MIDDLEWARE = "narwhal_guard.KeyGuard"
TLS_TARGET = "/narwhal/tls"
# The engines' key (issue 36, key rotation): never in the container's environment (so never in `docker inspect`) and
# never in the plan. The guard is the engine's only key check: it reads the engine host's key file, whose directory
# (<checkout>/secrets, the key file alone: role_env.py SECRETS_DIR) is mounted read-only at SECRETS_TARGET - a
# directory, so that the file install replaces by rename is seen in the container (a file bind mount keeps the old
# inode) - and accepts each key of it, the previous one too during a rotation, re-reading it when it changes: a new
# key costs no restart. GUARD_KEY_ENV names the file (a path, no secret). vLLM's own check stays off: VLLM_API_KEY is
# set empty (vLLM 0.32.0 entrypoints/serve/middleware/register.py keeps no empty key, so adds no check; an image
# whose Env carries a key of its own does not turn it back on) and no --api-key is passed.
SECRETS_TARGET = "/narwhal/secrets"
GUARD_KEY_ENV = "NARWHAL_GUARD_KEY_FILE"


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


def log_config(record):
    """HostConfig.LogConfig of the record's runtime.log: {"Type": driver, "Config": {"max-size", "max-file"}} (the
    Engine API takes option values as strings). None for a record written before runtime.log existed: no LogConfig
    is planned (the daemon's default driver), so such an engine keeps its plan hash."""
    log = record["runtime"].get("log")
    if log is None:
        return None
    where = "runtime.log"
    if not isinstance(log, dict):
        raise PlanError("launch record %s must be an object {driver, max_size, max_file}, got %r; %s"
                        % (where, log, RERUN), where)
    driver, size, count = log.get("driver"), log.get("max_size"), log.get("max_file")
    if driver not in LOG_DRIVERS:
        raise PlanError("launch record %s.driver=%r is not one of %s (NARWHAL_LOG_DRIVER); %s"
                        % (where, driver, ", ".join(LOG_DRIVERS), RERUN), where + ".driver")
    if not isinstance(size, str) or not LOG_SIZE.match(size):
        raise PlanError("launch record %s.max_size=%r is not a log size (a whole number and k, m or g, e.g. 100m: "
                        "NARWHAL_LOG_MAX_SIZE); %s" % (where, size, RERUN), where + ".max_size")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise PlanError("launch record %s.max_file=%r is not a positive whole number (NARWHAL_LOG_MAX_FILE); %s"
                        % (where, count, RERUN), where + ".max_file")
    return {"Type": driver, "Config": {"max-size": size, "max-file": str(count)}}


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


def _engine(record, role_env):
    """NARWHAL_ENGINE of the role environment, which must be the record's engine."""
    engine = role_value(role_env, "NARWHAL_ENGINE")
    if not ENGINE_NAME.match(engine):
        raise PlanError("role env NARWHAL_ENGINE=%r must be engine-<n>" % engine, "NARWHAL_ENGINE")
    if record.get("engine") != engine:
        raise PlanError("launch record engine=%r does not match role env NARWHAL_ENGINE=%s; install the engine's own "
                        "record" % (record.get("engine"), engine), "engine")
    return engine


def _image_and_transport(record):
    """(vendor, image ID, transport, UCX_TLS) of a record: the platform checked against the vendor and the
    transport, the UCX list against all three."""
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
    return vendor, image_id, transport, tls


def _model(record, role_env):
    """(mount, model path, served name): the role environment's mount and served name, which must be the record's."""
    runtime = record["runtime"]
    mount = _abs_path(role_value(role_env, "NARWHAL_MODEL_MOUNT"), "role env NARWHAL_MODEL_MOUNT")
    model_path = _abs_path(record_field(record, "runtime.model_path", str, allow_empty=False),
                           "launch record runtime.model_path")
    served = role_value(role_env, "NARWHAL_SERVED_MODEL_NAME")
    if served != runtime.get("served_model_name") or mount != model_mount(record):
        raise PlanError("role env NARWHAL_SERVED_MODEL_NAME=%s / NARWHAL_MODEL_MOUNT=%s do not match the record's "
                        "runtime.served_model_name %s; prepare a new run"
                        % (served, mount, runtime.get("served_model_name")), "NARWHAL_SERVED_MODEL_NAME")
    return mount, model_path, served


def model_labels(record):
    """{MODEL_MANIFEST_LABEL: runtime.model_manifest} when the record has the checkpoint's manifest digest (the deliver
    stage stamped the checkpoint), else {}: a record without one keeps the plan hash it had before the field existed.
    Any other value than "sha256:" and 64 lower-case hex digits is refused naming the field."""
    if "model_manifest" not in record["runtime"]:
        return {}
    digest = record_field(record, "runtime.model_manifest", str)
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise PlanError("launch record field runtime.model_manifest must be sha256:<64 hex digits> (the digest of the "
                        "checkpoint's manifest), got %r; %s" % (digest, RERUN), "runtime.model_manifest")
    return {MODEL_MANIFEST_LABEL: digest}


def bind_address(role_env):
    """NARWHAL_BIND_ADDRESS, the address `vllm serve --host` binds: an IP address (the engine's advertised address,
    or NARWHAL_ENGINE_BIND, which may be 0.0.0.0 or ::), as ipaddress writes it."""
    value = role_value(role_env, "NARWHAL_BIND_ADDRESS")
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise PlanError("role env NARWHAL_BIND_ADDRESS=%r is not an IP address; it is the engine's advertised address "
                        "or NARWHAL_ENGINE_BIND: correct NARWHAL_ENGINE_BIND and prepare a new run" % value,
                        "NARWHAL_BIND_ADDRESS")


def _endpoints(role_env):
    """(bind host, HTTP port, side-channel host, side-channel port) of the role environment."""
    family = role_value(role_env, "NARWHAL_BIND_FAMILY")
    if family not in BIND_FAMILIES:
        raise PlanError("role env NARWHAL_BIND_FAMILY=%r must be ipv4 or ipv6" % family, "NARWHAL_BIND_FAMILY")
    http_port = role_port(role_env, "NARWHAL_HTTP_PORT")
    side_port = role_port(role_env, "NARWHAL_SIDE_CHANNEL_PORT")
    side_host = side_channel_host(role_env.get("NARWHAL_ADVERTISED_ADDRESS", ""))
    return bind_address(role_env), http_port, side_host, side_port


def _sha256(role_env, key, required):
    value = role_env.get(key, "")
    if (value or required) and not re.match(r"^[0-9a-f]{64}\Z", value):
        raise PlanError("role env %s=%r is not a sha256 (64 hex digits); prepare a new run" % (key, value), key)
    return value


def key_file_mount(role_env):
    """(mount, container path) of the engine's key file (NARWHAL_API_KEY_FILE): its directory, which must be a
    SECRETS_DIR of its own (an older role environment's config/engine-api.key is refused: that directory holds the
    records), at SECRETS_TARGET, read-only."""
    key_file = _abs_path(role_value(role_env, "NARWHAL_API_KEY_FILE"), "role env NARWHAL_API_KEY_FILE")
    folder, name = posixpath.split(key_file)
    if posixpath.basename(folder) != SECRETS_DIR or not name:
        raise PlanError("role env NARWHAL_API_KEY_FILE=%s is not in the directory of its own that the engine mounts "
                        "(<checkout>/%s/); prepare a new run (install puts the key there)" % (key_file, SECRETS_DIR),
                        "NARWHAL_API_KEY_FILE")
    mount = {"type": "bind", "source": folder, "target": SECRETS_TARGET, "read_only": True}
    return mount, "%s/%s" % (SECRETS_TARGET, name)


def _access(role_env):
    """(mounts, flags, labels) of the key guard and the engine's TLS (who gets in): the guard's directory mounted at
    GUARD_TARGET and --middleware, the key file's directory at SECRETS_TARGET (key_file_mount); with
    NARWHAL_TLS_DIR, that directory at TLS_TARGET and --ssl-certfile and --ssl-keyfile. The sha256 of the guard and
    of the certificate are labels, so that a new one changes the plan (the key is in neither: a new key is read by
    the guard, not planned)."""
    guard_dir = _abs_path(role_value(role_env, "NARWHAL_GUARD_DIR"), "role env NARWHAL_GUARD_DIR")
    mounts = [{"type": "bind", "source": guard_dir, "target": GUARD_TARGET, "read_only": True},
              key_file_mount(role_env)[0]]
    flags = ["--middleware", GUARD_MIDDLEWARE]
    guard_sha = _sha256(role_env, "NARWHAL_GUARD_SHA256", False)
    labels = {GUARD_LABEL: guard_sha} if guard_sha else {}
    tls_dir = role_env.get("NARWHAL_TLS_DIR", "")
    if tls_dir:
        mounts.append({"type": "bind", "source": _abs_path(tls_dir, "role env NARWHAL_TLS_DIR"), "target": TLS_TARGET,
                       "read_only": True})
        flags += ["--ssl-certfile", "%s/%s" % (TLS_TARGET, TLS_FILES["cert"]),
                  "--ssl-keyfile", "%s/%s" % (TLS_TARGET, TLS_FILES["key"])]
        labels[TLS_CERT_LABEL] = _sha256(role_env, "NARWHAL_TLS_CERT_SHA256", True)
    return mounts, flags, labels


def python_path(runtime_env):
    """PYTHONPATH of the engine: the key guard first, then the record's (the image's own) PYTHONPATH."""
    own = runtime_env.get(PREFIXED_ENV[0], "")
    return GUARD_TARGET + (":" + own if own else "")


def _environment(record, vendor, gpu_ids, runtime_env, derived_env, managed):
    """The container's environment, sorted by name: the record's runtime and derived environment, the GPU visibility
    variable, the launcher-managed variables `managed` (the guard's key file among them), VLLM_API_KEY empty (vLLM's
    own check off: the guard is the check) and, where the image's vLLM reads the KV lease from the environment
    (<= 0.21), the lease. No key: the guard reads it from its file."""
    environment = dict(runtime_env)
    environment.update(derived_env)
    if gpu_ids:
        visibility = record_field(record, "gpu_visibility_env", str)
        if visibility != VISIBILITY_BY_VENDOR.get(vendor):
            raise PlanError("launch record gpu_visibility_env=%r is not the visibility variable of %s GPUs (%s); %s"
                            % (visibility, vendor, VISIBILITY_BY_VENDOR.get(vendor), RERUN), "gpu_visibility_env")
        environment[visibility] = ",".join(gpu_ids)
    environment.update(managed)
    environment[API_KEY_ENV] = ""
    lease = kv_lease(record)
    if lease is not None and lease[0] == LEASE_ENV:
        environment[LEASE_ENV] = str(lease[1])
    return dict(sorted(environment.items()))


SCALE_OUT_FLAG = "--enable-scale-out"


def kv_events(record, runtime_env):
    """(flags, environment) of a record's `kv_events` (_common/kv_events.py; none: ([], {}), so the plans of engines
    without them stay as they were): `--kv-events-config` with vLLM's ZMQ publisher on the record's endpoint, and
    PYTHONHASHSEED, the seed of vLLM's block hashes; a prefill engine also serves the render routes
    (SCALE_OUT_FLAG) the router's kv_aware policy asks. A record whose own environment (the image's, the operator's)
    sets another PYTHONHASHSEED is refused: the events of engines seeded differently would not agree."""
    if record.get("kv_events") is None:
        return [], {}
    # the endpoint from the port: whatever else a hand-edited record says, the publisher binds (a non-wildcard
    # endpoint would make vLLM connect to it and push the events there); the record check holds endpoint = this
    endpoint = bind_endpoint(record_field(record, "kv_events.port", int))
    hash_seed = record_field(record, "kv_events.hash_seed", str, allow_empty=False)
    seed = runtime_env.get(HASH_SEED_ENV)
    if seed is not None and seed != hash_seed:
        raise PlanError("launch record runtime.environment sets %s=%s but kv_events.hash_seed is %s (the image's "
                        "environment or NARWHAL_ENGINE_ENV): every engine of a fleet with KV events hashes its blocks "
                        "with one seed; set NARWHAL_KV_HASH_SEED=%s (or remove the variable), then %s"
                        % (HASH_SEED_ENV, seed, hash_seed, seed, RERUN), "NARWHAL_KV_HASH_SEED")
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
    flags = ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
    if record.get("role") == "prefill":
        # vllm-router's kv_aware prefill policy learns a request's token IDs from POST /v1/completions/render on a
        # prefill engine, which vLLM 0.32.0 answers 403 unless it runs with --enable-scale-out
        # (entrypoints/scale_out/factories.py::register_scale_out_api_routers); without them the router falls back to
        # load alone (fallback="preparation_rejected") and the events go unused. The routes are behind the key guard.
        flags.append(SCALE_OUT_FLAG)
    return flags, {HASH_SEED_ENV: hash_seed}


def _serve_command(record, mount, served, bind_host, http_port, access, tp, drain, extra_args):
    """The `vllm serve` command: the model, the bind address and port, the key guard and TLS (`access`), the
    parallelism, the connector, the dtypes and block size, the KV events (when the record has them), the drain (when
    the record has one) and, last, the record's extra arguments."""
    return [
        "serve", mount,
        "--served-model-name", served,
        "--host", bind_host,
        "--port", str(http_port),
    ] + access + [
        "--tensor-parallel-size", str(tp),
    ] + parallel_flags(record) + [
        "--kv-transfer-config", json.dumps(kv_transfer_config(record), separators=(",", ":")),
        "--dtype", record_field(record, "runtime.model_dtype", str, allow_empty=False),
        "--kv-cache-dtype", record_field(record, "runtime.kv_cache_dtype", str, allow_empty=False),
        "--block-size", str(record_field(record, "runtime.block_size", int)),
    ] + kv_events(record, {})[0] + ([SHUTDOWN_FLAG, str(drain)] if drain is not None else []) + [
        str(a) for a in extra_args]


def container_spec(record, role_env):
    """The container the engine runs, as data (pure). No key in it (the guard reads the key file). Every refusal names
    the record field or role-environment key; they come in the order of the fields below. For an engine across
    hosts it is the container of the host the role environment names (member_record)."""
    record = member_record(record, role_env)
    engine = _engine(record, role_env)
    vendor, image_id, transport, tls = _image_and_transport(record)
    if record_field(record, "network_mode", str) != "host":
        raise PlanError("launch record network_mode must be host; %s" % RERUN, "network_mode")
    gpu_ids, host_indices, tp = _gpu_fields(record, vendor)
    accel_devices = record_field(record, "accelerator_devices", list)
    transfer_devices = record_field(record, "transfer.devices", list)
    runtime_env, derived_env, extra_args = _runtime_fields(record)
    mount, model_path, served = _model(record, role_env)
    bind_host, http_port, side_host, side_port = _endpoints(role_env)
    access_mounts, access_flags, access_labels = _access(role_env)
    net_devices = _net_devices(record, role_env)
    devices, device_requests, verify_devices = _device_mappings(vendor, host_indices, accel_devices,
                                                                transfer_devices)
    environment = _environment(record, vendor, gpu_ids, runtime_env, derived_env, dict({
        "UCX_NET_DEVICES": ",".join(net_devices),
        "UCX_TLS": ",".join(tls),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": side_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        PREFIXED_ENV[0]: python_path(runtime_env),
        GUARD_KEY_ENV: key_file_mount(role_env)[1],
    }, **kv_events(record, runtime_env)[1]))
    drain = shutdown_timeout(record)
    logs = log_config(record)
    command = _serve_command(record, mount, served, bind_host, http_port, access_flags, tp, drain, extra_args)
    rdma = transport == "ucx_rdma"
    plan = {
        "engine": engine,
        "name": "narwhal-%s" % engine,
        "image": image_id,
        "image_ref": record["runtime"].get("image", ""),
        "entrypoint": ["vllm"],
        "command": command,
        "environment": environment,
        "network_mode": "host",
        "ipc_mode": "host",
        "devices": devices,
        "device_requests": device_requests,
        "verify_devices": verify_devices,
        "group_add": ["video", "render"] if vendor == "amd" else [],
        "cap_add": ["IPC_LOCK"] if rdma else [],
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}] if rdma else [],
        "security_opt": ["seccomp=unconfined"] if vendor == "amd" else [],
        "mounts": [{"type": "bind", "source": model_path, "target": mount, "read_only": True}] + access_mounts,
        "labels": dict(access_labels, **model_labels(record), **{ENGINE_LABEL: engine}),
        "restart_policy": {"name": RESTART_POLICY},
    }
    if logs is not None:  # only then: a plan without it keeps the hash it had before runtime.log existed
        plan["log_config"] = logs
    return plan


def docker_run_argv(plan, group_ids=None, run_id=None):
    """The complete container command as `docker run` reads it (no key in it). `group_ids` maps the plan's
    group names to the host's numeric IDs (the launcher passes them; see its start); `run_id` is the creating
    run's label."""
    plan = redacted(plan)
    argv = ["docker", "run", "-d", "--name", plan["name"], "--network", plan["network_mode"],
            "--ipc", plan["ipc_mode"], "--restart", plan["restart_policy"]["name"]]
    if plan.get("log_config"):
        argv += ["--log-driver", plan["log_config"]["Type"]]
        for key in sorted(plan["log_config"]["Config"]):
            argv += ["--log-opt", "%s=%s" % (key, plan["log_config"]["Config"][key])]
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
