# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""prepare_run end to end (plugins/module_utils/_prepare/run.py through plugins/modules/prepare_run.py):
the run it writes, its refusals (missing key, stale host, incompatible pair, changed policy inputs, output
paths, hostile files, hanging tools), relaunch from an earlier run, and check mode."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess

import pytest
from test_support.paths import REPO
from test_support.prepare import (
    API_KEY,
    CHECKOUT,
    NODES,
    SITE,
    files_map,
    fleet_for,
    good_hosts,
    inspection,
    make_checkout,
    prep_args,
    with_manifest,
    write_policy,
    write_source_manifest,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import POLICY_FILE, SOURCES_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import (
    check_policy,
    launch_policy,
    policy_changes,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import MANIFEST_SCHEMA, validation_errors
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare import run as _prepare_run_step
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.launcher import (
    build_zipapp,
    launcher_sources,
)

# ------------------------------------------------------------------------------------------------
# prepare_run end to end


@pytest.fixture
def run_module(step_runner):
    return lambda args: step_runner("prepare_run", args)


@pytest.fixture
def root(tmp_path, pd_launch):
    return make_checkout(tmp_path, pd_launch)


def test_prepare_validate_returns_records_and_writes_nothing(root, run_module, pd_launch):
    status, result = run_module(prep_args(root))
    assert status == "exit", result
    assert result["changed"] is False
    assert set(result["records"]) == {"engine-1", "engine-2"}
    assert result["records"]["engine-2"] == pd_launch["engines"]["engine-2"]
    assert re.fullmatch(r"run-[0-9a-f]{12}", result["run_id"])
    d1 = result["derived"]["engine-1"]
    assert d1["environment"]["UCX_NET_DEVICES"] == "eth1"
    assert d1["role_env"]["NARWHAL_RUN_ID"] == result["run_id"]
    assert d1["paths"]["run_dir"] == "%s/runs/%s" % (CHECKOUT, result["run_id"])
    assert result["derived"]["engine-2"]["environment"]["ROCR_VISIBLE_DEVICES"] == "0,1"
    assert not (root / "runs").exists()


def test_prepare_write_creates_the_run(root, run_module, pd_launch):
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "exit", result
    assert result["changed"] is True
    rid = result["run_id"]
    run_dir = root / "runs" / rid
    assert result["run_dir"] == str(run_dir)
    assert run_dir.is_dir()
    manifest_text = (run_dir / "manifest.json").read_text()
    assert stat.S_IMODE(os.stat(run_dir / "manifest.json").st_mode) == 0o600
    assert API_KEY not in manifest_text
    manifest = json.loads(manifest_text)
    assert validation_errors(manifest, MANIFEST_SCHEMA) == []
    assert manifest["run_id"] == rid
    assert set(manifest["engines"]) == {"engine-1", "engine-2"}
    assert manifest["engines"]["engine-2"]["role"] == "decode"
    assert manifest["inputs"]["env_file_sha256"] == "x"
    launcher = (run_dir / "launch_engine.pyz").read_bytes()
    assert launcher == build_zipapp(launcher_sources(str(root / "collection")))
    assert stat.S_IMODE(os.stat(run_dir / "launch_engine.pyz").st_mode) == 0o600
    sha = hashlib.sha256(launcher).hexdigest()
    assert (run_dir / "launch_engine.pyz.sha256").read_text() == "%s  launch_engine.pyz\n" % sha
    assert manifest["launcher"]["sha256"] == sha == result["launcher_sha256"]
    for e in ("engine-1", "engine-2"):
        assert json.loads((run_dir / e / ("engine-launch.%s.json" % e)).read_text()) == pd_launch["engines"][e]
        env_text = (run_dir / e / ("%s.env" % e)).read_text()
        assert "NARWHAL_RUN_ID=%s\n" % rid in env_text
        assert API_KEY not in env_text
        prepared = json.loads((run_dir / e / "prepared.json").read_text())
        derived = result["derived"][e]
        assert prepared == {"environment": derived["environment"], "vllm_args": derived["vllm_args"],
                            "container": derived["container"], "plan_hash": derived["plan_hash"]}
        assert manifest["engines"][e]["plan_hash"] == derived["plan_hash"]
    # the validate stage reports the same run ID, and the role environments the write stage wrote, byte for byte
    # (prepare's host checks read what install would write from them: roles/prepare, engine_prereqs' held)
    validated = run_module(prep_args(root))[1]
    assert validated["run_id"] == rid
    for e in ("engine-1", "engine-2"):
        assert validated["role_env_texts"][e] == {"0": (run_dir / e / ("%s.env" % e)).read_text()}
        assert validated["derived"][e]["role_env"] == result["derived"][e]["role_env"]
    # again: nothing changes
    status, again = run_module(prep_args(root, "write", good_hosts()))
    assert status == "exit" and again["changed"] is False and again["run_id"] == rid


def test_prepare_run_id_changes_with_the_launcher(root, run_module):
    first = run_module(prep_args(root))[1]["run_id"]
    main = root / "collection" / "roles" / "install" / "files" / "launcher" / "__main__.py"
    main.write_text(main.read_text() + "# v2\n")
    assert run_module(prep_args(root))[1]["run_id"] != first


def test_prepare_check_mode_writes_nothing(root, run_module):
    status, result = run_module(prep_args(root, "write", good_hosts(), check=True))
    assert status == "exit", result
    assert result["changed"] is True
    assert not (root / "runs").exists()


def _tls(root, hosts=("engine-1", "engine-2"), mode="site"):
    """A tls_material result for `hosts`, with its files on the controller (their content does not matter here)."""
    folder = root / "config" / "tls"
    (folder / "hosts").mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_text("ca\n")
    found = {}
    for host in hosts:
        for ext in ("crt", "key"):
            (folder / "hosts" / ("%s.%s" % (host, ext))).write_text("%s %s\n" % (host, ext))
        named = folder / "hosts" / host
        found[host] = {"cert": "%s.crt" % named, "key": "%s.key" % named,
                       "sha256": hashlib.sha256(host.encode()).hexdigest(), "not_after": "2027-01-01T00:00:00Z",
                       "days_left": 300, "names": ["172.31.241.11"]}
    return {"changed": False, "mode": mode, "ca": str(folder / "ca.crt"), "hosts": found}


def test_prepare_with_tls_serves_each_engines_certificate_and_always_the_guard(root, run_module):
    guard_sha = hashlib.sha256((REPO / "roles/install/files/guard/narwhal_guard.py").read_bytes()).hexdigest()
    plain = run_module(prep_args(root))[1]
    for e in ("engine-1", "engine-2"):
        env = plain["derived"][e]["role_env"]
        assert (env["NARWHAL_TLS_DIR"], env["NARWHAL_GUARD_SHA256"]) == ("", guard_sha)
        assert "--middleware" in plain["derived"][e]["vllm_args"] and "--ssl-certfile" not in plain["derived"][e][
            "vllm_args"]
        assert plain["install_sources"][e] == {"0": {"guard_sha256": guard_sha, "tls": None}}
    tls = _tls(root)
    write_policy(root, site={"NARWHAL_TLS": "site"})  # discovery recorded the mode (a policy key)
    args = prep_args(root, "write", good_hosts(), site={"NARWHAL_TLS": "site", "NARWHAL_ENGINE_BIND": "0.0.0.0"})
    status, result = run_module(dict(args, tls=tls))
    assert status == "exit", result
    for e in ("engine-1", "engine-2"):
        env = result["derived"][e]["role_env"]
        assert env["NARWHAL_TLS_DIR"] == "%s/tls/%s" % (CHECKOUT, e)
        assert env["NARWHAL_TLS_CERT_SHA256"] == tls["hosts"][e]["sha256"] and env["NARWHAL_BIND_ADDRESS"] == "0.0.0.0"
        role_env_text = (root / "runs" / result["run_id"] / e / ("%s.env" % e)).read_text()
        assert "NARWHAL_TLS_DIR=%s/tls/%s\n" % (CHECKOUT, e) in role_env_text
        assert result["install_sources"][e] == {"0": {"guard_sha256": guard_sha, "tls": {
            "cert": tls["hosts"][e]["cert"], "key": tls["hosts"][e]["key"], "ca": tls["ca"]}}}
        args_ = result["derived"][e]["vllm_args"]
        assert args_[args_.index("--ssl-certfile") + 1] == "/narwhal/tls/server.crt"
    assert result["run_id"] != plain["run_id"]
    # a new certificate of one host: a new run, whose plan replaces that engine only
    renewed = copy.deepcopy(tls)
    renewed["hosts"]["engine-2"]["sha256"] = "f" * 64
    again = run_module(dict(prep_args(root, site={"NARWHAL_TLS": "site", "NARWHAL_ENGINE_BIND": "0.0.0.0"}),
                            tls=renewed))[1]
    assert again["run_id"] != result["run_id"]
    assert again["derived"]["engine-1"]["plan_hash"] == result["derived"]["engine-1"]["plan_hash"]
    assert again["derived"]["engine-2"]["plan_hash"] != result["derived"]["engine-2"]["plan_hash"]


def test_prepare_takes_the_certificate_of_the_inventory_host_that_runs_the_engine(root, run_module):
    tls = _tls(root, hosts=("gpu-a", "engine-2"))
    write_policy(root, site={"NARWHAL_TLS": "operator"})
    args = dict(prep_args(root, site={"NARWHAL_TLS": "operator"}), tls=dict(tls, mode="operator"),
                engine_hosts={"engine-1": "gpu-a"})
    status, result = run_module(args)
    assert status == "exit", result
    assert result["install_sources"]["engine-1"]["0"]["tls"]["cert"] == tls["hosts"]["gpu-a"]["cert"]
    assert result["derived"]["engine-1"]["role_env"]["NARWHAL_TLS_CERT_SHA256"] == tls["hosts"]["gpu-a"]["sha256"]


@pytest.mark.parametrize("site,tls_of,key,words", [
    ({"NARWHAL_TLS": "site"}, None, "NARWHAL_TLS", "NARWHAL_TLS=site but the tls argument is missing"),
    ({"NARWHAL_TLS": "site"}, lambda t: dict(t, mode="off", hosts={}), "NARWHAL_TLS", "is for mode 'off'"),
    ({"NARWHAL_TLS": "off"}, lambda t: t, "NARWHAL_TLS", "NARWHAL_TLS=off but the tls argument is for mode 'site'"),
    ({"NARWHAL_TLS": "site"}, lambda t: dict(t, hosts={"engine-1": t["hosts"]["engine-1"]}), "tls",
     "no certificate for inventory host engine-2, which runs engine-2"),
    ({"NARWHAL_TLS": "site"}, lambda t: dict(t, ca="/nonexistent/ca.crt"), "tls", "'/nonexistent/ca.crt', not a file"),
    ({"NARWHAL_TLS": "site"}, lambda t: dict(t, hosts=dict(t["hosts"], **{"engine-2": dict(
        t["hosts"]["engine-2"], sha256=None)})), "tls", "engine-2 (engine-2) in the tls argument has no sha256"),
])
@pytest.mark.parametrize("stage", ["validate", "write"])
def test_prepare_refuses_tls_material_that_does_not_fit(root, run_module, site, tls_of, key, words, stage):
    write_policy(root, site=site)
    args = prep_args(root, stage, good_hosts(), site=site)
    if tls_of is not None:
        args["tls"] = tls_of(_tls(root))
    status, result = run_module(args)
    assert status == "fail" and result["input"] == key, result
    _refused(root, result, words, "tls_material")


def test_prepare_without_the_guard_in_the_collection_is_refused(root, run_module):
    (root / "collection" / "roles" / "install" / "files" / "guard" / "narwhal_guard.py").unlink()
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "collection"
    _refused(root, result, "cannot read the key guard")


def _refused(root, result, *words):
    assert result["msg"].startswith("prepare refused, no run was created")
    for w in words:
        assert w in result["msg"]
    assert not (root / "runs").exists()


def test_prepare_missing_key_file_is_refused(root, run_module):
    (root / "config" / "engine-api.key").unlink()
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail"
    assert result["input"] == "NARWHAL_API_KEY_FILE"
    _refused(root, result, "engine-api.key")


def test_prepare_empty_key_file_is_refused(root, run_module):
    (root / "config" / "engine-api.key").write_text("\n")
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail" and result["input"] == "NARWHAL_API_KEY_FILE"
    _refused(root, result, "must hold exactly one non-empty line")


def test_prepare_engine_without_record_is_refused(root, run_module):
    status, result = run_module(prep_args(root, "write", good_hosts(), engines=("engine-1", "engine-2", "engine-3")))
    assert status == "fail" and result["input"] == "NARWHAL_LAUNCH_CONFIG"
    _refused(root, result, "no record for engine-3")


def test_prepare_stale_host_is_refused(root, run_module):
    hosts = good_hosts()
    hosts["engine-2"]["image_id"] = "sha256:" + "1" * 64
    status, result = run_module(prep_args(root, "write", hosts))
    assert status == "fail" and result["input"] == "engine-2"
    _refused(root, result, "no longer matches")


def test_prepare_write_without_inspection_is_refused(root, run_module):
    status, result = run_module(prep_args(root, "write", {}))
    assert status == "fail" and result["input"] == "engine-1"
    _refused(root, result, "no longer matches")


def test_prepare_incompatible_pair_is_refused(root, run_module, pd_launch):
    pd_launch["engines"]["engine-2"]["runtime"]["kv_cache_dtype"] = "fp8"
    (root / "config" / "engine-launch.local.json").write_text(json.dumps(pd_launch))
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail" and result["input"] == "NARWHAL_KV_CACHE_DTYPE"
    _refused(root, result, "would fail vLLM's NIXL handshake: KV cache dtype differs (auto on engine-1")


# ------------------------------------------------------------------------------------------------
# the checkpoint's manifests (runtime.model_manifest; the deliver stage's model-manifest.json)

WEIGHTS = files_map(("model.safetensors", b"weights"))
RETRAINED = files_map(("model.safetensors", b"weights, retrained"), ("extra.bin", b"x"))


def _hosts_of(launch):
    return dict((e, inspection(r)) for e, r in launch["engines"].items())


def test_prepare_runs_a_pair_of_one_manifest_and_labels_their_containers(root, run_module, pd_launch):
    digest = [with_manifest(root, pd_launch, e, WEIGHTS) for e in ("engine-1", "engine-2")][0]
    status, result = run_module(prep_args(root, "write", _hosts_of(pd_launch)))
    assert status == "exit", result
    for e in ("engine-1", "engine-2"):
        assert result["derived"][e]["container"]["labels"]["org.narwhal.model-manifest"] == digest
    # the same with the deliver stage's manifest of NARWHAL_MODEL_SOURCE: the records are its
    write_source_manifest(root, WEIGHTS)
    status, again = run_module(prep_args(root, "write", _hosts_of(pd_launch),
                                         site={"NARWHAL_MODEL_SOURCE": "/srv/source/tiny-llama"}))
    assert status == "exit", again
    assert again["run_id"] == result["run_id"] and again["changed"] is False


def test_prepare_refuses_a_pair_of_different_weights_naming_the_files(root, run_module, pd_launch):
    one = with_manifest(root, pd_launch, "engine-1", WEIGHTS)
    two = with_manifest(root, pd_launch, "engine-2", RETRAINED)
    status, result = run_module(prep_args(root, "write", _hosts_of(pd_launch)))
    assert status == "fail" and result["input"] == "NARWHAL_MODEL_PATH"
    _refused(root, result, "engine-1 (prefill) and engine-2 (decode) serve different weights: runtime.model_manifest "
                           "is %s on engine-1 and %s on engine-2 (the files of engine-2 that differ from engine-1's: "
                           "extra.bin (not in the manifest), model.safetensors (18 bytes, expected 7))" % (one, two),
             "run the deliver stage, then discovery: ansible-playbook narwhal.deploy.site")
    # an extract of another discovery (its files are not the record's manifest) is not taken for the record's
    (root / "config" / "engine-launch.engine-2.inspection.json").write_text(json.dumps(
        {"model": {"manifest": {"digest": one, "files": WEIGHTS}}}))
    status, result = run_module(prep_args(root))
    assert status == "fail" and "(compare the files maps (/model/manifest/files) of " \
        "engine-launch.engine-1.inspection.json and engine-launch.engine-2.inspection.json in NARWHAL_CONFIG_DIR)" \
        in result["msg"]


def test_prepare_refuses_a_pair_where_one_record_has_no_manifest(root, run_module, pd_launch):
    digest = with_manifest(root, pd_launch, "engine-2", WEIGHTS)
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "NARWHAL_MODEL_PATH"
    _refused(root, result, "cannot be shown to serve one checkpoint: engine-2 has the manifest %s "
                           "(runtime.model_manifest), engine-1 has none" % digest)


def test_prepare_refuses_records_that_are_not_of_the_delivered_source(root, run_module, pd_launch):
    site = {"NARWHAL_MODEL_SOURCE": "/srv/source/tiny-llama"}
    status, result = run_module(prep_args(root, site=site))  # no manifest of the source yet
    assert status == "fail" and result["input"] == "NARWHAL_MODEL_SOURCE"
    _refused(root, result, "NARWHAL_MODEL_SOURCE is set but the manifest of the source %s cannot be read (No such file "
                           "or directory): the deliver stage writes it; run the deliver stage, then discovery"
             % (root / "config" / "model-manifest.json"))
    source = write_source_manifest(root, RETRAINED)
    status, result = run_module(prep_args(root, site=site))  # records of before the deliver stage: no manifest
    assert status == "fail" and result["input"] == "NARWHAL_MODEL_SOURCE"
    _refused(root, result, "the launch record of engine-1 has no checkpoint manifest", "is %s: the record" % source)
    old = [with_manifest(root, pd_launch, e, WEIGHTS) for e in ("engine-1", "engine-2")][0]
    status, result = run_module(prep_args(root, site=site))
    _refused(root, result, "the launch record of engine-1 has the checkpoint manifest %s (runtime.model_manifest), "
                           "but the manifest of NARWHAL_MODEL_SOURCE (%s) is %s (the files of engine-1 that differ "
                           "from the source's: extra.bin (missing), model.safetensors (7 bytes, expected 18))"
             % (old, root / "config" / "model-manifest.json", source))
    assert run_module(prep_args(root))[0] == "exit"  # without NARWHAL_MODEL_SOURCE nothing compares them
    write_source_manifest(root, WEIGHTS, digest=source)  # edited after the deliver stage wrote it
    status, result = run_module(prep_args(root, site=site))
    _refused(root, result, "records digest '%s', but its files map has digest %s: it was changed after the deliver "
                           "stage wrote it" % (source, old))
    (root / "config" / "model-manifest.json").write_text("[]")
    status, result = run_module(prep_args(root, site=site))
    _refused(root, result, "is not one the deliver stage wrote (TypeError")


def test_prepare_refuses_a_host_whose_checkpoint_manifest_changed_since_discovery(root, run_module, pd_launch):
    with_manifest(root, pd_launch, "engine-1", WEIGHTS)
    with_manifest(root, pd_launch, "engine-2", WEIGHTS)
    hosts = _hosts_of(pd_launch)
    hosts["engine-2"]["model_manifest"] = manifest_digest(RETRAINED)  # engine_prereqs' read of the STAMP now
    status, result = run_module(prep_args(root, "write", hosts))
    assert status == "fail" and result["input"] == "engine-2"
    _refused(root, result, "the record of engine-2 no longer matches its host: the checkpoint /srv/models/tiny-llama "
                           "holds the manifest %s (.narwhal-manifest.json), recorded %s"
             % (manifest_digest(RETRAINED), manifest_digest(WEIGHTS)))


def test_a_relaunch_is_not_held_to_the_sources_manifest(root, run_module, earlier):
    """A relaunch is a rollback: its records are the earlier run's, whatever the deliver stage delivers now (the
    hosts' checkpoints are still compared with them: the stale check)."""
    write_source_manifest(root, RETRAINED)
    args = dict(prep_args(root, "write", good_hosts(), site={"NARWHAL_MODEL_SOURCE": "/srv/source/tiny-llama"}),
                from_run=earlier["run_id"])
    status, result = run_module(args)
    assert status == "exit", result
    assert run_module(dict(args, from_run=None))[0] == "fail"


def test_prepare_refuses_the_example_nvidia_amd_pair(root, run_module, launch):
    (root / "config" / "fleet.json").write_text(json.dumps(fleet_for(launch["engines"])))
    (root / "config" / "engine-launch.local.json").write_text(json.dumps(launch))
    status, result = run_module(prep_args(root, "write", dict((e, inspection(r))
                                                              for e, r in launch["engines"].items())))
    assert status == "fail" and result["input"] == "NARWHAL_EXTRA_ARGS"
    _refused(root, result, "engine-1 (prefill) and engine-2 (decode) would fail vLLM's NIXL handshake",
             "FLASH_ATTN on engine-1 (cuda default)", "ROCM_AITER_UNIFIED_ATTN on engine-2 (rocm default)")


def test_prepare_fleet_disagreeing_with_records_is_refused(root, run_module, pd_launch):
    fleet = fleet_for(pd_launch["engines"])
    fleet[1]["accelerator"]["count"] = 4
    (root / "config" / "fleet.json").write_text(json.dumps(fleet))
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "NARWHAL_FLEET"
    _refused(root, result, "engine-2")


def test_prepare_refuses_a_fleet_whose_kv_events_are_not_its_records(root, run_module, pd_launch):
    """The fleet's kv_events are where a router subscribes: the endpoints the records publish on, or none."""
    fleet = fleet_for(pd_launch["engines"])
    fleet[0]["kv_events"] = ["tcp://%s:5557" % pd_launch["engines"]["engine-1"]["node"]["address"]]
    (root / "config" / "fleet.json").write_text(json.dumps(fleet))
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "NARWHAL_FLEET"
    _refused(root, result, "the fleet's kv_events for engine-1 (['tcp://", "are not the endpoints its record "
             "publishes on (none)")


# a credential no other rule knows: it looks like nothing secret_values or the token shapes would hide
URL_SECRET = "Zq7yK3pW9mXv2LtR"


@pytest.mark.parametrize("stage", ["validate", "write"])
@pytest.mark.parametrize("field, url", [
    ("url", "https://narwhal:%s@10.0.0.12:8000" % URL_SECRET),
    ("url", "https://%s@10.0.0.12:8000" % URL_SECRET),  # the key as the user name: no password to spot
    ("attestation_url", "http://op:%s/x@10.0.0.12:8010" % URL_SECRET),  # a / in the password ends the authority
])
def test_prepare_refuses_a_fleet_url_with_credentials_and_shows_none(root, run_module, pd_launch, stage, field, url):
    fleet = fleet_for(pd_launch["engines"])
    fleet[1][field] = url
    (root / "config" / "fleet.json").write_text(json.dumps(fleet))
    before = sorted(p for p in root.rglob("*") if "collection" not in p.parts)
    status, result = run_module(prep_args(root, stage, good_hosts()))
    assert status == "fail" and result["input"] == "NARWHAL_FLEET"
    _refused(root, result, "config/fleet.json: engine-2, field %s" % field, "carries user information",
             "<redacted>@10.0.0.12", "NARWHAL_API_KEY_FILE")
    assert URL_SECRET not in json.dumps(result)
    # nothing was written: no run, no other file, and the credential is only where the operator put it
    assert sorted(p for p in root.rglob("*") if "collection" not in p.parts) == before
    assert [p.name for p in root.rglob("*") if p.is_file() and URL_SECRET in p.read_text(errors="replace")] == [
        "fleet.json"]


def test_prepare_missing_launch_config_is_refused(root, run_module):
    (root / "config" / "engine-launch.local.json").unlink()
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "NARWHAL_LAUNCH_CONFIG"
    _refused(root, result, "cannot read")


# ------------------------------------------------------------------------------------------------
# records that match their inputs: the launch policy discovery recorded vs the current inputs


def test_prepare_with_unchanged_policy_inputs_passes(root, run_module):
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "exit", result
    assert (root / "runs" / result["run_id"]).is_dir()


def test_prepare_changed_site_policy_input_is_refused(root, run_module):
    digest = json.loads((root / "config" / SOURCES_FILE).read_text())["launch_config_sha256"]
    status, result = run_module(prep_args(root, site={"NARWHAL_KV_CACHE_DTYPE": "fp8"}))
    assert status == "fail" and result["input"] == "NARWHAL_KV_CACHE_DTYPE"
    assert result["msg"] == (
        "prepare refused, no run was created: NARWHAL_KV_CACHE_DTYPE changed since discovery (records: auto, "
        ".env now: fp8); the records (config/engine-launch.local.json, sha256 %s) were discovered from the old "
        "values; rerun discovery (ansible-playbook narwhal.deploy.discover), then prepare a new run" % digest[:12])
    _refused(root, result)


@pytest.mark.parametrize("stage", ["validate", "write"])
def test_prepare_changed_node_policy_input_is_refused(root, run_module, stage):
    nodes = copy.deepcopy(NODES)
    nodes["2"]["EXTRA_ARGS"] = "--max-num-seqs 8"
    status, result = run_module(prep_args(root, stage, good_hosts(), nodes=nodes))
    assert status == "fail" and result["input"] == "NARWHAL_NODE_2_EXTRA_ARGS"
    _refused(root, result, "NARWHAL_NODE_2_EXTRA_ARGS changed since discovery (records: unset, .env now: "
                           "'--max-num-seqs 8')", "rerun discovery")


def test_prepare_names_every_changed_policy_input(root, run_module):
    write_policy(root, site={"NARWHAL_EXTRA_ARGS": "--max-num-seqs 64"},
                 nodes={"1": {"ROLE": "prefill", "ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG"}, "2": NODES["2"]})
    nodes = {"1": {"ROLE": "prefill"}, "2": dict(NODES["2"], GPU_IDS=[2, 3]), "3": {"ROLE": "decode"}}
    status, result = run_module(prep_args(root, site={"NARWHAL_EXTRA_ARGS": "", "NARWHAL_BLOCK_SIZE": 32},
                                          nodes=nodes))
    assert status == "fail" and result["input"] == "NARWHAL_BLOCK_SIZE"
    _refused(root, result,
             "NARWHAL_BLOCK_SIZE changed since discovery (records: 16, .env now: 32); "
             "NARWHAL_EXTRA_ARGS changed since discovery (records: '--max-num-seqs 64', .env now: unset); "
             "NARWHAL_NODE_1_ENGINE_ENV changed since discovery (records: VLLM_LOGGING_LEVEL=DEBUG, .env now: unset); "
             "NARWHAL_NODE_2_GPU_IDS changed since discovery (records: 0,1, .env now: 2,3); "
             "NARWHAL_NODE_3_ROLE changed since discovery (records: unset, .env now: decode)")


def test_prepare_refuses_records_discovered_with_another_narwhal_tls(root, run_module):
    # the engines' URLs in deployment.env carry NARWHAL_TLS's scheme (_discover/fleet.py): a change needs discovery
    write_policy(root, site={"NARWHAL_TLS": "site"})
    assert run_module(dict(prep_args(root, site={"NARWHAL_TLS": "site"}), tls=_tls(root)))[0] == "exit"
    status, result = run_module(prep_args(root, "write", good_hosts(), site={"NARWHAL_TLS": "off"}))
    assert status == "fail" and result["input"] == "NARWHAL_TLS"
    _refused(root, result, "NARWHAL_TLS changed since discovery (records: site, .env now: off)", "rerun discovery")


def test_check_policy_refuses_an_extract_from_before_narwhal_tls():
    # its deployment.env holds http URLs: with TLS on by default, discovery must write them again
    inputs = {"site": dict(SITE, NARWHAL_TLS="site"), "nodes": NODES}
    recorded = launch_policy(inputs, ["engine-1", "engine-2"])
    del recorded["site"]["NARWHAL_TLS"]
    with pytest.raises(InputError) as err:
        check_policy(recorded, inputs)
    assert err.value.key == "NARWHAL_TLS" and "records: not recorded, .env now: site" in str(err.value)


def test_prepare_non_policy_input_changes_need_no_discovery(root, run_module):
    # read by prepare itself, not recorded: no rediscovery needed
    status, result = run_module(prep_args(root, site={"NARWHAL_ENGINE_CHECKOUT": "/opt/other",
                                                      "NARWHAL_ENGINE_READY_TIMEOUT": 60}))
    assert status == "exit", result
    assert result["derived"]["engine-1"]["paths"]["launcher"] == "/opt/other/bin/launch_engine.pyz"


@pytest.mark.parametrize("name", [POLICY_FILE, SOURCES_FILE])
def test_prepare_missing_policy_extract_or_index_is_refused(root, run_module, name):
    (root / "config" / name).unlink()
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    _refused(root, result, str(root / "config" / name) + " is missing", "rerun discovery")


def test_prepare_tampered_policy_extract_is_refused(root, run_module):
    # an edit that makes the extract agree with the new .env does not pass: the index still has the old sha256
    write_policy(root)
    index = (root / "config" / SOURCES_FILE).read_text()
    path = root / "config" / POLICY_FILE
    path.write_text(path.read_text().replace('"auto"', '"fp8"'))
    assert (root / "config" / SOURCES_FILE).read_text() == index
    status, result = run_module(prep_args(root, "write", good_hosts(), site={"NARWHAL_KV_CACHE_DTYPE": "fp8"}))
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    _refused(root, result, "the policy extract %s was changed after discovery" % path, "rerun discovery")


def test_prepare_index_without_the_policy_extract_is_refused(root, run_module):
    index_path = root / "config" / SOURCES_FILE
    index = json.loads(index_path.read_text())
    index["files"] = {}
    index_path.write_text(json.dumps(index))
    status, result = run_module(prep_args(root))
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    _refused(root, result, "lists no engine-launch.policy.json")


def test_check_policy_names_keys_an_older_extract_did_not_record():
    inputs = {"site": dict(SITE, NARWHAL_ENGINE_PORT=8000), "nodes": NODES}
    recorded = launch_policy(inputs, ["engine-1", "engine-2"])
    assert policy_changes(recorded, inputs) == []
    check_policy(recorded, inputs)
    del recorded["site"]["NARWHAL_ENGINE_PORT"]
    with pytest.raises(InputError) as err:
        check_policy(recorded, inputs)
    assert err.value.key == "NARWHAL_ENGINE_PORT"
    assert str(err.value) == ("NARWHAL_ENGINE_PORT changed since discovery (records: not recorded, .env now: 8000); "
                              "rerun discovery (ansible-playbook narwhal.deploy.discover), then prepare a new run")


def test_policy_changes_ignore_unset_spellings_and_node_number_types():
    inputs = {"site": dict(SITE), "nodes": {1: {"ROLE": "prefill"}, 2: {"ROLE": "decode", "GPU_IDS": [0, 1]}}}
    recorded = json.loads(json.dumps(launch_policy(inputs, ["engine-1", "engine-2"])))
    current = {"site": dict(SITE, NARWHAL_EXTRA_ARGS=None),
               "nodes": {"1": {"ROLE": "prefill"}, "2": {"ROLE": "decode", "GPU_IDS": [0, 1]}, "4": {"IP": "10.0.0.4"}}}
    # "" and None are both unset; a node without a role is not an engine (discovery ignores it too)
    assert policy_changes(recorded, current) == []


# ------------------------------------------------------------------------------------------------
# output paths (issue 13, class 3): the run directory its own, not an input, out of git; nothing created


@pytest.mark.parametrize("site,key,words", [
    ({"NARWHAL_RUNS_DIR": "config"}, "NARWHAL_RUNS_DIR", "which is also the output directory (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_RUNS_DIR": "docs/runs"}, "NARWHAL_RUNS_DIR",
     "a prepared run (%s/docs/runs/<run-id>) would be docs/runs/run-0 inside the checkout, which is not one of the "
     "git-ignored site paths"),
    ({"NARWHAL_RUNS_DIR": "config/engine-launch.local.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the run directory (NARWHAL_RUNS_DIR)"),
    ({"NARWHAL_API_KEY_FILE": "config/fleet.json"}, "NARWHAL_FLEET", "which is also the engine API key file"),
    ({"NARWHAL_API_KEY_FILE": "runs/engine-api.key"}, "NARWHAL_API_KEY_FILE", "inside the run directory"),
    ({"NARWHAL_API_KEY_FILE": "engine-api.key"}, "NARWHAL_API_KEY_FILE",
     "the engine API key file would be engine-api.key inside the checkout"),
    ({"NARWHAL_FLEET": "/x/.env"}, "NARWHAL_FLEET", "which is also the site inputs (.env)"),
])
@pytest.mark.parametrize("stage", ["validate", "write"])
def test_prepare_refuses_paths_that_collide_or_go_public(root, run_module, site, key, words, stage):
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    status, result = run_module(prep_args(root, stage, good_hosts(), site=site))
    assert status == "fail" and result["input"] == key, result
    _refused(root, result, words % root if "%s" in words else words)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


# hostile files and hanging tools (issue 13, classes 5 and 6)


def test_prepare_key_file_that_is_a_fifo_is_refused_not_waited_on(root, run_module):
    key = root / "config" / "engine-api.key"
    key.unlink()
    os.mkfifo(key, 0o600)
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail" and result["input"] == "NARWHAL_API_KEY_FILE"
    _refused(root, result, "is a FIFO, not a regular file")


def test_prepare_git_that_hangs_is_named(root, run_module, monkeypatch, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "git").write_text("#!/bin/sh\n/bin/sleep 30\n")
    (bindir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr(_prepare_run_step, "GIT_TIMEOUT", 1)
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "fail"
    # the first git call is the check that the outputs are git-ignored
    _refused(root, result, "'git rev-parse --is-inside-work-tree' in %s on host " % root, "did not answer within 1 s "
             "(timed out, killed) while checking that the outputs are git-ignored; git hangs on an unreachable "
             "network file system or a held repository lock")


# ------------------------------------------------------------------------------------------------
# relaunch: a new run from an earlier run's records and launcher snapshot (from_run)


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def earlier(root, run_module):
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "exit", result
    return result


def test_relaunch_makes_a_new_run_from_the_earlier_recipe(root, run_module, earlier):
    old_dir = root / "runs" / earlier["run_id"]
    # since then: .env's launch policy changed (the current records are refused), the collection's launcher changed,
    # and the current launch config is gone -- none of it matters to a relaunch
    assert run_module(prep_args(root, site={"NARWHAL_KV_CACHE_DTYPE": "fp8"}))[0] == "fail"
    main = root / "collection" / "roles" / "install" / "files" / "launcher" / "__main__.py"
    main.write_text(main.read_text() + "# v2\n")
    (root / "config" / "engine-launch.local.json").unlink()
    args = dict(prep_args(root, "write", good_hosts(), site={"NARWHAL_KV_CACHE_DTYPE": "fp8"}),
                from_run=earlier["run_id"])
    status, result = run_module(args)
    assert status == "exit", result
    assert result["changed"] is True and result["run_id"] != earlier["run_id"]
    new_dir = root / "runs" / result["run_id"]
    assert result["run_dir"] == str(new_dir)
    # the same return shape as a normal prepare, so the install role works unchanged
    assert set(result) == set(earlier)
    assert set(result["derived"]["engine-1"]) == set(earlier["derived"]["engine-1"])
    assert result["derived"]["engine-1"]["paths"]["run_dir"] == "%s/runs/%s" % (CHECKOUT, result["run_id"])
    assert result["derived"]["engine-1"]["role_env"]["NARWHAL_RUN_ID"] == result["run_id"]
    # the launcher snapshot byte for byte, the records unchanged
    assert (new_dir / "launch_engine.pyz").read_bytes() == (old_dir / "launch_engine.pyz").read_bytes()
    assert result["launcher_sha256"] == earlier["launcher_sha256"]
    assert result["launcher_sha256"] == hashlib.sha256((new_dir / "launch_engine.pyz").read_bytes()).hexdigest()
    assert result["records"] == earlier["records"]
    manifest = json.loads((new_dir / "manifest.json").read_text())
    assert validation_errors(manifest, MANIFEST_SCHEMA) == []
    assert manifest["relaunched_from"] == earlier["run_id"] and manifest["run_id"] == result["run_id"]
    assert manifest["inputs"] == earlier["manifest"]["inputs"]
    assert manifest["launcher"] == earlier["manifest"]["launcher"]
    for e in ("engine-1", "engine-2"):
        assert (new_dir / e / ("engine-launch.%s.json" % e)).read_text() == \
            (old_dir / e / ("engine-launch.%s.json" % e)).read_text()
        assert "NARWHAL_RUN_ID=%s\n" % result["run_id"] in (new_dir / e / ("%s.env" % e)).read_text()
    assert (old_dir / "manifest.json").read_text() == json.dumps(earlier["manifest"], indent=2) + "\n"
    # again: the same run, nothing changes
    status, again = run_module(args)
    assert status == "exit" and again["changed"] is False and again["run_id"] == result["run_id"]


def test_relaunch_of_some_engines_of_the_run(root, run_module, earlier):
    status, result = run_module(dict(prep_args(root, engines=("engine-2",)), from_run=earlier["run_id"]))
    assert status == "exit", result
    assert set(result["records"]) == {"engine-2"} and result["launcher_sha256"] == earlier["launcher_sha256"]


def _tamper_record(run_dir, engine, change, fix_digest):
    path = run_dir / engine / ("engine-launch.%s.json" % engine)
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record, indent=2) + "\n")
    if fix_digest:  # a consistent edit of record and manifest: the digests pass, the gates must still refuse
        manifest = json.loads((run_dir / "manifest.json").read_text())
        manifest["engines"][engine]["record_sha256"] = hashlib.sha256(
            json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


@pytest.mark.parametrize("case, change, words", [
    ("bad id", None, ["'../run-0' is not a run ID"]),
    ("absent", None, ["there is no run run-000000000000", "is not a directory (NARWHAL_RUNS_DIR)"]),
    ("no manifest", lambda d: (d / "manifest.json").unlink(), ["has no manifest.json"]),
    ("launcher", lambda d: (d / "launch_engine.pyz").write_bytes(b"PK tampered"),
     ["the launcher snapshot of run", "does not match the sha256 its manifest records"]),
    ("no launcher", lambda d: (d / "launch_engine.pyz").unlink(), ["has no launcher snapshot launch_engine.pyz"]),
    ("record", lambda d: _tamper_record(d, "engine-2", lambda r: r["runtime"].update(block_size=32), False),
     ["the record copy of engine-2 in run", "does not match the sha256 its manifest records"]),
    ("no record", lambda d: (d / "engine-1" / "engine-launch.engine-1.json").unlink(),
     ["has no record copy for engine-1 (engine-1/engine-launch.engine-1.json)"]),
    ("role env", lambda d: (d / "engine-1" / "engine-1.env").write_text(
        (d / "engine-1" / "engine-1.env").read_text().replace("NARWHAL_HTTP_PORT=8000", "NARWHAL_HTTP_PORT=9000")),
     ["the role environment of engine-1 in run", "differs from its manifest (NARWHAL_HTTP_PORT)"]),
    ("engine", None, ["did not prepare engine-3 (it has engine-1, engine-2); limit the play to its engines"]),
    ("schema", lambda d: _tamper_record(d, "engine-1", lambda r: r["transfer"].update(transport="tcp"), True),
     ["fail the launch-record schema"]),
])
def test_relaunch_refuses_a_broken_run_naming_it(root, run_module, earlier, case, change, words):
    run_dir = root / "runs" / earlier["run_id"]
    from_run = {"bad id": "../run-0", "absent": "run-000000000000"}.get(case, earlier["run_id"])
    if change:
        change(run_dir)
    engines = ("engine-1", "engine-2", "engine-3") if case == "engine" else ("engine-1", "engine-2")
    before = tree(root)
    status, result = run_module(dict(prep_args(root, "write", good_hosts(), engines=engines), from_run=from_run))
    assert status == "fail" and result["input"] == "from_run", result
    assert result["msg"].startswith("prepare refused, no run was created: from_run: ")
    for w in words:
        assert w in result["msg"]
    if case not in ("bad id", "absent"):
        assert "run %s (%s)" % (earlier["run_id"], run_dir) in result["msg"]
    assert tree(root) == before


def test_relaunch_applies_the_pd_gate(root, run_module, earlier):
    run_dir = root / "runs" / earlier["run_id"]
    _tamper_record(run_dir, "engine-2", lambda r: r["runtime"].update(kv_cache_dtype="fp8"), True)
    before = tree(root)
    status, result = run_module(dict(prep_args(root, "write", good_hosts()), from_run=earlier["run_id"]))
    assert status == "fail" and result["input"] == "NARWHAL_KV_CACHE_DTYPE"
    assert "would fail vLLM's NIXL handshake: KV cache dtype differs" in result["msg"]
    assert tree(root) == before


def test_relaunch_still_checks_the_host_and_the_key(root, run_module, earlier):
    hosts = good_hosts()
    hosts["engine-2"]["image_id"] = "sha256:" + "1" * 64
    status, result = run_module(dict(prep_args(root, "write", hosts), from_run=earlier["run_id"]))
    assert status == "fail" and result["input"] == "engine-2" and "no longer matches" in result["msg"]
    (root / "config" / "engine-api.key").chmod(0o644)
    status, result = run_module(dict(prep_args(root, "write", good_hosts()), from_run=earlier["run_id"]))
    assert status == "fail" and result["input"] == "NARWHAL_API_KEY_FILE"


# check mode on new inputs creates nothing, anywhere under the checkout (no run, no lock, no runs directory)


@pytest.mark.parametrize("stage", ["validate", "write"])
def test_check_mode_on_new_inputs_creates_nothing(root, run_module, stage):
    before = tree(root)
    status, result = run_module(prep_args(root, stage, good_hosts(), check=True))
    assert status == "exit", result
    assert tree(root) == before and not (root / "runs").exists()


@pytest.mark.parametrize("stage", ["validate", "write"])
def test_check_mode_relaunch_creates_nothing(root, run_module, earlier, stage):
    before = tree(root)
    status, result = run_module(dict(prep_args(root, stage, good_hosts(), check=True), from_run=earlier["run_id"]))
    assert status == "exit", result
    assert result["run_id"] != earlier["run_id"] and tree(root) == before
    if stage == "write":
        assert result["changed"] is True and result["manifest"]["relaunched_from"] == earlier["run_id"]


# ------------------------------------------------------------------ which narwhal.deploy prepared the run

def test_collection_identity_of_an_installed_collection(tmp_path):
    """ansible-galaxy's MANIFEST.json: its version, and the sha256 of FILES.json as the build."""
    (tmp_path / "MANIFEST.json").write_text(json.dumps({
        "collection_info": {"namespace": "narwhal", "name": "deploy", "version": "0.1.0"},
        "file_manifest_file": {"name": "FILES.json", "ftype": "file", "chksum_type": "sha256",
                               "chksum_sha256": "ab" * 32, "format": 1}, "format": 1}))
    (tmp_path / "galaxy.yml").write_text("namespace: other\nname: thing\nversion: 9.9.9\n")  # MANIFEST.json wins
    assert _prepare_run_step.collection_identity(str(tmp_path)) == {
        "name": "narwhal.deploy", "version": "0.1.0", "build": "FILES.json sha256:" + "ab" * 32}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_collection_identity_of_a_checkout(tmp_path):
    shutil.copy(REPO / "galaxy.yml", tmp_path / "galaxy.yml")
    assert _prepare_run_step.collection_identity(str(tmp_path)) == {
        "name": "narwhal.deploy", "version": "0.1.0", "build": "source tree (no MANIFEST.json, not a git checkout)"}
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "galaxy.yml"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert _prepare_run_step.collection_identity(str(tmp_path))["build"] == "git %s" % head
    (tmp_path / "galaxy.yml").write_text((tmp_path / "galaxy.yml").read_text() + "# changed\n")
    assert _prepare_run_step.collection_identity(str(tmp_path))["build"] == "git %s-dirty" % head


def test_collection_identity_refuses_a_collection_without_a_version(tmp_path):
    with pytest.raises(InputError) as err:
        _prepare_run_step.collection_identity(str(tmp_path))
    assert err.value.key == "collection" and "cannot read the version of the collection at %s" % tmp_path \
        in str(err.value)


def test_the_run_records_the_collection_and_keeps_the_application_revision(root, run_module, pd_launch):
    """A project made by init has no git: the application revision stays null/unknown as before, and the run now
    names the collection's version and build (manifest, role environment, hence the launcher's deployment.json)."""
    status, result = run_module(prep_args(root, "write", good_hosts()))
    assert status == "exit", result
    manifest = json.loads((root / "runs" / result["run_id"] / "manifest.json").read_text())
    assert manifest["application"] == {"revision": None, "dirty": None}
    assert manifest["collection"] == {"name": "narwhal.deploy", "version": "0.1.0",
                                      "build": "source tree (no MANIFEST.json, not a git checkout)"}
    for engine in ("engine-1", "engine-2"):
        role_env = manifest["engines"][engine]["role_env"]
        assert role_env["NARWHAL_APP_REVISION"] == "unknown"
        assert role_env["NARWHAL_COLLECTION"] == (
            "narwhal.deploy 0.1.0 (source tree (no MANIFEST.json, not a git checkout))")


def test_prepare_in_check_mode_takes_certificates_tls_material_would_make(root, run_module):
    # a first deploy in check mode: tls_material (check mode) reports the certificates it would write, none exist yet
    tls = _tls(root)
    for entry in tls["hosts"].values():
        os.unlink(entry["cert"])
    write_policy(root, site={"NARWHAL_TLS": "site"})
    status, result = run_module(dict(prep_args(root, "write", good_hosts(), check=True, site={"NARWHAL_TLS": "site"}),
                                     tls=tls))
    assert status == "exit", result
    assert result["install_sources"]["engine-2"]["0"]["tls"]["cert"] == tls["hosts"]["engine-2"]["cert"]
    assert not (root / "runs").exists() or not any((root / "runs").iterdir())
    # outside check mode the same argument is refused: the certificate is not there
    status, result = run_module(dict(prep_args(root, "write", good_hosts(), site={"NARWHAL_TLS": "site"}), tls=tls))
    assert status == "fail" and result["input"] == "tls" and "not a file on the controller" in result["msg"]
