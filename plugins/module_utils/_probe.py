# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runtime transfer probe, pure parts: the P/D request pair (VLLM_FACTS.md "P/D request flow"), the NIXL
metrics that prove KV moved, and the verdict."""

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
    return {
        "bytes_transferred": metric_sum(text, "vllm:nixl_bytes_transferred_sum"),
        "failed_transfers": metric_sum(text, "vllm:nixl_num_failed_transfers_total"),
        "external_prompt_tokens": _labelled(text, "vllm:prompt_tokens_by_source_total", "external_kv_transfer"),
    }


def _labelled(text, name, source):
    total, seen = 0.0, False
    for line in (text or "").splitlines():
        m = METRIC.match(line.strip())
        if m and m.group(1) == name and ('source="%s"' % source) in (m.group(2) or ""):
            total += float(m.group(3))
            seen = True
    return total if seen else None


def producer_request(model, prompt):
    return {"model": model, "prompt": prompt, "max_tokens": 1, "stream": False, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}}


def consumer_request(model, prompt, kv_transfer_params, max_tokens=8):
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": False, "temperature": 0,
            "kv_transfer_params": kv_transfer_params}


def reference_request(model, prompt, salt, max_tokens=8):
    """The same greedy request computed locally on the consumer: no kv_transfer_params, and a `cache_salt` the
    transferred blocks do not carry, so the prefix cache cannot serve it from them (a true recomputation)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": False, "temperature": 0,
            "cache_salt": salt}


def completion_text(body):
    """The first choice's text of a completions answer, or None."""
    if not isinstance(body, dict):
        return None
    choices = body.get("choices") or []
    return choices[0].get("text") if choices and isinstance(choices[0], dict) else None


def recompute_reasons(consumer_text, reference):
    """Reasons why the consumer's output (decoded over transferred KV) is not the local recomputation's."""
    status, body = reference
    if status != 200:
        return ["the local recomputation on the consumer answered HTTP %s" % status]
    expected = completion_text(body)
    if consumer_text != expected:
        return ["consumer output %r differs from its local recomputation %r: the transferred KV is not the "
                "prompt's" % (consumer_text, expected)]
    return []


def verdict(producer, consumer, before, after):
    """-> (ok, reasons). `producer`/`consumer` = (status, json or None); before/after = nixl_counters of the
    consumer. KV moved only if the bytes counter grew and the failure counter did not."""
    reasons = []
    p_status, p_body = producer
    c_status, c_body = consumer
    if p_status != 200:
        reasons.append("producer answered HTTP %s" % p_status)
    params = (p_body or {}).get("kv_transfer_params") if isinstance(p_body, dict) else None
    if p_status == 200 and not params:
        reasons.append("producer returned no kv_transfer_params (is NixlConnector configured with kv_both?)")
    if c_status != 200:
        reasons.append("consumer answered HTTP %s" % c_status)
    choices = (c_body or {}).get("choices") or [] if isinstance(c_body, dict) else []
    if any(ch.get("finish_reason") == "error" for ch in choices):
        reasons.append("consumer finished with reason 'error' (failed KV load)")
    if before.get("bytes_transferred") is None or after.get("bytes_transferred") is None:
        reasons.append("consumer exposes no vllm:nixl_bytes_transferred metric")
    elif after["bytes_transferred"] <= before["bytes_transferred"]:
        reasons.append("consumer's vllm:nixl_bytes_transferred did not grow (%s -> %s): the prompt was recomputed, "
                       "KV did not move" % (before["bytes_transferred"], after["bytes_transferred"]))
    if (after.get("failed_transfers") or 0) > (before.get("failed_transfers") or 0):
        reasons.append("consumer's vllm:nixl_num_failed_transfers grew (%s -> %s)"
                       % (before.get("failed_transfers"), after.get("failed_transfers")))
    return not reasons, reasons
