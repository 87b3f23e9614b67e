# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""prepare's checks (plugins/module_utils/_prepare/checks.py): the P/D compatibility gate, the shared-host gate,
stale-record detection, derivation of each engine's environment / vllm_args / role environment, the run ID and the
documents check. prepare_run end to end: tests/unit/plugins/module_utils/_prepare/test_run.py."""

from __future__ import annotations

import copy
import re

import pytest
from test_support.prepare import CHECKOUT, SITE, files_map, fleet_for, inspection

from ansible_collections.narwhal.deploy.plugins.module_utils._common import errors as _errors
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import manifest_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import (
    StaleRecordsError,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import role_env as _role_env
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import (
    check_documents,
    check_pair_manifests,
    check_source_manifest,
    compatibility,
    derive,
    render_role_env,
    run_id,
    shared_hosts,
    stale,
)

# ------------------------------------------------------------------------------------------------
# compatibility (the gate itself: tests/unit/plugins/module_utils/_prepare/test_gate.py)


def test_the_example_pair_is_refused_and_its_compatible_variant_passes(records, pd_launch):
    with pytest.raises(InputError) as err:
        compatibility(records)
    assert err.value.key == "NARWHAL_EXTRA_ARGS" and "attention backend differs" in str(err.value)
    assert compatibility(pd_launch["engines"]) is None


# ------------------------------------------------------------------------------------------------
# shared hosts


@pytest.fixture
def cohosted(records):
    records["engine-2"]["node"]["host_id"] = records["engine-1"]["node"]["host_id"]
    records["engine-1"]["gpu_host_indices"] = [0, 1, 2, 3]
    records["engine-2"]["gpu_host_indices"] = [4, 5]
    records["engine-2"]["node"].update(engine_port=8001, attest_port=8011, side_channel_port=5610,
                                       side_channel_ports=[5610, 5611])
    shared_hosts(records)  # the baseline of every co-hosted test is valid
    return records


def test_different_hosts_may_reuse_gpus_and_ports(records):
    assert records["engine-1"]["node"]["host_id"] != records["engine-2"]["node"]["host_id"]
    assert records["engine-1"]["node"]["engine_port"] == records["engine-2"]["node"]["engine_port"]
    shared_hosts(records)


def test_shared_host_overlapping_gpus_is_refused(cohosted):
    cohosted["engine-2"]["gpu_host_indices"] = [3, 4]
    with pytest.raises(InputError) as err:
        shared_hosts(cohosted)
    msg = str(err.value)
    assert "engine-1" in msg and "engine-2" in msg
    assert "GPU 3" in msg


@pytest.mark.parametrize("node2", [
    {"engine_port": 8000},
    {"attest_port": 8010},
    {"side_channel_port": 5602, "side_channel_ports": [5602, 5602]},
    {"engine_port": 8010},  # engine port of one = attestation port of the other
    {"attest_port": 8000},
    {"engine_port": 5601},  # inside the other's side-channel range
])
def test_shared_host_port_overlap_is_refused(cohosted, node2):
    cohosted["engine-1"]["node"].update(side_channel_port=5600, side_channel_ports=[5600, 5603])
    shared_hosts(cohosted)
    cohosted["engine-2"]["node"].update(node2)
    with pytest.raises(InputError) as err:
        shared_hosts(cohosted)
    msg = str(err.value)
    assert "engine-1" in msg and "engine-2" in msg and "overlap" in msg
    # the key of the port that moves: an engine's own, or the side-channel base every host shares
    assert err.value.key.startswith("NARWHAL_NODE_<n>_") or err.value.key == "NARWHAL_SIDE_CHANNEL_PORT"
    assert err.value.key != "NARWHAL_NODE_<n>_SIDE_CHANNEL_PORT"  # no such key


def test_side_channel_ranges_adjacent_do_not_overlap(cohosted):
    cohosted["engine-1"]["node"].update(side_channel_port=5600, side_channel_ports=[5600, 5603])
    cohosted["engine-2"]["node"].update(side_channel_port=5604, side_channel_ports=[5604, 5607])
    shared_hosts(cohosted)


@pytest.mark.parametrize("node", [
    {"side_channel_port": 8000, "side_channel_ports": [8000, 8000]},
    {"side_channel_port": 8010, "side_channel_ports": [8010, 8010]},
])
def test_one_engines_own_ports_are_discoverys_check_not_prepares(records, node):
    """Each port rule is checked once, where both ports are first known: one engine's side channel on its own HTTP
    or attestation port is refused by discovery (_discover/fleet.py::check_own_ports, tests/unit/plugins/
    module_utils/_discover/test_records.py); prepare's shared-host check compares engines of one host."""
    records["engine-1"]["node"].update(node)
    shared_hosts(records)


# ------------------------------------------------------------------------------------------------
# stale


@pytest.mark.parametrize("engine", ["engine-1", "engine-2"])
def test_matching_inspection_passes(records, engine):
    stale(records[engine], inspection(records[engine]))


def _gpu(current, index):
    return next(g for g in current["gpus"]["gpus"] if g["index"] == index)


@pytest.mark.parametrize("engine, change, detail", [
    ("engine-1", lambda c: c["gpus"]["gpus"].pop(), "GPU 7 is gone"),
    ("engine-2", lambda c: c["gpus"]["gpus"].pop(0), "GPU 0 is gone"),
    ("engine-1", lambda c: _gpu(c, 2).update(name="Tesla V100-SXM2-16GB"), "GPU 2 is now a Tesla V100-SXM2-16GB"),
    ("engine-2", lambda c: _gpu(c, 1).update(name="MI210"), "GPU 1 is now a MI210"),
    ("engine-1", lambda c: _gpu(c, 5).update(uuid="GPU-00000000-0000-0000-0000-000000000000"), "UUIDs changed"),
    ("engine-1", lambda c: c["gpus"].update(vendor="amd"), "the host now reports amd"),
    ("engine-2", lambda c: c.update(gpus={}), "the host now reports None"),
    ("engine-2", lambda c: c.update(missing_devices=["/dev/infiniband/uverbs4"]), "/dev/infiniband/uverbs4"),
    ("engine-1", lambda c: c["interface"].update(addresses=[{"address": "172.31.241.99"}]),
     "eth1 no longer carries 172.31.241.11 (it has 172.31.241.99)"),
    ("engine-2", lambda c: c["interface"].update(addresses=[]), "no longer carries 172.31.241.12 (it has none)"),
    ("engine-1", lambda c: c.update(image_id="sha256:" + "0" * 64), "is sha256:" + "0" * 64 + " on the host"),
    ("engine-2", lambda c: c.update(image_id=None), "is absent on the host"),
])
def test_stale_record_is_refused(records, engine, change, detail):
    current = inspection(records[engine])
    change(current)
    with pytest.raises(InputError) as err:
        stale(records[engine], current)
    assert err.value.key == engine
    assert "no longer matches" in str(err.value)
    assert detail in str(err.value)


@pytest.mark.parametrize("recorded, now, detail", [
    (None, "sha256:" + "1" * 64, "holds the manifest sha256:" + "1" * 64 + " (.narwhal-manifest.json), recorded none"),
    ("sha256:" + "2" * 64, None, "holds the manifest none (.narwhal-manifest.json), recorded sha256:" + "2" * 64),
    ("sha256:" + "2" * 64, "sha256:" + "1" * 64, "recorded sha256:" + "2" * 64),
])
def test_a_checkpoint_whose_manifest_changed_since_discovery_is_stale(records, recorded, now, detail):
    record = copy.deepcopy(records["engine-1"])
    if recorded:
        record["runtime"]["model_manifest"] = recorded
    current = inspection(record)
    stale(record, current)  # as discovered
    current["model_manifest"] = now
    with pytest.raises(InputError) as err:
        stale(record, current)
    assert err.value.key == "engine-1"
    assert "the checkpoint /srv/models/tiny-llama " in str(err.value) and detail in str(err.value)
    assert "rerun discovery" in str(err.value)


def test_empty_inspection_is_stale(records):
    with pytest.raises(InputError, match="no longer matches"):
        stale(records["engine-1"], {})


# ------------------------------------------------------------------------------------------------
# derive


def test_derive_nvidia_tcp(records):
    r = records["engine-1"]
    d = derive(r, CHECKOUT, "run-0123456789ab")
    managed = {
        "CUDA_VISIBLE_DEVICES": ",".join(r["gpu_ids"]),
        "UCX_NET_DEVICES": "eth1",
        "UCX_TLS": "tcp,cuda_copy,cuda_ipc,sm,self",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "172.31.241.11",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
        "VLLM_API_KEY": "",  # vLLM's own check off: no key in the plan, the guard reads the key file
        "NARWHAL_GUARD_KEY_FILE": "/narwhal/secrets/engine-api.key",
        "PYTHONPATH": "/narwhal/guard",
    }
    # the container's whole environment: the record's image env plus what the launcher manages
    assert d["environment"] == dict(r["runtime"]["environment"], **managed)
    assert d["environment"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e,GPU-bbf7")
    assert d["vllm_args"][-6:] == ["--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--block-size", "16"]
    assert d["vllm_args"][d["vllm_args"].index("--tensor-parallel-size") + 1] == "8"


def test_derive_amd_rdma(records):
    d = derive(records["engine-2"], CHECKOUT, "run-0123456789ab")
    env = d["environment"]
    assert env["ROCR_VISIBLE_DEVICES"] == "0,1"
    assert env["UCX_NET_DEVICES"] == "mlx5_6:1,mlx5_7:1"
    assert env["UCX_TLS"] == "rc,ud,rocm_copy,rocm_ipc,sm,self"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "172.31.241.12"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert d["vllm_args"][d["vllm_args"].index("--tensor-parallel-size") + 1] == "2"
    assert d["vllm_args"][-4:] == ["--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]


def test_derive_nvidia_rdma_adds_cuda_copy(records):
    r = records["engine-1"]
    r["transfer"].update(transport="ucx_rdma", net_devices=["mlx5_0:1"], devices=["/dev/infiniband/uverbs0"],
                         ucx_tls=["rc", "ud", "cuda_copy", "cuda_ipc", "sm", "self"])
    assert derive(r, CHECKOUT, "run-x")["environment"]["UCX_TLS"] == "rc,ud,cuda_copy,cuda_ipc,sm,self"
    r["transfer"]["ucx_tls"] = ["rc", "ud", "sm", "self"]  # hand-broken: GPU-memory KV without cuda_copy
    with pytest.raises(InputError, match="lacks cuda_copy: the KV cache is in GPU memory"):
        derive(r, CHECKOUT, "run-x")


def test_derive_role_env_and_paths(records):
    d = derive(records["engine-1"], CHECKOUT, "run-0123456789ab")
    assert d["paths"] == {
        "record": "/srv/narwhal/config/engine-launch.engine-1.json",
        "role_env": "/srv/narwhal/config/engine-1.env",
        "launcher": "/srv/narwhal/bin/launch_engine.pyz",
        "secrets_dir": "/srv/narwhal/secrets",
        "api_key": "/srv/narwhal/secrets/engine-api.key",
        "former_api_key": "/srv/narwhal/config/engine-api.key",
        "run_dir": "/srv/narwhal/runs/run-0123456789ab",
        "guard_dir": "/srv/narwhal/guard",
        "guard": "/srv/narwhal/guard/narwhal_guard.py",
        "tls_dir": "/srv/narwhal/tls/engine-1",
        "tls_cert": "/srv/narwhal/tls/engine-1/server.crt",
        "tls_key": "/srv/narwhal/tls/engine-1/server.key",
        "tls_ca": "/srv/narwhal/tls/engine-1/ca.crt",
    }
    assert d["role_env"] == {
        "NARWHAL_ENGINE": "engine-1",
        "NARWHAL_RECORD": "/srv/narwhal/config/engine-launch.engine-1.json",
        "NARWHAL_MODEL_MOUNT": "/models/tiny-llama",
        "NARWHAL_SERVED_MODEL_NAME": "tiny-llama",
        "NARWHAL_BIND_FAMILY": "ipv4",
        "NARWHAL_HTTP_PORT": "8000",
        "NARWHAL_ADVERTISED_ADDRESS": "172.31.241.11",
        "NARWHAL_SIDE_CHANNEL_PORT": "5600",
        "NARWHAL_FABRIC_INTERFACE": "eth1",
        "NARWHAL_API_KEY_FILE": "/srv/narwhal/secrets/engine-api.key",
        "NARWHAL_RUN_ID": "run-0123456789ab",
        "NARWHAL_RUN_DIR": "/srv/narwhal/runs/run-0123456789ab",
        "NARWHAL_BIND_ADDRESS": "172.31.241.11",
        "NARWHAL_TLS_DIR": "",
        "NARWHAL_TLS_CERT_SHA256": "",
        "NARWHAL_GUARD_DIR": "/srv/narwhal/guard",
        "NARWHAL_GUARD_SHA256": "",
    }
    text = render_role_env(d["role_env"])
    lines = text.splitlines()
    assert lines[0].startswith("# Role environment of engine-1")
    assert lines[1:] == sorted(lines[1:])
    assert "NARWHAL_HTTP_PORT=8000" in lines and text.endswith("\n")


def test_derive_with_a_bind_tls_and_the_guard(records):
    """Who gets in: NARWHAL_ENGINE_BIND, the engine's certificate (its entry of the tls_material result) and the
    guard's digest reach the role environment and the container; TLS off or absent leaves no TLS in either."""
    tls = {"cert": "/p/config/tls/hosts/engine-1.crt", "key": "/p/config/tls/hosts/engine-1.key",
           "sha256": "c" * 64, "not_after": "2027-01-01T00:00:00Z", "days_left": 300, "names": ["172.31.241.11"]}
    d = derive(records["engine-1"], CHECKOUT, "run-x", {"bind": "0.0.0.0", "tls": tls, "guard_sha256": "a" * 64})
    env = d["role_env"]
    assert (env["NARWHAL_BIND_ADDRESS"], env["NARWHAL_TLS_DIR"], env["NARWHAL_TLS_CERT_SHA256"],
            env["NARWHAL_GUARD_DIR"], env["NARWHAL_GUARD_SHA256"]) == (
        "0.0.0.0", "/srv/narwhal/tls/engine-1", "c" * 64, "/srv/narwhal/guard", "a" * 64)
    args = d["vllm_args"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--ssl-certfile") + 1] == "/narwhal/tls/server.crt"
    assert d["container"]["labels"] == {"org.narwhal.engine": "engine-1", "org.narwhal.guard-sha256": "a" * 64,
                                        "org.narwhal.tls-cert-sha256": "c" * 64}
    off = derive(records["engine-1"], CHECKOUT, "run-x", {"tls": None, "guard_sha256": "a" * 64})
    assert off["role_env"]["NARWHAL_TLS_DIR"] == "" and "--ssl-certfile" not in off["vllm_args"]
    assert off["plan_hash"] != d["plan_hash"]
    with pytest.raises(InputError, match="NARWHAL_BIND_ADDRESS='eth0' is not an IP address"):
        derive(records["engine-1"], CHECKOUT, "run-x", {"bind": "eth0"})


def test_derive_model_mount_flattens_slashes(records):
    records["engine-1"]["runtime"]["served_model_name"] = "meta-llama/Llama-3.1-8B"
    d = derive(records["engine-1"], CHECKOUT, "run-x")
    assert d["role_env"]["NARWHAL_MODEL_MOUNT"] == "/models/meta-llama_Llama-3.1-8B"


def test_derive_merges_derived_environment_and_extra_args(records):
    rt = records["engine-1"]["runtime"]
    rt["derived_environment"] = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    rt["extra_args"] = ["--max-model-len", "4096"]
    d = derive(records["engine-1"], CHECKOUT, "run-x")
    assert d["environment"]["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert d["environment"]["UCX_TLS"] == "tcp,cuda_copy,cuda_ipc,sm,self"
    assert d["vllm_args"][d["vllm_args"].index("--tensor-parallel-size") + 1] == "8"
    assert d["vllm_args"][-2:] == ["--max-model-len", "4096"]


def test_derive_refuses_gpus_without_visibility_env(records):
    """Prepare once skipped a missing visibility variable while the launcher refused it: one planner now."""
    r = records["engine-1"]
    r["gpu_visibility_env"] = None
    with pytest.raises(InputError, match="gpu_visibility_env must be str"):
        derive(r, CHECKOUT, "run-x")
    r["gpu_visibility_env"] = "ROCR_VISIBLE_DEVICES"
    with pytest.raises(InputError, match="is not the visibility variable of nvidia GPUs"):
        derive(r, CHECKOUT, "run-x")


@pytest.mark.parametrize("device", ["${OTHER}", "x${NARWHAL_FABRIC_INTERFACE}", "${NARWHAL_FABRIC_INTERFACE}x"])
def test_derive_unresolvable_net_device_is_refused(records, device):
    records["engine-1"]["transfer"]["net_devices"] = [device]
    with pytest.raises(InputError) as err:
        derive(records["engine-1"], CHECKOUT, "run-x")
    assert err.value.key == "engine-1"
    assert "transfer.net_devices[0]" in str(err.value)


@pytest.mark.parametrize("sep", ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\x00"])
def test_role_env_cannot_be_injected(records, sep):
    """Class 1: prepare writes no value that adds a line, and the launcher's reader (the same planner) splits at
    \n only and refuses a line with any other line boundary or control character."""

    d = derive(records["engine-1"], CHECKOUT, "run-x")
    with pytest.raises(InputError, match="must be one line of text"):
        render_role_env(dict(d["role_env"], NARWHAL_SERVED_MODEL_NAME="x%sNARWHAL_APP_REVISION=evil" % sep))
    if sep == "\n":
        return  # a real line: the reader cannot tell it from prepare's own (render_role_env refused it above)
    line = "NARWHAL_SERVED_MODEL_NAME=tiny-llama"
    text = render_role_env(d["role_env"]).replace(line, line + sep + "NARWHAL_APP_REVISION=evil")
    with pytest.raises(_errors.PlanError) as err:
        _role_env.parse_role_env(text, "/opt/narwhal/config/engine-1.env")
    assert "/opt/narwhal/config/engine-1.env line" in str(err.value)
    assert "control character" in str(err.value) or "is not KEY=VALUE" in str(err.value)


def test_role_env_reader_takes_what_prepare_writes(records):

    d = derive(records["engine-1"], CHECKOUT, "run-x")
    assert _role_env.parse_role_env(render_role_env(d["role_env"]), "x") == d["role_env"]


# ------------------------------------------------------------------------------------------------
# run ID


def _rid(records, engines=("engine-1", "engine-2"), launcher="a" * 64, inputs=None):
    engines = list(engines)
    derived = dict((e, derive(records[e], CHECKOUT, "run-pending")) for e in engines)
    return run_id(engines, records, derived, launcher, inputs or {"fleet_sha256": "f"})


def test_run_id_is_deterministic(records):
    first = _rid(records)
    assert re.fullmatch(r"run-[0-9a-f]{12}", first)
    assert _rid(copy.deepcopy(records)) == first
    assert _rid(records, engines=("engine-2", "engine-1")) == first  # order of the play does not matter


def test_run_id_changes_with_its_inputs(records):
    base = _rid(records)
    tls = {"cert": "/c", "key": "/k", "sha256": "c" * 64}
    derived = dict((e, derive(records[e], CHECKOUT, "run-pending", {"tls": tls})) for e in records)
    with_tls = run_id(list(records), records, derived, "a" * 64, {"fleet_sha256": "f"})
    derived["engine-1"] = derive(records["engine-1"], CHECKOUT, "run-pending", {"tls": dict(tls, sha256="d" * 64)})
    assert len({base, with_tls, run_id(list(records), records, derived, "a" * 64, {"fleet_sha256": "f"})}) == 3
    changed = copy.deepcopy(records)
    changed["engine-2"]["runtime"]["extra_args"] = []
    assert _rid(changed) != base
    changed = copy.deepcopy(records)
    changed["engine-1"]["sources"]["allocation"] = "something else"  # not derived, still in the record
    assert _rid(changed) != base
    assert _rid(records, launcher="b" * 64) != base
    assert _rid(records, engines=("engine-1",)) != base
    assert _rid(records, inputs={"fleet_sha256": "g"}) != base


# ------------------------------------------------------------------------------------------------
# check_documents


def test_check_documents_accepts_the_example(launch):
    check_documents(fleet_for(launch["engines"]), launch, SITE)


def test_check_documents_duplicate_iid(launch):
    fleet = fleet_for(launch["engines"])
    fleet[1]["iid"] = "n1"
    with pytest.raises(InputError) as err:
        check_documents(fleet, launch, SITE)
    assert err.value.key == "NARWHAL_FLEET"
    assert "duplicate iid" in str(err.value) and "config/fleet.json" in str(err.value)


def test_check_documents_fleet_schema(launch):
    fleet = fleet_for(launch["engines"])
    del fleet[0]["url"]
    with pytest.raises(InputError) as err:
        check_documents(fleet, launch, SITE)
    assert err.value.key == "NARWHAL_FLEET" and "fleet schema" in str(err.value)


@pytest.mark.parametrize("edit,shown", [
    (lambda r: r["runtime"].update(block_size=-16), "engines/engine-2/runtime/block_size: -16 is less than"),
    (lambda r: r.update(gpu_ids=["0,1", "1"]), "engines/engine-2/gpu_ids/0: '0,1' does not match"),
    (lambda r: r.update(gpu_ids=["0", "3"]), "engines/engine-2/gpu_ids: ['0', '3']: container-relative indices"),
    (lambda r: r["runtime"].update(block_size=64), "engines/engine-2/runtime.block_size: 64 is not the block size "
                                                   "the cache plan was made for"),
])
def test_check_documents_runs_the_launchers_record_check(launch, edit, shown):
    """Prepare refuses a hand-edited launch config with the check the launcher runs (_outputs/schemas.py)."""
    edit(launch["engines"]["engine-2"])
    with pytest.raises(InputError) as err:
        check_documents(fleet_for(launch["engines"]), launch, SITE)
    assert err.value.key == "NARWHAL_LAUNCH_CONFIG" and shown in str(err.value), str(err.value)


def test_check_documents_bad_transport(launch):
    launch["engines"]["engine-1"]["transfer"]["transport"] = "tcp"
    with pytest.raises(InputError) as err:
        check_documents(fleet_for(launch["engines"]), launch, SITE)
    assert err.value.key == "NARWHAL_LAUNCH_CONFIG"
    assert "config/engine-launch.local.json" in str(err.value)
    assert "transport" in str(err.value)


def test_a_record_value_that_would_add_a_role_env_line_is_refused(records):
    """The role env is a line-based file: a record value with a line break is refused by name, no traceback."""
    records["engine-1"]["node"]["fabric_interface"] = "eth1\nNARWHAL_RUN_DIR=/tmp/evil"
    with pytest.raises(InputError, match="must be one line of text"):
        derive(records["engine-1"], CHECKOUT, "run-x")


def test_stale_record_refusal_is_redacted():

    err = StaleRecordsError("NARWHAL_EXTRA_ARGS",
                            "NARWHAL_EXTRA_ARGS changed (records: --hf-token hf_abcdefghijklmnop)")
    assert "hf_abcdefghijklmnop" not in str(err) and "<redacted>" in str(err)


# ------------------------------------------------------------------------------------------------
# the checkpoint's manifests (runtime.model_manifest)

SHARDS = files_map(("model.safetensors", b"weights"), ("tokenizer.json", b"{}"))
OTHER = files_map(("model.safetensors", b"weights, retrained"), ("tokenizer.json", b"{}"))


def _with_digests(records, one, two):
    records = copy.deepcopy(records)
    for engine, digest in (("engine-1", one), ("engine-2", two)):
        if digest:
            records[engine]["runtime"]["model_manifest"] = digest
    return records


@pytest.mark.parametrize("one, two", [(None, None), (manifest_digest(SHARDS), manifest_digest(SHARDS))])
def test_a_pair_of_one_checkpoint_passes(records, one, two):
    check_pair_manifests(_with_digests(records, one, two))
    check_pair_manifests(_with_digests(records, one, two), {"engine-1": SHARDS, "engine-2": SHARDS}.get)


def test_a_pair_of_different_weights_is_refused_naming_engines_digests_and_files(records):
    a, b = manifest_digest(SHARDS), manifest_digest(OTHER)
    pair = _with_digests(records, a, b)
    with pytest.raises(InputError) as err:
        check_pair_manifests(pair, {"engine-1": SHARDS, "engine-2": OTHER}.get)
    assert err.value.key == "NARWHAL_MODEL_PATH"
    assert str(err.value) == (
        "NARWHAL_MODEL_PATH: engine-1 (prefill) and engine-2 (decode) serve different weights: runtime.model_manifest "
        "is %s on engine-1 and %s on engine-2 (the files of engine-2 that differ from engine-1's: model.safetensors "
        "(18 bytes, expected 7)); a prefill/decode pair serves one checkpoint: run the deliver stage, then discovery: "
        "ansible-playbook narwhal.deploy.site (or narwhal.deploy.deliver, then narwhal.deploy.discover), and prepare "
        "a new run" % (a, b))
    with pytest.raises(InputError) as err:  # the files maps not at hand: where to compare them
        check_pair_manifests(pair)
    assert ("(compare the files maps (/model/manifest/files) of engine-launch.engine-1.inspection.json and "
            "engine-launch.engine-2.inspection.json in NARWHAL_CONFIG_DIR)") in str(err.value)


@pytest.mark.parametrize("one, two, has, lacks", [
    ("sha256:" + "1" * 64, None, "engine-1", "engine-2"),
    (None, "sha256:" + "1" * 64, "engine-2", "engine-1"),
])
def test_a_pair_where_one_record_has_no_manifest_is_refused(records, one, two, has, lacks):
    with pytest.raises(InputError) as err:
        check_pair_manifests(_with_digests(records, one, two))
    assert err.value.key == "NARWHAL_MODEL_PATH"
    assert ("engine-1 (prefill) and engine-2 (decode) cannot be shown to serve one checkpoint: %s has the manifest "
            "sha256:%s (runtime.model_manifest), %s has none (its host's checkpoint held no .narwhal-manifest.json "
            "when discovery ran)" % (has, "1" * 64, lacks)) in str(err.value)


def test_records_of_the_sources_manifest_pass_and_others_are_refused(records):
    source = {"path": "/p/config/model-manifest.json", "digest": manifest_digest(SHARDS), "files": SHARDS}
    check_source_manifest(_with_digests(records, source["digest"], source["digest"]), source)
    stale_records = _with_digests(records, source["digest"], manifest_digest(OTHER))
    with pytest.raises(InputError) as err:
        check_source_manifest(stale_records, source, {"engine-2": OTHER}.get)
    assert err.value.key == "NARWHAL_MODEL_SOURCE"
    assert str(err.value) == (
        "NARWHAL_MODEL_SOURCE: the launch record of engine-2 has the checkpoint manifest %s (runtime.model_manifest), "
        "but the manifest of NARWHAL_MODEL_SOURCE (/p/config/model-manifest.json) is %s (the files of engine-2 that "
        "differ from the source's: model.safetensors (18 bytes, expected 7)): the record was not discovered from the "
        "checkpoint the deliver stage delivers; run the deliver stage, then discovery: ansible-playbook "
        "narwhal.deploy.site (or narwhal.deploy.deliver, then narwhal.deploy.discover), and prepare a new run"
        % (manifest_digest(OTHER), source["digest"]))
    with pytest.raises(InputError) as err:
        check_source_manifest(stale_records, source)
    assert ("is %s (compare the files maps (/model/manifest/files) of engine-launch.engine-2.inspection.json in "
            "NARWHAL_CONFIG_DIR with /p/config/model-manifest.json's): " % source["digest"]) in str(err.value)
    with pytest.raises(InputError) as err:
        check_source_manifest(_with_digests(records, None, source["digest"]), source)
    assert ("the launch record of engine-1 has no checkpoint manifest (runtime.model_manifest: its host's checkpoint "
            "held no .narwhal-manifest.json when discovery ran), but the manifest of NARWHAL_MODEL_SOURCE") \
        in str(err.value)
