# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The prepare_run step: validate the assigned records and write a prepared run (see plugins/modules/prepare_run.py).

prepare_run(task) reads a StepRun (_common/step.py) and returns the task's result; a refusal raises StepError. Its
action plugin (plugins/action/prepare_run.py) runs it in the controller's process.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import API_KEY_MAX_BYTES, api_key_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import REGENERATE, InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import subscriber_endpoints
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import (
    ENGINE_NAME,
    INSPECTION_FILE,
    MODEL_MANIFEST_FILE,
    POLICY_FILE,
    SOURCES_FILE,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    bin_path,
    host_name,
    read_regular,
    run_bounded,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import canonical_files, manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import (
    RERUN,
    check_policy,
    verify_extract,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.paths import check_paths, git_ignore_checker
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import MANIFEST_SCHEMA, validation_errors
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.writer import OutputError, OutputSet
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import (
    parse_role_env,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import (
    DELIVER_THEN_DISCOVER,
    RELAUNCH,
    canonical,
    check_documents,
    check_pair_manifests,
    check_run_id,
    check_source_manifest,
    compatibility,
    derive,
    past_run,
    role_env_texts,
    run_id,
    sha256_text,
    shared_hosts,
    stale,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.launcher import (
    GUARD_SOURCE,
    build_zipapp,
    launcher_sources,
)

__metaclass__ = type


def _path(root, value):
    return value if os.path.isabs(value) else os.path.join(root, value)


def _load(key, path):
    try:
        raw = read_regular(path)
        return raw, json.loads(raw)
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = "nested too deeply to be JSON a discovery wrote"
        raise InputError(key, "cannot read %s (%s); run discovery first, or %s" % (path, exc, REGENERATE))


def check_key_file(path):
    """The engine API key file: readable, mode 0600 or 0400, one non-empty line (never printed)."""
    try:
        st = os.stat(path)
        raw = read_regular(path, API_KEY_MAX_BYTES)  # a FIFO is refused by name, never waited on
    except OSError as exc:
        raise InputError("NARWHAL_API_KEY_FILE", "cannot read the engine API key file %s (%s); create it (one line, "
                                                 "mode 0600) and prepare a new run" % (path, exc.strerror))
    try:
        api_key_from(raw, st.st_mode, path)  # the launcher's own rule for the same file
    except PlanError as exc:
        raise InputError("NARWHAL_API_KEY_FILE", str(exc))


def check_records_policy(root, site, inputs):
    """Refuse records whose launch policy differs from the current inputs (docs/vllm-requirements.md, "Launch records":
    a corrected input must reach the records before the manifest records it)."""
    config = _path(root, site["NARWHAL_CONFIG_DIR"])
    index_path, extract_path = os.path.join(config, SOURCES_FILE), os.path.join(config, POLICY_FILE)
    for path in (index_path, extract_path):
        if not os.path.exists(path):
            raise InputError("NARWHAL_CONFIG_DIR", "%s is missing, so prepare cannot tell whether the launch records "
                                                   "match .env; %s" % (path, RERUN))
    _raw, index = _load("NARWHAL_CONFIG_DIR", index_path)
    try:
        raw = read_regular(extract_path)  # a FIFO is refused by name, never waited on (under discovery's lock)
    except OSError as exc:
        raise InputError("NARWHAL_CONFIG_DIR", "cannot read %s (%s); %s"
                         % (extract_path, getattr(exc, "strerror", None) or exc, RERUN))
    extract = verify_extract(index, raw, index_path, extract_path)
    digest = index.get("launch_config_sha256")  # which discovery wrote the records (no timestamp: idempotent)
    check_policy(extract, inputs,
                 "%s, sha256 %s" % (site["NARWHAL_LAUNCH_CONFIG"], digest[:12]) if isinstance(digest, str) else None)


def read_config(task, root, site, nodes, paths):
    """The fleet and the launch config, read under discovery's lock of NARWHAL_CONFIG_DIR (after completing or
    undoing an interrupted discovery write, docs/outputs.md) so that they are one set with the policy extract."""
    with OutputSet(_path(root, site["NARWHAL_CONFIG_DIR"]), "discovery", check_mode=task.check_mode, create=False,
                   who="prepare") as config:
        if config.pending:
            raise InputError("NARWHAL_CONFIG_DIR", "%s; run prepare without check mode (it completes that write "
                                                   "first) or rerun discovery" % config.pending)
        fleet_raw, fleet = _load("NARWHAL_FLEET", paths["fleet"])
        launch_raw, launch = _load("NARWHAL_LAUNCH_CONFIG", paths["launch_config"])
        check_records_policy(root, site, {"site": site, "nodes": nodes})
    for note in config.notes:
        task.warnings.append(note)
    return fleet_raw, fleet, launch_raw, launch


GIT_TIMEOUT = 60  # seconds each git command may take


def _git(git, root, *args):
    """(rc, stdout) of `git -C root args`, with a deadline that fails the step naming git and the host."""
    try:
        rc, out, _err = run_bounded([git, "-C", root] + list(args), GIT_TIMEOUT, {"LC_ALL": "C"})
    except CommandTimeoutError:
        raise StepError("prepare refused, no run was created: 'git %s' in %s on host %s did not answer within "
                        "%d s (timed out, killed); git hangs on an unreachable network file system or a held "
                        "repository lock (.git/index.lock): check the checkout, then prepare again"
                        % (" ".join(args), root, host_name(), GIT_TIMEOUT))
    except OSError as exc:
        raise StepError("prepare refused, no run was created: git could not be started on host %s (%s)"
                        % (host_name(), exc.strerror or exc))
    return rc, out


def revision(root):
    """(HEAD commit, dirty) of the checkout; (None, None) without git or outside a repository."""
    git = bin_path("git")
    if not git:
        return None, None
    rc, out = _git(git, root, "rev-parse", "HEAD")
    if rc != 0:
        return None, None
    rc2, status = _git(git, root, "status", "--porcelain", "--untracked-files=no")
    return out.strip(), bool(status.strip()) if rc2 == 0 else None


def collection_identity(collection):
    """{name, version, build} of the narwhal.deploy that prepares the run. Installed (ansible-galaxy): from its
    MANIFEST.json, the build being the sha256 of its FILES.json (the checksums of every file of that build). A
    checkout: galaxy.yml's version, the build being the checkout's git commit (-dirty with changes)."""
    manifest = os.path.join(collection, "MANIFEST.json")
    try:
        if os.path.isfile(manifest):
            info = json.loads(read_regular(manifest).decode("utf-8"))
            about = info["collection_info"]
            files = (info.get("file_manifest_file") or {}).get("chksum_sha256")
            return {"name": "%s.%s" % (about["namespace"], about["name"]), "version": str(about["version"]),
                    "build": "FILES.json sha256:%s" % files if files else "MANIFEST.json without a FILES.json checksum"}
        import yaml

        galaxy = yaml.safe_load(read_regular(os.path.join(collection, "galaxy.yml")).decode("utf-8"))
        about = {"name": "%s.%s" % (galaxy["namespace"], galaxy["name"]), "version": str(galaxy["version"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError("collection", "cannot read the version of the collection at %s (MANIFEST.json or galaxy.yml: "
                                       "%s); reinstall narwhal.deploy" % (collection, exc))
    rev, dirty = revision(collection)
    about["build"] = ("git %s%s" % (rev, "-dirty" if dirty else "") if rev else
                      "source tree (no MANIFEST.json, not a git checkout)")
    return about


def current_records(task, p, root, site, engines, paths):
    """(records, launcher bytes, inputs digests) from the current fleet and launch config (discovery's output,
    checked against the current .env policy) and the launcher built from the collection."""
    fleet_raw, fleet, launch_raw, launch = read_config(task, root, site, p["site"].get("nodes") or {}, paths)
    check_documents(fleet, launch, site)
    records = launch["engines"]
    missing = [e for e in engines if e not in records]
    if missing:
        raise InputError("NARWHAL_LAUNCH_CONFIG", "%s has no record for %s; %s"
                         % (site["NARWHAL_LAUNCH_CONFIG"], ", ".join(missing), REGENERATE))
    fleet_by_engine = dict((f.get("engine"), f) for f in fleet)
    for e in engines:
        f = fleet_by_engine.get(e)
        if f is None or f["iid"] != records[e]["iid"] or f["role"] != records[e]["role"]:
            raise InputError("NARWHAL_FLEET", "the fleet and the launch config disagree about %s; %s" % (e, REGENERATE))
        if "accelerator" in f and f["accelerator"] != records[e]["accelerator"]:
            raise InputError("NARWHAL_FLEET", "the fleet's hardware fields for %s (%s) differ from its record "
                                              "(%s); %s" % (e, f["accelerator"], records[e]["accelerator"], REGENERATE))
        if f.get("kv_events") != subscriber_endpoints(records[e]):
            raise InputError("NARWHAL_FLEET", "the fleet's kv_events for %s (%s) are not the endpoints its record "
                                              "publishes on (%s); %s" % (e, f.get("kv_events") or "none",
                                                                         subscriber_endpoints(records[e]) or "none",
                                                                         REGENERATE))
    try:
        launcher_bytes = build_zipapp(launcher_sources(p["collection"]))
    except (OSError, ValueError) as exc:
        raise InputError("collection", "cannot build the launcher from the collection at %s (%s); reinstall "
                                       "narwhal.deploy" % (p["collection"], exc))
    inputs_sha = {"env_file_sha256": p["site"].get("env_sha256"), "fleet_sha256": sha256_text(fleet_raw),
                  "launch_config_sha256": sha256_text(launch_raw)}
    return records, launcher_bytes, inputs_sha


def _run_file(path, parse):
    """A file of an earlier run: None when it does not exist, else parse(bytes); unreadable is refused by name."""
    try:
        raw = read_regular(path)
    except OSError as exc:
        if not os.path.lexists(path):
            return None
        raise InputError("from_run", "cannot read %s (%s); %s" % (path, getattr(exc, "strerror", None) or exc,
                                                                  RELAUNCH))
    try:
        return parse(raw)
    except (ValueError, RecursionError, PlanError) as exc:
        raise InputError("from_run", "%s is not what prepare wrote (%s); %s"
                         % (path, exc if not isinstance(exc, RecursionError) else "nested too deeply", RELAUNCH))


def read_past_run(runs_dir, from_run, engines):
    """(records of the run, its launcher snapshot bytes, its manifest) from runs/<from_run>/, validated
    (_prepare/checks.py::past_run). Reads only that run's files."""
    check_run_id(from_run)
    run_dir = os.path.join(runs_dir, from_run)
    if not os.path.isdir(run_dir):
        raise InputError("from_run", "there is no run %s: %s is not a directory (NARWHAL_RUNS_DIR); pick a run ID "
                                     "from the directories of %s" % (from_run, run_dir, runs_dir))
    manifest = _run_file(os.path.join(run_dir, "manifest.json"), json.loads)
    if manifest is None:
        raise InputError("from_run", "run %s (%s) has no manifest.json; %s" % (from_run, run_dir, RELAUNCH))
    names = sorted(manifest.get("engines") or {}) if isinstance(manifest, dict) else []
    names = [e for e in names if ENGINE_NAME.match(e)]  # never a path from the manifest
    launcher_file = "launch_engine.pyz"
    launcher = _run_file(os.path.join(run_dir, launcher_file), bytes)
    records = dict((e, _run_file(os.path.join(run_dir, e, "engine-launch.%s.json" % e), json.loads)) for e in names)
    role_envs = dict((e, _run_file(os.path.join(run_dir, e, "%s.env" % e),
                                   lambda raw, e=e: parse_role_env(raw.decode("utf-8"), "%s/%s.env" % (e, e))))
                     for e in names)
    if not isinstance(manifest, dict) or manifest.get("launcher", {}).get("file", launcher_file) != launcher_file:
        raise InputError("from_run", "the manifest of run %s (%s) is not one prepare wrote; %s"
                         % (from_run, run_dir, RELAUNCH))
    return past_run(from_run, run_dir, manifest, launcher, records, role_envs, engines), launcher, manifest


def module_spec():
    """The argument spec of prepare_run (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            site=dict(type="dict", required=True),
            engines=dict(type="list", elements="str", required=True),
            root=dict(type="path", required=True),
            collection=dict(type="path", required=True),
            stage=dict(type="str", default="validate", choices=["validate", "write"]),
            hosts=dict(type="dict", default={}),
            from_run=dict(type="str"),
            tls=dict(type="dict"),
            engine_hosts=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )


TLS_FIX = "the prepare role runs narwhal.deploy.tls_material before prepare_run and passes its result as `tls`"


def _tls_entry(tls, engine, host, check_mode=False):
    """The tls_material result's certificate of the inventory host `host` that runs `engine`, checked (in check mode
    the files need not exist yet: tls_material in check mode reports what it would write, and writes nothing)."""
    entry = (tls.get("hosts") or {}).get(host)
    if not isinstance(entry, dict):
        raise InputError("tls", "the tls argument (tls_material's result, mode %s) has no certificate for inventory "
                                "host %s, which runs %s; %s for every engine host of the play"
                         % (tls.get("mode"), host, engine, TLS_FIX))
    for name, path in (("cert", entry.get("cert")), ("key", entry.get("key")), ("ca", tls.get("ca"))):
        if not isinstance(path, str) or not os.path.isabs(path) or not (check_mode or os.path.isfile(path)):
            raise InputError("tls", "the %s of inventory host %s (%s) in the tls argument is %r, not a file on the "
                                    "controller; %s" % (name, host, engine, path, TLS_FIX))
    if not isinstance(entry.get("sha256"), str) or len(entry["sha256"]) != 64:
        raise InputError("tls", "the certificate of inventory host %s (%s) in the tls argument has no sha256; %s"
                         % (host, engine, TLS_FIX))
    return entry


def engine_access(p, site, engines, check_mode=False):
    """{engine: role_environment's who-gets-in arguments (bind, tls, guard_sha256)} and {engine: {narwhal_rank:
    install sources}}: NARWHAL_ENGINE_BIND, the certificate of the inventory host that runs the engine (`tls`, the
    tls_material step's result; `engine_hosts` maps an engine to that host, else the host of its name) and the
    sha256 of the collection's key guard. A TLS mode that is not NARWHAL_TLS's is refused by name."""
    wanted, tls = site.get("NARWHAL_TLS") or "off", p.get("tls")
    mode = (tls or {}).get("mode", "off")
    if (tls is None and wanted != "off") or (tls is not None and "NARWHAL_TLS" in site and mode != wanted):
        raise InputError("NARWHAL_TLS", "NARWHAL_TLS=%s but the tls argument is %s; %s"
                         % (wanted, "missing" if tls is None else "for mode %r" % mode, TLS_FIX))
    if mode not in ("off", "site", "operator"):
        raise InputError("tls", "the tls argument's mode %r is not site, operator or off; %s" % (mode, TLS_FIX))
    guard = os.path.join(p["collection"], GUARD_SOURCE)
    try:
        guard_sha = hashlib.sha256(read_regular(guard)).hexdigest()
    except OSError as exc:
        raise InputError("collection", "cannot read the key guard %s (%s); reinstall narwhal.deploy"
                         % (guard, exc.strerror or exc))
    access, sources = {}, {}
    for engine in engines:
        host = (p.get("engine_hosts") or {}).get(engine) or engine
        entry = _tls_entry(tls, engine, host, check_mode) if mode != "off" else None
        access[engine] = {"bind": site.get("NARWHAL_ENGINE_BIND") or "", "tls": entry, "guard_sha256": guard_sha}
        sources[engine] = {"0": {"guard_sha256": guard_sha, "tls": entry and {
            "cert": entry["cert"], "key": entry["key"], "ca": tls["ca"]}}}
    return access, sources


def _records(task, paths, root, site, engines):
    """(records, launcher bytes, input digests, the earlier run's manifest or None) of a new run or a relaunch."""
    p = task.params
    if not p["from_run"]:
        records, launcher_bytes, inputs_sha = current_records(task, p, root, site, engines, paths)
        return records, launcher_bytes, inputs_sha, None
    # a relaunch: the earlier run is the recipe; the current .env policy is not applied (a rollback)
    records, launcher_bytes, earlier = read_past_run(paths["runs_dir"], p["from_run"], engines)
    digests = ("env_file_sha256", "fleet_sha256", "launch_config_sha256")
    inputs_sha = dict((k, earlier["inputs"].get(k)) for k in digests)
    inputs_sha["relaunched_from"] = p["from_run"]
    return records, launcher_bytes, inputs_sha, earlier


def source_manifest(config_dir):
    """{"path", "digest", "files"} of the deliver stage's manifest of NARWHAL_MODEL_SOURCE (NARWHAL_CONFIG_DIR/
    model-manifest.json), its digest recomputed from its files; refused by name when missing, unreadable or changed."""
    path = os.path.join(config_dir, MODEL_MANIFEST_FILE)
    try:
        document = json.loads(read_regular(path))
        files = canonical_files(document["files"])
        digest = manifest_digest(files)
    except OSError as exc:
        raise InputError("NARWHAL_MODEL_SOURCE", "NARWHAL_MODEL_SOURCE is set but the manifest of the source %s cannot "
                                                 "be read (%s): the deliver stage writes it; %s"
                         % (path, getattr(exc, "strerror", None) or exc, DELIVER_THEN_DISCOVER))
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
        raise InputError("NARWHAL_MODEL_SOURCE", "the manifest of the source %s is not one the deliver stage wrote "
                                                 "(%s: %s); %s" % (path, exc.__class__.__name__, exc,
                                                                   DELIVER_THEN_DISCOVER))
    if document.get("digest") != digest:
        raise InputError("NARWHAL_MODEL_SOURCE", "the manifest of the source %s records digest %r, but its files map "
                                                 "has digest %s: it was changed after the deliver stage wrote it; %s"
                         % (path, document.get("digest"), digest, DELIVER_THEN_DISCOVER))
    return {"path": path, "digest": digest, "files": files}


def extract_files(config_dir, records):
    """files_of(engine) for the manifest checks: the files map of the manifest in the engine's inspection extract
    (/model/manifest/files), only when its digest is the record's runtime.model_manifest (so a newer discovery's
    extract beside a relaunched run's record is never taken for its own); None otherwise. Read only when asked."""
    def files_of(engine):
        try:
            extract = json.loads(read_regular(os.path.join(config_dir, INSPECTION_FILE % engine)))
            files = canonical_files(extract["model"]["manifest"]["files"])
            digest = manifest_digest(files)
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
            return None
        return files if digest == records[engine]["runtime"].get("model_manifest") else None
    return files_of


def check_manifests(p, paths, records, engines):
    """The checkpoint's manifests (docs/prepare.md): every prefill/decode pair serves one, and with
    NARWHAL_MODEL_SOURCE set (a new run; a relaunch is a rollback) the engines' are the source's."""
    files_of = extract_files(paths["config_dir"], records)
    check_pair_manifests(records, files_of)
    if p["site"]["site"].get("NARWHAL_MODEL_SOURCE") and not p["from_run"]:
        check_source_manifest(dict((e, records[e]) for e in engines), source_manifest(paths["config_dir"]), files_of)


def _stamp_identity(derived, engines, rev, dirty, collection):
    """The application revision and the collection in every host's role environment (the launcher records them in
    deployment.json with the container ID and its own digest)."""
    for e in engines:
        for host in [derived[e]] + list((derived[e].get("members") or {}).values()):
            host["role_env"]["NARWHAL_APP_REVISION"] = "%s%s" % (rev or "unknown", "-dirty" if dirty else "")
            host["role_env"]["NARWHAL_COLLECTION"] = "%(name)s %(version)s (%(build)s)" % collection


def _check_hosts(records, engines, hosts):
    """The write stage's current inspection of each host of each engine against its record (stale)."""
    for e in engines:
        stale(records[e], hosts.get(e) or {})
        for member in records[e].get("members") or []:  # each other host of an engine across hosts
            view = dict(member_view(records[e], member["member"]),
                        engine="%s (its host %s, narwhal_rank %d)" % (e, member["host"], member["member"]))
            stale(view, hosts.get("%s#%d" % (e, member["member"])) or {})


def _validate(task):
    """The validate stage (and the write stage's checks): the result validate returns, and what the write needs."""
    p = task.params
    site, root, engines = p["site"]["site"], p["root"], sorted(p["engines"])
    # the run directory and the files prepare reads: each its own, none an input, git-ignored in the checkout
    paths = check_paths(root, site, engines, p["site"].get("env_file"),
                        git_ignore_checker(root, GIT_TIMEOUT), os.path.realpath)
    records, launcher_bytes, inputs_sha, earlier = _records(task, paths, root, site, engines)
    compatibility(records)
    shared_hosts(records)
    check_manifests(p, paths, records, engines)
    launcher_sha = hashlib.sha256(launcher_bytes).hexdigest()
    checkout = site["NARWHAL_ENGINE_CHECKOUT"]
    access, sources = engine_access(p, site, engines, task.check_mode)
    draft = dict((e, derive(records[e], checkout, "run-pending", access[e])) for e in engines)
    rid = run_id(engines, records, draft, launcher_sha, inputs_sha)
    derived = dict((e, derive(records[e], checkout, rid, access[e])) for e in engines)
    for e in engines:  # the hosts after the head of an engine across hosts: the guard, no TLS (no HTTP server)
        sources[e].update((k, dict(sources[e]["0"], tls=None)) for k in derived[e].get("members") or {})
    check_key_file(paths["api_key_file"])
    collection = collection_identity(p["collection"])
    rev, dirty = revision(root)
    _stamp_identity(derived, engines, rev, dirty, collection)
    # Each host's role environment as the write stage writes it ({engine: {"0": head, "<k>": narwhal_rank k}}):
    # prepare reads what install would write with its host checks (roles/prepare, engine_prereqs' held).
    texts = dict((e, role_env_texts(derived[e])) for e in engines)
    result = {"changed": False, "run_id": rid, "records": dict((e, records[e]) for e in engines),
              "derived": derived, "launcher_sha256": launcher_sha, "role_env_texts": texts,
              "install_sources": sources}
    if p["stage"] == "write":
        _check_hosts(records, engines, p["hosts"])
    run = {"paths": paths, "engines": engines, "records": records, "derived": derived, "texts": texts,
           "launcher_bytes": launcher_bytes, "inputs_sha": inputs_sha, "earlier": earlier,
           "application": {"revision": rev, "dirty": dirty}, "collection": collection}
    return result, run


def _manifest(p, run, rid, launcher_sha):
    site, engines, records, derived = p["site"]["site"], run["engines"], run["records"], run["derived"]
    manifest = {
        "run_id": rid,
        "application": run["application"],
        "collection": run["collection"],
        "launcher": {"file": "launch_engine.pyz", "sha256": launcher_sha},
        "inputs": (dict(run["earlier"]["inputs"]) if p["from_run"] else
                   dict(run["inputs_sha"], env_file=p["site"].get("env_file"), fleet=site["NARWHAL_FLEET"],
                        launch_config=site["NARWHAL_LAUNCH_CONFIG"])),
        "engines": dict((e, {"host": e, "role": records[e]["role"], "iid": records[e]["iid"],
                             "record_sha256": sha256_text(canonical(records[e])),
                             "environment": derived[e]["environment"], "vllm_args": derived[e]["vllm_args"],
                             "container": derived[e]["container"], "plan_hash": derived[e]["plan_hash"],
                             "role_env": derived[e]["role_env"], "install": derived[e]["paths"]}) for e in engines),
    }
    # the other hosts of an engine across hosts: what each runs (docs/vllm-requirements.md, "Engines across hosts")
    for e in engines:
        if derived[e].get("members"):
            manifest["engines"][e]["members"] = derived[e]["members"]
    if p["from_run"]:
        manifest["relaunched_from"] = p["from_run"]
    errors = validation_errors(manifest, MANIFEST_SCHEMA)
    if errors:
        raise StepError("the manifest fails its schema, no run was created: %s" % "; ".join(errors))
    return manifest


def _run_files(run_dir, run, manifest, launcher_sha):
    """{path: (content, mode)} of the run directory."""
    records, derived, texts = run["records"], run["derived"], run["texts"]
    files = {os.path.join(run_dir, "manifest.json"): (json.dumps(manifest, indent=2) + "\n", 0o600),
             os.path.join(run_dir, "launch_engine.pyz"): (run["launcher_bytes"], 0o600),
             os.path.join(run_dir, "launch_engine.pyz.sha256"): ("%s  launch_engine.pyz\n" % launcher_sha, 0o600)}
    for e in run["engines"]:
        files[os.path.join(run_dir, e, "engine-launch.%s.json" % e)] = (json.dumps(records[e], indent=2) + "\n", 0o600)
        files[os.path.join(run_dir, e, "%s.env" % e)] = (texts[e]["0"], 0o600)
        for k in sorted(derived[e].get("members") or {}):
            files[os.path.join(run_dir, e, "%s.member-%s.env" % (e, k))] = (texts[e][k], 0o600)
        files[os.path.join(run_dir, e, "prepared.json")] = (json.dumps(
            {"environment": derived[e]["environment"], "vllm_args": derived[e]["vllm_args"],
             "container": derived[e]["container"], "plan_hash": derived[e]["plan_hash"]}, indent=2) + "\n", 0o600)
    return files


def prepare_run(task):
    p = task.params
    try:
        result, run = _validate(task)
    except InputError as exc:
        raise StepError("prepare refused, no run was created: %s" % exc, input=exc.key)
    except OutputError as exc:
        raise StepError("prepare: %s" % exc, path=exc.path)
    if p["stage"] == "validate":
        return result
    rid, launcher_sha = result["run_id"], result["launcher_sha256"]
    runs_dir = run["paths"]["runs_dir"]
    run_dir = os.path.join(runs_dir, rid)
    manifest = _manifest(p, run, rid, launcher_sha)
    files = _run_files(run_dir, run, manifest, launcher_sha)
    # One lock for the runs directory (a second prepare waits, then is refused by name); a new run is built aside and
    # renamed into place, a changed one swapped through the journal (plugins/module_utils/_outputs/writer.py).
    try:
        with OutputSet(runs_dir, "prepare", check_mode=task.check_mode) as runs:
            changes = runs.plan(files)
            if changes and not task.check_mode:
                if os.path.isdir(run_dir):
                    runs.apply(changes, kept="the previous files of %s are intact" % run_dir)
                else:
                    runs.create_tree(run_dir, files)
    except OutputError as exc:
        raise StepError("prepare: %s" % exc, path=exc.path)
    for note in runs.notes:
        task.warnings.append(note)
    result.update(changed=bool(changes), run_dir=run_dir, manifest=manifest)
    if task.diff and changes:
        result["diff"] = {"before": "", "after": "\n".join(sorted(c[0] for c in changes)) + "\n"}
    return result
