"""Transfer probe verdicts over vLLM-style metrics text."""

from ansible_collections.narwhal.deploy.plugins.module_utils._probe import (
    completion_text,
    consumer_request,
    metric_sum,
    nixl_counters,
    producer_request,
    recompute_reasons,
    reference_request,
    verdict,
)

METRICS = """# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_sum{model_name="tiny",engine="0"} 3584.0
vllm:nixl_bytes_transferred_count{model_name="tiny",engine="0"} 1.0
vllm:nixl_num_failed_transfers_total{model_name="tiny",engine="0"} 0.0
vllm:prompt_tokens_by_source_total{model_name="tiny",source="external_kv_transfer"} 14.0
vllm:prompt_tokens_by_source_total{model_name="tiny",source="local_compute"} 2.0
"""
ZERO = {"bytes_transferred": 0.0, "failed_transfers": 0.0, "external_prompt_tokens": 0.0}
PARAMS = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": "e", "remote_host": "10.0.0.11",
          "remote_port": 5600}
OK_P = (200, {"choices": [{"finish_reason": "length"}], "kv_transfer_params": PARAMS})
OK_C = (200, {"choices": [{"finish_reason": "length"}]})


def test_counters_parse_labelled_samples():
    assert nixl_counters(METRICS) == {"bytes_transferred": 3584.0, "failed_transfers": 0.0,
                                      "external_prompt_tokens": 14.0}
    assert metric_sum("other 1\n", "vllm:nixl_bytes_transferred_sum") is None


def test_requests_follow_the_pd_flow():
    p = producer_request("tiny", "hi")
    assert p["max_tokens"] == 1 and p["kv_transfer_params"]["do_remote_decode"] is True
    assert p["kv_transfer_params"]["do_remote_prefill"] is False
    assert consumer_request("tiny", "hi", PARAMS)["kv_transfer_params"] is PARAMS


def test_kv_moved_passes():
    assert verdict(OK_P, OK_C, ZERO, nixl_counters(METRICS)) == (True, [])


def test_silent_recompute_fails():
    ok, reasons = verdict(OK_P, OK_C, nixl_counters(METRICS), nixl_counters(METRICS))
    assert not ok and "did not grow" in reasons[0]


def test_failed_load_and_missing_params_fail():
    grown = dict(ZERO, bytes_transferred=10.0, failed_transfers=1.0)
    ok, reasons = verdict(OK_P, (500, {"object": "error"}), ZERO, grown)
    assert not ok and "consumer answered HTTP 500" in reasons and any("failed_transfers grew" in r for r in reasons)
    ok, reasons = verdict((200, {"choices": []}), (0, None), ZERO, ZERO)
    assert not ok and any("no kv_transfer_params" in r for r in reasons)
    ok, reasons = verdict(OK_P, (200, {"choices": [{"finish_reason": "error"}]}), ZERO, nixl_counters(METRICS))
    assert not ok and any("finish" in r for r in reasons)


def test_missing_metric_fails():
    ok, reasons = verdict(OK_P, OK_C, nixl_counters(""), nixl_counters(""))
    assert not ok and "no vllm:nixl_bytes_transferred metric" in reasons[0]


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
    assert filters.probe_row(row) == ("engine-1 -> engine-2: PASS, 32768.0 bytes of KV via [fd00:6e77:e1::11]:5600 "
                                      "in 0.28s (decode 0.18s), output = local recomputation")
    row.update(ok=False, reasons=["x"], matches_recompute=None, remote_host="10.0.0.1")
    assert filters.probe_row(row).endswith("FAIL (x), 32768.0 bytes of KV via 10.0.0.1:5600 in 0.28s (decode 0.18s)")
