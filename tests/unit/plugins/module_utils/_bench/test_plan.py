"""The benchmark's plan (plugins/module_utils/_bench/plan.py): the targets and loads of a run, each step's exact
`vllm bench serve` arguments (parsed here by vLLM's own argument names), the second router, and the refusals."""

import json
import re

import pytest
from test_support.bench import lengths

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import (
    BENCH_ROUTER_NAME,
    bench_plan,
    bench_router_plan,
    bench_routers,
    from_record,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS, NODE_INPUTS
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers, router_config

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


def plan(inputs=None, record=None, limits=None, routers=None, fleet=None):
    return bench_plan(inputs or site(), fleet_workers(fleet or FLEET), "http://10.0.0.21:30000",
                      "http://10.0.0.21:30001", "tiny", "/models/tiny", "20261202T201500Z", from_record(record)[0],
                      limits or lengths(fleet or FLEET), routers)


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


def _only_real_inputs(text):
    named = set(re.findall(r"NARWHAL_(?:NODE_<n>_)?[A-Z0-9_]*[A-Z0-9]", text))
    inputs = {spec["name"] for spec in INPUTS} | {"NARWHAL_NODE_<n>_%s" % spec["name"] for spec in NODE_INPUTS}
    assert named and named <= inputs, named - inputs


def test_lengths_beyond_the_engines_context_are_refused_by_name():
    record = {"runtime": {"extra_args": ["--max-model-len=512", "--enforce-eager", "--max-model-len", "256"]}}
    assert from_record(record) == (False, 256)
    with pytest.raises(PlanError) as err:
        plan(site(NARWHAL_BENCH_INPUT_LEN="200", NARWHAL_BENCH_OUTPUT_LEN="64"), limits=lengths(FLEET, 256))
    assert err.value.key == "NARWHAL_BENCH_INPUT_LEN" and "264 tokens" in str(err.value) and "256" in str(err.value)
    # the fix names the input that holds --max-model-len, and every key the message names is a real input
    assert "raise --max-model-len in NARWHAL_EXTRA_ARGS" in str(err.value)
    _only_real_inputs(str(err.value))
    plan(site(NARWHAL_BENCH_INPUT_LEN="192", NARWHAL_BENCH_OUTPUT_LEN="64"), limits=lengths(FLEET, 256))


def test_lengths_are_checked_against_every_engine_a_step_reaches():
    """The hidden check's case: only a prefill engine is shorter than the request (the benchmark host, a decode
    engine, allows it): the P/D steps reach it, so it is refused, naming the engine, its limit and where it was
    read; the engines that hold the request are not named."""
    inputs = site(NARWHAL_BENCH_INPUT_LEN="200", NARWHAL_BENCH_OUTPUT_LEN="64")
    with pytest.raises(PlanError) as err:
        plan(inputs, limits=lengths(FLEET, 4096, engine_1=256))
    text = str(err.value)
    assert "engine-1 (prefill; the pd steps reach it) serves at most 256 tokens (--max-model-len in the record)" in text
    assert "engine-2" not in text and "engine-3" not in text and err.value.key == "NARWHAL_BENCH_INPUT_LEN"
    # a decode engine that is not the first one is reached by the P/D steps alone
    with pytest.raises(PlanError) as err:
        plan(inputs, limits=lengths(FLEET, 4096, engine_3=128))
    assert "engine-3 (decode; the pd steps reach it) serves at most 128 tokens" in str(err.value)
    # the first decode engine: every target reaches it
    with pytest.raises(PlanError) as err:
        plan(inputs, limits=lengths(FLEET, 4096, engine_2=128))
    assert "engine-2 (decode; the pd/direct/router steps reach it) serves at most 128 tokens" in str(err.value)


def test_an_engine_whose_length_is_unknown_is_refused_with_the_fix():
    with pytest.raises(PlanError) as err:
        plan(limits=lengths(FLEET, 4096, engine_3=None))
    text = str(err.value)
    assert "the longest sequence engine-3 (decode; the pd steps reach it) serves is not known (no --max-model-len " \
           "in the record and no length in the checkpoint's config)" in text
    assert "set --max-model-len in NARWHAL_EXTRA_ARGS" in text and "lower them" not in text
    _only_real_inputs(text)
    # an engine the launch config does not have (the lookup did not see it)
    with pytest.raises(PlanError, match="engine-1 .* is not known \\(not in the launch config\\)"):
        plan(limits={"max_model_len": {"engine-2": 4096, "engine-3": 4096}})


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


# ------------------------------------------------------------------ the workload, the policies (issue 38)

FLEET_2P2D = [
    {"engine": "engine-1", "role": "prefill", "url": "https://10.0.0.11:8000", "kv_events": ["tcp://10.0.0.11:5557"]},
    {"engine": "engine-2", "role": "decode", "url": "https://10.0.0.12:8000", "kv_events": ["tcp://10.0.0.12:5557"]},
    {"engine": "engine-3", "role": "prefill", "url": "https://10.0.0.13:8000", "kv_events": ["tcp://10.0.0.13:5557"]},
    {"engine": "engine-4", "role": "decode", "url": "https://10.0.0.14:8000", "kv_events": ["tcp://10.0.0.14:5557"]},
]
POLICIES = "round_robin,cache_aware,kv_aware"


def test_the_default_workload_is_todays_step_to_the_word():
    """NARWHAL_BENCH_WORKLOAD=random (the default): the plan is the one the benchmark made before the workload and
    the policies existed, argument for argument, and has no key of theirs."""
    made = plan()
    assert made["steps"][0]["argv"] == [
        "--backend", "openai", "--base-url", "http://10.0.0.21:30000", "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", "/models/tiny", "--dataset-name", "random", "--random-input-len", "512",
        "--random-output-len", "128", "--num-prompts", "64", "--seed", "1", "--request-rate", "1", "--ignore-eos",
        "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--ready-check-timeout-sec", "120", "--label", "01-pd-rate-1", "--save-result", "--save-detailed",
        "--result-dir", "/narwhal-bench/out", "--result-filename", "01-pd-rate-1.json", "--disable-tqdm"]
    assert sorted(made) == ["decode_engine", "shape", "slo", "stamp", "steps", "targets"]
    assert made["shape"] == {"input_len": 512, "output_len": 128, "prompts": 64}
    assert plan(site(NARWHAL_BENCH_WORKLOAD="random")) == made


def test_the_prefix_workload_is_vllms_prefix_repetition_dataset():
    inputs = site(NARWHAL_BENCH_WORKLOAD="prefix", NARWHAL_BENCH_PREFIX_LEN="384", NARWHAL_BENCH_SUFFIX_LEN="32",
                  NARWHAL_BENCH_PREFIXES="4", NARWHAL_BENCH_PROMPTS="12", NARWHAL_BENCH_OUTPUT_LEN="16")
    made = plan(inputs)
    argv = made["steps"][0]["argv"]
    assert argv[:24] == [
        "--backend", "openai", "--base-url", "http://10.0.0.21:30000", "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", "/models/tiny", "--dataset-name", "prefix_repetition",
        "--prefix-repetition-prefix-len", "384", "--prefix-repetition-suffix-len", "32",
        "--prefix-repetition-num-prefixes", "4", "--prefix-repetition-output-len", "16",
        "--num-prompts", "12", "--seed", "1"]
    assert "--random-input-len" not in argv and "--random-output-len" not in argv
    assert made["shape"] == {"input_len": 416, "output_len": 16, "prompts": 12, "prefix_len": 384, "suffix_len": 32,
                             "prefixes": 4}
    assert made["workload"] == "prefix" and made["policies"] == []
    # every step its own seed: no step's prefixes are in an engine's cache from an earlier step
    assert len({args_of(s["argv"])["--seed"][0] for s in made["steps"]}) == len(made["steps"])


def test_the_prefix_workload_checks_prefix_suffix_and_output_against_every_engine():
    inputs = site(NARWHAL_BENCH_WORKLOAD="prefix", NARWHAL_BENCH_PREFIX_LEN="200", NARWHAL_BENCH_SUFFIX_LEN="40",
                  NARWHAL_BENCH_OUTPUT_LEN="20")
    with pytest.raises(PlanError) as err:
        plan(inputs, limits=lengths(FLEET, 4096, engine_1=256))
    text = str(err.value)
    assert err.value.key == "NARWHAL_BENCH_PREFIX_LEN"
    assert text.startswith("NARWHAL_BENCH_PREFIX_LEN + NARWHAL_BENCH_SUFFIX_LEN + "
                           "NARWHAL_BENCH_OUTPUT_LEN = 260 tokens per request")
    assert "engine-1 (prefill; the pd steps reach it) serves at most 256 tokens" in text
    plan(inputs, limits=lengths(FLEET, 4096, engine_1=260))


@pytest.mark.parametrize("prompts, prefixes", [("12", "5"), ("4", "8")])
def test_prompts_that_the_prefixes_do_not_divide_are_refused(prompts, prefixes):
    with pytest.raises(PlanError) as err:
        plan(site(NARWHAL_BENCH_WORKLOAD="prefix", NARWHAL_BENCH_PROMPTS=prompts, NARWHAL_BENCH_PREFIXES=prefixes))
    assert err.value.key == "NARWHAL_BENCH_PREFIXES" and "multiple of NARWHAL_BENCH_PREFIXES" in str(err.value)
    _only_real_inputs(str(err.value))


@pytest.mark.parametrize("value, words", [("round_robin,fastest", "names 'fastest', not one of round_robin"),
                                          ("cache_aware,cache_aware", "names cache_aware twice")])
def test_policies_are_router_policies_each_once(value, words):
    with pytest.raises(InputError) as err:
        site(NARWHAL_BENCH_POLICIES=value)
    assert err.value.key == "NARWHAL_BENCH_POLICIES" and words in str(err.value)
    policies = site(NARWHAL_BENCH_POLICIES=" kv_aware, round_robin")["NARWHAL_BENCH_POLICIES"]
    assert policies == ["kv_aware", "round_robin"]
    assert site()["NARWHAL_BENCH_POLICIES"] is None


def policy_site(**values):
    return site(**dict({"NARWHAL_BENCH_POLICIES": POLICIES, "NARWHAL_NODE_3_ROLE": "prefill",
                        "NARWHAL_NODE_4_ROLE": "decode"}, **values))


def test_each_policy_has_a_pd_router_of_its_own_from_the_router_stages_planner():
    inputs = policy_site()
    routers = bench_routers(RECORD, inputs, FLEET_2P2D)
    assert [r["target"] for r in routers] == ["pd-round_robin", "pd-cache_aware", "pd-kv_aware"]
    assert [r["name"] for r in routers] == ["narwhal-router-bench-round_robin", "narwhal-router-bench-cache_aware",
                                            "narwhal-router-bench-kv_aware"]
    assert [r["port"] for r in routers] == [30001, 30002, 30003]
    assert [r["url"] for r in routers] == ["https://10.0.0.21:30001", "https://10.0.0.21:30002",
                                           "https://10.0.0.21:30003"]
    for router in routers:
        policy = router["policy"]
        # the router stage's own command line, the policy as the site's prefill policy: nothing copied here
        expected = router_config(dict(inputs, NARWHAL_ROUTER_PREFILL_POLICY=policy), fleet_workers(FLEET_2P2D),
                                 None, "10.0.0.21")
        assert router["config"]["args"] == expected["args"] and "--vllm-pd-disaggregation" in expected["args"]
        # its own port, no metrics front (nothing scrapes it), its own worker set, the TLS front of the fleet's
        assert router["config"]["fronts"] == [{"listen": ["10.0.0.21", router["port"]], "to": "port"}]
        assert router["config"]["workers_file"] == "/narwhal/bench-workers-%s.json" % policy
        assert router["command"] == ["/narwhal/narwhal_router.py", "/narwhal/bench-router-%s.json" % policy]
        assert router["config"]["tls"] == {"cert": "/narwhal/tls/server.crt", "key": "/narwhal/tls/server.key"}
        assert router["env"] == ["SSL_CERT_FILE=/narwhal/tls/ca.crt"] and router["image"] == "sha256:abc"
        files = dict((f["name"], json.loads(f["content"])) for f in router["files"])
        assert files == {"bench-router-%s.json" % policy: router["config"],
                         "bench-workers-%s.json" % policy: router["workers_doc"]}
        assert router["workers_doc"]["prefill"] == ["https://10.0.0.11:8000", "https://10.0.0.13:8000"]
        assert router["workers_doc"]["decode"] == ["https://10.0.0.12:8000", "https://10.0.0.14:8000"]
        assert router["labels"]["org.narwhal.role"] == "router-bench"
    assert len({r["hash"] for r in routers}) == 3
    # only the kv_aware router keeps the KV event sources (vllm-router refuses --pd-kv-events otherwise)
    assert [("kv_events" in r["workers_doc"]) for r in routers[:2]] == [False, False]


def test_each_policys_router_routes_prefill_by_its_policy_and_decode_by_the_sites():
    routers = bench_routers(RECORD, policy_site(NARWHAL_ROUTER_DECODE_POLICY="power_of_two"), FLEET_2P2D)
    assert [args_of(r["config"]["args"])["--prefill-policy"] for r in routers] == [
        ["round_robin"], ["cache_aware"], ["kv_aware"]]
    assert {tuple(args_of(r["config"]["args"])["--decode-policy"]) for r in routers} == {("power_of_two",)}
    # the kv_aware router subscribes to every prefill engine's events (narwhal_router.py: --pd-kv-events)
    assert routers[2]["workers_doc"]["kv_events"] == {"https://10.0.0.11:8000": ["tcp://10.0.0.11:5557"],
                                                      "https://10.0.0.13:8000": ["tcp://10.0.0.13:5557"]}


def test_kv_aware_over_prefill_blocks_of_another_size_is_refused_by_name():
    """vllm-router 0.1.17 hashes static KV event sources as 16-token blocks: a prefill engine recorded with 32-token
    blocks (a CPU image's least) would match no prefix. Discovery refuses it only under the site's own kv_aware
    policy; the benchmark's is refused here, from the launch records."""
    records = dict((e["engine"], {"runtime": {"cache_plan": {"block_size": 16}}}) for e in FLEET_2P2D)
    bench_routers(RECORD, policy_site(), FLEET_2P2D, records=records)
    records["engine-3"] = {"runtime": {"cache_plan": {"block_size": 32}}}
    records["engine-4"] = {"runtime": {"cache_plan": {"block_size": 64}}}  # a decode engine: not asked
    with pytest.raises(PlanError) as err:
        bench_routers(RECORD, policy_site(), FLEET_2P2D, records=records)
    assert err.value.key == "NARWHAL_BENCH_POLICIES" and "the blocks of engine-3 32 tokens" in str(err.value)
    assert "set NARWHAL_BLOCK_SIZE=16" in str(err.value) and "engine-4" not in str(err.value)
    _only_real_inputs(str(err.value))
    bench_routers(RECORD, policy_site(NARWHAL_BENCH_POLICIES="round_robin,cache_aware"), FLEET_2P2D, records=records)


def test_with_policies_every_load_has_every_policy_side_by_side_with_its_own_seed():
    inputs = policy_site(NARWHAL_BENCH_RATES="1,4", NARWHAL_BENCH_CONCURRENCY="4", NARWHAL_BENCH_WORKLOAD="prefix")
    made = plan(inputs, routers=bench_routers(RECORD, inputs, FLEET_2P2D), fleet=FLEET_2P2D)
    steps = made["steps"]
    assert [s["id"] for s in steps[:3]] == ["01-pd-round_robin-rate-1", "02-pd-cache_aware-rate-1",
                                            "03-pd-kv_aware-rate-1"]
    assert len(steps) == 9 and [s["load"]["label"] for s in steps[::3]] == ["rate-1", "rate-4", "concurrency-4"]
    assert {s["url"] for s in steps if s["target"] == "pd-kv_aware"} == {"https://10.0.0.21:30003"}
    assert [t["target"] for t in made["targets"]] == ["pd-round_robin", "pd-cache_aware", "pd-kv_aware"]
    assert not {"pd", "direct", "router"} & {s["target"] for s in steps}
    assert len({args_of(s["argv"])["--seed"][0] for s in steps}) == 9
    assert made["policies"] == ["round_robin", "cache_aware", "kv_aware"] and made["workload"] == "prefix"
    assert steps[0]["container"] == "narwhal-bench-20261202t201500z-01-pd-round_robin-rate-1"


def test_with_policies_each_steps_router_must_be_planned():
    inputs = policy_site()
    routers = bench_routers(RECORD, inputs, FLEET_2P2D)
    with pytest.raises(PlanError) as err:
        plan(inputs, routers=routers[:2], fleet=FLEET_2P2D)
    assert err.value.key == "NARWHAL_BENCH_POLICIES" and "no router planned for pd-kv_aware" in str(err.value)


def test_kv_aware_over_engines_without_events_is_refused_by_name_before_anything_runs():
    fleet = [dict(e) for e in FLEET_2P2D]
    del fleet[0]["kv_events"]
    del fleet[2]["kv_events"]
    with pytest.raises(PlanError) as err:
        bench_routers(RECORD, policy_site(), fleet)
    text = str(err.value)
    assert err.value.key == "NARWHAL_BENCH_POLICIES"
    assert "kv_aware routes by the prefill engines' KV events, and engine-1, engine-3 publish none" in text
    assert "NARWHAL_KV_EVENTS=on" in text
    # decode engines without events do not matter, nor a fleet without events when kv_aware is not asked for
    del fleet[1]["kv_events"]
    bench_routers(RECORD, policy_site(NARWHAL_BENCH_POLICIES="round_robin,cache_aware"), fleet)


@pytest.mark.parametrize("values, words", [
    ({"NARWHAL_ROUTER_METRICS_PORT": "30002"}, "pd-cache_aware listens on NARWHAL_BENCH_ROUTER_PORT + 1 = 30002, "
                                               "which is NARWHAL_ROUTER_METRICS_PORT too"),
    ({"NARWHAL_BENCH_ROUTER_METRICS_PORT": "30003"}, "pd-kv_aware listens on NARWHAL_BENCH_ROUTER_PORT + 2 = 30003, "
                                                     "which is NARWHAL_BENCH_ROUTER_METRICS_PORT too"),
    ({"NARWHAL_ROUTER_PORT": "30001"}, "pd-round_robin listens on NARWHAL_BENCH_ROUTER_PORT + 0 = 30001, which is "
                                       "NARWHAL_ROUTER_PORT too"),
    ({"NARWHAL_BENCH_ROUTER_PORT": "65534"}, "pd-kv_aware listens on NARWHAL_BENCH_ROUTER_PORT + 2 = 65536, "
                                             "beyond 65535"),
])
def test_the_policies_routers_ports_must_be_free(values, words):
    with pytest.raises(PlanError) as err:
        bench_routers(RECORD, policy_site(**values), FLEET_2P2D)
    assert err.value.key == "NARWHAL_BENCH_ROUTER_PORT" and words in str(err.value)
    _only_real_inputs(str(err.value))


def test_without_policies_the_benchmark_runs_todays_second_router():
    (router,) = bench_routers(PLAIN_RECORD, site(NARWHAL_TLS="off"), FLEET)
    assert router == dict(bench_router_plan(PLAIN_RECORD, site(NARWHAL_TLS="off"), fleet_workers(FLEET)),
                          target="router", files=[{"name": "bench-router.json",
                                                   "content": json.dumps(router["config"], indent=2,
                                                                         sort_keys=True) + "\n"}])
