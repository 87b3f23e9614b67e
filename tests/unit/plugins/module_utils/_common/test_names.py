"""An inventory host's engine: the host variable narwhal_node, or the name engine-<n> (_common/names.py)."""
import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import (
    engine_hosts,
    host_engine,
    inventory_engines,
)


@pytest.mark.parametrize("host,node,engine", [
    ("engine-1", None, "engine-1"),
    ("engine-12", "", "engine-12"),
    ("gpu-a17.dc1.example", 3, "engine-3"),
    ("gpu-a17.dc1.example", "3", "engine-3"),
    ("gpu-a17.dc1.example", " 7 ", "engine-7"),
    ("engine-4", 4, "engine-4"),
    ("10.0.0.5", 2, "engine-2"),
])
def test_a_host_is_the_engine_of_its_node(host, node, engine):
    assert host_engine(host, node) == engine


@pytest.mark.parametrize("host,node,message", [
    ("gpu-a17", None, "inventory host gpu-a17 is in group engines but has no host variable narwhal_node and is "
                      "not named engine-<n>; set narwhal_node: <n>"),
    ("engine-01", None, "not named engine-<n>"),
    ("gpu-a17", 0, "narwhal_node: 0, which is not a node number"),
    ("gpu-a17", -2, "narwhal_node: -2, which is not a node number"),
    ("gpu-a17", "03", "which is not a node number"),
    ("gpu-a17", "3a", "which is not a node number"),
    ("gpu-a17", True, "narwhal_node: True, which is not a node number"),
    ("gpu-a17", 2.0, "which is not a node number"),
    ("gpu-a17", [1], "which is not a node number"),
    ("gpu-a17", 10 ** 9, "which is not a node number"),
    ("engine-3", 2, "inventory host engine-3 has narwhal_node: 2, so it would run engine-2 under the name of another "
                    "engine; a host named engine-<n> is node <n>: set narwhal_node: 3"),
])
def test_a_host_without_a_node_is_refused_by_name(host, node, message):
    with pytest.raises(InputError) as err:
        host_engine(host, node)
    assert str(err.value).startswith("narwhal_node: ")
    assert message in str(err.value)


def test_the_inventory_maps_every_host_once():
    assert inventory_engines([("gpu-a17", 1), ("gpu-b03", "2"), ("engine-3", None)]) == {
        "gpu-a17": "engine-1", "gpu-b03": "engine-2", "engine-3": "engine-3"}
    # two engines on one machine are two inventory hosts (same ansible_host), each with its node
    assert inventory_engines([("gpu-a17-a", 1), ("gpu-a17-b", 2)]) == {"gpu-a17-a": "engine-1", "gpu-a17-b": "engine-2"}
    with pytest.raises(InputError) as err:
        inventory_engines([("engine-2", None), ("gpu-b03", 2)])
    assert "inventory hosts engine-2 and gpu-b03 are both engine-2 (node 2 of .env)" in str(err.value)


# ------------------------------------------------------------------------------------------------
# engines across hosts: narwhal_rank


def test_engine_hosts_orders_the_hosts_of_an_engine_by_rank():
    hosts = [("gpu-a18", 1, 1), ("gpu-a17", 1, 0), ("gpu-b03", 2, None), ("engine-3", None, "0")]
    assert engine_hosts(hosts) == {"engine-1": ["gpu-a17", "gpu-a18"], "engine-2": ["gpu-b03"],
                                   "engine-3": ["engine-3"]}
    assert inventory_engines(hosts) == {"gpu-a18": "engine-1", "gpu-a17": "engine-1", "gpu-b03": "engine-2",
                                        "engine-3": "engine-3"}


@pytest.mark.parametrize("hosts, needle", [
    ([("gpu-a17", 1, 0), ("gpu-a18", 1, 0)],
     "inventory hosts gpu-a17 and gpu-a18 of engine-1 both have narwhal_rank: 0"),
    ([("gpu-a17", 1, 0), ("gpu-a18", 1, 2)], "the 2 inventory hosts of engine-1 have narwhal_rank 0, 2, so rank 1 is "
                                             "missing"),
    ([("gpu-a17", 1, 0), ("gpu-a18", 1, None)],
     "inventory hosts gpu-a17 and gpu-a18 are both engine-1 (node 1 of .env) and gpu-a18 has no narwhal_rank"),
    ([("gpu-a17", 1, 1)], "inventory host gpu-a17 has narwhal_rank: 1 but is the only host of engine-1"),
    ([("gpu-a17", 1, "head")], "inventory host gpu-a17 has narwhal_rank: 'head', which is not a host rank"),
    ([("gpu-a17", 1, True)], "which is not a host rank"),
])
def test_engine_hosts_refuses_ranks_by_name(hosts, needle):
    with pytest.raises(InputError) as err:
        engine_hosts(hosts)
    assert needle in str(err.value)
