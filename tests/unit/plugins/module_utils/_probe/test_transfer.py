"""The transfer_probe step (plugins/module_utils/_probe/transfer.py) running pairs in rounds: against a fake
fleet of engines behind `call` (counters per engine, the P/D flow), the probes of a round run at once, never more
than `parallel`, never two with an engine in common, and every pair's verdict and evidence are those of a serial
run. Against real HTTP: tests/unit/plugins/module_utils/_probe/test_verdict.py (stand-in engines)."""

import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from test_support.tempca import CA, https_server

from ansible_collections.narwhal.deploy.plugins.module_utils._common import http
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import probe_pairs
from ansible_collections.narwhal.deploy.plugins.module_utils._probe import transfer as step
from ansible_collections.narwhal.deploy.plugins.modules import transfer_probe

KEY = "sk-narwhal-probe-test-key-0123456789"
PROMPT_TOKENS = 16
METRICS = """vllm:nixl_bytes_transferred_sum{{engine="0"}} {bytes}
vllm:nixl_bytes_transferred_count{{engine="0"}} {transfers}
vllm:nixl_xfer_time_seconds_sum{{engine="0"}} {seconds}
vllm:nixl_num_failed_transfers_total{{engine="0"}} 0.0
vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {external}
vllm:request_success_total{{finished_reason="length"}} {finished}
vllm:nixl_num_kv_expired_reqs_total{{engine="0"}} 0.0
vllm:nixl_num_notifications_after_expiry_total{{engine="0"}} 0.0
"""


class Fleet:
    """Engines answering the probe's HTTP calls as vLLM does: a producer request finishes there; a consumer request
    moves 2048 bytes of KV per prompt token through the consumer's NIXL counters and finishes there."""

    def __init__(self, names, details=True, delay=0.02, slow_consumer=None):
        self.counters = dict((n, {"bytes": 0, "transfers": 0, "external": 0, "finished": 0, "seconds": 0.0})
                             for n in names)
        self.details, self.delay, self.lock = details, delay, threading.Lock()
        self.slow_consumer, self.prompts = slow_consumer, []

    def call(self, url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
        engine, path = url.split("//", 1)[1].split("/", 1)
        mine = self.counters[engine]
        if path == "metrics":
            with self.lock:
                return 200, METRICS.format(**mine)
        assert key == KEY
        time.sleep(self.delay)
        params = body.get("kv_transfer_params") or {}
        with self.lock:
            self.prompts.append(body["prompt"])
            mine["finished"] += 1
            if params.get("do_remote_decode"):
                return 200, {"choices": [{"text": " ", "finish_reason": "length"}],
                             "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": engine,
                                                    "remote_block_ids": [1], "remote_host": engine,
                                                    "remote_port": 5600}}
            usage = {"prompt_tokens": PROMPT_TOKENS}
            if params:
                mine["bytes"] += 2048 * PROMPT_TOKENS
                mine["transfers"] += 1
                mine["external"] += PROMPT_TOKENS
                # 1 MB/s from the producer p0 (a slow link), 4 MB/s from every other; with slow_consumer, 1 MB/s
                # to and from that engine instead
                slow = (params.get("remote_host") == "p0" if self.slow_consumer is None
                        else self.slow_consumer in (engine, params.get("remote_host")))
                mine["seconds"] += 2048 * PROMPT_TOKENS / (1e6 if slow else 4e6)
                if self.details:
                    usage["prompt_tokens_details"] = {"cached_tokens": PROMPT_TOKENS}
            return 200, {"choices": [{"text": " the fox", "finish_reason": "length"}], "usage": usage}


@pytest.fixture
def watched(monkeypatch):
    """probe_pair wrapped: records the most probes at once and fails a probe that starts on a busy engine."""
    seen = {"active": set(), "most": 0, "clash": []}
    lock = threading.Lock()
    real = step.probe_pair

    def probe_pair(module, key, producer, consumer, warn=None):
        with lock:
            busy = set(e for pair in seen["active"] for e in pair)
            if busy & set((producer, consumer)):
                seen["clash"].append((producer, consumer))
            seen["active"].add((producer, consumer))
            seen["most"] = max(seen["most"], len(seen["active"]))
        try:
            return real(module, key, producer, consumer, warn)
        finally:
            with lock:
                seen["active"].discard((producer, consumer))

    monkeypatch.setattr(step, "probe_pair", probe_pair)
    return seen


def fleet_args(prefill, decode, **extra):
    fleet = ([{"engine": "p%d" % i, "role": "prefill"} for i in range(prefill)]
             + [{"engine": "d%d" % i, "role": "decode"} for i in range(decode)])
    args = {"engines": dict((e["engine"], {"url": "http://%s" % e["engine"], "role": e["role"]}) for e in fleet),
            "pairs": probe_pairs(fleet), "model": "tiny", "api_key": KEY, "recompute": "report"}
    args.update(extra)
    return args


SAME = ("producer", "consumer", "ok", "reasons", "evidence", "notes", "concurrent_traffic", "cached_tokens",
        "prompt_tokens", "bytes", "transfer_s", "rate_bytes_s", "output", "matches_recompute", "remote_host",
        "remote_port", "producer_before", "producer_after")


def run(module_runner, monkeypatch, args, details=True):
    fake = Fleet(args["engines"], details=details)
    monkeypatch.setattr(step, "call", fake.call)
    return module_runner(transfer_probe.main, args)


@pytest.mark.parametrize("details", [True, False], ids=["request", "counters"])
@pytest.mark.parametrize("prefill,decode,parallel", [(3, 3, 8), (4, 2, 3), (2, 5, 64), (3, 3, 1)])
def test_rounds_run_at_once_within_the_bound_with_the_serial_verdicts(module_runner, monkeypatch, watched, prefill,
                                                                      decode, parallel, details):
    status, serial = run(module_runner, monkeypatch, fleet_args(prefill, decode, parallel=1), details)
    assert status == "exit", serial
    assert watched["most"] == 1 and serial["rounds"] == len(serial["results"]) == 2 * prefill * decode
    watched["most"] = 0
    status, result = run(module_runner, monkeypatch, fleet_args(prefill, decode, parallel=parallel), details)
    assert status == "exit", result
    assert not watched["clash"]
    assert watched["most"] == min(parallel, prefill, decode)  # a round is a matching: min(P, D) pairs at most
    least = max(2 * max(prefill, decode), -(-2 * prefill * decode // parallel))
    assert result["rounds"] == least and sorted(set(r["round"] for r in result["results"])) == list(range(1, least + 1))
    # the same pairs in the same order, each with the serial run's verdict and evidence: the counters move for
    # this pair's request only, so even counter evidence sees no concurrent traffic
    assert [[r[k] for k in SAME] for r in result["results"]] == [[r[k] for k in SAME] for r in serial["results"]]
    for row in result["results"]:
        assert row["ok"] and row["evidence"] == ("request" if details else "counters"), row
        assert row["concurrent_traffic"] is False and row["notes"] == []
        assert row["bytes"] == 2048 * PROMPT_TOKENS
    assert result.get("warnings", []) == serial.get("warnings", [])


def test_rounds_are_faster_than_one_pair_at_a_time(module_runner, monkeypatch):
    started = time.time()
    status, _result = run(module_runner, monkeypatch, fleet_args(4, 4, parallel=1))
    serial = time.time() - started
    started = time.time()
    status, result = run(module_runner, monkeypatch, fleet_args(4, 4, parallel=8))
    assert status == "exit" and result["rounds"] == 8
    assert time.time() - started < serial / 2


def test_a_failed_pair_fails_the_step_naming_it_among_concurrent_ones(module_runner, monkeypatch):
    args = fleet_args(2, 2, parallel=8)
    fake = Fleet(args["engines"])
    real = fake.call

    def call(url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
        if url == "http://d1/v1/completions" and (body.get("kv_transfer_params") or {}).get("remote_host") == "p0":
            return 500, "boom"
        return real(url, key, body, request_id, timeout, cafile=cafile)

    monkeypatch.setattr(step, "call", call)
    status, result = module_runner(transfer_probe.main, args)
    assert status == "fail" and result["msg"].startswith("transfer probe failed: p0 -> d1: consumer answered HTTP 500")
    assert "; " not in result["msg"]  # the only failed pair
    assert [r["ok"] for r in result["results"]].count(False) == 1
    assert all("round" in r for r in result["results"])


def test_an_error_in_one_probe_thread_is_raised(module_runner, monkeypatch):
    args = fleet_args(2, 2, parallel=8)

    def call(url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(step, "call", call)
    with pytest.raises(RuntimeError, match="unexpected"):
        module_runner(transfer_probe.main, args)


def test_parallel_below_one_is_refused(module_runner, monkeypatch):
    status, result = run(module_runner, monkeypatch, fleet_args(1, 1, parallel=0))
    assert status == "fail" and result["input"] == "parallel" and "parallel must be 1" in result["msg"]


def _tcp_link(bits, rail="eth1"):
    return {"transport": "ucx_tcp", "nominal_bits_s": bits, "why": None,
            "rails": [{"rail": rail, "nominal_bits_s": bits, "rate": "%d Mb/s" % (bits // 10 ** 6), "virtual": False,
                       "why": None}]}


def test_each_pair_has_its_transfer_rate_and_the_slowest_is_named(module_runner, monkeypatch):
    # p0's side of its transfers is slow (the fake moves 1 MB/s from it); its link is a 100 Mb/s one
    links = {"p0": _tcp_link(10 ** 8, "eth7"), "p1": _tcp_link(10 ** 10), "d0": _tcp_link(10 ** 10),
             "d1": _tcp_link(25 * 10 ** 9)}
    status, result = run(module_runner, monkeypatch, fleet_args(2, 2, links=links))
    assert status == "exit", result
    rates = dict(((r["producer"], r["consumer"]), r["rate_bytes_s"]) for r in result["results"])
    assert rates == {("p0", "d0"): 1000000, ("p0", "d1"): 1000000, ("p1", "d0"): 4000000, ("p1", "d1"): 4000000,
                     ("d0", "p0"): 4000000, ("d0", "p1"): 4000000, ("d1", "p0"): 4000000, ("d1", "p1"): 4000000}
    assert result["slowest"] == {"producer": "p0", "consumer": "d0", "rate_bytes_s": 1000000,
                                 "bytes": 2048.0 * PROMPT_TOKENS, "transfer_s": pytest.approx(0.032768),
                                 "nominal_bits_s": 10 ** 8, "utilisation": 0.08}
    by_pair = dict(((r["producer"], r["consumer"]), r) for r in result["results"])
    assert by_pair[("p1", "d1")]["link"]["nominal_bits_s"] == 10 ** 10
    assert by_pair[("p1", "d1")]["link"]["bound"] == "producer" and by_pair[("p1", "d1")]["utilisation"] == 0.0032
    assert by_pair[("d1", "p0")]["link"]["producer"] == links["d1"]
    # p0 is slow only as a producer: every engine, p0 too, has a 4 MB/s pair, so no rail is slower than another and
    # the first by name is named, tied with the rest
    rail = result["slowest_rail"]
    assert rail["rate_bytes_s"] == 4000000 and rail["tied"] == ["d1", "p0", "p1"] and rail["engine"] == "d0"


def test_the_slowest_rail_is_the_engine_whose_every_pair_is_slow(module_runner, monkeypatch):
    """A pair is no faster than its slower rail: with p0 slow both ways, p0's fastest pair is the slowest of all."""
    links = dict((e, _tcp_link(10 ** 10)) for e in ("p0", "p1", "d0", "d1"))
    fake = Fleet(["p0", "p1", "d0", "d1"], slow_consumer="p0")
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, fleet_args(2, 2, links=links))
    assert status == "exit", result
    rail = result["slowest_rail"]
    assert (rail["engine"], rail["rail"], rail["rate_bytes_s"], rail["pairs"], rail["tied"]) == \
        ("p0", "eth1", 1000000, 4, [])
    assert rail["utilisation"] == 0.0008 and rail["engine_nominal_bits_s"] == 10 ** 10


def test_without_links_the_figures_say_so(module_runner, monkeypatch):
    status, result = run(module_runner, monkeypatch, fleet_args(1, 1))
    assert status == "exit", result
    assert all(r["utilisation"] is None and "no link given" in r["link"]["why"] for r in result["results"])
    assert result["slowest"]["nominal_bits_s"] is None and result["slowest_rail"]["rail"] is None


DP_METRICS = """vllm:nixl_bytes_transferred_sum{{engine="{rank}",model_name="tiny"}} {bytes}
vllm:nixl_bytes_transferred_count{{engine="{rank}",model_name="tiny"}} {transfers}
vllm:nixl_num_failed_transfers_total{{engine="{rank}",model_name="tiny"}} 0.0
vllm:prompt_tokens_by_source_total{{engine="{rank}",model_name="tiny",source="external_kv_transfer"}} {external}
vllm:request_success_total{{engine="{rank}",finished_reason="length",model_name="tiny"}} {finished}
"""


class DataParallelFleet:
    """Data-parallel engines as vLLM 0.32.0 serves them (research in docs/vllm-requirements.md, "The transfer probe"):
    one HTTP port, X-data-parallel-rank picks the rank (else the balancer: rank 0 here), every per-engine family
    labelled engine="<rank>", a producer rank's params name <id>_dp<rank> and the side channel 5600 + rank.
    `liar`: an engine whose producer answers from rank 0 whatever rank was asked for."""

    def __init__(self, sizes, liar=None):
        self.sizes, self.liar, self.lock = sizes, liar, threading.Lock()
        self.counters = dict(((e, r), {"bytes": 0, "transfers": 0, "external": 0, "finished": 0})
                             for e, size in sizes.items() for r in range(size))
        self.seen = []

    def call(self, url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
        engine, path = url.split("//", 1)[1].split("/", 1)
        if path == "metrics":
            with self.lock:
                return 200, "".join(DP_METRICS.format(rank=r, **self.counters[(engine, r)])
                                    for r in range(self.sizes[engine]))
        rank = int((extra_headers or {}).get("X-data-parallel-rank", 0))
        params = body.get("kv_transfer_params") or {}
        with self.lock:
            mine = self.counters[(engine, rank)]
            mine["finished"] += 1
            if params.get("do_remote_decode"):
                served = 0 if engine == self.liar else rank
                self.seen.append(("produce", engine, rank))
                return 200, {"choices": [{"text": " ", "finish_reason": "length"}],
                             "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "%s-id_dp%d"
                                                    % (engine, served), "remote_block_ids": [1],
                                                    "remote_host": engine, "remote_port": 5600 + served}}
            if params:
                self.seen.append(("consume", engine, rank))
                mine["bytes"] += 2048 * PROMPT_TOKENS
                mine["transfers"] += 1
                mine["external"] += PROMPT_TOKENS
            return 200, {"choices": [{"text": " the fox", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": PROMPT_TOKENS,
                                   "prompt_tokens_details": {"cached_tokens": PROMPT_TOKENS}}}


def dp_args(sizes):
    fleet = [{"engine": "p0", "role": "prefill"}, {"engine": "d0", "role": "decode"}]
    return {"engines": dict((e["engine"], {"url": "http://%s" % e["engine"], "role": e["role"]}) for e in fleet),
            "pairs": probe_pairs(fleet), "model": "tiny", "api_key": KEY, "recompute": "off", "data_parallel": sizes}


def test_every_data_parallel_rank_produces_and_consumes_with_its_own_proof(module_runner, monkeypatch):
    """DP 2 prefill and DP 4 decode: each direction is probed max(2, 4) = 4 times, every rank of both engines is
    asked by header, each consumer rank's counters (label engine="<rank>") prove its own request."""
    fake = DataParallelFleet({"p0": 2, "d0": 4})
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, dp_args({"p0": 2, "d0": 4}))
    assert status == "exit", result
    assert [r["ok"] for r in result["results"]] == [True, True]
    forward = result["results"][0]
    assert (forward["producer"], forward["consumer"]) == ("p0", "d0")
    assert [(r["producer_rank"], r["consumer_rank"]) for r in forward["ranks"]] == [(0, 0), (1, 1), (0, 2), (1, 3)]
    assert all(r["evidence"] == "request" and r["cached_tokens"] == PROMPT_TOKENS for r in forward["ranks"])
    assert [r["remote_port"] for r in forward["ranks"]] == [5600, 5601, 5600, 5601]
    assert sorted(set((what, e, r) for what, e, r in fake.seen)) == sorted(
        [("produce", "p0", 0), ("produce", "p0", 1), ("produce", "d0", 0), ("produce", "d0", 1),
         ("produce", "d0", 2), ("produce", "d0", 3)]
        + [("consume", "d0", r) for r in range(4)] + [("consume", "p0", 0), ("consume", "p0", 1)])
    # each consumer rank moved exactly its own request's KV
    assert all(fake.counters[("d0", r)]["transfers"] == 1 for r in range(4))
    assert [fake.counters[("p0", r)]["transfers"] for r in range(2)] == [2, 2]


def test_a_producer_answering_from_another_rank_fails_the_pair(module_runner, monkeypatch):
    fake = DataParallelFleet({"p0": 2, "d0": 2}, liar="p0")
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, dp_args({"p0": 2, "d0": 2}))
    assert status == "fail"
    assert "p0 -> d0: rank 1 -> 1: the producer's remote_engine_id 'p0-id_dp0' is not DP rank 1's" in result["msg"]


def test_data_parallel_size_1_probes_as_before(module_runner, monkeypatch):
    fake = DataParallelFleet({"p0": 1, "d0": 1})
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, dp_args({"p0": 1, "d0": 1}))
    assert status == "exit", result
    assert all("ranks" not in r and "producer_rank" not in r for r in result["results"])


def test_a_long_prompt_fills_the_prompt_to_the_tokens_asked(module_runner, monkeypatch):
    fake = Fleet(["p0", "d0"])
    monkeypatch.setattr(step, "call", fake.call)
    args = fleet_args(1, 1, prompt_tokens=200, max_model_len={"p0": 256, "d0": 4096})
    status, result = module_runner(transfer_probe.main, args)
    assert status == "exit", result
    assert fake.prompts and all(len(p.split()) == 200 for p in fake.prompts)
    assert fake.prompts[0].split()[1:3] == ["narwhal", "transfer"] and fake.prompts[0].endswith(" the the")
    # each request's prompt begins with its own fresh ID (nothing of it is in a prefix cache)
    assert len(set(p.split()[0] for p in fake.prompts)) >= 2


def test_the_default_prompt_is_the_short_one(module_runner, monkeypatch):
    fake = Fleet(["p0", "d0"])
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, fleet_args(1, 1))
    assert status == "exit", result
    assert all(p.split()[1:] == "narwhal transfer probe - the quick brown fox jumps over the lazy dog".split()
               for p in fake.prompts)


@pytest.mark.parametrize("limits, needle", [
    ({"p0": 256, "d0": 200}, "d0 serves at most 200 tokens, and 250 prompt tokens + 8 answer tokens are 258"),
    ({"p0": 256}, "the max_model_len of d0 is not known"),
])
def test_a_prompt_longer_than_an_engine_serves_is_refused(module_runner, monkeypatch, limits, needle):
    """Before anything is probed."""
    fake = Fleet(["p0", "d0"])
    monkeypatch.setattr(step, "call", fake.call)
    status, result = module_runner(transfer_probe.main, fleet_args(1, 1, prompt_tokens=250, max_model_len=limits))
    assert status == "fail" and result["input"] == "prompt_tokens" and needle in result["msg"]
    assert "narwhal_probe_prompt_tokens" in result["msg"] and fake.prompts == []
    status, result = module_runner(transfer_probe.main, fleet_args(1, 1, prompt_tokens=-1))
    assert status == "fail" and "prompt_tokens must be 0" in result["msg"]


# ------------------------------------------------------------- TLS: every request verified against ca_file (issue 35)


def test_every_request_is_verified_against_the_ca_file_and_a_refused_engine_fails_its_pairs_by_name(
        module_runner, monkeypatch, tmp_path):
    ca = str(CA().write(tmp_path / "ca.crt"))
    args = fleet_args(2, 2, parallel=8, ca_file=ca)
    fake = Fleet(args["engines"])
    seen = []

    def call(url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
        seen.append(cafile)
        if url.startswith("http://d1/"):  # d1 presents a certificate the site CA did not sign
            return 0, "certificate verify failed: unable to get local issuer certificate"
        return fake.call(url, key, body, request_id, timeout, extra_headers)

    monkeypatch.setattr(step, "call", call)
    status, result = module_runner(transfer_probe.main, args)
    assert status == "fail" and set(seen) == {ca}
    failed = dict(((r["producer"], r["consumer"]), r) for r in result["results"] if not r["ok"])
    assert sorted(failed) == [("d1", "p0"), ("d1", "p1"), ("p0", "d1"), ("p1", "d1")]
    for row in failed.values():
        assert row["reasons"] == [
            "d1 (http://d1): TLS refused, certificate verify failed: unable to get local issuer certificate; its "
            "certificate must be valid, name the URL's host and be signed by the CA %s (rerun prepare and launch: "
            "NARWHAL_TLS=site reissues it; with operator certificates, correct the host's certificate in "
            "NARWHAL_TLS_DIR)" % ca]
    assert "p0 -> d1: d1 (http://d1): TLS refused, certificate verify failed" in result["msg"]
    # nothing was asked of a refused pair: only the 4 pairs without d1 sent completions (the producer's, the
    # consumer's and the recompute reference)
    assert len(fake.prompts) == 4 * 3


def test_a_ca_file_that_cannot_be_read_fails_before_any_probe(module_runner, monkeypatch, tmp_path):
    (tmp_path / "ca.crt").write_text("no certificate\n")
    for path, why in ((tmp_path / "missing.crt", "No such file or directory"), (tmp_path / "ca.crt", "")):
        fake = Fleet(["p0", "d0"])
        monkeypatch.setattr(step, "call", fake.call)
        status, result = module_runner(transfer_probe.main, fleet_args(1, 1, ca_file=str(path)))
        assert status == "fail" and result["input"] == "ca_file", result
        assert result["msg"].startswith("transfer probe: cannot read the CA certificate %s on host " % path)
        assert why in result["msg"] and "pass the CA's path as ca_file" in result["msg"]
        assert fake.prompts == []


class Metrics(BaseHTTPRequestHandler):
    """An HTTPS engine that serves /metrics and refuses every completion (404): enough to tell TLS from the rest."""

    posted = []

    def do_GET(self):  # noqa: N802 - http.server's name
        body = METRICS.format(bytes=0, transfers=0, seconds=0.0, external=0, finished=0).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.posted.append(self.path)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_over_real_tls_the_site_ca_passes_and_another_cas_engine_is_named(module_runner, tmp_path, monkeypatch):
    monkeypatch.setattr(http, "_CONTEXTS", {})
    site, other = CA("narwhal site CA"), CA("another CA")
    servers, urls = [], {}
    for name, issuer in (("p0", site), ("d0", site), ("d1", other)):
        srv, urls[name] = https_server(Metrics, *issuer.write_server(tmp_path, name, ["127.0.0.1"]))
        servers.append(srv)
    try:
        args = {"engines": dict((e, {"url": urls[e], "role": "prefill" if e == "p0" else "decode"}) for e in urls),
                "pairs": [["p0", "d0"], ["p0", "d1"]], "model": "tiny", "api_key": KEY, "parallel": 1,
                "ca_file": str(site.write(tmp_path / "ca.crt"))}
        Metrics.posted = []
        status, result = module_runner(transfer_probe.main, args)
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
    assert status == "fail"
    good, bad = result["results"]
    assert good["reasons"][0] == "producer answered HTTP 404"  # TLS passed: the producer was asked
    assert len(bad["reasons"]) == 1 and bad["reasons"][0].startswith(
        "d1 (%s): TLS refused, certificate verify failed: unable to get local issuer certificate" % urls["d1"])
    assert Metrics.posted == ["/v1/completions"]  # the pair with d1 asked nothing
    assert KEY not in result["msg"]
