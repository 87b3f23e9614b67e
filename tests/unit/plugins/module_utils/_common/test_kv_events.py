# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rules of KV events (plugins/module_utils/_common/kv_events.py): each role's policy, when events are on, a
record's field, the endpoints a subscriber reaches by DP rank, and the hash algorithm an argument list gives vLLM."""

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import (
    events_on,
    hash_algo,
    record_field,
    role_policy,
    subscriber_endpoints,
)


def test_a_role_without_its_own_policy_takes_the_shared_one():
    site = {"NARWHAL_ROUTER_POLICY": "cache_aware", "NARWHAL_ROUTER_DECODE_POLICY": "power_of_two"}
    assert role_policy(site, "prefill") == ("cache_aware", "NARWHAL_ROUTER_POLICY")
    assert role_policy(site, "decode") == ("power_of_two", "NARWHAL_ROUTER_DECODE_POLICY")
    assert role_policy({}, "prefill") == ("round_robin", "NARWHAL_ROUTER_POLICY")


@pytest.mark.parametrize("mode, policies, on", [
    (None, {}, False),
    ("auto", {"NARWHAL_ROUTER_POLICY": "round_robin"}, False),
    ("auto", {"NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware"}, True),
    ("auto", {"NARWHAL_ROUTER_POLICY": "kv_aware"}, True),
    # the decode policy does not decide: vllm-router feeds events to a kv_aware prefill policy only
    ("auto", {"NARWHAL_ROUTER_DECODE_POLICY": "kv_aware"}, False),
    ("on", {"NARWHAL_ROUTER_POLICY": "round_robin"}, True),
    ("off", {"NARWHAL_ROUTER_POLICY": "round_robin"}, False),
])
def test_events_are_on_when_asked_or_when_the_prefill_policy_needs_them(mode, policies, on):
    site = dict(policies, NARWHAL_KV_EVENTS=mode)
    assert events_on(site) is on
    assert (record_field(dict(site, NARWHAL_KV_HASH_SEED=7), 5600) is not None) is on


def test_the_record_field_binds_every_interface_at_its_port_with_the_seed_as_text():
    site = {"NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_HASH_SEED": 4294967295}
    assert record_field(site, 5601) == {"endpoint": "tcp://*:5601", "port": 5601, "hash_seed": "4294967295"}
    assert record_field({"NARWHAL_KV_EVENTS": "on"}, 5557)["hash_seed"] == "0"


def test_subscriber_endpoints_follow_the_dp_ranks_on_the_host_that_runs_them():
    one = {"node": {"address": "10.0.0.11"}, "kv_events": {"port": 5557}}
    assert subscriber_endpoints(one) == ["tcp://10.0.0.11:5557"]
    dp = dict(one, data_parallel_size=3)
    assert subscriber_endpoints(dp) == ["tcp://10.0.0.11:5557", "tcp://10.0.0.11:5558", "tcp://10.0.0.11:5559"]
    # an engine across hosts: two ranks per host, rank r on the host r // 2 (members in narwhal_rank order)
    across = {"node": {"address": "fd00::11"}, "kv_events": {"port": 6000}, "data_parallel_size": 4,
              "data_parallel_size_local": 2, "members": [{"member": 1, "node": {"address": "fd00::12"}}]}
    assert subscriber_endpoints(across) == ["tcp://[fd00::11]:6000", "tcp://[fd00::11]:6001",
                                            "tcp://[fd00::12]:6002", "tcp://[fd00::12]:6003"]
    assert subscriber_endpoints({"node": {"address": "10.0.0.11"}}) is None


@pytest.mark.parametrize("args, algo", [
    ([], None),
    (["--max-num-seqs", "8"], None),
    (["--prefix-caching-hash-algo", "xxhash"], "xxhash"),
    (["--prefix-caching-hash-algo=sha256_cbor"], "sha256_cbor"),
    (["--prefix_caching_hash_algo", "xxhash_cbor"], "xxhash_cbor"),
    # vLLM's parser keeps the last
    (["--prefix-caching-hash-algo", "xxhash", "--prefix-caching-hash-algo=sha256"], "sha256"),
])
def test_the_hash_algorithm_is_the_last_an_argument_list_gives(args, algo):
    assert hash_algo(args) == algo
