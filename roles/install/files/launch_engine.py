#!/usr/bin/env python3
"""narwhal.deploy engine launcher (seed §16, ARCHITECTURE §7). Runs on the engine host.

Self-contained: Python 3.8+ stdlib, plus the Docker SDK (python3-docker >= 4.3, Debian ships 5.0.3) imported
only by `start`. It is shipped as a snapshot with a sha256, so it imports nothing from the collection.

  launch_engine.py --role-env PATH plan          write <NARWHAL_RUN_DIR>/plan.json, print the docker run argv
  launch_engine.py --role-env PATH start [--force]
                                                 write the plan, then start (or keep) container narwhal-<engine>,
                                                 write <NARWHAL_RUN_DIR>/deployment.json; runs the image
                                                 check first (or reuses a matching checked.json) and
                                                 starts nothing when it fails
  launch_engine.py --role-env PATH check         write the plan, run the image check in a short-lived container
                                                 of the recorded image, write <NARWHAL_RUN_DIR>/checked.json
  launch_engine.py --role-env PATH probe-version [--timeout S]
                                                 wait for /health, GET /version, compare it with checked.json's
                                                 vllm_api_version, write <NARWHAL_RUN_DIR>/version-probe.json

Inputs: the role environment file (KEY=VALUE, no shell expansion) and the launch record it names
(NARWHAL_RECORD: one `engines.<name>` object of config/engine-launch.*.json).

Entrypoint choice: the plan sets the entrypoint to ["vllm"] and the command to ["serve", <mount>, ...]. Real
vllm/vllm-openai images have ENTRYPOINT `vllm serve` (recent) or `python3 -m vllm.entrypoints.openai.api_server`
(older); overriding it explicitly makes the process argv independent of the image, and the split
"vllm" / "serve ..." is exactly what `docker run --entrypoint vllm IMAGE serve ...` produces, so the recorded
argv and the container's Config.Entrypoint/Config.Cmd agree one to one.

Errors exit with status 2 and one line on stderr naming the field or entry and the fix.
"""
import argparse
import copy
import grp
import hashlib
import ipaddress
import json
import os
import re
import shlex
import sys
import time

PLAN_HASH_LABEL = "org.narwhal.plan-hash"
ENGINE_LABEL = "org.narwhal.engine"
REDACTED = "<redacted>"
STOP_TIMEOUT = 30  # seconds vLLM gets to shut down (SIGTERM) before a replaced container is killed
API_KEY_ENV = "VLLM_API_KEY"

# Flags whose value the launcher owns (normalised: `--x_y` -> `--x-y`). `--config` (a YAML file of
# arguments) could set any of them and `--uds` replaces the HTTP host/port, so both are refused too.
MANAGED_LONG_FLAGS = (
    "--port", "--host", "--tensor-parallel-size", "--kv-transfer-config", "--api-key", "--served-model-name",
    "--model", "--dtype", "--kv-cache-dtype", "--block-size", "--data-parallel-size",
    "--pipeline-parallel-size", "--config", "--uds",
)
MANAGED_SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size",
                       "-pp": "--pipeline-parallel-size"}

VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
MANAGED_ENV = VISIBILITY_ENV + (
    "UCX_NET_DEVICES", "UCX_TLS", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", API_KEY_ENV,
    "VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_HOST_IP", "VLLM_PORT",
)
# Derived by discovery into runtime.derived_environment; managed (no extra may touch it) but kept.
DERIVED_ENV = ("VLLM_SSM_CONV_STATE_LAYOUT",)

# UCX_TLS per transport and platform. ucx_tcp uses plain "tcp" (VLLM_FACTS: `tcp` for ucx_tcp): the NIXL
# traffic must go over the recorded fabric interface only, so neither shared-memory nor GPU IPC shortcuts are
# allowed to bypass it. RDMA: rc/ud verbs plus sm/self, plus the GPU memory transports of the platform so
# UCX can register device memory (cuda_copy/cuda_ipc on CUDA, rocm_copy/rocm_ipc on ROCm).
UCX_TLS = {
    ("ucx_tcp", "cuda"): "tcp",
    ("ucx_tcp", "rocm"): "tcp",
    ("ucx_tcp", "cpu"): "tcp",
    ("ucx_rdma", "cuda"): "rc,ud,sm,self,cuda_copy,cuda_ipc",
    ("ucx_rdma", "rocm"): "rc,ud,sm,self,rocm_copy,rocm_ipc",
    ("ucx_rdma", "cpu"): "rc,ud,sm,self",
}
BIND_HOSTS = {"ipv4": "0.0.0.0", "ipv6": "::"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SUBST = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class LaunchError(Exception):
    """A refused input: the message names the field or entry and the fix."""


# ----------------------------------------------------------------------------------------------- inputs

def read_role_env(path):
    """KEY=VALUE lines; `#` comments and blank lines ignored; no shell expansion, no quote removal."""
    result = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise LaunchError("role environment %s: %s; pass the engine's role env file with --role-env"
                          % (path, exc.strerror or exc))
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep or not ENV_NAME.match(key):
            raise LaunchError("role environment %s line %d: %r is not KEY=VALUE; fix the line"
                              % (path, number, stripped))
        result[key] = value
    return result


def load_record(path):
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except OSError as exc:
        raise LaunchError("NARWHAL_RECORD %s: %s; rerun install to copy the launch record"
                          % (path, exc.strerror or exc))
    except ValueError as exc:
        raise LaunchError("NARWHAL_RECORD %s is not JSON (%s); rerun discovery and install" % (path, exc))
    if not isinstance(record, dict):
        raise LaunchError("NARWHAL_RECORD %s: expected one engine record object" % path)
    return record


def read_api_key(path):
    """The engine API key from a 0600 file (one line)."""
    if not path:
        raise LaunchError("role env NARWHAL_API_KEY_FILE is not set; install writes the engine key file")
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            key = fh.read()
    except OSError as exc:
        raise LaunchError("NARWHAL_API_KEY_FILE %s: %s; rerun install to write the engine key"
                          % (path, exc.strerror or exc))
    if st.st_mode & 0o077:
        raise LaunchError("NARWHAL_API_KEY_FILE %s has mode %04o; it must be 0600 (chmod 600)"
                          % (path, st.st_mode & 0o7777))
    key = key.strip()
    if not key or "\n" in key or "\r" in key:
        raise LaunchError("NARWHAL_API_KEY_FILE %s must hold exactly one non-empty line" % path)
    return key


def _field(record, dotted, kind, allow_empty=True):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise LaunchError("launch record field %s is missing; rerun discovery" % dotted)
        value = value[part]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise LaunchError("launch record field %s must be %s, got %r; rerun discovery"
                          % (dotted, getattr(kind, "__name__", kind), value))
    if not allow_empty and not value and value != 0:
        raise LaunchError("launch record field %s is empty; rerun discovery" % dotted)
    return value


def _role(role_env, key, required=True):
    value = role_env.get(key, "")
    if required and not value:
        raise LaunchError("role env %s is not set; rerun install to write the engine's role environment" % key)
    return value


def _port(role_env, key):
    value = _role(role_env, key)
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise LaunchError("role env %s=%r is not a TCP port (1-65535)" % (key, value))
    return int(value)


def _version(text):
    parts = []
    for piece in str(text).split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group(0)))
    if len(parts) < 2:
        raise LaunchError("launch record field runtime.vllm_version=%r is not a version; rerun discovery" % text)
    return tuple(parts)


def _resolve(value, role_env, where):
    """Complete-value substitution: a value that is exactly ${NAME} takes NAME from the role env."""
    match = SUBST.match(value)
    if match:
        resolved = role_env.get(match.group(1), "")
        if not resolved:
            raise LaunchError("%s=%s: role env %s is not set" % (where, value, match.group(1)))
        return resolved
    if "${" in value:
        raise LaunchError("%s=%r: only a complete ${NAME} value is substituted; rerun discovery" % (where, value))
    return value


def _side_channel_host(address):
    if not address:
        raise LaunchError("role env NARWHAL_ADVERTISED_ADDRESS is not set; it must be the node's fabric address")
    name = address.strip("[]")
    bad = name.lower() in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback") \
        or name.lower().endswith(".localhost")
    try:
        ip = ipaddress.ip_address(name)
        bad = bad or ip.is_unspecified or ip.is_loopback
    except ValueError:
        pass
    if bad:
        raise LaunchError("role env NARWHAL_ADVERTISED_ADDRESS=%s cannot be VLLM_NIXL_SIDE_CHANNEL_HOST: it is "
                          "advertised to the other engines, so use the node's fabric address (record node.address)"
                          % address)
    return name


# ------------------------------------------------------------------------------------- managed overrides

def _flag_name(token):
    """The managed flag a token sets, or None. Handles --x_y, --flag=value, --flag.key (vLLM dotted JSON
    args), -tp/-tp=2, and unambiguous argparse abbreviations of a managed flag (--tensor-parallel)."""
    if not token.startswith("-") or token == "-" or token == "--":
        return None
    head = token.split("=", 1)[0]
    if head.startswith("--"):
        head = head.split(".", 1)[0].replace("_", "-")
        for flag in MANAGED_LONG_FLAGS:
            if head == flag or (len(head) > 3 and flag.startswith(head)):
                return flag
        return None
    return MANAGED_SHORT_FLAGS.get(head.split(".", 1)[0])


def check_args(args, where):
    for index, token in enumerate(args):
        if not isinstance(token, str):
            raise LaunchError("%s[%d]=%r is not a string" % (where, index, token))
        flag = _flag_name(token)
        if flag:
            raise LaunchError("%s[%d]=%r overrides launcher-managed %s; remove it (the launcher sets it from the "
                              "record and the role env)" % (where, index, token, flag))


def parse_engine_env(text):
    """NARWHAL_ENGINE_ENV: KEY=VALUE entries separated by spaces or newlines."""
    result = {}
    for entry in (text or "").split():
        key, sep, value = entry.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise LaunchError("role env NARWHAL_ENGINE_ENV entry %r is not KEY=VALUE" % entry)
        if key in MANAGED_ENV:
            raise LaunchError("role env NARWHAL_ENGINE_ENV entry %s is launcher-managed; remove it (the launcher "
                              "sets it from the record and the role env)" % key)
        result[key] = value
    return result


def _check_record_env(env, where, allowed=()):
    for key, value in env.items():
        if not ENV_NAME.match(key) or not isinstance(value, str):
            raise LaunchError("launch record %s.%s must be a string variable" % (where, key))
        if key in MANAGED_ENV and key not in allowed:
            raise LaunchError("launch record %s.%s is launcher-managed; rerun discovery" % (where, key))


# ------------------------------------------------------------------------------------------------- plan

def kv_transfer_config(record):
    """NixlConnector, kv_both, UCX, failure propagation where the image's vLLM knows the field (>= 0.14)."""
    runtime = record.get("runtime") or {}
    version = _version(runtime.get("vllm_version", ""))
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if version >= (0, 14):
        # the image's own KVTransferConfig validates the value (the image check); records before this field: fail
        config["kv_load_failure_policy"] = runtime.get("kv_load_failure_policy") or "fail"
    if runtime.get("kv_buffer_device") == "cpu":
        config["kv_buffer_device"] = "cpu"
    config["kv_connector_extra_config"] = {"backends": ["UCX"]}
    return config


def _device(path, where):
    if not isinstance(path, str) or not path.startswith("/dev/") or ":" in path or "," in path:
        raise LaunchError("launch record %s entry %r is not a /dev path; rerun discovery" % (where, path))
    return "%s:%s:rwm" % (path, path)


def host_group_ids(names):
    """Numeric IDs of the HOST's groups that own the GPU device nodes (ROCm: video, render).

    Docker resolves a group *name* inside the image's /etc/group, where `render` is often missing ("Unable to
    find group render"); the device nodes belong to the host's groups, so their numeric IDs are what counts.
    A group the host does not have owns no device and is left out."""
    ids = []
    for name in names:
        try:
            ids.append(str(grp.getgrnam(name).gr_gid))
        except KeyError:
            continue
    return ids


def build_plan(role_env, record, api_key_present=True):
    """The container the engine runs, as data (pure). The API key is a placeholder."""
    engine = _role(role_env, "NARWHAL_ENGINE")
    if not re.match(r"^engine-[0-9]+$", engine):
        raise LaunchError("role env NARWHAL_ENGINE=%r must be engine-<n>" % engine)
    if record.get("engine") != engine:
        raise LaunchError("launch record engine=%r does not match role env NARWHAL_ENGINE=%s; install the "
                          "engine's own record" % (record.get("engine"), engine))
    vendor = _field(record, "accelerator.vendor", str)
    image_id = _field(record, "runtime.image_id", str, allow_empty=False)
    platform = _field(record, "runtime.platform", str)
    transport = _field(record, "transfer.transport", str)
    if (transport, platform) not in UCX_TLS:
        raise LaunchError("launch record transfer.transport=%r / runtime.platform=%r is not supported "
                          "(ucx_tcp|ucx_rdma on cuda|rocm|cpu)" % (transport, platform))
    if _field(record, "network_mode", str) != "host":
        raise LaunchError("launch record network_mode must be host; rerun discovery")
    gpu_ids = [str(g) for g in _field(record, "gpu_ids", list)]
    host_indices = _field(record, "gpu_host_indices", list)
    tp = _field(record, "tensor_parallel_size", int)
    if tp < 1:
        raise LaunchError("launch record tensor_parallel_size=%d must be >= 1" % tp)
    if gpu_ids and len(gpu_ids) != tp:
        raise LaunchError("launch record gpu_ids has %d entries but tensor_parallel_size is %d; rerun discovery"
                          % (len(gpu_ids), tp))
    if len(host_indices) != len(gpu_ids):
        raise LaunchError("launch record gpu_host_indices and gpu_ids differ in length; rerun discovery")
    accel_devices = _field(record, "accelerator_devices", list)
    transfer_devices = _field(record, "transfer.devices", list)
    runtime_env = _field(record, "runtime.environment", dict)
    derived_env = _field(record, "runtime.derived_environment", dict)
    extra_args = _field(record, "runtime.extra_args", list)
    _check_record_env(runtime_env, "runtime.environment")
    _check_record_env(derived_env, "runtime.derived_environment", allowed=DERIVED_ENV)
    check_args(extra_args, "launch record runtime.extra_args")
    engine_args_text = role_env.get("NARWHAL_ENGINE_ARGS", "")
    try:
        engine_args = shlex.split(engine_args_text)
    except ValueError as exc:
        raise LaunchError("role env NARWHAL_ENGINE_ARGS is not valid shell words (%s)" % exc)
    check_args(engine_args, "role env NARWHAL_ENGINE_ARGS")
    engine_env = parse_engine_env(role_env.get("NARWHAL_ENGINE_ENV", ""))
    if record.get("runtime", {}).get("trust_remote_code") and "--trust-remote-code" not in extra_args:
        raise LaunchError("launch record runtime.trust_remote_code is true but runtime.extra_args lacks "
                          "--trust-remote-code; rerun discovery")
    if record.get("runtime", {}).get("ssm_conv_state") and derived_env.get("VLLM_SSM_CONV_STATE_LAYOUT") != "DS":
        raise LaunchError("launch record runtime.ssm_conv_state is true but runtime.derived_environment lacks "
                          "VLLM_SSM_CONV_STATE_LAYOUT=DS; rerun discovery")

    mount = _role(role_env, "NARWHAL_MODEL_MOUNT")
    model_path = _field(record, "runtime.model_path", str, allow_empty=False)
    for where, path in (("role env NARWHAL_MODEL_MOUNT", mount), ("launch record runtime.model_path", model_path)):
        if not path.startswith("/") or "," in path:
            raise LaunchError("%s=%r must be an absolute path without commas" % (where, path))
    served = _role(role_env, "NARWHAL_SERVED_MODEL_NAME")
    family = _role(role_env, "NARWHAL_BIND_FAMILY")
    if family not in BIND_HOSTS:
        raise LaunchError("role env NARWHAL_BIND_FAMILY=%r must be ipv4 or ipv6" % family)
    http_port = _port(role_env, "NARWHAL_HTTP_PORT")
    side_port = _port(role_env, "NARWHAL_SIDE_CHANNEL_PORT")
    side_host = _side_channel_host(role_env.get("NARWHAL_ADVERTISED_ADDRESS", ""))

    net_devices = [_resolve(str(d), role_env, "launch record transfer.net_devices[%d]" % i)
                   for i, d in enumerate(_field(record, "transfer.net_devices", list, allow_empty=False))]

    devices, device_requests, verify_devices = [], [], []
    if vendor == "nvidia":
        # GPUs through the NVIDIA runtime's device request (it also brings the driver libraries); the
        # recorded /dev/nvidia* nodes are kept for verification only.
        verify_devices = [str(d) for d in accel_devices]
        if host_indices:
            device_requests = [{"driver": "nvidia", "device_ids": [str(i) for i in host_indices],
                                "capabilities": [["gpu"]]}]
    else:
        devices = [_device(d, "accelerator_devices") for d in accel_devices]
    devices += [_device(d, "transfer.devices") for d in transfer_devices]

    environment = dict(runtime_env)
    environment.update(engine_env)
    environment.update(derived_env)
    if gpu_ids:
        environment[_field(record, "gpu_visibility_env", str)] = ",".join(gpu_ids)
        if record["gpu_visibility_env"] not in VISIBILITY_ENV:
            raise LaunchError("launch record gpu_visibility_env=%r is not a visibility variable"
                              % record["gpu_visibility_env"])
    environment["UCX_NET_DEVICES"] = ",".join(net_devices)
    environment["UCX_TLS"] = UCX_TLS[(transport, platform)]
    environment["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_host
    environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_port)
    if api_key_present:
        environment[API_KEY_ENV] = REDACTED

    command = [
        "serve", mount,
        "--served-model-name", served,
        "--host", BIND_HOSTS[family],
        "--port", str(http_port),
        "--tensor-parallel-size", str(tp),
        "--kv-transfer-config", json.dumps(kv_transfer_config(record), separators=(",", ":")),
        "--dtype", _field(record, "runtime.model_dtype", str, allow_empty=False),
        "--kv-cache-dtype", _field(record, "runtime.kv_cache_dtype", str, allow_empty=False),
        "--block-size", str(_field(record, "runtime.block_size", int)),
    ] + [str(a) for a in extra_args] + engine_args

    rdma = transport == "ucx_rdma"
    return {
        "engine": engine,
        "name": "narwhal-%s" % engine,
        "image": image_id,
        "image_ref": record.get("runtime", {}).get("image", ""),
        "entrypoint": ["vllm"],
        "command": command,
        "environment": dict(sorted(environment.items())),
        "network_mode": "host",
        "ipc_mode": "host",
        "devices": devices,
        "device_requests": device_requests,
        "verify_devices": verify_devices,
        "group_add": host_group_ids(("video", "render")) if vendor == "amd" else [],
        "cap_add": ["IPC_LOCK"] if rdma else [],
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}] if rdma else [],
        "security_opt": ["seccomp=unconfined"] if vendor == "amd" else [],
        "mounts": [{"type": "bind", "source": model_path, "target": mount, "read_only": True}],
        "labels": {ENGINE_LABEL: engine},
    }


def _redacted(plan):
    plan = copy.deepcopy(plan)
    if API_KEY_ENV in plan.get("environment", {}):
        plan["environment"][API_KEY_ENV] = REDACTED
    return plan


def plan_hash(plan):
    """sha256 of the canonical JSON of the plan, the API key excluded."""
    canonical = json.dumps(_redacted(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def docker_run_argv(plan):
    """The complete container command as `docker run` reads it (API key redacted)."""
    plan = _redacted(plan)
    argv = ["docker", "run", "-d", "--name", plan["name"], "--network", plan["network_mode"],
            "--ipc", plan["ipc_mode"]]
    for device in plan["devices"]:
        argv += ["--device", device]
    for request in plan["device_requests"]:
        argv += ["--gpus", '"device=%s"' % ",".join(request["device_ids"])]
    for group in plan["group_add"]:
        argv += ["--group-add", group]
    for cap in plan["cap_add"]:
        argv += ["--cap-add", cap]
    for ulimit in plan["ulimits"]:
        argv += ["--ulimit", "%s=%d:%d" % (ulimit["name"], ulimit["soft"], ulimit["hard"])]
    for opt in plan["security_opt"]:
        argv += ["--security-opt", opt]
    for mount in plan["mounts"]:
        argv += ["--mount", "type=%s,source=%s,target=%s%s" % (mount["type"], mount["source"], mount["target"],
                                                               ",readonly" if mount["read_only"] else "")]
    labels = dict(plan["labels"])
    labels[PLAN_HASH_LABEL] = plan_hash(plan)
    for key in sorted(labels):
        argv += ["--label", "%s=%s" % (key, labels[key])]
    for key in sorted(plan["environment"]):
        argv += ["-e", "%s=%s" % (key, plan["environment"][key])]
    argv += ["--entrypoint", plan["entrypoint"][0], plan["image"]] + plan["entrypoint"][1:] + plan["command"]
    return argv


# ------------------------------------------------------------------------------------------------ files

def launcher_sha256():
    with open(os.path.abspath(__file__), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _write_private(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _run_dir(role_env):
    run_dir = _role(role_env, "NARWHAL_RUN_DIR")
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LaunchError("role env NARWHAL_RUN_DIR=%s: %s" % (run_dir, exc.strerror or exc))
    return run_dir


def prepare(role_env_path):
    """Read the inputs, build and write the plan. Returns (role_env, plan, hash, argv)."""
    role_env = read_role_env(role_env_path)
    record = load_record(_role(role_env, "NARWHAL_RECORD"))
    read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))  # refuse early: the engine always runs with a key
    plan = build_plan(role_env, record, api_key_present=True)
    digest = plan_hash(plan)
    argv = docker_run_argv(plan)
    run_dir = _run_dir(role_env)
    _write_private(os.path.join(run_dir, "plan.json"), {
        "engine": plan["engine"], "run_id": role_env.get("NARWHAL_RUN_ID", ""), "plan": _redacted(plan),
        "plan_hash": digest, "argv": argv, "launcher_sha256": launcher_sha256()})
    return role_env, plan, digest, argv


# ------------------------------------------------------------------------------------------------ start

def _docker_client():
    try:
        import docker  # lazily: only `start` needs a daemon
    except ImportError:
        raise LaunchError("the Docker SDK for Python is missing; install python3-docker on the engine host")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and connection errors
        raise LaunchError("cannot reach the Docker daemon (%s); start docker or fix DOCKER_HOST" % exc)
    return docker, client


def create_kwargs(docker, plan, digest, api_key):
    """Keyword arguments of client.containers.create for a plan (the real key injected here only)."""
    environment = dict(plan["environment"])
    if API_KEY_ENV in environment:
        environment[API_KEY_ENV] = api_key
    labels = dict(plan["labels"])
    labels[PLAN_HASH_LABEL] = digest
    return {
        "image": plan["image"],
        "command": plan["command"],
        "entrypoint": plan["entrypoint"],
        "name": plan["name"],
        "detach": True,
        "environment": ["%s=%s" % (k, environment[k]) for k in sorted(environment)],
        "network_mode": plan["network_mode"],
        "ipc_mode": plan["ipc_mode"],
        "devices": plan["devices"] or None,
        "device_requests": [docker.types.DeviceRequest(**r) for r in plan["device_requests"]] or None,
        "group_add": plan["group_add"] or None,
        "cap_add": plan["cap_add"] or None,
        "ulimits": [docker.types.Ulimit(**u) for u in plan["ulimits"]] or None,
        "security_opt": plan["security_opt"] or None,
        "mounts": [docker.types.Mount(target=m["target"], source=m["source"], type=m["type"],
                                      read_only=m["read_only"]) for m in plan["mounts"]],
        "labels": labels,
    }


def check_host(plan):
    """What the container needs from this host exists: the recorded device nodes and the model directory."""
    for entry in plan["devices"]:
        path = entry.split(":", 1)[0]
        if not os.path.exists(path):
            raise LaunchError("device %s from the launch record (accelerator_devices/transfer.devices) is not on "
                              "this host; rerun discovery" % path)
    for path in plan["verify_devices"]:
        if not os.path.exists(path):
            raise LaunchError("device %s from the launch record accelerator_devices is not on this host; check "
                              "the NVIDIA driver or rerun discovery" % path)
    for mount in plan["mounts"]:
        if not os.path.isdir(mount["source"]):
            raise LaunchError("launch record runtime.model_path %s is not a directory on this host; stage the "
                              "model or rerun discovery" % mount["source"])


def start(role_env_path, force=False, out=None):
    role_env, plan, digest, argv = prepare(role_env_path)
    api_key = read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    check_host(plan)
    docker, client = _docker_client()
    record = load_record(_role(role_env, "NARWHAL_RECORD"))
    # the image check: refuses (nothing started) on failure; a checked.json of this plan hash, image ID and
    # launcher is reused unless --force. Its verdict goes to stderr, stdout keeps the one start line.
    checked, check_how = image_check(role_env, record, plan, digest, docker=docker, client=client,
                                     reuse=not force, out=sys.stderr)
    existing = None
    try:
        existing = client.containers.get(plan["name"])
    except docker.errors.NotFound:
        pass
    action, replaced = "started", None
    if existing is not None:
        labels = existing.attrs.get("Config", {}).get("Labels") or {}
        if existing.status == "running" and labels.get(PLAN_HASH_LABEL) == digest and not force:
            container, action = existing, "unchanged"
        else:
            replaced = existing.id
            if existing.status == "running":
                existing.stop(timeout=STOP_TIMEOUT)
            existing.remove(force=True)
            action = "replaced"
    if action != "unchanged":
        try:
            client.images.get(plan["image"])
        except docker.errors.ImageNotFound:
            raise LaunchError("launch record runtime.image_id %s is not on this host; load the recorded image "
                              "(%s) or rerun discovery" % (plan["image"], plan["image_ref"]))
        try:
            container = client.containers.create(**create_kwargs(docker, plan, digest, api_key))
            container.start()
        except docker.errors.APIError as exc:
            raise LaunchError("docker refused container %s: %s" % (plan["name"], str(exc).replace(api_key, REDACTED)))
        container.reload()
    deployment = {
        "engine": plan["engine"], "run_id": role_env.get("NARWHAL_RUN_ID", ""), "action": action,
        "app_revision": role_env.get("NARWHAL_APP_REVISION", ""),
        "container_id": container.id, "container_name": plan["name"], "plan_hash": digest,
        "image_id": plan["image"], "launcher_sha256": launcher_sha256(),
        "started_at": container.attrs.get("State", {}).get("StartedAt", ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "replaced_container_id": replaced,
        "checked_sha256": checked_sha256(checked), "check": check_how,
        "vllm_api_version": checked["vllm_api_version"],
    }
    existing = os.path.join(_run_dir(role_env), "deployment.json")
    if action != "unchanged" or not os.path.exists(existing):
        # An unchanged engine keeps the record of the deployment that is still running (idempotence).
        _write_private(existing, deployment)
    print("unchanged" if action == "unchanged" else "%s %s %s" % (action, plan["name"], container.id),
          file=out or sys.stdout)
    return deployment


# ------------------------------------------------------------------------------------------ image check

CHECK_PREFIX = "narwhal-check-"  # the check container: narwhal-check-<engine>-<random>, removed afterwards
CHECK_TIMEOUT = 300  # seconds the check container may take (real vLLM images import torch)
CHECK_MARKER = "NARWHAL_CHECK_JSON="
CONNECTOR_MODULES = ("vllm.distributed.kv_transfer.kv_connector.v1.nixl",             # vLLM >= 0.28
                     "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector")   # vLLM <= 0.25
SSM_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"

# Runs inside the image (python3 -c SCRIPT SPEC_JSON); Python 3.8+ stdlib plus the image's own packages.
# It only observes and prints one JSON document; the launcher decides (decide_check).
CHECK_SCRIPT = r"""
import importlib, importlib.metadata as md, json, os, sys, traceback
spec = json.loads(sys.argv[1])
def err(exc):
    return ("%s: %s" % (type(exc).__name__, exc))[:600]
def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except BaseException as exc:
        return {"ok": False, "error": err(exc)}
out = {"python": sys.version.split()[0], "packages": {}}
for name in spec["packages"]:
    try:
        out["packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        out["packages"][name] = None
def vllm_version():
    from vllm.version import __version__
    return __version__
out["vllm_api_version"] = attempt(vllm_version)
def kv_config():
    try:
        from vllm.config.kv_transfer import KVTransferConfig
        where = "vllm.config.kv_transfer.KVTransferConfig"
    except ImportError:
        from vllm.config import KVTransferConfig
        where = "vllm.config.KVTransferConfig"
    KVTransferConfig(**spec["kv_transfer_config"])
    return where
out["kv_transfer_config"] = attempt(kv_config)
out["connector_module"] = attempt(lambda: importlib.import_module(spec["connector_module"]).__name__)
out["nixl_module"] = attempt(lambda: importlib.import_module(spec["nixl_module"]).__name__)
auto_map = {}
for fname in ("config.json", "tokenizer_config.json"):
    path = os.path.join(spec["mount"], fname)
    if not os.path.isfile(path):
        auto_map[fname] = {"present": False, "auto_map": False}
        continue
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        auto_map[fname] = {"present": True, "auto_map": bool(isinstance(data, dict) and data.get("auto_map"))}
    except BaseException as exc:
        auto_map[fname] = {"present": True, "auto_map": False, "error": err(exc)}
out["auto_map"] = auto_map
def tokenizer():
    from transformers import AutoTokenizer
    return type(AutoTokenizer.from_pretrained(spec["mount"], trust_remote_code=spec["trust_remote_code"])).__name__
out["tokenizer"] = attempt(tokenizer)
if spec["ssm_conv_state"]:
    def ssm():
        import vllm.envs
        return spec["ssm_env"] in vllm.envs.environment_variables
    out["ssm_layout_known"] = attempt(ssm)
sys.stdout.write("\n" + spec["marker"] + json.dumps(out, sort_keys=True) + "\n")
"""


def connector_module(vllm_version):
    """The NixlConnector module vLLM imports (VLLM_FACTS: a package `v1.nixl` from 0.28, `v1.nixl_connector`
    before)."""
    return CONNECTOR_MODULES[0] if _version(vllm_version) >= (0, 28) else CONNECTOR_MODULES[1]


def nixl_module(vllm_version, platform):
    """The NIXL module vLLM will import: nixl._api on CUDA/CPU; on ROCm rixl._api (0.14-0.25) or
    nixl_rocm._api (>= 0.28); <= 0.11 always nixl._api."""
    version = _version(vllm_version)
    if platform != "rocm" or version < (0, 14):
        return "nixl._api"
    return "nixl_rocm._api" if version >= (0, 28) else "rixl._api"


def plan_kv_transfer_config(plan):
    """The kv-transfer config exactly as the plan passes it to `vllm serve`."""
    command = plan["command"]
    for index, token in enumerate(command[:-1]):
        if token == "--kv-transfer-config":
            return json.loads(command[index + 1])
    raise LaunchError("the plan has no --kv-transfer-config; this launcher is broken, reinstall it")


def check_spec(plan, record):
    """What the check container examines (pure): packages, kv config, modules, mount, remote-code flag."""
    runtime = record.get("runtime") or {}
    packages = _field(record, "runtime.expected_packages", dict, allow_empty=False)
    for name, version in packages.items():
        if not isinstance(version, str) or not version:
            raise LaunchError("launch record runtime.expected_packages.%s=%r must be an exact version string; "
                              "rerun discovery" % (name, version))
    vllm_version = _field(record, "runtime.vllm_version", str, allow_empty=False)
    platform = _field(record, "runtime.platform", str)
    return {
        "packages": sorted(packages),
        "expected_packages": dict(packages),
        "vllm_version": vllm_version,
        "kv_transfer_config": plan_kv_transfer_config(plan),
        "connector_module": connector_module(vllm_version),
        "nixl_module": nixl_module(vllm_version, platform),
        "mount": plan["mounts"][0]["target"],
        "trust_remote_code": "--trust-remote-code" in plan["command"],
        "ssm_conv_state": bool(runtime.get("ssm_conv_state")),
        "ssm_env": SSM_LAYOUT_ENV,
        "marker": CHECK_MARKER,
    }


def decide_check(report, spec, image_id, digest):
    """The verdict over the check container's JSON (pure). Returns the checked.json document or raises one
    LaunchError naming every failed field and its fix."""
    failures, checks = [], ["image_identity"]

    def ok(name):
        entry = report.get(name)
        return isinstance(entry, dict) and entry.get("ok") is True

    def error(name):
        entry = report.get(name)
        return " ".join(str(entry.get("error", "no result")).split()) if isinstance(entry, dict) else "no result"

    found = report.get("packages") or {}
    for name in spec["packages"]:
        expected, actual = spec["expected_packages"][name], found.get(name)
        if actual is None:
            failures.append("launch record runtime.expected_packages.%s=%s: distribution %s is not installed in "
                            "image %s; use the recorded image or rerun discovery" % (name, expected, name, image_id))
        elif actual != expected:
            failures.append("launch record runtime.expected_packages.%s=%s but image %s has %s %s; use the "
                            "recorded image or rerun discovery" % (name, expected, image_id, name, actual))
    checks.append("packages")
    api_version = None
    if ok("vllm_api_version"):
        api_version = report["vllm_api_version"]["value"]
        try:
            same = _version(api_version)[:3] == _version(spec["vllm_version"])[:3]
        except LaunchError:
            same = False
        if not same:
            failures.append("launch record runtime.vllm_version=%s but the image's vllm.version.__version__ is %s; "
                            "rerun discovery" % (spec["vllm_version"], api_version))
    else:
        failures.append("vllm.version.__version__ cannot be read in image %s (%s); the image has no usable vLLM, "
                        "use the recorded image or rerun discovery" % (image_id, error("vllm_api_version")))
    checks.append("vllm_api_version")
    if not ok("kv_transfer_config"):
        failures.append("--kv-transfer-config %s is rejected by the image's KVTransferConfig (%s); rerun discovery "
                        "so runtime.vllm_version matches the image, or update the launcher"
                        % (json.dumps(spec["kv_transfer_config"], separators=(",", ":")), error("kv_transfer_config")))
    checks.append("kv_transfer_config")
    for name, what in (("connector_module", "NixlConnector module"), ("nixl_module", "NIXL module")):
        if not ok(name):
            failures.append("%s %s does not import in the image (%s); check runtime.vllm_version/runtime.platform "
                            "and the image's NIXL (runtime.expected_packages)" % (what, spec[name], error(name)))
        checks.append(name)
    auto_map = report.get("auto_map") or {}
    for fname in ("config.json", "tokenizer_config.json"):
        entry = auto_map.get(fname) or {}
        if entry.get("error"):
            failures.append("checkpoint %s/%s is not readable JSON (%s); fix the staged model"
                            % (spec["mount"], fname, entry["error"]))
    needs = [f for f in ("config.json", "tokenizer_config.json") if (auto_map.get(f) or {}).get("auto_map")]
    if needs and not spec["trust_remote_code"]:
        failures.append("checkpoint %s has auto_map in %s but --trust-remote-code is not in the command; set "
                        "runtime.trust_remote_code and add --trust-remote-code to runtime.extra_args (rerun "
                        "discovery)" % (spec["mount"], " and ".join(needs)))
    elif spec["trust_remote_code"] and not needs:
        failures.append("--trust-remote-code is in the command but checkpoint %s has no auto_map in config.json or "
                        "tokenizer_config.json; remove it from runtime.extra_args/NARWHAL_ENGINE_ARGS (rerun "
                        "discovery)" % spec["mount"])
    checks.append("trust_remote_code")
    if not ok("tokenizer"):
        failures.append("the checkpoint tokenizer does not construct: AutoTokenizer.from_pretrained(%s, "
                        "trust_remote_code=%s) failed (%s); stage the tokenizer files with the model"
                        % (spec["mount"], spec["trust_remote_code"], error("tokenizer")))
    checks.append("tokenizer")
    if spec["ssm_conv_state"]:
        entry = report.get("ssm_layout_known") or {}
        if not (entry.get("ok") and entry.get("value") is True):
            failures.append("launch record runtime.ssm_conv_state is true but the image's vLLM does not know %s "
                            "(vllm.envs.environment_variables; needs vLLM >= 0.22): use a newer image"
                            % SSM_LAYOUT_ENV + (" (%s)" % entry["error"] if entry.get("error") else ""))
        checks.append("ssm_conv_state_layout")
    if failures:
        raise LaunchError("image check failed: " + "; ".join(failures))
    return {
        "vllm_api_version": api_version,
        "plan_hash": digest,
        "image_id": image_id,
        "checked_packages": {name: found[name] for name in spec["packages"]},
        "checks": checks,
        "kv_transfer_config": spec["kv_transfer_config"],
        "connector_module": spec["connector_module"],
        "nixl_module": spec["nixl_module"],
        "trust_remote_code": spec["trust_remote_code"],
    }


def parse_check_output(text):
    for line in reversed(text.splitlines()):
        if line.startswith(CHECK_MARKER):
            try:
                report = json.loads(line[len(CHECK_MARKER):])
            except ValueError:
                break
            if isinstance(report, dict):
                return report
    return None


def verify_image(docker, client, plan):
    """Image identity: the recorded ID is present, and the recorded reference (if here) still points to it."""
    image_id = plan["image"]
    try:
        image = client.images.get(image_id)
    except docker.errors.ImageNotFound:
        current = None
        if plan.get("image_ref"):
            try:
                current = client.images.get(plan["image_ref"]).id
            except docker.errors.ImageNotFound:
                pass
        raise LaunchError("launch record runtime.image_id %s is not on this host%s; load the recorded image or "
                          "rerun discovery" % (image_id, " (runtime.image %s is now %s: tampered or rebuilt)"
                                               % (plan["image_ref"], current) if current else ""))
    if image.id != image_id:
        raise LaunchError("launch record runtime.image_id %s resolves to image %s; record the full sha256 image ID "
                          "(rerun discovery)" % (image_id, image.id))
    if plan.get("image_ref"):
        try:
            current = client.images.get(plan["image_ref"]).id
        except docker.errors.ImageNotFound:
            current = image_id  # loaded by ID only: nothing to compare
        if current != image_id:
            raise LaunchError("launch record runtime.image %s now resolves to %s, not the recorded runtime.image_id "
                              "%s (tampered or rebuilt image); restore the recorded image or rerun discovery"
                              % (plan["image_ref"], current, image_id))
    return image


def run_check_container(docker, client, plan, spec):
    """Run CHECK_SCRIPT in a short-lived container of the recorded image ID: no network, the model mount
    read-only, the plan's environment (no API key) and devices; the container is removed afterwards."""
    environment = {k: v for k, v in plan["environment"].items() if k != API_KEY_ENV}
    name = "%s%s-%s" % (CHECK_PREFIX, plan["engine"], os.urandom(4).hex())
    kwargs = {
        "image": plan["image"], "entrypoint": ["python3"],
        "command": ["-c", CHECK_SCRIPT, json.dumps(spec, sort_keys=True)],
        "name": name, "detach": True, "network_mode": "none",
        "environment": ["%s=%s" % (k, environment[k]) for k in sorted(environment)],
        "devices": plan["devices"] or None,
        "device_requests": [docker.types.DeviceRequest(**r) for r in plan["device_requests"]] or None,
        "group_add": plan["group_add"] or None,
        "security_opt": plan["security_opt"] or None,
        "mounts": [docker.types.Mount(target=m["target"], source=m["source"], type=m["type"], read_only=True)
                   for m in plan["mounts"]],
        "labels": {ENGINE_LABEL + "-check": plan["engine"]},
    }
    container = None
    try:
        container = client.containers.create(**kwargs)
        if container.attrs.get("Image") != plan["image"]:
            raise LaunchError("the check container of runtime.image_id %s runs image %s; the image ID is not the "
                              "recorded one (rerun discovery)" % (plan["image"], container.attrs.get("Image")))
        container.start()
        try:
            status = container.wait(timeout=CHECK_TIMEOUT)
        except Exception as exc:  # requests timeout / connection errors
            raise LaunchError("the image check container %s did not finish within %d s (%s); check the image "
                              "runtime.image_id %s" % (name, CHECK_TIMEOUT, exc, plan["image"]))
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
    except docker.errors.APIError as exc:
        raise LaunchError("docker refused the image check container for runtime.image_id %s: %s"
                          % (plan["image"], exc))
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
    report = parse_check_output(stdout)
    if report is None:
        code = status.get("StatusCode") if isinstance(status, dict) else status
        raise LaunchError("the image check in runtime.image_id %s printed no result (exit %s): %s; the image needs "
                          "python3 on PATH" % (plan["image"], code, " ".join(stderr.split())[-400:] or "no output"))
    return report


def _read_json_file(path):
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def image_check(role_env, record, plan, digest, docker=None, client=None, reuse=False, out=None):
    """Verify the image (identity always), then run the check container or reuse a checked.json of the same
    plan hash, image ID and launcher. Writes checked.json; returns (document, "ran" | "reused")."""
    if client is None:
        docker, client = _docker_client()
    verify_image(docker, client, plan)
    path = os.path.join(_run_dir(role_env), "checked.json")
    previous = _read_json_file(path) if reuse else None
    if previous and previous.get("plan_hash") == digest and previous.get("image_id") == plan["image"] \
            and previous.get("launcher_sha256") == launcher_sha256():
        document, how = previous, "reused"
    else:
        spec = check_spec(plan, record)
        report = run_check_container(docker, client, plan, spec)
        document = decide_check(report, spec, plan["image"], digest)
        document.update(engine=plan["engine"], run_id=role_env.get("NARWHAL_RUN_ID", ""),
                        launcher_sha256=launcher_sha256(),
                        checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        _write_private(path, document)
        how = "ran"
    print("image check ok (%s): %s vllm %s image %s plan %s, checks: %s"
          % (how, plan["engine"], document["vllm_api_version"], plan["image"], digest[:12],
             ",".join(document["checks"])), file=out or sys.stdout)
    return document, how


def check(role_env_path, out=None):
    role_env, plan, digest, _argv = prepare(role_env_path)
    record = load_record(_role(role_env, "NARWHAL_RECORD"))
    check_host(plan)
    return image_check(role_env, record, plan, digest, out=out)[0]


def checked_sha256(document):
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------ version probe

def _http_get(url, timeout):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe_url(role_env, path, address=None):
    address = (address or role_env.get("NARWHAL_ADVERTISED_ADDRESS", "")).strip("[]") or "127.0.0.1"
    if ":" in address:
        address = "[%s]" % address
    return "http://%s:%d%s" % (address, _port(role_env, "NARWHAL_HTTP_PORT"), path)


def container_exit(sdk, name, secret=None, lines=25):
    """(exit code, last log lines) when the container `name` has stopped; None while it runs, or when Docker
    cannot be asked (`sdk` None: the health wait then runs to its timeout). `secret` is redacted."""
    if sdk is None:
        return None
    docker, client = sdk
    try:
        container = client.containers.get(name)
    except docker.errors.APIError:  # NotFound included: only a stopped container is a definite answer
        return None
    if container.status not in ("exited", "dead"):
        return None
    code = container.attrs.get("State", {}).get("ExitCode")
    try:
        tail = container.logs(tail=lines).decode("utf-8", "replace")
    except docker.errors.APIError as exc:
        tail = "(logs unavailable: %s)" % exc
    if secret:
        tail = tail.replace(secret, REDACTED)
    return code, tail.rstrip()


def probe_version(role_env_path, timeout=300.0, interval=1.0, address=None, out=None):
    """Wait for /health (200), GET /version, compare with checked.json's vllm_api_version. The engine is
    reached at `address` (default: the role env's NARWHAL_ADVERTISED_ADDRESS, else 127.0.0.1)."""
    role_env = read_role_env(role_env_path)
    record = load_record(_role(role_env, "NARWHAL_RECORD"))
    plan = build_plan(role_env, record, api_key_present=True)
    digest = plan_hash(plan)
    run_dir = _run_dir(role_env)
    checked = _read_json_file(os.path.join(run_dir, "checked.json"))
    if not checked or not checked.get("vllm_api_version"):
        raise LaunchError("%s/checked.json is missing or unreadable; run `launch_engine.py check` (or start) first"
                          % run_dir)
    if checked.get("plan_hash") != digest:
        raise LaunchError("%s/checked.json is for plan %s, the current plan is %s; run start (or check) again"
                          % (run_dir, checked.get("plan_hash"), digest))
    health, version_url = probe_url(role_env, "/health", address), probe_url(role_env, "/version", address)
    try:
        sdk = _docker_client()
    except LaunchError:
        sdk = None
    try:
        secret = read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    except LaunchError:
        secret = None
    began = time.time()
    last = "no answer"
    while True:
        try:
            status, _body = _http_get(health, timeout=min(10.0, max(1.0, timeout)))
            if status == 200:
                break
            last = "HTTP %d" % status
        except OSError as exc:
            last = str(getattr(exc, "reason", exc))
        if time.time() - began >= timeout:
            raise LaunchError("%s did not answer 200 within %d s (last: %s); see the engine container's logs "
                              "(docker logs narwhal-%s)" % (health, timeout, last, role_env.get("NARWHAL_ENGINE")))
        dead = container_exit(sdk, plan["name"], secret)
        if dead:
            raise LaunchError("engine container %s exited (code %s) before %s answered; its last log lines:\n%s"
                              % (plan["name"], dead[0], health, dead[1]))
        time.sleep(interval)
    waited = round(time.time() - began, 3)
    try:
        status, body = _http_get(version_url, timeout=10)
        served = json.loads(body.decode("utf-8")).get("version") if status == 200 else None
    except (OSError, ValueError, AttributeError) as exc:
        raise LaunchError("GET %s failed (%s); the engine is not a vLLM OpenAI server" % (version_url, exc))
    if status != 200 or not isinstance(served, str):
        raise LaunchError("GET %s answered HTTP %s without a version; the engine is not a vLLM OpenAI server"
                          % (version_url, status))
    expected = checked["vllm_api_version"]
    result = {"engine": role_env.get("NARWHAL_ENGINE", ""), "run_id": role_env.get("NARWHAL_RUN_ID", ""),
              "url": version_url, "version": served, "expected": expected, "ok": served == expected,
              "plan_hash": digest, "image_id": checked.get("image_id")}
    # No timestamps in the file: an unchanged engine probed again leaves it byte-for-byte the same.
    _write_private(os.path.join(run_dir, "version-probe.json"), result)
    result["health_wait_s"] = waited
    if not result["ok"]:
        raise LaunchError("GET %s answered version %s but checked.json vllm_api_version is %s; the running engine "
                          "is not the checked image: stop it and run start again" % (version_url, served, expected))
    print("version ok: %s %s = checked %s" % (version_url, served, expected), file=out or sys.stdout)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(prog="launch_engine.py", description="Plan and start one vLLM engine.")
    parser.add_argument("--role-env", required=True, help="the engine's role environment file")
    parser.add_argument("action", choices=("plan", "start", "check", "probe-version"))
    parser.add_argument("--force", action="store_true", help="start: rerun the image check and replace the "
                        "container even if unchanged (e.g. after an API key rotation, which the plan hash does not "
                        "see)")
    parser.add_argument("--timeout", type=float, default=300.0, help="probe-version: seconds to wait for /health")
    parser.add_argument("--address", help="probe-version: the engine's address (default: the role env's "
                        "NARWHAL_ADVERTISED_ADDRESS)")
    args = parser.parse_args(argv)
    try:
        if args.action == "plan":
            run_argv = prepare(args.role_env)[3]
            print(" ".join(shlex.quote(a) for a in run_argv))
        elif args.action == "check":
            check(args.role_env)
        elif args.action == "probe-version":
            probe_version(args.role_env, timeout=args.timeout, address=args.address)
        else:
            start(args.role_env, force=args.force)
    except LaunchError as exc:
        print("launch_engine: error: %s" % " ".join(str(exc).split()), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
