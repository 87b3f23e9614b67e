# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""prepare, pure planning (docs/vllm-requirements.md, "Launch records" and "The runtime object"): validate the assigned
records and the P/D compatibility gate, compare them with the current host inspection, derive each engine's
environment, vllm_args and role environment, and build the run manifest. Every refusal raises InputError naming
the input and the fix.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import refuse_fleet_userinfo
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import REGENERATE, InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import INSPECTION_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import bound_ports
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP, describe_difference
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    FLEET_SCHEMA,
    MANIFEST_SCHEMA,
    launch_config_errors,
    validation_errors,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import role_env as _role_env
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import plan_hash, redacted
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import install_paths, role_environment
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.gate import check_pairs

__metaclass__ = type


def canonical(document):
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def check_documents(fleet, launch_config, site):
    errors = validation_errors(fleet, FLEET_SCHEMA)
    if errors:
        raise InputError("NARWHAL_FLEET", "%s fails the fleet schema (%s); %s"
                         % (site["NARWHAL_FLEET"], "; ".join(errors[:5]), REGENERATE))
    try:  # a URL written into the fleet file itself (its ${NAME} values are the fleet lookup's to check)
        refuse_fleet_userinfo(fleet, site["NARWHAL_FLEET"])
    except PlanError as exc:
        raise InputError("NARWHAL_FLEET", str(exc))
    errors = launch_config_errors(launch_config)
    if errors:
        raise InputError("NARWHAL_LAUNCH_CONFIG", "%s fails the launch-record schema (%s); %s"
                         % (site["NARWHAL_LAUNCH_CONFIG"], "; ".join(errors[:5]), REGENERATE))
    iids = [e["iid"] for e in fleet]
    if len(set(iids)) != len(iids):
        raise InputError("NARWHAL_FLEET", "duplicate iid in %s (%s); %s"
                         % (site["NARWHAL_FLEET"], ", ".join(iids), REGENERATE))


def compatibility(records):
    """The P/D gate: every prefill/decode pair must pass vLLM's NIXL handshake (_prepare/gate.py::check_pairs)."""
    check_pairs(records)


def shared_hosts(records):
    """Engines on one physical host must not overlap in GPUs, HTTP, attestation, side-channel, data-parallel RPC or KV
    events ports (each host's ports: _common/ports.py::bound_ports). One engine's ports against each other are
    discovery's check (_discover/fleet.py::check_own_ports): it knows them all first."""
    by_host = {}
    for r in records.values():
        by_host.setdefault(r["node"].get("host_id") or r["engine"], []).append(r)
        for member in r.get("members") or []:  # each other host of an engine across hosts: what it runs there
            view = member_view(r, member["member"])
            view["engine"] = "%s (its host %s, narwhal_rank %d)" % (r["engine"], member["host"], member["member"])
            view["headless"] = True  # engine cores only: no HTTP or attestation port on this host
            by_host.setdefault(member["node"]["host_id"], []).append(view)
    for group in by_host.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                both = "%s and %s share a host" % (a["engine"], b["engine"])
                gpus = sorted(set(a.get("gpu_host_indices", [])) & set(b.get("gpu_host_indices", [])))
                if gpus:
                    raise InputError("NARWHAL_NODE_<n>_GPU_IDS", "%s and both use GPU %s; %s"
                                     % (both, ",".join(map(str, gpus)), REGENERATE))
                ports_a = bound_ports(a)
                for name, (lo, hi) in bound_ports(b).items():
                    for other, (olo, ohi) in ports_a.items():
                        if lo <= ohi and olo <= hi:
                            raise InputError(_port_key(name, "<n>"),
                                             "%s and their %s / %s ports overlap (%d-%d and %d-%d); %s"
                                             % (both, other, name, olo, ohi, lo, hi, REGENERATE))


# The fix of a record whose weights are not the ones delivered: the deliver stage (first in site) puts the source's
# checkpoint on every engine host, discovery records its manifest (docs/launch-record.md, runtime.model_manifest).
DELIVER_THEN_DISCOVER = ("run the deliver stage, then discovery: ansible-playbook narwhal.deploy.site (or "
                         "narwhal.deploy.deliver, then narwhal.deploy.discover), and prepare a new run")


def _manifest_of(record):
    return record["runtime"].get("model_manifest")


def _files_difference(expected, found, how, where):
    """'<how>: <the files that differ>' of two files maps, or where to compare them when either is not at hand."""
    if expected is not None and found is not None:
        return "%s: %s" % (how, describe_difference(expected, found))
    return "compare the files maps (/model/manifest/files) of %s" % where


def check_pair_manifests(records, files_of=lambda engine: None):
    """Every prefill/decode pair serves one checkpoint: the records' runtime.model_manifest (the digest of the
    manifest the deliver stage stamped on the engine's host) must be equal, and present on both or on neither.
    `files_of(engine)`: the files map of the engine's manifest (its inspection extract's), or None when not at hand.
    Raises InputError (NARWHAL_MODEL_PATH) naming both engines, both digests and the files that differ."""
    prefill = [r for _e, r in sorted(records.items()) if r["role"] == "prefill"]
    decode = [r for _e, r in sorted(records.items()) if r["role"] == "decode"]
    for p in prefill:
        for d in decode:
            a, b = _manifest_of(p), _manifest_of(d)
            if a == b:
                continue
            both = "%s (prefill) and %s (decode)" % (p["engine"], d["engine"])
            if a and b:
                extracts = "%s and %s in NARWHAL_CONFIG_DIR" % (INSPECTION_FILE % p["engine"],
                                                                INSPECTION_FILE % d["engine"])
                why = "serve different weights: runtime.model_manifest is %s on %s and %s on %s (%s)" % (
                    a, p["engine"], b, d["engine"],
                    _files_difference(files_of(p["engine"]), files_of(d["engine"]),
                                      "the files of %s that differ from %s's" % (d["engine"], p["engine"]), extracts))
            else:
                has, lacks = (p, d) if a else (d, p)
                why = ("cannot be shown to serve one checkpoint: %s has the manifest %s (runtime.model_manifest), %s "
                       "has none (its host's checkpoint held no %s when discovery ran)"
                       % (has["engine"], _manifest_of(has), lacks["engine"], STAMP))
            raise InputError("NARWHAL_MODEL_PATH", "%s %s; a prefill/decode pair serves one checkpoint: %s"
                             % (both, why, DELIVER_THEN_DISCOVER))


def check_source_manifest(records, source, files_of=lambda engine: None):
    """With NARWHAL_MODEL_SOURCE set, every record's runtime.model_manifest is the digest of the source's manifest
    (`source`: {"path", "digest", "files"} of NARWHAL_CONFIG_DIR/model-manifest.json, which the deliver stage
    writes). Raises InputError (NARWHAL_MODEL_SOURCE) naming the engine, both digests and the files that differ."""
    for engine, record in sorted(records.items()):
        digest = _manifest_of(record)
        if digest == source["digest"]:
            continue
        if digest:
            what = "has the checkpoint manifest %s (runtime.model_manifest)" % digest
            files = " (%s)" % _files_difference(source["files"], files_of(engine),
                                                "the files of %s that differ from the source's" % engine,
                                                "%s in NARWHAL_CONFIG_DIR with %s's"
                                                % (INSPECTION_FILE % engine, source["path"]))
        else:
            what = "has no checkpoint manifest (runtime.model_manifest: its host's checkpoint held no %s when " \
                   "discovery ran)" % STAMP
            files = ""
        raise InputError("NARWHAL_MODEL_SOURCE", "the launch record of %s %s, but the manifest of NARWHAL_MODEL_SOURCE "
                                                 "(%s) is %s%s: the record was not discovered from the checkpoint the "
                                                 "deliver stage delivers; %s"
                         % (engine, what, source["path"], source["digest"], files, DELIVER_THEN_DISCOVER))


def _port_key(name, node):
    """The .env key that moves the port `name` of engine `node` (a number, or <n>)."""
    if name == "data-parallel RPC":
        return "NARWHAL_DATA_PARALLEL_RPC_PORT"
    if name == "side-channel":
        return "NARWHAL_SIDE_CHANNEL_PORT"  # one key for every host; each engine's range follows from it
    if name == "kv-events":
        return "NARWHAL_KV_EVENTS_PORT"  # the same: one first port of each host
    return "NARWHAL_NODE_%s_%s" % (node, {"engine": "ENGINE_PORT", "attestation": "ATTEST_PORT"}[name])


def stale(record, current):
    """Compare a record with the current inspection of its host: GPUs, devices, address, image, the checkpoint's
    manifest. `current` = {"gpus": narwhal_gpus, "interface": narwhal_interface, "image_id": str|None,
    "model_manifest": the digest of the checkpoint's STAMP now (engine_prereqs) or None, "missing_devices": [...]}."""
    engine = record["engine"]
    fix = "the record of %s no longer matches its host: %%s; %s" % (engine, REGENERATE)
    gpus = current.get("gpus") or {}
    if record["accelerator"]["vendor"] in ("nvidia", "amd"):
        if gpus.get("vendor") != record["accelerator"]["vendor"]:
            raise InputError(engine, fix % ("recorded %s GPUs, the host now reports %s"
                                            % (record["accelerator"]["vendor"], gpus.get("vendor"))))
        by_index = dict((g["index"], g) for g in gpus.get("gpus", []))
        for index in record.get("gpu_host_indices", []):
            g = by_index.get(index)
            if g is None:
                raise InputError(engine, fix % ("GPU %d is gone" % index))
            if g.get("name") != record["accelerator"]["product"]:
                raise InputError(engine, fix % ("GPU %d is now a %s, recorded %s"
                                                % (index, g.get("name"), record["accelerator"]["product"])))
        uuids = [by_index[i].get("uuid") for i in record.get("gpu_host_indices", [])]
        if record["gpu_ids"] and record["gpu_ids"][0].startswith("GPU-") and record["gpu_ids"] != uuids:
            raise InputError(engine, fix % "the allocated GPUs' UUIDs changed")
    if current.get("missing_devices"):
        raise InputError(engine, fix % ("device paths missing on the host: %s" % ", ".join(current["missing_devices"])))
    addresses = [a["address"] for a in (current.get("interface") or {}).get("addresses", [])]
    if record["node"]["address"] not in addresses:
        raise InputError(engine, fix % ("%s no longer carries %s (it has %s)" % (
            record["node"]["fabric_interface"], record["node"]["address"], ", ".join(addresses) or "none")))
    if current.get("image_id") != record["runtime"]["image_id"]:
        raise InputError(engine, fix % ("image %s is %s on the host, recorded %s" % (
            record["runtime"]["image"], current.get("image_id") or "absent", record["runtime"]["image_id"])))
    if current.get("model_manifest") != _manifest_of(record):  # the deliver stage's STAMP, read by engine_prereqs
        raise InputError(engine, fix % ("the checkpoint %s holds the manifest %s (%s), recorded %s: weights were "
                                        "delivered since discovery" % (
                                            record["runtime"]["model_path"], current.get("model_manifest") or "none",
                                            STAMP, _manifest_of(record) or "none")))


def _derive_host(record, checkout, run_id, member=0, access=None):
    engine = record["engine"]
    role_env = role_environment(record, checkout, run_id, member=member, **(access or {}))
    try:
        _role_env.render_role_env(role_env)  # every value one line of text (the role env is a line-based file)
        plan = container_spec(record, role_env)
    except PlanError as exc:
        raise InputError(engine, "the launcher would refuse the record of %s%s: %s; %s"
                         % (engine, " on its host of narwhal_rank %d" % member if member else "", exc, REGENERATE))
    return {"environment": plan["environment"], "vllm_args": plan["command"][2:], "container": redacted(plan),
            "plan_hash": plan_hash(plan), "role_env": role_env}


def derive(record, checkout, run_id, access=None):
    """-> {"environment", "vllm_args", "container", "plan_hash", "role_env", "paths"} for one engine: the
    planner's container (the one the launcher starts), so the manifest records what the container gets. An engine
    across hosts adds `members`: {"<k>": the same (without paths) for its host of narwhal_rank k}. `access`: who
    gets in, role_environment's `bind`, `tls` and `guard_sha256` ({}: the advertised address, TLS off, no guard
    digest)."""
    derived = _derive_host(record, checkout, run_id, access=access)
    derived["paths"] = install_paths(checkout, record["engine"], run_id)
    if record.get("members"):
        derived["members"] = dict((str(m["member"]), dict(_derive_host(record, checkout, run_id, m["member"], access),
                                                          host=m["host"]))
                                  for m in record["members"])
    return derived


def render_role_env(role_env):
    try:
        return _role_env.render_role_env(role_env)
    except PlanError as exc:
        raise InputError(exc.key or "NARWHAL_ENV_FILE", str(exc))


def role_env_texts(derived):
    """Each host's role environment file of one derived engine, as prepare writes it: {"0": the head's, "<k>": the
    host of narwhal_rank k's} (<engine>.env and <engine>.member-<k>.env in the run)."""
    return dict([("0", render_role_env(derived["role_env"]))] + [
        (k, render_role_env(host["role_env"])) for k, host in sorted((derived.get("members") or {}).items())])


def run_id(engines, records, derived, launcher_sha256, inputs_sha):
    # the plan hash too: it holds what the environment and arguments do not show (the key guard's and the served
    # certificate's sha256, labels of the container), so a new certificate is a new run
    material = canonical({"engines": sorted(engines), "records": dict((e, records[e]) for e in engines),
                          "derived": dict((e, {"environment": derived[e]["environment"],
                                               "vllm_args": derived[e]["vllm_args"],
                                               "plan_hash": derived[e]["plan_hash"]}) for e in engines),
                          "launcher": launcher_sha256, "inputs": inputs_sha})
    return "run-" + sha256_text(material)[:12]


# ------------------------------------------------------------------------------------------------ relaunch

RUN_ID = re.compile(r"^run-[0-9a-f]{12}\Z")

RELAUNCH = "prepare from another run, or from the current records (without from_run)"


def check_run_id(from_run):
    if not isinstance(from_run, str) or not RUN_ID.match(from_run):
        raise InputError("from_run", "%r is not a run ID (run-<12 hex digits>, the name of a directory in "
                                     "NARWHAL_RUNS_DIR); %s" % (from_run, RELAUNCH))


def past_run(from_run, run_dir, manifest, launcher, records, role_envs, engines):
    """Validate an earlier run read from `run_dir` (its manifest as parsed JSON, its launcher snapshot bytes, and
    per engine of the manifest its record copy and its role environment, each parsed, or None when the file is
    missing) and return its records for a relaunch of `engines`. Checked: the manifest's schema and run ID, the
    launcher and every record against the manifest's own digests, each role environment against the manifest, and
    that every engine asked for is in the run. Not checked: the current .env policy (a relaunch is a rollback)."""
    where = "run %s (%s)" % (from_run, run_dir)
    errors = validation_errors(manifest, MANIFEST_SCHEMA)
    if errors:
        raise InputError("from_run", "the manifest of %s fails its schema (%s); %s"
                         % (where, "; ".join(errors[:5]), RELAUNCH))
    if manifest["run_id"] != from_run:
        raise InputError("from_run", "the manifest of %s is the manifest of %s; %s"
                         % (where, manifest["run_id"], RELAUNCH))
    missing = [e for e in engines if e not in manifest["engines"]]
    if missing:
        raise InputError("from_run", "%s did not prepare %s (it has %s); limit the play to its engines (-l) or %s"
                         % (where, ", ".join(missing), ", ".join(sorted(manifest["engines"])), RELAUNCH))
    if launcher is None:
        raise InputError("from_run", "%s has no launcher snapshot %s; %s" % (where, manifest["launcher"]["file"],
                                                                             RELAUNCH))
    if sha256_text(launcher) != manifest["launcher"]["sha256"]:
        raise InputError("from_run", "the launcher snapshot of %s does not match the sha256 its manifest records "
                                     "(%s): it was changed after prepare; %s"
                         % (where, manifest["launcher"]["sha256"][:12], RELAUNCH))
    for engine in sorted(manifest["engines"]):
        entry = manifest["engines"][engine]
        if records.get(engine) is None:
            raise InputError("from_run", "%s has no record copy for %s (%s/engine-launch.%s.json); %s"
                             % (where, engine, engine, engine, RELAUNCH))
        if sha256_text(canonical(records[engine])) != entry["record_sha256"]:
            raise InputError("from_run", "the record copy of %s in %s does not match the sha256 its manifest records "
                                         "(%s): it was changed after prepare; %s"
                             % (engine, where, entry["record_sha256"][:12], RELAUNCH))
        if role_envs.get(engine) is None:
            raise InputError("from_run", "%s has no role environment for %s (%s/%s.env); %s"
                             % (where, engine, engine, engine, RELAUNCH))
        if role_envs[engine] != entry["role_env"]:
            changed = sorted(k for k in set(role_envs[engine]) | set(entry["role_env"])
                             if role_envs[engine].get(k) != entry["role_env"].get(k))
            raise InputError("from_run", "the role environment of %s in %s differs from its manifest (%s): it was "
                                         "changed after prepare; %s" % (engine, where, ", ".join(changed), RELAUNCH))
    launch = {"version": 1, "engines": dict((e, records[e]) for e in manifest["engines"])}
    errors = launch_config_errors(launch)
    if errors:
        raise InputError("from_run", "the records of %s fail the launch-record schema of this narwhal.deploy (%s); "
                                     "%s" % (where, "; ".join(errors[:5]), RELAUNCH))
    return launch["engines"]
