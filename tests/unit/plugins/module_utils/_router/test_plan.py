"""The router's plan (plugins/module_utils/_router/plan.py): workers from the resolved fleet, the vllm-router command
line, the hash, and the readiness report against the router's /workers answer."""

import json

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    KEY,
    PLAN_HASH_LABEL,
    config_text,
    fleet_workers,
    local_url,
    report_problems,
    router_args,
    router_bind,
    router_config,
    router_plan,
    tls_names,
    worker_report,
)

FLEET = [
    {"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
    {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000/"},
    {"engine": "engine-3", "role": "decode", "url": "http://[fd00::13]:8000"},
]
SITE = {"NARWHAL_ROUTER_IMAGE": "narwhal/vllm-router:0.1.17", "NARWHAL_ROUTER_PORT": 30000,
        "NARWHAL_ROUTER_METRICS_PORT": 29000, "NARWHAL_ROUTER_BIND": "0.0.0.0", "NARWHAL_ROUTER_POLICY": "round_robin",
        "NARWHAL_ROUTER_READY_TIMEOUT": 300, "NARWHAL_ROUTER_DIR": "/opt/narwhal-router", "NARWHAL_TLS": "off"}


def test_workers_come_from_the_fleet_in_its_order():
    workers = fleet_workers(FLEET)
    assert workers == {"prefill": [{"engine": "engine-1", "url": "http://10.0.0.11:8000"}],
                       "decode": [{"engine": "engine-2", "url": "http://10.0.0.12:8000"},
                                  {"engine": "engine-3", "url": "http://[fd00::13]:8000"}]}


@pytest.mark.parametrize("fleet, words", [
    ([FLEET[0]], "no decode engine"),
    (FLEET[1:], "no prefill engine"),
    (FLEET + [{"engine": "engine-4", "role": "decode", "url": "http://10.0.0.12:8000"}], "engine-2 and engine-4"),
    ([FLEET[0], {"engine": "engine-2", "role": "both", "url": "http://x:1"}], "role 'both'"),
    ([FLEET[0], {"engine": "engine-2", "role": "decode", "url": "${NARWHAL_NODE_2_URL}"}], "no engine URL"),
    ({"engines": FLEET}, "not a list"),
])
def test_a_fleet_the_router_cannot_serve_is_refused_by_name(fleet, words):
    with pytest.raises(PlanError) as err:
        fleet_workers(fleet)
    assert words in str(err.value) and "NARWHAL_FLEET" in str(err.value)


def test_the_command_line_holds_no_worker_no_address_and_no_secret():
    """The worker set is workers.json's and the addresses the start script's (narwhal_router.py adds --prefill and
    --decode per URL of workers.json and loopback --host/--port/--prometheus-host/--prometheus-port per process)."""
    args = router_args(SITE, fleet_workers(FLEET))
    assert args[:2] == ["--vllm-pd-disaggregation", "--kv-connector"]
    assert not {"--prefill", "--decode", "--host", "--port", "--prometheus-host", "--prometheus-port",
                "--api-key"} & set(args)
    config = router_config(SITE, fleet_workers(FLEET))
    assert config["fronts"] == [{"listen": ["0.0.0.0", 30000], "to": "port"},
                                {"listen": ["0.0.0.0", 29000], "to": "prometheus_port"}]
    assert config["workers_file"] == "/narwhal/workers.json" and "api_key_validation_urls" not in config
    assert config["drain_timeout"] == 120 and config["ready_timeout"] == 600
    assert router_config(dict(SITE, NARWHAL_ROUTER_DRAIN_TIMEOUT=30), fleet_workers(FLEET))["drain_timeout"] == 30


def test_workers_json_is_the_fleet_by_role_in_its_order():
    plan = router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")
    assert plan["workers_doc"] == {"prefill": ["http://10.0.0.11:8000"],
                                   "decode": ["http://10.0.0.12:8000", "http://[fd00::13]:8000"]}
    assert "10.0.0.11" not in json.dumps(plan["config"])  # no fleet in router.json


def test_the_two_ports_must_differ():
    with pytest.raises(PlanError) as err:
        router_args(dict(SITE, NARWHAL_ROUTER_METRICS_PORT=30000), fleet_workers(FLEET))
    assert err.value.key == "NARWHAL_ROUTER_METRICS_PORT"


def test_the_plan_hash_follows_what_needs_a_new_container_only():
    base = router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")
    assert base["labels"][PLAN_HASH_LABEL] == base["hash"]
    assert base["url"] == "http://10.0.0.21:30000" and base["metrics_url"] == "http://10.0.0.21:29000/metrics"
    assert base["config"]["api_key_file"] == KEY
    assert router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.99")["hash"] == base["hash"]
    # the stage's wait is not the router's: a shorter wait for one run must not replace the router
    assert router_plan(dict(SITE, NARWHAL_ROUTER_READY_TIMEOUT=40), FLEET, "sha256:aa", "0.1.17", "c1")["hash"] \
        == base["hash"]
    # a reload applies router.json and workers.json: another fleet, policy or drain keeps the container
    for reloaded in (router_plan(SITE, FLEET[:2], "sha256:aa", "0.1.17", "c1"),
                     router_plan(dict(SITE, NARWHAL_ROUTER_POLICY="cache_aware"), FLEET, "sha256:aa", "0.1.17", "c1"),
                     router_plan(dict(SITE, NARWHAL_ROUTER_DRAIN_TIMEOUT=30), FLEET, "sha256:aa", "0.1.17", "c1")):
        assert reloaded["hash"] == base["hash"]
        assert (reloaded["config"], reloaded["workers_doc"]) != (base["config"], base["workers_doc"])
    for changed in (router_plan(SITE, FLEET, "sha256:bb", "0.1.17", "c1"),
                    router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c2"),
                    router_plan(dict(SITE, NARWHAL_ROUTER_PORT=30005), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_ROUTER_METRICS_PORT=29005), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_ROUTER_BIND="10.0.0.21"), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_ROUTER_DIR="/srv/r"), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_LOG_MAX_SIZE="10m"), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_LOG_MAX_FILE=2), FLEET, "sha256:aa", "0.1.17", "c1"),
                    router_plan(dict(SITE, NARWHAL_LOG_DRIVER="local"), FLEET, "sha256:aa", "0.1.17", "c1")):
        assert changed["hash"] != base["hash"]
    assert json.loads(config_text(base["config"])) == base["config"]


def test_the_router_container_logs_are_bounded_by_the_log_inputs():
    plan = router_plan(dict(SITE, NARWHAL_LOG_DRIVER="local", NARWHAL_LOG_MAX_SIZE="20m", NARWHAL_LOG_MAX_FILE=3),
                       FLEET, "sha256:aa", "0.1.17", "c1")
    assert plan["log"] == {"Type": "local", "Config": {"max-size": "20m", "max-file": "3"}}
    # the catalogue's defaults when the site lacks them
    assert router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c1")["log"] == {
        "Type": "json-file", "Config": {"max-size": "100m", "max-file": "5"}}


def test_docker_stop_gives_the_drain_a_margin():
    plan = router_plan(dict(SITE, NARWHAL_ROUTER_DRAIN_TIMEOUT=30), FLEET, "sha256:aa", "0.1.17", "c1")
    assert plan["drain_timeout"] == 30 and plan["stop_timeout"] > 30


@pytest.mark.parametrize("bind, url", [("0.0.0.0", "http://127.0.0.1:30000"), ("::", "http://[::1]:30000"),
                                       ("10.0.0.21", "http://10.0.0.21:30000"), ("fd00::21", "http://[fd00::21]:30000")])
def test_the_router_host_reaches_its_router_on_loopback_for_a_wildcard_bind(bind, url):
    assert local_url(bind, 30000) == url


def _answer(*rows):
    return {"workers": [{"url": u, "worker_type": t, "is_healthy": h} for u, t, h in rows]}


def test_the_report_is_ok_only_for_the_whole_fleet_healthy():
    workers = fleet_workers(FLEET)
    ok = worker_report(_answer(("http://10.0.0.11:8000", "prefill", True), ("http://10.0.0.12:8000", "decode", True),
                               ("http://[fd00::13]:8000", "decode", True)), workers)
    assert ok["ok"] and ok["seen"] == ["engine-1", "engine-2", "engine-3"] and report_problems(ok) == []
    bad = worker_report(_answer(("http://10.0.0.11:8000", "decode", True), ("http://10.0.0.12:8000", "decode", False),
                                ("http://10.0.0.99:8000", "decode", True)), workers)
    assert not bad["ok"]
    lines = report_problems(bad)
    assert lines == ["the router lacks engine-3 (decode http://[fd00::13]:8000)",
                     "the router holds as unhealthy engine-2 (decode http://10.0.0.12:8000)",
                     "the router has engine-1 (prefill http://10.0.0.11:8000) as decode",
                     "the router routes to workers outside the fleet: http://10.0.0.99:8000"]


def test_a_dp_aware_router_lists_every_rank_of_a_worker():
    """vllm-router 0.1.17 with --intra-node-data-parallel-size lists <url>@<rank> per data-parallel rank (seen in the
    proving ground: 'http://172.31.240.12:8000@1', ...): every rank counts for the fleet's worker."""
    workers = fleet_workers(FLEET)
    urls = (("http://10.0.0.11:8000", "prefill"), ("http://10.0.0.12:8000", "decode"),
            ("http://[fd00::13]:8000", "decode"))
    ranks = [(url + "@%d" % r, role, True) for url, role in urls for r in (0, 1)]
    ok = worker_report(_answer(*ranks), workers)
    assert ok["ok"] and ok["seen"] == ["engine-1", "engine-2", "engine-3"]
    ranks[3] = ("http://10.0.0.12:8000@1", "decode", False)  # one rank of engine-2 unhealthy
    bad = worker_report(_answer(*ranks), workers)
    assert report_problems(bad) == ["the router holds as unhealthy engine-2 (decode http://10.0.0.12:8000)"]


def test_an_answer_that_is_not_a_worker_list_lacks_every_worker():
    report = worker_report("All servers healthy", fleet_workers(FLEET))
    assert not report["ok"] and len(report["missing"]) == 3


def test_data_parallel_engines_make_the_router_dp_aware_and_dp_1_adds_nothing():
    workers = fleet_workers(FLEET)
    assert "--intra-node-data-parallel-size" not in router_args(dict(SITE, NARWHAL_DATA_PARALLEL_SIZE=1), workers)
    assert router_args(SITE, workers) == router_args(dict(SITE, NARWHAL_DATA_PARALLEL_SIZE=1), workers)
    args = router_args(dict(SITE, NARWHAL_DATA_PARALLEL_SIZE=2), workers)
    assert args[-2:] == ["--intra-node-data-parallel-size", "2"]
    # per-node sizes (narwhal_site.engines) decide when given
    engines = dict((e, {"data_parallel_size": 4}) for e in ("engine-1", "engine-2", "engine-3"))
    assert router_args(SITE, workers, engines)[-1] == "4"
    plain = router_plan(SITE, FLEET, "sha256:abc", "0.1.17", "0" * 64)
    dp2 = router_plan(dict(SITE, NARWHAL_DATA_PARALLEL_SIZE=2), FLEET, "sha256:abc", "0.1.17", "0" * 64)
    assert dp2["config"] != plain["config"] and dp2["hash"] == plain["hash"]  # router.json: a reload


def test_engines_of_different_data_parallel_sizes_are_refused_by_name():
    engines = {"engine-1": {"data_parallel_size": 2}, "engine-2": {"data_parallel_size": 1}}
    with pytest.raises(PlanError) as err:
        router_args(SITE, fleet_workers(FLEET), engines)
    assert err.value.key == "NARWHAL_DATA_PARALLEL_SIZE"
    assert "engine-1 2, engine-2 1, engine-3 1" in str(err.value) and "one --intra-node-data-parallel-size" in \
        str(err.value)


def test_the_router_plan_filter_reads_per_node_data_parallel_sizes():
    """The roles' router_plan filter passes narwhal_site.engines: per-node NARWHAL_NODE_<n>_DATA_PARALLEL_SIZE
    reaches the router, and a fleet of mixed sizes is refused by name there too."""
    from ansible.errors import AnsibleFilterError

    from ansible_collections.narwhal.deploy.plugins.filter.narwhal import router_plan as router_plan_filter
    engines = dict((e, {"data_parallel_size": 2}) for e in ("engine-1", "engine-2", "engine-3"))
    plan = router_plan_filter({"site": SITE, "engines": engines}, FLEET, "sha256:abc", "0.1.17", "0" * 64)
    assert plan["config"]["args"][-2:] == ["--intra-node-data-parallel-size", "2"]
    assert plan["config"] != router_plan_filter({"site": SITE}, FLEET, "sha256:abc", "0.1.17", "0" * 64)["config"]
    assert json.loads(plan["workers_text"]) == plan["workers_doc"] and json.loads(plan["config_text"]) == plan["config"]
    engines["engine-2"] = {"data_parallel_size": 1}
    with pytest.raises(AnsibleFilterError) as err:
        router_plan_filter({"site": SITE, "engines": engines}, FLEET, "sha256:abc", "0.1.17", "0" * 64)
    assert "engine-1 2, engine-2 1, engine-3 2" in str(err.value)


# TLS and the bind (issue 35): the router binds its host's address unless NARWHAL_ROUTER_BIND says otherwise; with TLS
# narwhal_router.py's fronts end TLS on that address (vllm-router is on loopback either way, issue 36).
TLS_SITE = dict(SITE, NARWHAL_TLS="site", NARWHAL_ROUTER_BIND="")
CERT = {"cert": "/p/config/tls/hosts/router-1.crt", "key": "/p/config/tls/hosts/router-1.key", "sha256": "ab" * 32,
        "not_after": "2027-01-01T00:00:00Z", "days_left": 300, "names": ["10.0.0.21"]}


@pytest.mark.parametrize("bind, address, bound", [("", "10.0.0.21", "10.0.0.21"), ("", "fd00::21", "fd00::21"),
                                                  ("", " 10.0.0.21 ", "10.0.0.21"),
                                                  ("10.1.0.21", "router-1.lab", "10.1.0.21")])
def test_an_empty_bind_is_the_router_address(bind, address, bound):
    assert router_bind(dict(TLS_SITE, NARWHAL_ROUTER_BIND=bind), address) == bound


@pytest.mark.parametrize("address", ["router-1.lab", None, "", "[fd00::21]"])
def test_an_empty_bind_with_a_router_address_that_is_no_ip_address_is_refused_by_name(address):
    for tls in ("site", "off"):
        with pytest.raises(PlanError) as err:
            router_bind(dict(TLS_SITE, NARWHAL_TLS=tls), address)
        assert err.value.key == "NARWHAL_ROUTER_BIND"
        assert "router_address" in str(err.value) and "%r, not an IP address" % (address,) in str(err.value)


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "127.0.0.1", "127.0.0.2", "::1"])
def test_with_tls_a_wildcard_or_loopback_bind_is_refused_by_name(bind):
    for tls in ("site", "operator"):
        with pytest.raises(PlanError) as err:
            router_plan(dict(TLS_SITE, NARWHAL_TLS=tls, NARWHAL_ROUTER_BIND=bind), FLEET, "sha256:aa", "0.1.17", "c1",
                        "10.0.0.21", tls=CERT)
        assert err.value.key == "NARWHAL_ROUTER_BIND" and bind in str(err.value) and "NARWHAL_TLS=%s" % tls in \
            str(err.value)
    # without TLS the router binds them itself
    assert router_bind(dict(TLS_SITE, NARWHAL_TLS="off", NARWHAL_ROUTER_BIND=bind), "10.0.0.21") == bind


def test_with_tls_the_fronts_end_tls_on_the_router_address():
    config = router_config(TLS_SITE, fleet_workers(FLEET), address="10.0.0.21")
    assert "--host" not in config["args"]  # vllm-router: loopback, the start script's choice
    assert config["tls"] == {"cert": "/narwhal/tls/server.crt", "key": "/narwhal/tls/server.key"}
    assert config["fronts"] == [{"listen": ["10.0.0.21", 30000], "to": "port"},
                                {"listen": ["10.0.0.21", 29000], "to": "prometheus_port"}]
    plain = router_config(dict(TLS_SITE, NARWHAL_TLS="off"), fleet_workers(FLEET), address="10.0.0.21")
    assert "tls" not in plain and plain["fronts"] == config["fronts"]


def test_the_tls_plan_is_https_verifies_the_engines_and_restarts_on_a_new_certificate():
    fleet = [dict(e, url=e["url"].replace("http://", "https://")) for e in FLEET]
    plan = router_plan(TLS_SITE, fleet, "sha256:aa", "0.1.17", "c1", "10.0.0.21", tls=CERT)
    assert plan["url"] == "https://10.0.0.21:30000" and plan["metrics_url"] == "https://10.0.0.21:29000/metrics"
    assert plan["local_url"] == "https://10.0.0.21:30000" and plan["local_metrics_url"] == "https://10.0.0.21:29000"
    assert plan["env"] == ["SSL_CERT_FILE=/narwhal/tls/ca.crt"] and plan["tls"] is True
    assert plan["workers_doc"]["decode"][0] == "https://10.0.0.12:8000"
    assert "ab" * 32 not in json.dumps(plan["config"])  # the certificate's hash is the plan's, not router.json's
    renewed_cert = dict(CERT, sha256="cd" * 32, days_left=365)
    renewed = router_plan(TLS_SITE, fleet, "sha256:aa", "0.1.17", "c1", "10.0.0.21", tls=renewed_cert)
    assert renewed["hash"] != plan["hash"]
    # days left alone change nothing
    assert router_plan(TLS_SITE, fleet, "sha256:aa", "0.1.17", "c1", "10.0.0.21", tls=dict(CERT, days_left=1))["hash"] \
        == plan["hash"]
    off = router_plan(dict(TLS_SITE, NARWHAL_TLS="off"), FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")
    assert off["url"] == "http://10.0.0.21:30000" and "env" not in off and off["hash"] != plan["hash"]


def test_with_tls_a_router_host_without_its_certificate_is_refused():
    for tls in (None, {}, dict(CERT, sha256="")):
        with pytest.raises(PlanError) as err:
            router_plan(TLS_SITE, FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21", tls=tls)
        assert err.value.key == "NARWHAL_TLS" and "tls_material" in str(err.value)


def test_the_hash_is_that_of_the_container_fields():
    """The hash covers image, entrypoint, command, entry_sha256, dir, env, tls_sha256, ports, bind and log (issue 36:
    router.json and workers.json left it; a router of an earlier release is replaced once, drained)."""
    import hashlib

    plan = router_plan(dict(SITE, NARWHAL_ROUTER_BIND="10.0.0.21"), FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")
    fields = dict((k, plan[k]) for k in ("image", "entrypoint", "command", "entry_sha256", "dir", "port",
                                         "metrics_port", "bind", "log"))
    assert plan["hash"] == hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()


def test_the_certificate_names_the_router_address_and_a_bind_of_its_own():
    assert tls_names(TLS_SITE, "10.0.0.21") == ["10.0.0.21"]
    assert tls_names(dict(TLS_SITE, NARWHAL_ROUTER_BIND="10.1.0.21"), "router-1.lab") == ["router-1.lab", "10.1.0.21"]


def test_the_local_url_filter_follows_the_bind_and_tls():
    from ansible.errors import AnsibleFilterError

    from ansible_collections.narwhal.deploy.plugins.filter.narwhal import router_local_url, router_tls_names

    assert router_local_url({"site": TLS_SITE}, "fd00::21") == "https://[fd00::21]:30000"
    assert router_local_url({"site": dict(TLS_SITE, NARWHAL_TLS="off", NARWHAL_ROUTER_BIND="::")}, "fd00::21") \
        == "http://[::1]:30000"
    with pytest.raises(AnsibleFilterError, match="NARWHAL_ROUTER_BIND is empty"):
        router_local_url({"site": TLS_SITE}, "router-1.lab")
    assert router_tls_names({"site": TLS_SITE}, "10.0.0.21") == ["10.0.0.21"]


# ------------------------------------------------------------------------------ routing policies and KV events

KV_FLEET = [
    dict(FLEET[0], kv_events=["tcp://10.0.0.11:5557", "tcp://10.0.0.11:5558"]),
    dict(FLEET[1], kv_events=["tcp://10.0.0.12:5557", "tcp://10.0.0.12:5558"]),
    dict(FLEET[2], kv_events=["tcp://[fd00::13]:5557", "tcp://[fd00::13]:5558"]),
]


def _policies(args):
    return [args[args.index(flag) + 1] for flag in ("--prefill-policy", "--decode-policy")]


def test_each_role_gets_its_policy_and_the_shared_one_when_it_has_none():
    assert _policies(router_args(SITE, fleet_workers(FLEET))) == ["round_robin", "round_robin"]
    site = dict(SITE, NARWHAL_ROUTER_POLICY="power_of_two", NARWHAL_ROUTER_DECODE_POLICY="cache_aware")
    args = router_args(site, fleet_workers(FLEET))
    assert _policies(args) == ["power_of_two", "cache_aware"] and "--policy" not in args
    assert "--pd-kv-events" not in args  # the start script adds them from workers.json


def test_a_kv_aware_prefill_policy_subscribes_to_the_fleets_prefill_endpoints():
    site = dict(SITE, NARWHAL_ROUTER_PREFILL_POLICY="kv_aware")
    workers = fleet_workers(KV_FLEET)
    assert workers["prefill"][0]["kv_events"] == KV_FLEET[0]["kv_events"]
    plan = router_plan(site, KV_FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")
    assert _policies(plan["config"]["args"]) == ["kv_aware", "round_robin"]
    # the base URL as key (vllm-router refuses <url>@<rank>), the endpoints by DP rank; the prefill workers only
    assert plan["workers_doc"] == {"prefill": ["http://10.0.0.11:8000"],
                                   "decode": ["http://10.0.0.12:8000", "http://[fd00::13]:8000"],
                                   "kv_events": {"http://10.0.0.11:8000": KV_FLEET[0]["kv_events"]}}
    # no kv_aware prefill policy: workers.json is what it was, whatever the fleet publishes
    assert router_plan(SITE, KV_FLEET, "sha256:aa", "0.1.17", "c1")["workers_doc"] == \
        router_plan(SITE, FLEET, "sha256:aa", "0.1.17", "c1")["workers_doc"]
    # the policy is a reload, not a new container
    assert plan["hash"] == router_plan(SITE, KV_FLEET, "sha256:aa", "0.1.17", "c1", "10.0.0.21")["hash"]


def test_kv_aware_over_a_fleet_without_kv_events_is_refused_by_name():
    with pytest.raises(PlanError) as err:
        router_args(dict(SITE, NARWHAL_ROUTER_POLICY="kv_aware"), fleet_workers(FLEET))
    assert err.value.key == "NARWHAL_ROUTER_POLICY"
    assert "is kv_aware, but the fleet's prefill engine(s) engine-1 publish no KV events" in str(err.value)
    # a decode policy of kv_aware asks nothing of the fleet: vllm-router feeds events to the prefill policy only
    assert _policies(router_args(dict(SITE, NARWHAL_ROUTER_DECODE_POLICY="kv_aware"), fleet_workers(FLEET))) == [
        "round_robin", "kv_aware"]


@pytest.mark.parametrize("kv", ["tcp://10.0.0.11:5557", [], ["http://10.0.0.11:5557"], ["tcp://10.0.0.11"],
                                ["tcp://10.0.0.11:5557,tcp://10.0.0.11:5558"]])
def test_kv_events_the_router_cannot_subscribe_to_are_refused(kv):
    with pytest.raises(PlanError) as err:
        fleet_workers([dict(FLEET[0], kv_events=kv), FLEET[1]])
    assert "engine-1 has kv_events" in str(err.value) and "rerun discovery" in str(err.value)


def _flow(args):
    """The admission options of a command line -> {option: value}."""
    names = ("--max-concurrent-requests", "--queue-size", "--queue-timeout-secs", "--rate-limit-tokens-per-second")
    return dict((a, args[i + 1]) for i, a in enumerate(args) if a in names)


def test_the_router_refuses_at_once_beyond_its_cap_by_default():
    """No queue (a waiting request gets 408 after up to a second in vllm-router 0.1.17: refused at once instead) and
    the slowest refill vllm-router takes (1 request per second beyond the finished ones); the cap, unset, is 1024 per
    decode engine rank: two decode engines, DP 1 -> 2048, DP 2 -> 4096."""
    workers = fleet_workers(FLEET)
    assert _flow(router_args(SITE, workers)) == {"--max-concurrent-requests": "2048", "--queue-size": "0",
                                                 "--queue-timeout-secs": "1", "--rate-limit-tokens-per-second": "1"}
    assert _flow(router_args(dict(SITE, NARWHAL_DATA_PARALLEL_SIZE=2), workers))["--max-concurrent-requests"] == "4096"
    engines = dict((e, {"data_parallel_size": 4}) for e in ("engine-1", "engine-2", "engine-3"))
    assert _flow(router_args(SITE, workers, engines))["--max-concurrent-requests"] == "8192"
    # the DP size stays the last option, the worker set the start script's
    assert router_args(SITE, workers, engines)[-2:] == ["--intra-node-data-parallel-size", "4"]


def test_the_operators_flow_control_inputs_reach_the_command_line_and_change_only_router_json():
    workers = fleet_workers(FLEET)
    site = dict(SITE, NARWHAL_ROUTER_MAX_CONCURRENT=64, NARWHAL_ROUTER_QUEUE_SIZE=16, NARWHAL_ROUTER_QUEUE_TIMEOUT=5,
                NARWHAL_ROUTER_RATE_LIMIT=10)
    assert _flow(router_args(site, workers)) == {"--max-concurrent-requests": "64", "--queue-size": "16",
                                                 "--queue-timeout-secs": "5", "--rate-limit-tokens-per-second": "10"}
    # the cap set by hand does not follow the fleet
    assert _flow(router_args(dict(site, NARWHAL_DATA_PARALLEL_SIZE=2), workers))["--max-concurrent-requests"] == "64"
    plain = router_plan(SITE, FLEET, "sha256:abc", "0.1.17", "0" * 64)
    tuned = router_plan(site, FLEET, "sha256:abc", "0.1.17", "0" * 64)
    assert tuned["config"] != plain["config"] and tuned["hash"] == plain["hash"]  # router.json: a reload


def test_the_router_command_line_parses_with_vllm_routers_own_parser():
    """The start script hands router.json's args to vllm_router.launch_router.parse_router_args: every flow-control
    option is one it knows, with the value it reads."""
    from vllm_router.launch_router import parse_router_args

    workers = fleet_workers(FLEET)
    site = dict(SITE, NARWHAL_ROUTER_MAX_CONCURRENT=64, NARWHAL_ROUTER_QUEUE_SIZE=16, NARWHAL_ROUTER_RATE_LIMIT=10)
    parsed = parse_router_args(router_args(site, workers) + ["--prefill", "http://p:1", "--decode", "http://d:1"])
    assert (parsed.max_concurrent_requests, parsed.queue_size, parsed.queue_timeout_secs,
            parsed.rate_limit_tokens_per_second) == (64, 16, 1, 10)
