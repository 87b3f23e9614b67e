"""The real vllm-router (requirements/router.txt) routes by the stand-in engines' KV events as it would by vLLM's:
two prefill stand-ins publishing their prefix cache's events (--kv-events-config), one decode, the router in P/D mode
with --prefill-policy kv_aware and --pd-kv-events (the plan does not write them yet: router.json's args are edited
here), started as the router role starts it (test_support.router).

How vllm-router 0.1.17 routes by events (read from its logs and /metrics): it indexes the token IDs of each
BlockStored event per worker (the engine's block hashes are the chain's anchors: parents and removals), asks the
prefill worker for the request's token IDs (POST /v1/completions/render, vLLM's scale-out render endpoint; only when
that route is absent, 404, POST /tokenize), hashes them in blocks of 16 and sends the request to the prefill worker
with the fewest new prefill tokens (credited_prefix_tokens: the indexed prefix). The engines' own block hashes need
not agree across engines (their PYTHONHASHSEED may differ): the index matches token IDs. vLLM 0.32 answers the
render endpoints 403 unless it runs with --enable-scale-out; then the router does not tokenize and the P/D admission
falls back (fallback="preparation_rejected"), whatever the events say. Events of another block size than 16 (what
--pd-kv-events assumes) are dropped (a debug line, "dense batch rejected ... reason=BlockSizeMismatch")."""
import json
import re
import time

import pytest
from test_support.router import router_process
from test_support.standin import engine_process, free_port

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call

KEY = "sk-narwhal-kv-routing-test-key-0123456789abcdef"
WORDS = ["w%d" % i for i in range(100)]
PREFIX_A, PREFIX_B = " ".join(WORDS[:40]), " ".join(WORDS[50:90])  # 40 tokens each: 2 full blocks of 16


def fleet(tmp_path, scale_out=True, block_size=16):
    """Two prefill engines publishing KV events on free ports, one decode -> (engines, procs, {url: port})."""
    engines, procs, ports = [], [], {}
    for n, role in ((1, "prefill"), (2, "prefill"), (3, "decode")):
        flags = ["--enable-prompt-tokens-details", "--block-size", str(block_size)]
        if role == "prefill":
            port = free_port()
            flags += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True,
                                                        "endpoint": "tcp://*:%d" % port})]
            flags += ["--enable-scale-out"] if scale_out else []
        url, proc = engine_process(tmp_path, str(n), KEY, *flags, env={"PYTHONHASHSEED": "0"})
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
        if role == "prefill":
            ports[url] = port
            engines[-1]["kv_events"] = ["tcp://127.0.0.1:%d" % port]  # the fleet entry's subscriber endpoints
    return engines, procs, ports


def policies(prefill):
    """router_process's arguments for a prefill policy: the site's policies, planned as the router stage plans them
    (a kv_aware prefill policy: --pd-kv-events per prefill worker from the fleet entries' kv_events, added by the
    start script from workers.json), and debug logging (the kv_index lines)."""
    return {"site": {"NARWHAL_ROUTER_PREFILL_POLICY": prefill, "NARWHAL_ROUTER_DECODE_POLICY": "round_robin"},
            "edit_args": lambda args: args.extend(["--log-level", "debug"])}


@pytest.fixture
def stopped():
    procs = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(10)


def direct(url, prompt):
    status, out = call(url + "/v1/completions", KEY, {"model": "tiny", "prompt": prompt, "max_tokens": 1}, timeout=20)
    assert status == 200, out


def routed(router, prompt):
    """One request through the router -> the cached_tokens its answer reports (the decode reports the prefill's)."""
    status, out = call(router["url"] + "/v1/completions", KEY, {"model": "tiny", "prompt": prompt, "max_tokens": 2},
                       timeout=30)
    assert status == 200, out
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(url, name, **labels):
    status, text = call(url, None) if url.endswith("/metrics") else call(url + "/metrics", None)
    assert status == 200
    pattern = re.compile(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name))
    for line in text.splitlines():
        m = pattern.match(line)
        if m and all('%s="%s"' % kv in (m.group(1) or "") for kv in labels.items()):
            return float(m.group(2))
    raise AssertionError("no %s %s in %s" % (name, labels, url))


def wait_indexed(router, url, timeout=20):
    """Until the router's kv_index has taken a batch of `url`'s events (its debug line), then a moment for the
    index update that follows it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = re.sub(r"\x1b\[[0-9;]*m", "", router["log"].read_text(errors="replace"))
        if "kv_index live sequence advanced source=%s " % url in text:
            time.sleep(1.0)  # the batch is applied to the index right after that line: a wide margin for a busy CPU
            return
        time.sleep(0.1)
    raise AssertionError("the router never took %s's KV events:\n%s" % (url, text[-3000:]))


def test_kv_aware_sends_each_request_to_the_prefill_engine_that_holds_its_prefix(tmp_path, stopped):
    engines, procs, ports = fleet(tmp_path)
    stopped += procs
    router = router_process(tmp_path, engines, KEY, **policies("kv_aware"))
    stopped.append(router["proc"])
    p1, p2 = engines[0]["url"], engines[1]["url"]
    direct(p2, PREFIX_A + " warm")  # prefix A cached on engine 2, B on engine 1, their events published
    direct(p1, PREFIX_B + " warm")
    wait_indexed(router, p2)
    wait_indexed(router, p1)
    cached = []
    for i in range(3):
        cached += [routed(router, PREFIX_A + " q%d" % i), routed(router, PREFIX_B + " q%d" % i)]
    assert cached == [32] * 6  # every prefill hit its 2 prefix blocks (reported through the decode)
    for url in (p1, p2):  # A only on engine 2, B only on engine 1: a routed request hits only where it belongs
        assert metric(url, "vllm:request_success_total", finished_reason="length") == 4  # warm-up + 3 routed
        assert metric(url, "vllm:prefix_cache_hits_total") == 3 * 32
        assert metric(url, "vllm:prefix_cache_queries_total") == 41 + 3 * 41
    assert metric(router["metrics_url"], "vllm_router_pd_credited_prefix_tokens_total") == 6 * 32
    assert metric(router["metrics_url"], "vllm_router_pd_prefill_decisions_total", fallback="none") == 6
    assert metric(router["metrics_url"], "vllm_router_kv_routing_inputs_total", result="render") >= 6


def test_round_robin_spreads_the_same_prefix(tmp_path, stopped):
    engines, procs, _ports = fleet(tmp_path)
    stopped += procs
    router = router_process(tmp_path, engines, KEY, **policies("round_robin"))
    stopped.append(router["proc"])
    cached = [routed(router, PREFIX_A + " q%d" % i) for i in range(4)]
    assert sorted(cached) == [0, 0, 32, 32]  # each engine computes the prefix once, then hits it
    for engine in engines[:2]:
        assert metric(engine["url"], "vllm:request_success_total", finished_reason="length") == 2
        assert metric(engine["url"], "vllm:prefix_cache_hits_total") == 32


def test_kv_aware_without_the_render_endpoint_falls_back(tmp_path, stopped):
    """vLLM 0.32 without --enable-scale-out answers /v1/completions/render 403: the router gets no token IDs, its
    admission falls back (preparation_rejected) and does not use the events."""
    engines, procs, ports = fleet(tmp_path, scale_out=False)
    stopped += procs
    router = router_process(tmp_path, engines, KEY, **policies("kv_aware"))
    stopped.append(router["proc"])
    for i in range(3):
        routed(router, PREFIX_A + " q%d" % i)
    assert metric(router["metrics_url"], "vllm_router_pd_prefill_decisions_total",
                  fallback="preparation_rejected") == 3
    assert "POST /v1/completions/render HTTP/1.1\" 403" in (tmp_path / "engine-1.log").read_text()


def test_kv_aware_drops_the_events_of_another_block_size(tmp_path, stopped):
    """--pd-kv-events sources are taken as 16-token blocks: a prefill engine with --block-size 32 publishes events
    the router rejects, so it never knows what that engine holds."""
    engines, procs, ports = fleet(tmp_path, block_size=32)
    stopped += procs
    router = router_process(tmp_path, engines, KEY, **policies("kv_aware"))
    stopped.append(router["proc"])
    direct(engines[1]["url"], PREFIX_A + " warm")
    deadline = time.time() + 20
    text = ""
    while "reason=BlockSizeMismatch" not in text and time.time() < deadline:
        time.sleep(0.1)
        text = re.sub(r"\x1b\[[0-9;]*m", "", router["log"].read_text(errors="replace"))
    assert "kv_index dense batch rejected source=%s rank=0 reason=BlockSizeMismatch" % engines[1]["url"] in text
    assert "kv_index live sequence advanced" not in text
