# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Traffic through the router, pure parts (docs/vllm-requirements.md, "Traffic through the router"): the request matrix
(completions and chat completions, streamed and not, prompts shorter and longer than one KV block), the text of an
answer or a stream, the evidence that KV moved for one request, and the verdict.

Each prompt starts with a fresh ID, so no engine holds any of its blocks in its prefix cache; the decode engines'
own answers are asked with a `cache_salt` the transferred blocks do not carry, so they are computed from the
prompt (the transfer probe's reference request, _probe/verdict.py)."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import nixl_counters

__metaclass__ = type

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def prompt(unique, kind, block_size):
    """A short prompt (a few tokens: under one block of `block_size`) or a long one: one and a half blocks of words,
    so more than one block with any tokenizer (a word is at least one token) and still far from a small
    --max-model-len."""
    if kind == "short":
        return "%s hi" % unique
    count = block_size + block_size // 2
    words = (WORDS * (1 + count // len(WORDS)))[:count]
    return "%s %s" % (unique, " ".join(words))


def request_body(endpoint, model, text, max_tokens, stream, salt=None):
    """One greedy request. return_token_ids (vLLM's CompletionRequest and ChatCompletionRequest) adds the generated
    token IDs to every choice and stream chunk: the answers are compared as tokens, which a detokenizer cannot
    hold back (an incremental detokenizer keeps a byte-level BPE piece that does not finish a UTF-8 character
    out of a stream, while the whole answer decodes it)."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": stream, "return_token_ids": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if stream:
        body["stream_options"] = {"include_usage": True}
    if salt:
        body["cache_salt"] = salt
    return body


def matrix():
    """Every (endpoint, stream, prompt kind) of one round, in a fixed order."""
    return [(e, s, k) for e in ("completions", "chat") for s in (False, True) for k in ("short", "long")]


def _token_ids(choice):
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    return None


def answer_text(endpoint, body):
    """The first choice's text of a non-streamed answer, or None."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return None
    if endpoint == "chat":
        message = choices[0].get("message")
        return message.get("content") if isinstance(message, dict) else None
    return choices[0].get("text")


def answer_tokens(body):
    """The first choice's generated token IDs of a non-streamed answer (return_token_ids), or None."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return None
    return _token_ids(choices[0])


def stream_text(endpoint, events):
    """(text, usage, finish_reason, token IDs or None) of a stream's events: the pieces and token IDs of choice 0
    joined, the usage chunk's usage."""
    pieces, usage, finish, ids, with_ids = [], None, None, [], False
    for event in events:
        if not isinstance(event, dict):
            continue
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            piece = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
            if isinstance(piece, str):
                pieces.append(piece)
            chunk_ids = _token_ids(choice)
            if chunk_ids is not None:
                with_ids = True
                ids.extend(chunk_ids)
            finish = choice.get("finish_reason") or finish
    return "".join(pieces), usage, finish, (ids if with_ids else None)


def same_answer(got_text, got_ids, direct):
    """Whether the router's answer equals every decode engine's own ({engine: (text, token IDs or None)}): as token
    IDs where both sides carry them, else as text. -> (equal, how it was compared)."""
    if not direct or (not got_text and not got_ids):
        return False, "text"
    if got_ids is not None and all(ids is not None for _text, ids in direct.values()):
        return all(ids == got_ids for _text, ids in direct.values()), "token ids"
    return all(text == got_text for text, _ids in direct.values()), "text"


def usage_tokens(usage):
    """(prompt_tokens, cached_tokens) of a usage object; None where absent."""
    if not isinstance(usage, dict):
        return None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt_tokens = usage.get("prompt_tokens")
    return (prompt_tokens if isinstance(prompt_tokens, int) else None,
            cached if isinstance(cached, int) and not isinstance(cached, bool) else None)


def counters(texts):
    """{engine: nixl_counters} of {engine: /metrics text or None}."""
    return dict((engine, nixl_counters(text) if text is not None else None) for engine, text in texts.items())


def _grew(before, after, key):
    if not before or not after or before.get(key) is None or after.get(key) is None:
        return 0.0
    return after[key] - before[key]


def kv_evidence(cached_tokens, decode_before, decode_after):
    """How this request's KV is proven to have moved: the consumer's own count of prompt tokens it did not compute
    (usage.prompt_tokens_details.cached_tokens, with --enable-prompt-tokens-details), else the growth of a decode
    engine's NIXL transfers. -> (evidence or None, the decode engines whose transfers grew)."""
    grew = sorted(e for e in decode_after if _grew(decode_before.get(e), decode_after.get(e), "transfers") > 0)
    failed = sorted(e for e in decode_after
                    if _grew(decode_before.get(e), decode_after.get(e), "failed_transfers") > 0)
    if failed:
        return None, grew, "NIXL failed transfers grew on %s" % ", ".join(failed)
    if cached_tokens:
        return "cached_tokens=%d" % cached_tokens, grew, None
    if grew:
        return "nixl transfers grew on %s" % ", ".join(grew), grew, None
    if cached_tokens == 0:
        return None, grew, "the decode engine counts 0 cached tokens and no NIXL transfer grew: it recomputed"
    return None, grew, "no decode engine's NIXL transfers grew"


def served(before, after):
    """Engines whose finished requests grew between two {engine: nixl_counters} readings."""
    return sorted(e for e in after if _grew(before.get(e), after.get(e), "finished_requests") > 0)


def coverage_problems(fleet_workers, served_by):
    """Engines of the fleet that served no request through the router."""
    missing = [w["engine"] for role in ("prefill", "decode") for w in fleet_workers[role]
               if not served_by.get(w["engine"])]
    return ["%s served no request through the router" % ", ".join(missing)] if missing else []
