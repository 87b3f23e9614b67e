# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Engines across hosts (NARWHAL_NODE_<n>_HOSTS): the record of the head with its `members`
(_discover/members.py, collect_records of _discover/outputs.py), the member view and the commands the one
planner gives each host (_plan/container.py), prepare's derive and shared-host check, and the refusals by name."""

from __future__ import annotations

import copy

import pytest
from test_support.records import BASE, host, iface, image, model, nvidia, rdma, stamped_model

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import subscriber_endpoints
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import bound_ports
from ansible_collections.narwhal.deploy.plugins.module_utils._discover import outputs as _discovery_outputs
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import record_errors
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import render_role_env, role_environment
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import derive, role_env_texts, shared_hosts

MIXTRAL = "aiconf__mistralai--Mixtral-8x7B-v0.1"
# engine-1: DP 4 / EP over two hosts (gpu-a17 the head, gpu-a18 rank 1), 4 GPUs each; engine-2 one host
SPREAD = {"NARWHAL_NODE_1_HOSTS": "2", "NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "4", "NARWHAL_GPUS_PER_ENGINE": "4",
          "NARWHAL_NODE_1_ENABLE_EXPERT_PARALLEL": "true"}


def plan_site(tmp_path, extra=None, member_facts=None, transport=None):
    values = dict(BASE, **SPREAD)
    values.update(extra or {})
    if transport:
        values["NARWHAL_TRANSPORT"] = transport
    inputs = load_inputs(values)
    rd = rdma(tmp_path / "dev") if transport == "ucx_rdma" else None
    facts = host(nvidia(tmp_path / "dev"), tmp_path, mdl=model(tmp_path, MIXTRAL), rd=rd)
    ifs = {"engine-1": iface("10.0.0.11", "box-a"), "engine-2": iface("10.0.0.13", "box-c")}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], ifs)
    members = {"engine-1": [{"host": "gpu-a18", "interface": iface("10.0.0.12", "box-b"),
                             "inspection": member_facts or facts}]}
    document, extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts, "engine-2": facts},
                                                            members)
    return inputs, document["engines"], extracts


def test_an_engine_across_two_hosts_is_one_record_with_its_member(tmp_path, dev):
    _inputs, records, extracts = plan_site(tmp_path)
    one = records["engine-1"]
    assert record_errors(one) == []
    assert one["data_parallel_size"] == 4 and one["data_parallel_size_local"] == 2
    assert one["data_parallel_rpc_port"] == 29550 and one["enable_expert_parallel"] is True
    assert one["tensor_parallel_size"] == 2 and one["gpu_host_indices"] == [0, 1, 2, 3]
    # the head's side channels are its ranks 0 and 1; the member's ranks 2 and 3 on its own address
    assert one["node"]["side_channel_ports"] == [5600, 5601] and one["node"]["address"] == "10.0.0.11"
    [member] = one["members"]
    assert member["member"] == 1 and member["host"] == "gpu-a18" and member["data_parallel_start_rank"] == 2
    assert member["node"] == {"address": "10.0.0.12", "fabric_interface": "eth1", "side_channel_ports": [5602, 5603],
                              "host_id": "box-b"}
    assert member["gpu_host_indices"] == [0, 1, 2, 3] and len(member["gpu_ids"]) == 4
    assert member["sources"]["host"] == {"file": "engine-launch.engine-1.member-1.inspection.json", "pointer": "/host"}
    assert "NARWHAL_NODE_1_HOSTS=2: 2 rank(s) on each host" in one["sources"]["parallelism"]
    assert extracts["engine-launch.engine-1.member-1.inspection.json"]["inventory_host"] == "gpu-a18"
    # an engine on one host has none of it
    two = records["engine-2"]
    assert not set(two) & {"members", "data_parallel_size_local", "data_parallel_rpc_port", "data_parallel_size"}


def test_each_host_gets_its_own_command_from_the_one_planner(tmp_path, dev):
    _inputs, records, _extracts = plan_site(tmp_path)
    one = records["engine-1"]
    head = container_spec(one, role_environment(one, "/opt/narwhal", "run-x"))
    worker = container_spec(one, role_environment(one, "/opt/narwhal", "run-x", member=1))
    assert head["command"][head["command"].index("--data-parallel-size"):][:9] == [
        "--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-address", "10.0.0.11",
        "--data-parallel-rpc-port", "29550", "--enable-expert-parallel"]
    assert "--headless" not in head["command"]
    tail = worker["command"][worker["command"].index("--data-parallel-size"):][:12]
    assert tail == ["--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-address",
                    "10.0.0.11", "--data-parallel-rpc-port", "29550", "--data-parallel-start-rank", "2", "--headless",
                    "--enable-expert-parallel"]
    # each host's NIXL side channel on its own address, from the same base port (vLLM adds the global rank)
    assert head["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.11"
    assert worker["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.12"
    assert worker["environment"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == head["environment"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    # a role environment for a member the record does not have is refused
    env = dict(role_environment(one, "/opt/narwhal", "run-x"), NARWHAL_ENGINE_MEMBER="2")
    with pytest.raises(PlanError) as err:
        container_spec(one, env)
    assert "NARWHAL_ENGINE_MEMBER=2 names host 2 of engine-1 but its launch record has members 1 .. 1" in str(err.value)


def test_an_engine_across_hosts_publishes_each_ranks_kv_events_on_its_own_host(tmp_path, dev):
    """KV events of an engine across hosts: one port range on all its hosts (port + global rank), each host binding
    the ports of its own ranks, the fleet listing each rank's endpoint at the address of its host, one
    --kv-events-config (the base endpoint) on every host. engine-2 on another machine starts at the base again."""
    inputs, records, _extracts = plan_site(tmp_path, {"NARWHAL_KV_EVENTS": "on"})
    one, two = records["engine-1"], records["engine-2"]
    assert record_errors(one) == [] and one["kv_events"]["port"] == 5557 and two["kv_events"]["port"] == 5557
    assert subscriber_endpoints(one) == ["tcp://10.0.0.11:5557", "tcp://10.0.0.11:5558", "tcp://10.0.0.12:5559",
                                         "tcp://10.0.0.12:5560"]
    assert bound_ports(one)["kv-events"] == (5557, 5558)
    assert bound_ports(member_view(one, 1))["kv-events"] == (5559, 5560)
    head = container_spec(one, role_environment(one, "/opt/narwhal", "run-x"))
    worker = container_spec(one, role_environment(one, "/opt/narwhal", "run-x", member=1))
    for spec in (head, worker):
        at = spec["command"].index("--kv-events-config")
        assert spec["command"][at + 1].endswith('"endpoint":"tcp://*:5557"}')
        assert spec["environment"]["PYTHONHASHSEED"] == "0"
    shared_hosts(records)
    # engine-2 moved onto the member's machine without a port plan of its own: prepare names the overlap
    clash = copy.deepcopy(records)
    clash["engine-2"]["node"]["host_id"] = "box-b"
    clash["engine-2"]["gpu_host_indices"] = [4, 5, 6, 7]
    clash["engine-2"]["node"].update(side_channel_port=5700, side_channel_ports=[5700, 5700])
    clash["engine-2"]["kv_events"].update(port=5560, endpoint="tcp://*:5560")
    with pytest.raises(InputError) as err:
        shared_hosts(clash)
    assert err.value.key == "NARWHAL_KV_EVENTS_PORT" and "kv-events / kv-events ports overlap (5559-5560 and " \
        "5560-5560)" in str(err.value)


def test_prepare_derives_every_host_and_checks_the_members_machines(tmp_path, dev):
    _inputs, records, _extracts = plan_site(tmp_path)
    derived = derive(records["engine-1"], "/opt/narwhal", "run-x")
    assert derived["role_env"].get("NARWHAL_ENGINE_MEMBER") is None
    assert derived["members"]["1"]["role_env"]["NARWHAL_ENGINE_MEMBER"] == "1"
    assert derived["members"]["1"]["role_env"]["NARWHAL_ADVERTISED_ADDRESS"] == "10.0.0.12"
    assert derived["members"]["1"]["host"] == "gpu-a18"
    assert "--headless" in derived["members"]["1"]["vllm_args"]
    shared_hosts(records)
    # engine-2 on the member's machine with the same GPUs: refused by name
    clash = copy.deepcopy(records)
    clash["engine-2"]["node"]["host_id"] = "box-b"
    with pytest.raises(InputError) as err:
        shared_hosts(clash)
    assert "engine-1 (its host gpu-a18, narwhal_rank 1) and engine-2 share a host and both use GPU 0,1,2,3" \
        in str(err.value)
    # on other GPUs and side channels it fits: a headless host binds no HTTP or attestation port of its engine
    clash["engine-2"]["gpu_host_indices"] = [4, 5, 6, 7]
    clash["engine-2"]["node"]["side_channel_ports"] = [5700, 5700]
    clash["engine-2"]["node"]["side_channel_port"] = 5700
    assert clash["engine-2"]["node"]["engine_port"] == clash["engine-1"]["node"]["engine_port"]
    shared_hosts(clash)


def test_each_host_of_an_engine_across_hosts_has_its_role_environment_file(tmp_path, dev):
    """role_env_texts: what prepare writes as <engine>.env and <engine>.member-<k>.env, and what its host checks read
    install's files against (the head's, then each other host's with its rank, address and interface)."""
    _inputs, records, _extracts = plan_site(tmp_path)
    derived = derive(records["engine-1"], "/opt/narwhal", "run-x")
    texts = role_env_texts(derived)
    assert sorted(texts) == ["0", "1"]
    assert texts["0"] == render_role_env(derived["role_env"]) and "NARWHAL_ENGINE_MEMBER" not in texts["0"]
    assert texts["1"] == render_role_env(derived["members"]["1"]["role_env"])
    assert "NARWHAL_ENGINE_MEMBER=1\n" in texts["1"] and "NARWHAL_ADVERTISED_ADDRESS=10.0.0.12\n" in texts["1"]
    assert list(role_env_texts(derive(records["engine-2"], "/opt/narwhal", "run-x"))) == ["0"]


@pytest.mark.parametrize("extra, own, key", [
    ({"NARWHAL_DATA_PARALLEL_RPC_PORT": "8000"}, "HTTP port 8000", "NARWHAL_ENGINE_PORT"),
    ({"NARWHAL_DATA_PARALLEL_RPC_PORT": "8010"}, "attestation port 8010", "NARWHAL_ATTEST_PORT"),
    ({"NARWHAL_DATA_PARALLEL_RPC_PORT": "9000", "NARWHAL_NODE_1_ENGINE_PORT": "9000"}, "HTTP port 9000",
     "NARWHAL_NODE_1_ENGINE_PORT"),
    ({"NARWHAL_DATA_PARALLEL_RPC_PORT": "5601"}, "side-channel ports 5600-5601", "NARWHAL_SIDE_CHANNEL_PORT"),
])
def test_the_heads_data_parallel_rpc_port_on_its_own_port_is_refused_at_discovery(tmp_path, dev, extra, own, key):
    """The head binds vLLM's DP handshake socket on --data-parallel-rpc-port, next to its HTTP server, attestation
    sidecar and side channel: discovery, which first knows them all, refuses it on one of them by name."""
    with pytest.raises(InputError) as err:
        plan_site(tmp_path, extra)
    assert err.value.key == "NARWHAL_DATA_PARALLEL_RPC_PORT"
    rpc = int(extra["NARWHAL_DATA_PARALLEL_RPC_PORT"])
    what = own.split(" port")[0]
    assert str(err.value) == (
        "NARWHAL_DATA_PARALLEL_RPC_PORT: engine-1 (an engine across hosts) would bind vLLM's data-parallel RPC port %d "
        "on its head, which holds its own %s (%s); one engine cannot bind both: set NARWHAL_DATA_PARALLEL_RPC_PORT to "
        "a free port outside the engines' HTTP, attestation and side-channel ports, or move the engine's %s port "
        "with %s, then rerun discovery" % (rpc, own, key, what, key))


def test_the_heads_data_parallel_rpc_port_is_one_of_its_hosts_ports(tmp_path, dev):
    """The head binds vLLM's DP handshake socket on --data-parallel-rpc-port: not on another engine's port of the
    same machine (prepare's shared-host check); a headless host binds none of it."""
    _inputs, records, _extracts = plan_site(tmp_path)
    head = records["engine-1"]
    assert head["data_parallel_rpc_port"] == 29550
    # engine-2 on the head's machine, its HTTP port on the RPC port
    clash = copy.deepcopy(records)
    clash["engine-2"]["node"].update(host_id=head["node"]["host_id"], engine_port=29550, side_channel_port=5700,
                                     side_channel_ports=[5700, 5700])
    clash["engine-2"]["gpu_host_indices"] = [4, 5, 6, 7]
    with pytest.raises(InputError) as err:
        shared_hosts(clash)
    assert err.value.key == "NARWHAL_NODE_<n>_ENGINE_PORT"
    assert "engine-1 and engine-2 share a host and their data-parallel RPC / engine ports overlap" in str(err.value)
    # on the member's machine (headless: no RPC socket bound there) the same port fits
    clash["engine-2"]["node"]["host_id"] = "box-b"
    shared_hosts(clash)


def test_a_member_with_another_image_or_fewer_gpus_is_refused_by_name(tmp_path, dev):
    other = host(nvidia(tmp_path / "dev"), tmp_path, mdl=model(tmp_path, MIXTRAL),
                 img=dict(image(), id="sha256:" + "b" * 64))
    with pytest.raises(InputError) as err:
        plan_site(tmp_path, member_facts=other)
    assert err.value.key == "NARWHAL_IMAGE"
    assert "the hosts of engine-1 differ in the engine image (ID)" in str(err.value)
    assert "gpu-a18 has sha256:bbbb" in str(err.value)
    with pytest.raises(InputError) as err:
        plan_site(tmp_path, {"NARWHAL_NODE_1_GPU_IDS": "0,1,2,3"},
                  member_facts=dict(host({"vendor": "nvidia", "gpus": [], "devices": []}, tmp_path,
                                         mdl=model(tmp_path, MIXTRAL))))
    assert "gpu-a18" in str(err.value) or "engine-1" in str(err.value)


def _stamped_site(tmp_path, head_shard, member_shard):
    """plan_site with the head's and the member's checkpoints stamped by the deliver stage (None: not stamped)."""
    def facts(shard, name):
        mdl = stamped_model(tmp_path, shard, MIXTRAL, name) if shard is not None else model(tmp_path, MIXTRAL)
        return host(nvidia(tmp_path / "dev"), tmp_path, mdl=mdl)
    head, member = facts(head_shard, "head"), facts(member_shard, "member")
    inputs = load_inputs(dict(BASE, **SPREAD))
    ifs = {"engine-1": iface("10.0.0.11", "box-a"), "engine-2": iface("10.0.0.13", "box-c")}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], ifs)
    members = {"engine-1": [{"host": "gpu-a18", "interface": iface("10.0.0.12", "box-b"), "inspection": member}]}
    document, extracts = _discovery_outputs.collect_records(plan, inputs, {"engine-1": head, "engine-2": head},
                                                            members)
    return head, document["engines"], extracts


def test_the_hosts_of_an_engine_hold_one_checkpoint_manifest(tmp_path, dev):
    head, records, extracts = _stamped_site(tmp_path, b"weights", b"weights")
    assert records["engine-1"]["runtime"]["model_manifest"] == head["model"]["manifest"]["digest"]
    member = extracts["engine-launch.engine-1.member-1.inspection.json"]["model"]["manifest"]
    assert member == head["model"]["manifest"]


@pytest.mark.parametrize("head_shard, member_shard, words", [
    (b"weights", b"weights, damaged", "files that differ: model.safetensors (16 bytes, expected 7)"),
    (b"weights", b"wEights", "files that differ: model.safetensors (sha256 differs)"),
    (b"weights", None, "gpu-a18 holds no manifest (.narwhal-manifest.json)"),
    (None, b"weights", "engine-1 holds no manifest (.narwhal-manifest.json)"),
])
def test_a_member_with_another_checkpoint_manifest_is_refused_by_name(tmp_path, dev, head_shard, member_shard, words):
    with pytest.raises(InputError) as err:
        _stamped_site(tmp_path, head_shard, member_shard)
    text = str(err.value)
    assert err.value.key == "NARWHAL_MODEL_PATH"
    assert "the hosts of engine-1 differ in the checkpoint's manifest (.narwhal-manifest.json of NARWHAL_MODEL_PATH)" \
        in text
    assert words in text
    assert "run the deliver stage (NARWHAL_MODEL_SOURCE)" in text
    assert text.count("sha256:") == (head_shard is not None) + (member_shard is not None)


def test_inputs_refuse_a_dp_size_the_hosts_cannot_share(tmp_path):
    with pytest.raises(InputError) as err:
        load_inputs(dict(BASE, NARWHAL_NODE_1_HOSTS="2", NARWHAL_NODE_1_DATA_PARALLEL_SIZE="3"))
    assert err.value.key == "NARWHAL_NODE_1_HOSTS"
    assert "the DP size must be a multiple of the host count" in str(err.value)
    with pytest.raises(InputError) as err:
        load_inputs(dict(BASE, NARWHAL_NODE_1_HOSTS="2", NARWHAL_NODE_1_DATA_PARALLEL_SIZE="4",
                         NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_TP_SIZE="1"))
    assert "gives it 4 on each of its 2 hosts (NARWHAL_NODE_1_HOSTS), 8 in all" in str(err.value)


def test_discovery_needs_every_host_of_the_engine(tmp_path, dev):
    values = dict(BASE, **SPREAD)
    inputs = load_inputs(values)
    facts = host(nvidia(tmp_path / "dev"), tmp_path, mdl=model(tmp_path, MIXTRAL))
    plan = build_fleet(inputs, ["engine-1", "engine-2"], {"engine-1": iface("10.0.0.11", "box-a"),
                                                          "engine-2": iface("10.0.0.13", "box-c")})
    with pytest.raises(InputError) as err:
        _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts, "engine-2": facts}, {})
    assert err.value.key == "NARWHAL_NODE_1_HOSTS"
    assert "is 2 but discovery gathered 1 host(s) of engine-1" in str(err.value)
    same = {"engine-1": [{"host": "gpu-a18", "interface": iface("10.0.0.12", "box-a"), "inspection": facts}]}
    with pytest.raises(InputError) as err:
        _discovery_outputs.collect_records(plan, inputs, {"engine-1": facts, "engine-2": facts}, same)
    assert "gpu-a18 (narwhal_rank 1) of engine-1 is the same machine as its head" in str(err.value)


def test_the_member_view_is_the_head_record_with_the_hosts_own_fields(tmp_path, dev):
    _inputs, records, _extracts = plan_site(tmp_path, transport="ucx_rdma")
    one = records["engine-1"]
    view = member_view(one, 1)
    assert "members" not in view and view["member"] == {"rank": 1, "start_rank": 2, "head_address": "10.0.0.11"}
    assert view["node"]["address"] == "10.0.0.12" and view["node"]["engine_port"] == one["node"]["engine_port"]
    assert view["transfer"] == one["members"][0]["transfer"] and view["transfer"]["devices"]
    assert member_view(one, 0)["member"]["rank"] == 0
    with pytest.raises(KeyError):
        member_view(one, 2)
