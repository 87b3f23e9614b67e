"""A kv_aware prefill policy end to end at the router (issue 38): the plan's workers.json maps each prefill URL to its
engine's KV events endpoints (_router/plan.py::workers_doc), the start script (roles/router/files/narwhal_router.py,
kv_event_sources) gives vllm-router one `--pd-kv-events URL=EP[,EP...]` per prefill URL of the set, and the real
vllm-router (requirements/router.txt) subscribes to each endpoint of each rank, also in DP-aware mode and after a
reload with a prefill worker out of the set. The stand-in engines here publish nothing: a ZMQ subscriber connects
whether or not a publisher listens, and the router logs its subscription at once."""
import json
import os
import re
import signal
import time

import pytest
from test_support.paths import REPO, load_file
from test_support.router import router_process
from test_support.standin import engine_process, free_port

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call

FRONT = load_file("narwhal_router", REPO / "roles" / "router" / "files" / "narwhal_router.py")
KEY = "sk-narwhal-kv-events-test-key-0123456789abcdef"
KV_AWARE = {"NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware", "NARWHAL_ROUTER_DECODE_POLICY": "round_robin"}
# what vllm-router 0.1.17 logs for each subscription (src/kv_index/subscriber.rs), ANSI colours aside
SUBSCRIBED = re.compile(r"kv_index subscriber for (\S+) rank(\d+) on (tcp://\S+)")


def _fleet(tmp_path, dp=1):
    """Two prefill and one decode stand-in of `dp` DP ranks, each with the kv_events discovery would list for it
    (free loopback ports, by rank) -> (fleet entries, processes)."""
    flags = ["--data-parallel-size", str(dp)] if dp > 1 else []
    engines, procs = [], []
    for n, role in ((1, "prefill"), (2, "prefill"), (3, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY, *flags)
        first = free_port()
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url,
                        "kv_events": ["tcp://127.0.0.1:%d" % (first + r) for r in range(dp)]})
        procs.append(proc)
    return engines, procs


def _subscriptions(log, timeout=20, want=0):
    """{(url, rank): endpoint} of the subscriptions in a router log, once it holds `want` of them."""
    deadline = time.time() + timeout
    while True:
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        found = dict(((url, int(rank)), ep) for url, rank, ep in SUBSCRIBED.findall(text))
        if len(found) >= want or time.time() > deadline:
            return found, text
        time.sleep(0.2)


@pytest.fixture
def stopped():
    started = []
    yield started.append
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_the_router_subscribes_to_every_prefill_engines_events(tmp_path, stopped):
    engines, procs = _fleet(tmp_path)
    for proc in procs:
        stopped(proc)
    router = router_process(tmp_path, engines, KEY, site=KV_AWARE)
    stopped(router["proc"])
    workers = json.loads(router["workers"].read_text())
    assert workers["kv_events"] == {e["url"]: e["kv_events"] for e in engines[:2]}
    found, text = _subscriptions(router["log"], want=2)
    assert found == {(engines[0]["url"], 0): engines[0]["kv_events"][0],
                     (engines[1]["url"], 0): engines[1]["kv_events"][0]}, text[-3000:]
    assert call(router["url"] + "/v1/completions", KEY, {"model": "tiny", "prompt": "kv", "max_tokens": 2},
                timeout=30)[0] == 200
    # a roll took engine-2 out (router_members keeps the map): the reload subscribes to the prefill it is given only
    # (vllm-router refuses --pd-kv-events for a URL it does not route to)
    workers["prefill"] = [engines[0]["url"]]
    router["workers"].write_text(json.dumps(workers))
    os.kill(router["proc"].pid, signal.SIGHUP)
    deadline = time.time() + 30
    while "reload 2 done" not in router["log"].read_text(errors="replace") and time.time() < deadline:
        time.sleep(0.2)
    text = re.sub(r"\x1b\[[0-9;]*m", "", router["log"].read_text(errors="replace"))
    assert "reload 2 done" in text, text[-3000:]
    # the second vllm-router's lines: after the first one served, up to the reload's end
    second = text.split("narwhal_router: serving", 1)[1].split("reload 2 done", 1)[0]
    assert SUBSCRIBED.findall(second) == [(engines[0]["url"], "0", engines[0]["kv_events"][0])], second[-3000:]
    assert call(router["url"] + "/v1/completions", KEY, {"model": "tiny", "prompt": "kv", "max_tokens": 2},
                timeout=30)[0] == 200


def test_dp_ranks_are_subscribed_under_the_base_url(tmp_path, stopped):
    """With --intra-node-data-parallel-size vllm-router routes to <url>@<rank> but takes the KV sources by the base
    URL, the endpoints in rank order (an <url>@<rank> key is refused: "use the base URL without the '@rank' suffix")."""
    engines, procs = _fleet(tmp_path, dp=2)
    for proc in procs:
        stopped(proc)
    router = router_process(tmp_path, engines, KEY, site=dict(KV_AWARE, NARWHAL_DATA_PARALLEL_SIZE=2))
    stopped(router["proc"])
    config = json.loads(router["config"].read_text())
    assert config["args"][config["args"].index("--intra-node-data-parallel-size") + 1] == "2"
    found, text = _subscriptions(router["log"], want=4)
    assert found == dict(((e["url"], r), e["kv_events"][r]) for e in engines[:2] for r in range(2)), text[-3000:]


def test_the_start_script_adds_the_sources_under_kv_aware_only():
    workers = {"prefill": ["http://p1:1", "http://p2:1"], "decode": ["http://d:1"],
               "kv_events": {"http://p1:1": ["tcp://p1:5557", "tcp://p1:5558"], "http://p2:1": ["tcp://p2:5557"],
                             "http://gone:1": ["tcp://gone:5557"]}}
    assert FRONT.kv_event_sources(["--prefill-policy", "kv_aware"], workers) == [
        "--pd-kv-events", "http://p1:1=tcp://p1:5557,tcp://p1:5558", "--pd-kv-events", "http://p2:1=tcp://p2:5557"]
    # any other prefill policy takes no --pd-kv-events (vllm-router: "requires a kv_aware prefill policy")
    assert FRONT.kv_event_sources(["--prefill-policy", "cache_aware"], workers) == []
    assert FRONT.kv_event_sources([], workers) == []
    with pytest.raises(FRONT.Refused, match="no kv_events for prefill worker\\(s\\) http://p3:1"):
        FRONT.kv_event_sources(["--prefill-policy", "kv_aware"], dict(workers, prefill=["http://p1:1", "http://p3:1"]))


@pytest.mark.parametrize("kv", [["tcp://p:1"], {"http://p:1": []}, {"http://p:1": "tcp://p:1"},
                                {"http://p:1": ["http://p:1"]}, {"http://p:1": ["tcp://p:1,tcp://p:2"]}])
def test_a_kv_events_map_the_start_script_cannot_use_is_refused(tmp_path, kv):
    path = tmp_path / "workers.json"
    path.write_text(json.dumps({"prefill": ["http://p:1"], "decode": ["http://d:1"], "kv_events": kv}))
    with pytest.raises(FRONT.Refused, match="kv_events must be"):
        FRONT.read_workers(str(path))
