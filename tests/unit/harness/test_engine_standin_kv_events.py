"""The stand-in engine's prefix cache, prefill cost and KV events (tests/harness/images/engine-standin/site/vllm/
standin/prefix_cache.py, kv_events.py, server.py) against what the real vLLM 0.32.0 code computes
(tests/fixtures/recorded/vllm-0.32.0-kv-events: hashes, msgpack bytes, endpoint rules, config refusals, render
shapes), its counters as vLLM counts them, and its events on the wire, read with a ZMQ subscriber as vllm-router
reads them."""
import json
import re
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq
from test_support import standin as _standin
from test_support.paths import RECORDED
from test_support.standin import KEY, TINY, engine_log, engine_process, free_port

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import is_secret_name

GOLDEN = json.loads((RECORDED / "vllm-0.32.0-kv-events" / "golden.json").read_text())
WORDS = ["w%d" % i for i in range(64)]


def words(n, start=0):
    return " ".join(WORDS[start:start + n])


@pytest.fixture
def modules(monkeypatch):
    with _standin.loaded("0.33.0", monkeypatch) as loaded:
        yield loaded


@pytest.fixture
def engine(modules, monkeypatch):
    """start(*flags) -> (url, state) of an in-process engine; every engine stopped after the test."""
    servers = []

    def start(*flags):
        return _standin.start_engine(modules, monkeypatch, servers, *flags, model_config=TINY)

    yield start
    _standin.stop(servers)


def call(url, path, body=None, headers=None, key=KEY):
    data = None if body is None else json.dumps(body).encode()
    head = dict({"Content-Type": "application/json"}, **(headers or {}))
    if key:
        head["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST", headers=head)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read() or b"null") if path != "/metrics" else resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def complete(url, prompt, headers=None, **extra):
    status, out = call(url, "/v1/completions", dict({"model": "tiny", "prompt": prompt, "max_tokens": 1}, **extra),
                       headers)
    assert status == 200, out
    return out


def metric(url, name, **labels):
    text = call(url, "/metrics")[1]
    want = dict(labels)
    found = []
    for line in text.splitlines():
        m = re.match(r'^([a-z_:]+)\{(.*)\} (\S+)$', line)
        if m and m.group(1) == name:
            have = dict(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2)))
            if all(have.get(k) == v for k, v in want.items()):
                found.append(float(m.group(3)))
    assert len(found) == 1, (name, labels, found)
    return found[0]


# ------------------------------------------------------------------------------------------------
# against the real code's values


def test_block_hashes_are_vllms(modules):
    server, _serve = modules
    for key, real in GOLDEN["hashes"].items():
        algo, seed = key.split("/")
        cache = server.prefix_cache.PrefixCache(16, 10, algo, {} if seed == "None" else {"PYTHONHASHSEED": seed})
        assert cache.none_hash.hex() == real["none_hash"], key
        assert [h.hex() for h in cache.block_hashes(GOLDEN["tokens"])] == real["blocks"], key
    cache = server.prefix_cache.PrefixCache(16, 10, "sha256", {})
    assert [cache.external(h) for h in cache.block_hashes(GOLDEN["tokens"])] == GOLDEN["int_block_hashes"]
    raw = server.prefix_cache.PrefixCache(16, 10, "sha256", {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"})
    assert raw.external(b"\x01" * 32) == b"\x01" * 32


def test_events_are_vllms_maps_and_bytes(modules):
    """The events the cache writes are the maps msgspec writes for vLLM's structs, in the same order, and the batch
    is msgspec's bytes."""
    server, _serve = modules
    for key, env, rank in (("batch_int_rank0", {}, 0),
                           ("batch_bytes_rank1", {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}, 1)):
        real = bytes.fromhex(GOLDEN[key])
        ts, real_events, real_rank = msgpack.unpackb(real)
        assert real_rank == rank
        cache = server.prefix_cache.PrefixCache(16, 1, "sha256", env)
        hashes = cache.block_hashes(GOLDEN["tokens"])
        tokens = GOLDEN["tokens"][:32]
        first = cache.store(hashes, tokens, 0)  # both blocks new; capacity 1: the second block evicted
        second = cache.store(hashes, tokens, 16)  # the first a hit: the second stored with its parent
        ours = [first[0], second[0], dict(first[1], block_hashes=[cache.external(hashes[0])]), cache.clear()[0]]
        assert [list(e.items()) for e in ours] == [list(e.items()) for e in real_events], key
        assert first[1]["block_hashes"] == [cache.external(hashes[1])]  # the LRU: the request's last block first
        assert server.kv_events.encode_batch(ts, real_events, rank) == real


def test_endpoint_rules_are_vllms(modules):
    server, _serve = modules
    for endpoint, bind in GOLDEN["bind"].items():
        assert server.kv_events.is_bind_endpoint(endpoint) is bind, endpoint
    for endpoint, real in GOLDEN["offset_rank2"].items():
        try:
            ours = server.kv_events.offset_endpoint_port(endpoint, 2)
        except ValueError as exc:
            ours = "ValueError: %s" % exc
        assert ours == real, endpoint


def test_config_is_vllms(modules):
    from vllm.config.kv_events import KVEventsConfig, ValidationError
    for case, real in GOLDEN["configs"]:
        try:
            ours = KVEventsConfig(**case).asdict()
        except ValidationError as exc:
            ours = str(exc)
        assert ours == real, case
    assert KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:5559").asdict() == \
        GOLDEN["kv_event_sources_config"]


def test_render_is_vllms_generate_request(modules):
    server, _serve = modules
    api = server.openai_api
    for body, real in GOLDEN["renders"]:
        req = api.Request(api.COMPLETION, body, 256)
        ours = api.generate_request(req, body, "cmpl-x")
        assert ours["token_ids"] == api.prompt_token_ids(body["prompt"])
        assert list(dict(ours, token_ids=[1, 2]).items()) == list(real.items()), body
        assert list(ours["sampling_params"].items()) == list(real["sampling_params"].items()), body


# ------------------------------------------------------------------------------------------------
# the prefix cache, counted as vLLM counts it


def test_prefix_cache_hits_and_counters(engine):
    """Full 16-token blocks, within num_tokens - 1 (vLLM recomputes the last prompt token): counted as queries and
    hits, local_cache_hit and cached_tokens."""
    url, _state = engine("--enable-prompt-tokens-details")
    details = [complete(url, p)["usage"]["prompt_tokens_details"]["cached_tokens"]
               for p in (words(40), words(40), words(32), words(33), words(15))]
    assert details == [0, 32, 16, 32, 0]  # 40: 2 blocks; 32: only (32-1)//16 = 1 block may hit; 15: none
    queries, hits = 40 + 40 + 32 + 33 + 15, 32 + 16 + 32
    assert metric(url, "vllm:prefix_cache_queries_total") == queries
    assert metric(url, "vllm:prefix_cache_hits_total") == hits
    assert metric(url, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == hits
    assert metric(url, "vllm:prompt_tokens_by_source_total", source="local_compute") == queries - hits
    assert metric(url, "vllm:prompt_tokens_cached_total") == hits


def test_no_prefix_caching_counts_nothing(engine):
    url, _state = engine("--no-enable-prefix-caching", "--enable-prompt-tokens-details")
    assert [complete(url, words(40))["usage"]["prompt_tokens_details"]["cached_tokens"] for _twice in "ab"] == [0, 0]
    assert metric(url, "vllm:prefix_cache_queries_total") == 0  # record_prefix_cache_stats: no lookup, no record
    assert metric(url, "vllm:prompt_tokens_by_source_total", source="local_compute") == 80


def test_block_size_and_lru_eviction(engine):
    """--block-size 8, --num-gpu-blocks-override 4: two 16-word prompts fill the cache; a third evicts the least
    recently used blocks: those of the prompt used longest ago."""
    url, state = engine("--block-size", "8", "--num-gpu-blocks-override", "4", "--enable-prompt-tokens-details")
    cached = [complete(url, p)["usage"]["prompt_tokens_details"]["cached_tokens"]
              for p in (words(16), words(16, 20), words(16), words(16, 40), words(16), words(16, 20))]
    # A, B, A (hit 8: (16-1)//8 = 1 block), C (evicts B's 2 blocks, the least recently used), A (kept), B (gone)
    assert cached == [0, 0, 8, 0, 8, 0]
    assert len(state.ranks[0].cache.blocks) == 4


def test_producer_reports_its_hits_and_consumer_reads_only_what_it_lacks(engine, modules):
    server, _serve = modules
    (p_url, _p), (c_url, _c) = engine("--enable-prompt-tokens-details"), engine("--enable-prompt-tokens-details")
    prompt, payload = words(40), server.kv_payload(words(40))[1]
    step = len(payload) // 3  # 40 tokens: 3 blocks of 16
    moved = 0
    for round_, (p_hit, read) in enumerate(((0, len(payload)), (32, len(payload) - 2 * step))):
        out = complete(p_url, prompt, {"X-Request-Id": "r%d" % round_},
                       kv_transfer_params={"do_remote_decode": True})
        params = out["kv_transfer_params"]
        assert params["remote_prefill_cached_tokens"] == p_hit
        answer = complete(c_url, prompt, kv_transfer_params=params, max_tokens=2)
        # the consumer reports the producer's hits (vLLM 0.32 output_processor), reads only the blocks it lacks
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == p_hit
        moved += read
        assert metric(c_url, "vllm:nixl_bytes_transferred_count") == round_ + 1
        assert metric(c_url, "vllm:nixl_bytes_transferred_sum") == moved
    assert metric(c_url, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 32
    assert metric(c_url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 40 + 8
    assert metric(c_url, "vllm:prompt_tokens_by_source_total", source="local_compute") == 0
    assert metric(c_url, "vllm:prefix_cache_hits_total") == 32


# what a wait may fall short of its lower bound: the clocks' granularity (the stand-in stamps arrivals with wall time
# and waits with a monotonic timeout)
SLACK = 0.01


def test_prefill_cost_is_per_computed_token_and_serialised(engine, modules, monkeypatch):
    server, _serve = modules
    # the knobs go through NARWHAL_ENGINE_ENV, which refuses secret-looking names
    assert not is_secret_name(server.PREFILL_ENV) and not is_secret_name(server.LOAD_ENV)
    assert server.prefill_seconds({server.PREFILL_ENV: "x"})[1] == (
        "NARWHAL_STANDIN_PREFILL_S_PER_TOK='x' is not a number of seconds from 0 to 10 (the stand-in's prefill "
        "time per prompt token it computes)")
    monkeypatch.setenv(server.PREFILL_ENV, "0.01")
    url, _state = engine()
    elapsed = []
    for prompt in (words(40), words(40)):
        started = time.monotonic()
        complete(url, prompt)
        elapsed.append(time.monotonic() - started)
    # 40 tokens computed, then 8 (the first 32 found in the cache): lower bounds only, a loaded machine adds time
    assert elapsed[0] >= 0.40 - SLACK and elapsed[1] >= 0.08 - SLACK
    assert metric(url, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 32
    assert metric(url, "vllm:prompt_tokens_by_source_total", source="local_compute") == 48
    # two prefills at once: one after the other (one batch at a time)
    done = []
    threads = [threading.Thread(target=lambda p=p: (complete(url, p), done.append(time.monotonic())))
               for p in (words(20, 40), words(20, 1))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(done) - started >= 0.40 - SLACK and min(done) - started >= 0.20 - SLACK
    assert metric(url, "vllm:time_to_first_token_seconds_sum") >= 0.4 + 0.08 + 0.2 + 0.4 - SLACK


def test_tokenize_and_render(engine):
    url, _state = engine("--chat-template", "{{ messages }}")
    status, out = call(url, "/tokenize", {"model": "tiny", "prompt": "a b c"}, key=None)  # vLLM checks /v1 only
    assert status == 200 and out["count"] == 3 and out["max_model_len"] == 2048 and out["token_strs"] is None
    ids = out["tokens"]
    status, chat = call(url, "/tokenize", {"messages": [{"role": "user", "content": "a b c"}]})
    rendered_prompt = call(url, "/tokenize", {"prompt": "user: a b c\nassistant:"})[1]["tokens"]
    assert status == 200 and chat["tokens"] == rendered_prompt and chat["count"] == 5
    assert call(url, "/tokenize", {"model": "nope", "prompt": "x"})[0] == 404
    status, refused = call(url, "/v1/completions/render", {"model": "tiny", "prompt": "a b c"})
    assert (status, refused["error"]["type"], refused["error"]["code"]) == (403, "PermissionDeniedError", 403)
    url, _state = engine("--enable-scale-out", "--chat-template", "{{ messages }}")
    status, rendered = call(url, "/v1/completions/render", {"model": "tiny", "prompt": "a b c"},
                            {"X-Request-Id": "abc"})
    assert status == 200 and [(r["request_id"], r["token_ids"]) for r in rendered] == [("cmpl-abc", ids)]
    status, rendered = call(url, "/v1/chat/completions/render", {"messages": [{"role": "user", "content": "a b c"}]})
    assert status == 200 and rendered["token_ids"] == chat["tokens"] and rendered["request_id"].startswith("chatcmpl-")
    assert call(url, "/v1/completions/render", {"prompt": "x"}, key=None)[0] == 401  # /v1: the key


# ------------------------------------------------------------------------------------------------
# the events on the wire (engines as processes, a ZMQ subscriber)


def events_config(port, **more):
    return json.dumps(dict({"enable_kv_cache_events": True, "endpoint": "tcp://*:%d" % port}, **more))


def replay(port, start=0):
    """The publisher's buffered batches from seq `start` through its replay socket -> [(topic, seq, payload)]."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect("tcp://127.0.0.1:%d" % port)
    try:
        sock.send_multipart((b"", start.to_bytes(8, "big")))
        out = []
        while True:
            assert sock.poll(5000), "no replay answer"
            _empty, topic, seq, payload = sock.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                return out
            out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    finally:
        sock.close(linger=0)


def test_events_as_vllm_publishes_them(tmp_path, modules):
    """Store, evict (the LRU block of the older request, its last block first), reset: BlockStored, BlockRemoved and
    AllBlocksCleared batches, one per step, seq from 0, topic as configured; the hashes are the chain of the prompt's
    token IDs with PYTHONHASHSEED; /kv_event_sources names the endpoints."""
    server, _serve = modules
    port, replay_port = free_port(), free_port()
    url, proc = engine_process(tmp_path, "1", KEY, "--num-gpu-blocks-override", "3", "--kv-events-config",
                               events_config(port, replay_endpoint="tcp://*:%d" % replay_port, topic="kv"),
                               env={"PYTHONHASHSEED": "7", "VLLM_SERVER_DEV_MODE": "1"}, guard=False)
    try:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect("tcp://127.0.0.1:%d" % port)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        assert not sub.poll(500)  # ZMQ's slow joiner: a PUB drops what it sends before the connection is up
        a, b = words(56), words(20, 30)
        complete(url, words(40))  # blocks a1 a2
        complete(url, a)  # a1 a2 hit, a3 stored
        complete(url, b)  # b1 stored, a3 evicted (capacity 3)
        assert call(url, "/reset_prefix_cache", {}) == (200, {"success": True})
        live = []
        while len(live) < 4 and sub.poll(5000):
            live.append(sub.recv_multipart())
        sub.close(linger=0)
        cache = server.prefix_cache.PrefixCache(16, 3, "sha256", {"PYTHONHASHSEED": "7"})
        ids_a, ids_b = server.openai_api.prompt_token_ids(a), server.openai_api.prompt_token_ids(b)
        ha, hb = [cache.external(h) for h in cache.block_hashes(ids_a)], cache.external(cache.block_hashes(ids_b)[0])

        def stored(hashes, parent, tokens):
            return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                    "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
        want = [[stored(ha[:2], None, ids_a[:32])], [stored(ha[2:], ha[1], ids_a[32:48])],
                [stored([hb], None, ids_b[:16]),
                 {"type": "BlockRemoved", "block_hashes": [ha[2]], "medium": "GPU", "group_idx": 0}],
                [{"type": "AllBlocksCleared"}]]
        got = [(topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)) for topic, seq, payload in live]
        assert [(t, s, p[1], p[2]) for t, s, p in got] == [(b"kv", i, w, 0) for i, w in enumerate(want)]
        assert all(abs(p[0] - time.time()) < 60 for _t, _s, p in got)  # ts: the step's time.time()
        assert [(s, p[1]) for _t, s, p in replay(replay_port, 1)] == list(enumerate(want))[1:]
        assert call(url, "/kv_event_sources", key=None) == (200, {"0": {
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:%d" % port,
            "replay_endpoint": "tcp://*:%d" % replay_port, "buffer_steps": 10000, "hwm": 100000,
            "max_queue_size": 100000, "topic": "kv"}})
        assert "ZMQ publisher bound tcp://*:%d" % port in engine_log(tmp_path, "1")
    finally:
        proc.kill()
        proc.wait(10)


def test_dp_rank_publishes_on_port_plus_rank(tmp_path):
    port = _standin.free_ports(2)
    url, proc = engine_process(tmp_path, "1", KEY, "--data-parallel-size", "2", "--kv-events-config",
                               events_config(port), guard=False)
    try:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect("tcp://127.0.0.1:%d" % (port + 1))
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        assert not sub.poll(500)
        complete(url, words(20), {"X-data-parallel-rank": "1"})
        assert sub.poll(5000)
        _topic, seq, payload = sub.recv_multipart()
        sub.close(linger=0)
        assert int.from_bytes(seq, "big") == 0 and msgpack.unpackb(payload)[2] == 1
        sources = call(url, "/kv_event_sources", key=None)[1]
        want = [("0", "tcp://*:%d" % port), ("1", "tcp://*:%d" % (port + 1))]
        assert [(k, v["endpoint"]) for k, v in sources.items()] == want
    finally:
        proc.kill()
        proc.wait(10)


def test_an_endpoint_without_wildcard_is_connected_to(tmp_path):
    """_is_bind_endpoint: tcp://127.0.0.1:<port> is connected to (here a subscriber binds it), not bound."""
    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.bind("tcp://127.0.0.1:%d" % port)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    url, proc = engine_process(tmp_path, "1", KEY, "--kv-events-config",
                               json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:%d" % port}),
                               guard=False)
    try:
        # a bound SUB sends its subscription to a peer that connected only once the application calls it (libzmq
        # processes the new pipe then): polling does
        assert not sub.poll(500)
        complete(url, words(20))
        assert sub.poll(5000) and msgpack.unpackb(sub.recv_multipart()[2])[1][0]["type"] == "BlockStored"
        assert "ZMQ publisher connecting tcp://127.0.0.1:%d" % port in engine_log(tmp_path, "1")
    finally:
        sub.close(linger=0)
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("flags,env,status,line", [
    (("--kv-events-config", '{"enable_kv_cache_events": true, "foo": 1}'), {}, 2,
     "argument --kv-events-config: 1 validation error for KVEventsConfig\nfoo\n  Unexpected keyword argument"),
    (("--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}',
      "--data-parallel-size", "2"), {}, 1, "ValueError: Invalid endpoint: must contain 'inproc' or 'tcp'"),
    (("--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:0"}'), {}, 1,
     "the KV events endpoint tcp://*:0 (a port the OS picks) is not modelled"),
    (("--prefix-caching-hash-algo", "xxhash"), {}, 1, "--prefix-caching-hash-algo xxhash is not modelled"),
    ((), {"NARWHAL_STANDIN_PREFILL_S_PER_TOK": "-1"}, 1, "NARWHAL_STANDIN_PREFILL_S_PER_TOK='-1' is not"),
])
def test_start_refusals(tmp_path, flags, env, status, line):
    _url, proc = engine_process(tmp_path, "1", KEY, *flags, env=env, wait=False, guard=False)
    assert proc.wait(30) == status
    assert line in engine_log(tmp_path, "1")


def test_events_warn_without_prefix_caching_and_publish_nothing(tmp_path):
    port = free_port()
    url, proc = engine_process(tmp_path, "1", KEY, "--no-enable-prefix-caching", "--kv-events-config",
                               events_config(port), guard=False)
    try:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.connect("tcp://127.0.0.1:%d" % port)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        assert not sub.poll(500)
        complete(url, words(40))
        assert not sub.poll(500)
        sub.close(linger=0)
        assert "KV cache events are on, but prefix caching is not enabled." in engine_log(tmp_path, "1")
        assert call(url, "/kv_event_sources", key=None)[1]["0"]["endpoint"] == "tcp://*:%d" % port
    finally:
        proc.kill()
        proc.wait(10)
