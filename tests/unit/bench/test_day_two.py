"""bench/day_two.py (`make day-two`): the pure parts, the figures of an operation from the recorded requests, the
site's .env, the table and what --strict refuses. The benchmark itself needs a simulated site and is not run by the
suite (docs/day-two.md)."""
from __future__ import annotations

import sys

import pytest
from test_support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))

import day_two  # noqa: E402 - bench/day_two.py

REFS = ["a0", "b1"] + ["x"] * (len(day_two.PROMPTS) - 2)


def _ok(sent, done, prompt=0, text=None):
    return {"sent": sent, "done": done, "prompt": prompt, "ok": True, "text": REFS[prompt] if text is None else text}


def _failed(sent, done, error="APIStatusError: Error code: 500"):
    return {"sent": sent, "done": done, "prompt": 0, "ok": False, "error": error}


def test_figures_count_the_window_and_find_the_longest_gap():
    records = [_ok(9.0, 9.5),                      # before the window: not counted
               _ok(10.0, 10.2), _ok(10.2, 10.4, prompt=1),
               _failed(10.4, 10.5), _failed(10.6, 10.7, "APIConnectionError: Connection error."),
               _failed(10.8, 10.9),
               _ok(11.0, 13.4, prompt=1, text="b2"),  # answered, but not the reference
               _ok(13.5, 13.6),
               _ok(20.5, 20.6)]                    # after the window: not counted
    fig = day_two.summarize(records, REFS, 10.0, 15.0)
    assert (fig["requests"], fig["failed"], fig["failed_in_a_row"], fig["differ"]) == (7, 3, 3, 1)
    assert fig["first_error"] == "APIStatusError: Error code: 500"
    assert fig["errors"] == [{"error": "APIStatusError: Error code: 500", "count": 2},
                             {"error": "APIConnectionError: Connection error.", "count": 1}]
    assert fig["first_difference"] == {"prompt": day_two.PROMPTS[1], "reference": "b1", "answer": "b2"}
    # successes done at 10.2, 10.4, 13.4, 13.6: the longest gap is 10.4 -> 13.4; the window's end is 1.4 s later
    assert fig["longest_gap_s"] == 3.0


def test_a_window_without_success_is_one_gap():
    fig = day_two.summarize([_failed(1.0, 1.5), _failed(2.0, 2.5)], REFS, 0.0, 6.0)
    assert (fig["requests"], fig["failed"], fig["failed_in_a_row"], fig["longest_gap_s"]) == (2, 2, 2, 6.0)
    clean = day_two.summarize([_ok(0.5, 0.7), _ok(1.0, 1.2)], REFS, 0.0, 1.5)
    assert (clean["failed"], clean["differ"], clean["first_error"], clean["longest_gap_s"]) == (0, 0, None, 0.7)


def test_env_is_the_operators_file_with_the_edits():
    text = day_two.env_text(20, {"NARWHAL_NODE_1_EXTRA_ARGS": "--max-num-seqs 64",
                                 "NARWHAL_IMAGE": day_two.NEXT_IMAGE})
    lines = text.splitlines()
    assert "NARWHAL_NODE_1_EXTRA_ARGS='--max-num-seqs 64'" in lines
    assert "NARWHAL_IMAGE=narwhal-sim/engine-standin:next" in lines
    assert "NARWHAL_IMAGE=narwhal-sim/engine-standin:latest" not in lines
    assert "NARWHAL_ENGINE_ENV=NARWHAL_STANDIN_LOAD_S=20" in lines
    assert [line for line in lines if line.endswith("_ROLE=prefill")] == ["NARWHAL_NODE_1_ROLE=prefill",
                                                                          "NARWHAL_NODE_3_ROLE=prefill"]
    assert "NARWHAL_ENGINE_ENV" not in day_two.env_text(0, {})


def _row(name, **kw):
    row = {"operation": name, "requests": 100, "failed": 0, "failed_in_a_row": 0, "first_error": None, "differ": 0,
           "first_difference": None, "longest_gap_s": 0.4, "whole_after_s": 12.5, "not_whole": None,
           "action": {"rc": 0, "action_s": 10.0, "detail": "site rc 0"}}
    row.update(kw)
    return row


def test_table_and_strict():
    doc = {"started_at": "20261206T000000Z", "commit": "ee6dc23", "rate": 5.0, "load_s": 20, "client": "openai",
           "operations": [_row("replace-prefill"),
                          _row("upgrade", failed=3, first_error="APIStatusError: 500 | mismatch", differ=1,
                               first_difference={"prompt": "p", "reference": "a", "answer": "b"}),
                          _row("host-cut", whole_after_s=None, not_whole="router: engine-3 unhealthy", failed=4,
                               failed_after_drop=1, first_error_after_drop="APIConnectionError",
                               action={"rc": 0, "action_s": 50.0, "detail": "cut", "cut_rc": 2,
                                       "cut_closing": ["engine-3 failed"]}),
                          _row("router-restart", action={"rc": 1, "action_s": 0.1, "detail": "docker restart"}),
                          {"operation": "kill-engine", "skipped": "no such engine"}]}
    text = day_two.table(doc)
    assert "| replace-prefill | 100 | 0 | - | 0 | 0 | 0.4 | 12.5 | 10.0 | - |" in text
    assert "APIStatusError: 500 \\| mismatch" in text
    assert "| host-cut | 100 | 4 | 1 | 0 | 0 | 0.4 | not within %d s |" % day_two.WHOLE_TIMEOUT_S in text
    assert "| kill-engine | skipped: no such engine |" in text
    found = day_two.problems(doc)
    assert found[0].startswith("upgrade: 3 of 100 requests failed, first: APIStatusError")
    assert found[1].startswith("upgrade: 1 answers differ")
    # a lost host: the requests that failed before the router dropped it are not counted, those after are
    assert found[2] == "host-cut: 1 requests failed after the router had dropped the host, first: APIConnectionError"
    assert found[3].startswith("host-cut: the site run with the host off did not go on for the others (rc 2, want 4")
    assert found[4] == "host-cut: the fleet was not whole within %d s (router: engine-3 unhealthy)" \
        % day_two.WHOLE_TIMEOUT_S
    assert found[5:] == ["router-restart: docker restart", "kill-engine: skipped (no such engine)"]
    cut = _row("host-cut", failed=4, failed_after_drop=0, first_error_after_drop=None,
               action={"rc": 0, "action_s": 50.0, "detail": "cut", "cut_rc": 4,
                       "cut_closing": ["engine-3 engine-3 prefill ... unreachable"]})
    assert day_two.problems({"operations": [cut]}) == []
    assert day_two.problems({"operations": [_row("replace-prefill")]}) == []


def test_ops_are_checked_and_kept_in_order(capsys):
    assert day_two.parse(["--ops", "upgrade, replace-prefill"]).ops == ["replace-prefill", "upgrade"]
    assert day_two.parse([]).ops == list(day_two.OPS)
    with pytest.raises(SystemExit):
        day_two.parse(["--ops", "replace-prefil"])
    assert "--ops: unknown operation(s) replace-prefil; choose from replace-prefill" in capsys.readouterr().err


class _StatusError(Exception):
    status_code = 500

    def __init__(self, body):
        super().__init__("Error code: 500")
        self.response = type("Response", (), {"text": body})()


def test_error_text_says_what_the_router_answered():
    assert day_two.error_text(_StatusError("KV transfer failed\n")) == "_StatusError: HTTP 500 KV transfer failed"
    assert day_two.error_text(_StatusError("")) == "_StatusError: HTTP 500 (empty body)"
    try:
        try:
            raise ConnectionResetError("Server disconnected without sending a response.")
        except ConnectionResetError as cause:
            raise RuntimeError("Connection error.") from cause
    except RuntimeError as exc:
        assert day_two.error_text(exc) == ("RuntimeError: Connection error. (ConnectionResetError: Server "
                                           "disconnected without sending a response.)")
