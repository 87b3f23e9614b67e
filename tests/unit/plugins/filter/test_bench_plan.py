"""The bench_routers and bench_plan filters as the benchmark role calls them: narwhal_site, the resolved fleet, the
fleet router's record, the routers' plans (or, as before, the second router's URL) and every engine's length from
the probe_engines lookup; a refusal is a filter error."""
import pytest
from ansible.errors import AnsibleFilterError
from test_support.bench import lengths

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import bench_plan, bench_routers
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
RECORD = {"url": "http://10.0.0.21:30000", "image": "sha256:abc", "vllm_router_version": "0.1.17"}
STAMP = "20261202T201500Z"


def narwhal_site(**values):
    inputs = dict({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                   "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_TLS": "off", "NARWHAL_BENCH_RATES": "2"}, **values)
    return {"site": load_inputs(inputs)["site"], "engines": {}}


def test_the_role_passes_the_routers_and_every_engines_length():
    site = narwhal_site()
    routers = bench_routers(RECORD, site, FLEET)
    assert [(r["target"], r["url"]) for r in routers] == [("router", "http://10.0.0.21:30001")]
    made = bench_plan(site, FLEET, RECORD["url"], routers, STAMP, None, lengths=lengths(FLEET))
    assert [t["url"] for t in made["targets"]] == ["http://10.0.0.21:30000", "http://10.0.0.12:8000",
                                                   "http://10.0.0.21:30001"]
    # the second router's URL, as the filter took it before the policies
    assert bench_plan(site, FLEET, RECORD["url"], "http://10.0.0.21:30001", STAMP, None,
                      lengths=lengths(FLEET)) == made


def test_policies_reach_the_plan_through_their_routers():
    site = narwhal_site(NARWHAL_BENCH_POLICIES="round_robin,cache_aware")
    routers = bench_routers(RECORD, site, FLEET)
    made = bench_plan(site, FLEET, RECORD["url"], routers, STAMP, None, lengths=lengths(FLEET))
    want = [("pd-round_robin", "http://10.0.0.21:30001"), ("pd-cache_aware", "http://10.0.0.21:30002")]
    assert [(t["target"], t["url"]) for t in made["targets"]] == want


def test_refusals_are_filter_errors():
    with pytest.raises(AnsibleFilterError, match="engine-1 .prefill; the pd steps reach it. serves at most 100"):
        bench_plan(narwhal_site(), FLEET, RECORD["url"], bench_routers(RECORD, narwhal_site(), FLEET), STAMP,
                   lengths=lengths(FLEET, 4096, engine_1=100))
    with pytest.raises(AnsibleFilterError, match="kv_aware routes by the prefill engines' KV events"):
        bench_routers(RECORD, narwhal_site(NARWHAL_BENCH_POLICIES="kv_aware"), FLEET)
