"""The benchmark's plan (plugins/module_utils/_bench/plan.py): the targets and loads of a run, each step's exact
`vllm bench serve` arguments (parsed here by vLLM's own argument names), the second router, and the refusals."""

import re

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import (
    BENCH_ROUTER_NAME,
    bench_plan,
    bench_router_plan,
    from_record,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS, NODE_INPUTS
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

FLEET = [
    {"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
    {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"},
    {"engine": "engine-3", "role": "decode", "url": "http://10.0.0.13:8000"},
]
BASE = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny", "NARWHAL_IMAGE": "vllm/vllm:1",
        "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode"}
# the router stage's record with NARWHAL_TLS on (the default): https, the router's certificate
RECORD = {"url": "https://10.0.0.21:30000", "image": "sha256:abc", "vllm_router_version": "0.1.17",
          "image_ref": "narwhal/vllm-router:0.1.17", "bind": "10.0.0.21",
          "tls": {"sha256": "ab" * 32, "not_after": "2027-01-01T00:00:00Z", "days_left": 300}}
PLAIN_RECORD = dict(RECORD, url="http://10.0.0.21:30000", tls=None)


def site(**values):
    return load_inputs(dict(BASE, **values))["site"]


def args_of(argv):
    """{flag: [values]} of an argument list (a flag without a value maps to [])."""
    out, key = {}, None
    for word in argv:
        if word.startswith("--"):
            key = word
            out.setdefault(key, [])
        else:
            out[key].append(word)
    return out


def plan(inputs=None, record=None):
    return bench_plan(inputs or site(), fleet_workers(FLEET), "http://10.0.0.21:30000", "http://10.0.0.21:30001",
                      "tiny", "/models/tiny", "20261202T201500Z", *from_record(record))


def test_every_load_has_the_three_targets_side_by_side():
    steps = plan(site(NARWHAL_BENCH_RATES="1,2.5,inf", NARWHAL_BENCH_CONCURRENCY="4"))["steps"]
    assert [s["id"] for s in steps[:3]] == ["01-pd-rate-1", "02-direct-rate-1", "03-router-rate-1"]
    assert [s["load"]["label"] for s in steps[::3]] == ["rate-1", "rate-2.5", "rate-inf", "concurrency-4"]
    assert {s["url"] for s in steps if s["target"] == "direct"} == {"http://10.0.0.12:8000"}
    assert {s["url"] for s in steps if s["target"] == "pd"} == {"http://10.0.0.21:30000"}
    assert {s["url"] for s in steps if s["target"] == "router"} == {"http://10.0.0.21:30001"}
    closed = args_of(steps[-1]["argv"])
    assert closed["--max-concurrency"] == ["4"] and closed["--request-rate"] == ["inf"]
    assert "--max-concurrency" not in args_of(steps[0]["argv"])


def test_a_step_is_vllm_bench_serve_at_fixed_lengths_with_its_own_seed():
    steps = plan(site(NARWHAL_BENCH_INPUT_LEN="64", NARWHAL_BENCH_OUTPUT_LEN="16", NARWHAL_BENCH_PROMPTS="8"))["steps"]
    first = args_of(steps[0]["argv"])
    assert first["--random-input-len"] == ["64"] and first["--random-output-len"] == ["16"]
    assert first["--num-prompts"] == ["8"] and first["--dataset-name"] == ["random"]
    assert first["--ignore-eos"] == [] and first["--temperature"] == ["0"]
    assert first["--percentile-metrics"] == ["ttft,tpot,itl,e2el"] and first["--metric-percentiles"] == ["50,90,99"]
    assert first["--result-filename"] == ["01-pd-rate-1.json"] and first["--tokenizer"] == ["/models/tiny"]
    # no step reuses another's prompts (the decode engine caches what the P/D steps sent it)
    assert len({tuple(args_of(s["argv"])["--seed"]) for s in steps}) == len(steps)
    assert "--goodput" not in first and "--trust-remote-code" not in first


def test_the_operators_slos_become_goodput_and_remote_code_follows_the_record():
    record = {"runtime": {"trust_remote_code": True, "extra_args": ["--max-model-len", "4096"]}}
    steps = plan(site(NARWHAL_BENCH_SLO_TTFT_MS="250", NARWHAL_BENCH_SLO_E2EL_MS="2000.5"), record)["steps"]
    first = args_of(steps[0]["argv"])
    assert first["--goodput"] == ["ttft:250", "e2el:2000.5"]
    assert "--trust-remote-code" in first


def test_lengths_beyond_the_engines_context_are_refused_by_name():
    record = {"runtime": {"extra_args": ["--max-model-len=512", "--enforce-eager", "--max-model-len", "256"]}}
    assert from_record(record) == (False, 256)
    with pytest.raises(PlanError) as err:
        plan(site(NARWHAL_BENCH_INPUT_LEN="200", NARWHAL_BENCH_OUTPUT_LEN="64"), record)
    assert err.value.key == "NARWHAL_BENCH_INPUT_LEN" and "264 tokens" in str(err.value) and "256" in str(err.value)
    # the fix names the input that holds --max-model-len, and every key the message names is a real input
    assert "raise --max-model-len in NARWHAL_EXTRA_ARGS" in str(err.value)
    named = set(re.findall(r"NARWHAL_(?:NODE_<n>_)?[A-Z0-9_]*[A-Z0-9]", str(err.value)))
    inputs = {spec["name"] for spec in INPUTS} | {"NARWHAL_NODE_<n>_%s" % spec["name"] for spec in NODE_INPUTS}
    assert named and named <= inputs, named - inputs
    plan(site(NARWHAL_BENCH_INPUT_LEN="192", NARWHAL_BENCH_OUTPUT_LEN="64"), record)


def test_no_secret_and_no_key_flag_in_any_step():
    for step in plan()["steps"]:
        assert not any("key" in word.lower() for word in step["argv"] if word.startswith("--"))


def test_the_second_router_is_regular_mode_over_the_first_decode_engine():
    inputs = site(NARWHAL_TLS="off")
    router = bench_router_plan(PLAIN_RECORD, inputs, fleet_workers(FLEET))
    args = args_of(router["config"]["args"])
    assert router["name"] == BENCH_ROUTER_NAME and router["image"] == "sha256:abc"
    assert args["--worker-urls"] == ["http://10.0.0.12:8000"] and "--vllm-pd-disaggregation" not in args
    # the start script puts vllm-router on loopback; its front binds where the fleet's router binds (router_address)
    assert not {"--host", "--port", "--prometheus-host", "--prometheus-port"} & set(args)
    assert router["config"]["fronts"] == [{"listen": ["10.0.0.21", 30001], "to": "port"}]
    assert router["url"] == "http://10.0.0.21:30001" and router["local_url"] == "http://10.0.0.21:30001"
    assert router["command"] == ["/narwhal/narwhal_router.py", "/narwhal/bench-router.json"]
    assert router["config"]["api_key_validation_urls"] == ["http://10.0.0.12:8000/v1/models"]
    assert "tls" not in router["config"] and "env" not in router
    ipv6 = bench_router_plan(dict(PLAIN_RECORD, url="http://[fd00::21]:30000"), inputs, fleet_workers(FLEET))
    assert ipv6["url"] == "http://[fd00::21]:30001"
    assert ipv6["config"]["fronts"] == [{"listen": ["fd00::21", 30001], "to": "port"}]
    assert bench_router_plan(PLAIN_RECORD, inputs, fleet_workers(FLEET))["hash"] == router["hash"]
    wildcard = bench_router_plan(PLAIN_RECORD, site(NARWHAL_TLS="off", NARWHAL_ROUTER_BIND="0.0.0.0"),
                                 fleet_workers(FLEET))
    assert wildcard["local_url"] == "http://127.0.0.1:30001"


def test_with_tls_the_second_router_is_behind_its_own_tls_front():
    fleet = [dict(e, url=e["url"].replace("http://", "https://")) for e in FLEET]
    router = bench_router_plan(RECORD, site(), fleet_workers(fleet))
    args = args_of(router["config"]["args"])
    assert "--host" not in args and args["--worker-urls"] == ["https://10.0.0.12:8000"]
    assert router["config"]["tls"] == {"cert": "/narwhal/tls/server.crt", "key": "/narwhal/tls/server.key"}
    assert router["config"]["fronts"] == [{"listen": ["10.0.0.21", 30001], "to": "port"}]
    assert router["url"] == "https://10.0.0.21:30001" and router["local_url"] == "https://10.0.0.21:30001"
    assert router["env"] == ["SSL_CERT_FILE=/narwhal/tls/ca.crt"]
    renewed = bench_router_plan(dict(RECORD, tls=dict(RECORD["tls"], sha256="cd" * 32)), site(), fleet_workers(fleet))
    assert renewed["hash"] != router["hash"]


@pytest.mark.parametrize("record, tls, words", [
    (PLAIN_RECORD, "site", "has url http://10.0.0.21:30000, but NARWHAL_TLS is site"),
    (RECORD, "off", "has url https://10.0.0.21:30000, but NARWHAL_TLS is off"),
    (dict(RECORD, tls=None), "site", "no certificate from tls_material"),
])
def test_a_router_record_of_another_tls_setting_is_refused(record, tls, words):
    with pytest.raises(PlanError) as err:
        bench_router_plan(record, site(NARWHAL_TLS=tls), fleet_workers(FLEET))
    assert words in str(err.value) and "rerun the router stage" in str(err.value)


@pytest.mark.parametrize("values, key", [
    ({"NARWHAL_BENCH_ROUTER_PORT": "30000"}, "NARWHAL_BENCH_ROUTER_PORT"),
    ({"NARWHAL_BENCH_ROUTER_METRICS_PORT": "29000"}, "NARWHAL_BENCH_ROUTER_METRICS_PORT"),
    ({"NARWHAL_BENCH_ROUTER_METRICS_PORT": "30001"}, "NARWHAL_BENCH_ROUTER_METRICS_PORT"),
])
def test_the_second_routers_ports_must_be_free(values, key):
    with pytest.raises(PlanError) as err:
        bench_router_plan(RECORD, site(**values), fleet_workers(FLEET))
    assert err.value.key == key


def test_a_router_record_without_its_url_is_refused():
    with pytest.raises(PlanError, match="rerun the router stage"):
        bench_router_plan(dict(RECORD, url=None), site(), fleet_workers(FLEET))


@pytest.mark.parametrize("url", ["http://10.0.0.21", "10.0.0.21:30000", "http://[10.0.0.21]:30000"])
def test_a_router_record_whose_url_names_no_host_and_port_is_refused(url):
    with pytest.raises(PlanError) as err:
        bench_router_plan(dict(RECORD, url=url), site(), fleet_workers(FLEET))
    assert str(err.value) == ("the router's record has url %r, not http(s)://host:port; rerun the router stage"
                              % url) and err.value.key == "runs/routers"
