"""Traffic through the router, pure parts (plugins/module_utils/_router/traffic.py): the request matrix, answer and
stream texts, the KV evidence and the engines each request reached."""

from ansible_collections.narwhal.deploy.plugins.module_utils._router.traffic import (
    answer_text,
    answer_tokens,
    coverage_problems,
    kv_evidence,
    matrix,
    prompt,
    request_body,
    same_answer,
    served,
    stream_text,
    usage_tokens,
)


def test_one_round_covers_both_endpoints_streamed_and_not_short_and_long():
    assert len(matrix()) == len(set(matrix())) == 8
    assert {m[0] for m in matrix()} == {"completions", "chat"} and {m[2] for m in matrix()} == {"short", "long"}


def test_short_prompts_are_under_one_block_and_long_ones_span_several():
    assert len(prompt("id", "short", 16).split()) < 16
    assert len(prompt("id", "long", 16).split()) > 16 and len(prompt("id", "long", 32).split()) > 32
    assert prompt("a", "long", 16) != prompt("b", "long", 16)


def test_request_bodies_are_greedy_and_ask_for_usage_when_streamed():
    chat = request_body("chat", "m", "hello", 8, True)
    assert chat["messages"] == [{"role": "user", "content": "hello"}] and chat["temperature"] == 0
    assert chat["stream_options"] == {"include_usage": True} and chat["return_token_ids"] is True
    plain = request_body("completions", "m", "hello", 8, False, salt="s")
    assert plain["prompt"] == "hello" and plain["cache_salt"] == "s" and "stream_options" not in plain


def test_texts_of_answers_and_streams():
    assert answer_text("chat", {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}) == "hi"
    assert answer_text("completions", {"choices": [{"text": " t1"}]}) == " t1"
    assert answer_text("completions", "Internal Server Error") is None
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": " a"}}]},
              {"choices": [{"index": 0, "delta": {"content": " b"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 20, "prompt_tokens_details": {"cached_tokens": 20}}}]
    text, usage, finish, ids = stream_text("chat", events)
    assert (text, finish, usage_tokens(usage), ids) == (" a b", "length", (20, 20), None)
    two = [{"choices": [{"index": 0, "text": "x"}]}, {"choices": [{"index": 1, "text": "y"}]}]
    assert stream_text("completions", two)[0] == "x"


def _c(transfers, failed=0.0, finished=0.0):
    return {"transfers": transfers, "failed_transfers": failed, "finished_requests": finished}


def test_kv_evidence_prefers_the_request_and_never_passes_a_failed_transfer():
    before, after = {"engine-2": _c(1.0)}, {"engine-2": _c(2.0)}
    assert kv_evidence(14, before, after)[0] == "cached_tokens=14"
    assert kv_evidence(None, before, after)[:2] == ("nixl transfers grew on engine-2", ["engine-2"])
    evidence, _grew, problem = kv_evidence(0, before, {"engine-2": _c(1.0)})
    assert evidence is None and "recomputed" in problem
    evidence, _grew, problem = kv_evidence(14, before, {"engine-2": _c(2.0, failed=1.0)})
    assert evidence is None and "failed transfers" in problem
    assert kv_evidence(None, {"engine-2": None}, {"engine-2": None})[2] == "no decode engine's NIXL transfers grew"


def test_served_and_coverage():
    before = {"engine-1": _c(0, finished=3.0), "engine-2": _c(0, finished=1.0)}
    after = {"engine-1": _c(0, finished=4.0), "engine-2": _c(0, finished=1.0)}
    assert served(before, after) == ["engine-1"]
    workers = {"prefill": [{"engine": "engine-1"}], "decode": [{"engine": "engine-2"}]}
    assert coverage_problems(workers, {"engine-1": 2, "engine-2": 0}) == [
        "engine-2 served no request through the router"]
    assert coverage_problems(workers, {"engine-1": 2, "engine-2": 1}) == []


def test_token_ids_of_answers_and_streams():
    assert answer_tokens({"choices": [{"text": " a", "token_ids": [5, 6]}]}) == [5, 6]
    assert answer_tokens({"choices": [{"text": " a", "token_ids": None}]}) is None
    assert answer_tokens({"choices": [{"text": " a", "token_ids": ["5"]}]}) is None
    assert answer_tokens({"choices": [{"text": " a", "token_ids": [True]}]}) is None
    # a stream whose text the detokenizer held back still carries its tokens (vLLM 0.32, return_token_ids)
    held = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"content": ""}, "token_ids": [226]}]},
            {"choices": [{"index": 0, "delta": {"content": ""}, "token_ids": [128], "finish_reason": "length"}]}]
    assert stream_text("chat", held)[0] == "" and stream_text("chat", held)[3] == [226, 128]


def test_answers_compare_as_tokens_where_both_sides_carry_them():
    direct = {"engine-2": ("\ufffd", [226, 128]), "engine-3": ("\ufffd", [226, 128])}
    assert same_answer("", [226, 128], direct) == (True, "token ids")
    assert same_answer("", [226, 129], direct) == (False, "token ids")
    assert same_answer(" a", None, {"engine-2": (" a", None)}) == (True, "text")
    assert same_answer(" a", [1], {"engine-2": (" a", None)}) == (True, "text")
    assert same_answer(" b", None, {"engine-2": (" a", [1])}) == (False, "text")
    assert same_answer("", None, {"engine-2": ("", None)}) == (False, "text")
    assert same_answer(" a", [1], {}) == (False, "text")
