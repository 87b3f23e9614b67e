"""The engine's node settings resolved once (_inputs/nodes.py, narwhal_site.engines, the filter node_settings)
and the launcher's command line from one place (the filter launcher_command)."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import (
    FilterModule,
    install_paths_filter,
    launcher_command,
    node_settings,
    summary_entry,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import interface_addresses
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs import nodes as _nodes
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.site import site_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import install_paths

BASE = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode",
        "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_MODEL_PATH": "/srv/models/tiny"}

OVERRIDDEN = dict(BASE, NARWHAL_NODE_2_FABRIC_INTERFACE="ib0", NARWHAL_NODE_2_ENGINE_PORT="8100",
                  NARWHAL_NODE_2_ATTEST_PORT="8101", NARWHAL_NODE_2_IMAGE="rocm/vllm:v0.33.0",
                  NARWHAL_NODE_2_RDMA_DEVICES="mlx5_0:1",
                  NARWHAL_NODE_2_ATTESTATION_URL="http://10.0.0.12:8101/attest")


def site(values):
    """narwhal_site as site_inputs sets it (nodes keyed by str, engines resolved)."""
    inputs = load_inputs(values)
    inputs["engines"] = _nodes.resolve_engines(inputs)
    inputs["nodes"] = dict((str(n), v) for n, v in inputs["nodes"].items())
    return inputs


def old_lookup(narwhal_site, engine):
    """What the roles' YAML looked an engine's node up with before: narwhal_site.nodes[engine | regex_replace(
    '^engine-', '')] | default({}), then <KEY> | default(<site value>)."""
    node = narwhal_site["nodes"].get(engine[len("engine-"):] if engine.startswith("engine-") else engine, {})
    s = narwhal_site["site"]
    return {"fabric_interface": node.get("FABRIC_INTERFACE", s["NARWHAL_FABRIC_INTERFACE"]),
            "image": node.get("IMAGE", s["NARWHAL_IMAGE"]), "role": node.get("ROLE"),
            "attestation_url": node.get("ATTESTATION_URL")}


# ------------------------------------------------------------------------------------- the pure function

def test_a_node_override_wins_and_names_its_input():
    inputs = load_inputs(OVERRIDDEN)
    s2 = _nodes.node_settings(inputs["site"], inputs["nodes"][2], 2)
    assert s2 == {"engine": "engine-2", "node": 2, "role": "decode", "fabric_interface": "ib0", "engine_port": 8100,
                  "attest_port": 8101, "image": "rocm/vllm:v0.33.0", "rdma_devices": "mlx5_0:1", "ip": None,
                  "hosts": None, "url": None, "attestation_url": "http://10.0.0.12:8101/attest",
                  "data_parallel_size": 1, "enable_expert_parallel": False,
                  "inputs": {"fabric_interface": "NARWHAL_NODE_2_FABRIC_INTERFACE",
                             "engine_port": "NARWHAL_NODE_2_ENGINE_PORT", "attest_port": "NARWHAL_NODE_2_ATTEST_PORT",
                             "image": "NARWHAL_NODE_2_IMAGE", "rdma_devices": "NARWHAL_NODE_2_RDMA_DEVICES",
                             "data_parallel_size": "NARWHAL_DATA_PARALLEL_SIZE",
                             "enable_expert_parallel": "NARWHAL_ENABLE_EXPERT_PARALLEL"}}


def test_without_an_override_the_site_value_applies():
    inputs = load_inputs(OVERRIDDEN)
    s1 = _nodes.node_settings(inputs["site"], inputs["nodes"][1], 1)
    assert (s1["fabric_interface"], s1["engine_port"], s1["attest_port"], s1["image"]) == (
        "eth1", inputs["site"]["NARWHAL_ENGINE_PORT"], inputs["site"]["NARWHAL_ATTEST_PORT"],
        "vllm/vllm-openai:v0.33.0")
    assert s1["rdma_devices"] == inputs["site"]["NARWHAL_RDMA_DEVICES"]
    assert s1["inputs"] == {"fabric_interface": "NARWHAL_FABRIC_INTERFACE", "engine_port": "NARWHAL_ENGINE_PORT",
                            "attest_port": "NARWHAL_ATTEST_PORT", "image": "NARWHAL_IMAGE",
                            "rdma_devices": "NARWHAL_RDMA_DEVICES", "data_parallel_size": "NARWHAL_DATA_PARALLEL_SIZE",
                            "enable_expert_parallel": "NARWHAL_ENABLE_EXPERT_PARALLEL"}
    assert (s1["role"], s1["ip"], s1["url"], s1["attestation_url"]) == ("prefill", None, None, None)


def test_node_without_inputs_and_a_host_not_named_engine():
    inputs = load_inputs(BASE)
    none = _nodes.node_settings(inputs["site"], None, 7)
    assert none["engine"] == "engine-7" and none["role"] is None and none["fabric_interface"] == "eth1"
    other = _nodes.node_settings(inputs["site"], {}, None)
    assert other["engine"] is None and other["node"] is None and other["inputs"]["image"] == "NARWHAL_IMAGE"


def test_resolve_engines_is_keyed_by_engine_for_int_and_str_node_numbers():
    inputs = load_inputs(OVERRIDDEN)
    engines = _nodes.resolve_engines(inputs)
    assert list(engines) == ["engine-1", "engine-2"]
    as_str = dict(inputs, nodes=dict((str(n), v) for n, v in inputs["nodes"].items()))
    assert _nodes.resolve_engines(as_str) == engines
    assert engines["engine-2"] == _nodes.node_settings(inputs["site"], inputs["nodes"][2], 2)


def test_engine_settings_reads_the_resolved_ones_first():
    inputs = site(OVERRIDDEN)
    assert _nodes.engine_settings(inputs, "engine-2") is inputs["engines"]["engine-2"]
    without = dict(inputs, engines=None)
    assert _nodes.engine_settings(without, "engine-2") == inputs["engines"]["engine-2"]
    assert _nodes.engine_settings(inputs, "engine-9")["fabric_interface"] == "eth1"


def test_site_inputs_returns_the_engines(tmp_path, monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("NARWHAL_"):
            monkeypatch.delenv(key)
    env = tmp_path / "site.env"
    env.write_text("".join("%s=%s\n" % kv for kv in sorted(OVERRIDDEN.items())))

    class Module:
        params = {"env_file": str(env), "use_process_env": False, "root": None}
        check_mode = False

        def warn(self, text):
            raise AssertionError(text)

        def fail_json(self, **kwargs):
            raise AssertionError(kwargs)

    result = site_inputs(Module())
    narwhal_site = result["ansible_facts"]["narwhal_site"]
    assert narwhal_site["engines"] == site(OVERRIDDEN)["engines"]
    assert sorted(narwhal_site["nodes"]) == ["1", "2"]


# ---------------------------------------------------------------------- discovery reads the same settings

def _facts(address):
    info = {"family": "inet", "local": address, "prefixlen": 24, "scope": "global", "preferred_life_time": 4294967295}
    return {"addresses": interface_addresses([{"ifname": "eth1", "addr_info": [info]}], "eth1")[1], "host_id": None}


@pytest.mark.parametrize("values", [BASE, OVERRIDDEN])
def test_the_fleet_is_planned_with_the_filters_settings(values):
    narwhal_site = site(values)
    inputs = {"site": narwhal_site["site"], "nodes": dict((int(k), v) for k, v in narwhal_site["nodes"].items()),
              "engines": narwhal_site["engines"]}
    hosts = {"engine-1": _facts("10.0.0.11"), "engine-2": _facts("10.0.0.12")}
    plan = build_fleet(inputs, ["engine-1", "engine-2"], hosts)
    # and the same plan from load_inputs alone (no resolved engines): the settings come from one function
    assert plan == build_fleet(load_inputs(values), ["engine-1", "engine-2"], hosts)
    for node in plan["nodes"]:
        settings = node_settings(narwhal_site, node["engine"])
        assert (node["interface"], node["engine_port"], node["attest_port"], node["role"]) == (
            settings["fabric_interface"], settings["engine_port"], settings["attest_port"], settings["role"])


def test_a_down_interface_is_refused_by_the_input_it_came_from():
    inputs = load_inputs(OVERRIDDEN)
    down = dict(_facts("10.0.0.12"), operstate="DOWN")
    with pytest.raises(InputError) as err:
        build_fleet(inputs, ["engine-1", "engine-2"], {"engine-1": _facts("10.0.0.11"), "engine-2": down})
    assert err.value.key == "NARWHAL_NODE_2_FABRIC_INTERFACE"
    assert "interface ib0 on host engine-2 is down" in str(err.value)


# ------------------------------------------------------------------------------------ the filters

@pytest.mark.parametrize("values", [BASE, OVERRIDDEN])
@pytest.mark.parametrize("engine", ["engine-1", "engine-2", "engine-3", "localhost"])
def test_node_settings_gives_what_the_roles_looked_up_before(values, engine):
    narwhal_site = site(values)
    settings = node_settings(narwhal_site, engine)
    old = old_lookup(narwhal_site, engine)
    assert dict((k, settings[k]) for k in old) == old
    # inputs and status: ROLE | default('') / default('-'); prepare: ATTESTATION_URL | default(omit)
    assert (settings["role"] or "") == (old["role"] or "")


def test_node_settings_is_a_filter_of_the_collection_and_wants_narwhal_site():
    filters = FilterModule().filters()
    assert filters["node_settings"] is node_settings and filters["launcher_command"] is launcher_command
    with pytest.raises(AnsibleFilterError, match="narwhal_site"):
        node_settings("eth1", "engine-1")
    with pytest.raises(AnsibleFilterError, match="narwhal_site"):
        launcher_command(None, "engine-1")


def test_summary_entry_takes_the_role_from_the_node_settings():
    narwhal_site = site(OVERRIDDEN)
    assert summary_entry({"inventory_hostname": "engine-2", "narwhal_site": narwhal_site})["role"] == "decode"
    assert summary_entry({"inventory_hostname": "engine-3", "narwhal_site": narwhal_site})["role"] is None
    assert summary_entry({"inventory_hostname": "engine-1"})["role"] is None


@pytest.mark.parametrize("python", [None, "/usr/bin/python3", "/opt/py/bin/python3.12"])
def test_launcher_command_is_the_command_the_roles_ran(python):
    narwhal_site = site(dict(BASE, NARWHAL_ENGINE_CHECKOUT="/opt/narwhal"))
    result = launcher_command(narwhal_site, "engine-2", python)
    interpreter = python or "/usr/bin/python3"
    planned = install_paths("/opt/narwhal", "engine-2", "")
    assert result["paths"] == install_paths_filter("/opt/narwhal", "engine-2") == dict(
        (k, v) for k, v in planned.items() if k != "run_dir")
    assert result["role_env"] == "/opt/narwhal/config/engine-2.env" == planned["role_env"]
    assert result["argv"] == [interpreter, "/opt/narwhal/bin/launch_engine.pyz", "--role-env",
                              "/opt/narwhal/config/engine-2.env"]
    # launch and stop ran `{{ python }} {{ paths.launcher }} --role-env {{ role_env path }} <command>`
    assert result["command"] == "%s %s --role-env %s" % (interpreter, planned["launcher"], planned["role_env"])


def test_launcher_command_takes_the_sites_checkout():
    narwhal_site = site(dict(BASE, NARWHAL_ENGINE_CHECKOUT="/srv/engines/narwhal"))
    assert launcher_command(narwhal_site, "engine-1")["argv"][1:] == [
        "/srv/engines/narwhal/bin/launch_engine.pyz", "--role-env", "/srv/engines/narwhal/config/engine-1.env"]


# ------------------------------------------------------------------------------------- inventory hosts of any name

def test_inventory_engines_ties_hosts_to_their_nodes_and_keeps_env_the_source_of_roles():
    narwhal_site = site(BASE)
    hostvars = {"gpu-a17.dc1.example": {"narwhal_node": 1}, "gpu-b03.dc1.example": {"narwhal_node": "2"},
                "router-1": {}}
    groups = {"engines": ["gpu-a17.dc1.example", "gpu-b03.dc1.example"], "routers": ["router-1"],
              "decode": ["gpu-b03.dc1.example"]}
    inventory_engines = FilterModule().filters()["inventory_engines"]
    assert inventory_engines(groups, hostvars, narwhal_site) == {"gpu-a17.dc1.example": "engine-1",
                                                                 "gpu-b03.dc1.example": "engine-2"}
    with pytest.raises(AnsibleFilterError) as err:
        inventory_engines(dict(groups, prefill=["gpu-b03.dc1.example"]), hostvars, narwhal_site)
    assert str(err.value).startswith("NARWHAL_NODE_2_ROLE: inventory host gpu-b03.dc1.example (engine-2) is in the "
                                     "inventory's group prefill, but .env has NARWHAL_NODE_2_ROLE=decode")
    with pytest.raises(AnsibleFilterError) as err:
        inventory_engines(dict(groups, engines=groups["engines"] + ["gpu-c11"]), hostvars, narwhal_site)
    assert "inventory host gpu-c11 is in group engines but has no host variable narwhal_node" in str(err.value)
    # a node .env gives no role, put in an inventory group of its own
    hostvars["gpu-c11"] = {"narwhal_node": 3}
    with pytest.raises(AnsibleFilterError) as err:
        inventory_engines(dict(groups, engines=groups["engines"] + ["gpu-c11"], decode=["gpu-c11"]), hostvars,
                          narwhal_site)
    assert "gpu-c11 (engine-3) is in the inventory's group decode, but .env has no role for it" in str(err.value)


def test_engine_hosts_lists_an_engine_across_hosts_head_first_and_checks_the_count_of_dotenv():
    narwhal_site = site(dict(BASE, NARWHAL_NODE_1_HOSTS="2", NARWHAL_DATA_PARALLEL_SIZE="2"))
    hostvars = {"gpu-a17": {"narwhal_node": 1, "narwhal_rank": 0}, "gpu-a18": {"narwhal_node": 1, "narwhal_rank": 1},
                "gpu-b03": {"narwhal_node": 2}}
    groups = {"engines": ["gpu-a18", "gpu-a17", "gpu-b03"]}
    filters = FilterModule().filters()
    assert filters["engine_hosts"](groups, hostvars, narwhal_site) == {"engine-1": ["gpu-a17", "gpu-a18"],
                                                                       "engine-2": ["gpu-b03"]}
    assert filters["inventory_engines"](groups, hostvars, narwhal_site) == {
        "gpu-a18": "engine-1", "gpu-a17": "engine-1", "gpu-b03": "engine-2"}
    with pytest.raises(AnsibleFilterError) as err:
        filters["engine_hosts"](groups, hostvars, site(BASE))
    assert str(err.value).startswith("NARWHAL_NODE_1_HOSTS: engine-1 spans 1 host(s) by .env (NARWHAL_NODE_1_HOSTS "
                                     "unset: 1) but the inventory has 2 host(s) of it in group engines "
                                     "(gpu-a17, gpu-a18)")


def test_member_record_and_status_key_name_the_host_of_an_engine_across_hosts():
    filters = FilterModule().filters()
    record = {"engine": "engine-1", "node": {"address": "10.0.0.1", "side_channel_ports": [5600, 5600]},
              "gpu_ids": ["0"], "data_parallel_size_local": 1,
              "members": [{"member": 1, "host": "gpu-a18", "data_parallel_start_rank": 1, "gpu_ids": ["0"],
                           "gpu_host_indices": [0], "accelerator_devices": [], "transfer": {"net_devices": ["eth1"]},
                           "node": {"address": "10.0.0.2", "fabric_interface": "eth1",
                                    "side_channel_ports": [5601, 5601], "host_id": "b"}}]}
    view = filters["member_record"](record, 1)
    assert view["node"]["address"] == "10.0.0.2" and view["member"]["start_rank"] == 1 and "members" not in view
    assert filters["member_record"](record, 0)["node"]["address"] == "10.0.0.1"
    assert filters["member_record"]({"engine": "engine-2"}, 0) == {"engine": "engine-2"}
    with pytest.raises(AnsibleFilterError) as err:
        filters["member_record"](record, 2)
    assert "the launch record of engine-1 has no host of narwhal_rank 2" in str(err.value)
    assert filters["status_key"]({"engine": "engine-1", "member": 1}) == "engine-1#1"
    assert filters["status_key"]({"engine": "engine-1", "member": 0}) == "engine-1"


def test_a_nodes_false_overrides_the_sites_true():
    inputs = load_inputs(dict(OVERRIDDEN, NARWHAL_ENABLE_EXPERT_PARALLEL="true",
                              NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL="false", NARWHAL_NODE_2_DATA_PARALLEL_SIZE="2"))
    s1 = _nodes.node_settings(inputs["site"], inputs["nodes"][1], 1)
    s2 = _nodes.node_settings(inputs["site"], inputs["nodes"][2], 2)
    assert (s1["enable_expert_parallel"], s1["data_parallel_size"]) == (True, 1)
    assert (s2["enable_expert_parallel"], s2["data_parallel_size"]) == (False, 2)
    assert s2["inputs"]["enable_expert_parallel"] == "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL"
