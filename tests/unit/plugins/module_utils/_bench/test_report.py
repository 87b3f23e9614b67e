"""The benchmark's figures (plugins/module_utils/_bench/report.py): a real `vllm bench serve` result reduced, the
rows, the router's overhead, the problems and the table."""

from test_support.bench import lengths

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import (
    comparison,
    counter_deltas,
    engine_counters,
    kept,
    overhead,
    problems,
    row,
    table,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
SITE = load_inputs({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                    "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_BENCH_RATES": "2"})["site"]
PLAN = bench_plan(SITE, fleet_workers(FLEET), "http://r:30000", "http://r:30001", "tiny", "/models/tiny",
                  "20261202T201500Z", False, lengths(FLEET))


def result(ttft, e2el, failed=0, errors=None):
    """The shape of vllm bench serve 0.32's result JSON with --save-detailed (a real one's keys)."""
    out = {"duration": 2.1, "completed": 8 - failed, "failed": failed, "num_prompts": 8, "request_throughput": 3.8,
           "request_goodput": None, "output_throughput": 60.6, "ttfts": [0.02] * 8, "generated_texts": ["x"] * 8,
           "errors": errors or [""] * 8, "itls": [[0.005]] * 8}
    for metric, value in (("ttft", ttft), ("tpot", 5.9), ("itl", 6.1), ("e2el", e2el)):
        for prefix in ("mean", "median", "std", "p50", "p90", "p99"):
            out["%s_%s_ms" % (prefix, metric)] = value
    return out


def test_kept_drops_the_per_request_lists_and_keeps_distinct_errors():
    got = kept(result(25.0, 110.0, failed=2, errors=["", "HTTP 500: boom", "HTTP 500: boom", "timeout"]))
    assert "ttfts" not in got and "generated_texts" not in got and got["p99_ttft_ms"] == 25.0
    assert got["errors"] == ["HTTP 500: boom", "timeout"]


def test_overhead_is_the_router_minus_the_engine_alone_at_each_load():
    results = {"01-pd-rate-2": result(40.0, 150.0), "02-direct-rate-2": result(25.0, 110.0),
               "03-router-rate-2": result(27.5, 113.0)}
    rows = [row(s, kept(results.get(s["id"]) or {})) for s in PLAN["steps"]]
    over = overhead(rows)
    assert over[0]["load"] == "rate-2" and over[0]["p50_ttft_ms"] == 2.5 and over[0]["p50_e2el_ms"] == 3.0
    assert over[1]["load"] == "concurrency-8" and over[1]["p50_ttft_ms"] is None
    text = table(rows, over, {"ttft": 250})
    assert "01-pd-rate-2" in text and "router overhead" in text and "ttft <= 250 ms" in text


def test_problems_name_the_step_the_target_and_the_errors():
    results = {"01-pd-rate-2": kept(result(40.0, 150.0, failed=3, errors=["HTTP 500: no worker"]))}
    lines = problems(PLAN["steps"], results, {"02-direct-rate-2": "vllm bench serve exited 1"})
    assert lines[0].startswith("01-pd-rate-2 (P/D through the router at http://r:30000): 3 of 8 requests failed")
    assert "HTTP 500: no worker" in lines[0]
    assert lines[1].endswith("no result: vllm bench serve exited 1")
    assert len(lines) == len(PLAN["steps"])
    assert problems(PLAN["steps"], dict((s["id"], kept(result(1.0, 2.0))) for s in PLAN["steps"])) == []


# ------------------------------------------------------------------ the engines' own counters (issue 38)

def metrics_text(queries, hits, kv_bytes=None, transfers=None, ranks=1):
    """An engine's /metrics as vLLM 0.32 writes these families (prometheus_client: a counter's _total and _created,
    a histogram's _sum and _count, one label set per DP rank)."""
    lines = ["# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.",
             "# TYPE vllm:prefix_cache_queries counter"]
    for rank in range(ranks):
        labels = '{engine="%d",model_name="tiny"}' % rank
        lines += ["vllm:prefix_cache_queries_total%s %s" % (labels, float(queries)),
                  "vllm:prefix_cache_queries_created%s 1.7e+09" % labels,
                  "vllm:prefix_cache_hits_total%s %s" % (labels, float(hits))]
        if kv_bytes is not None:
            lines += ["vllm:nixl_bytes_transferred_sum%s %s" % (labels, float(kv_bytes)),
                      "vllm:nixl_bytes_transferred_count%s %s" % (labels, float(transfers))]
    return "\n".join(lines) + "\n"


def test_engine_counters_sum_every_rank_and_say_none_for_a_family_the_engine_lacks():
    assert engine_counters(metrics_text(100, 40, 2.5e6, 3, ranks=2)) == {
        "prefix_cache_queries": 200.0, "prefix_cache_hits": 80.0, "kv_bytes": 5e6, "kv_transfers": 6.0,
        "kv_failed_transfers": None}
    assert engine_counters(metrics_text(1, 0))["kv_bytes"] is None
    assert set(engine_counters("")) == {"prefix_cache_queries", "prefix_cache_hits", "kv_bytes", "kv_transfers",
                                        "kv_failed_transfers"}


def test_counter_deltas_are_the_growth_and_nothing_across_a_restart():
    before, after = engine_counters(metrics_text(100, 40, 1000, 1)), engine_counters(metrics_text(300, 190, 5000, 3))
    assert counter_deltas(before, after) == {"prefix_cache_queries": 200.0, "prefix_cache_hits": 150.0,
                                             "kv_bytes": 4000.0, "kv_transfers": 2.0, "kv_failed_transfers": None}
    restarted = counter_deltas(after, engine_counters(metrics_text(10, 0, 0, 0)))
    assert restarted["prefix_cache_queries"] is None and restarted["kv_bytes"] is None


ROLES = {"http://p1:8000": "prefill", "http://p2:8000": "prefill", "http://d1:8000": "decode"}


def counters(p1, p2, d1):
    keys = ("prefix_cache_queries", "prefix_cache_hits", "kv_bytes", "kv_transfers", "kv_failed_transfers")
    return {"http://p1:8000": dict(zip(keys, p1, strict=True)), "http://p2:8000": dict(zip(keys, p2, strict=True)),
            "http://d1:8000": dict(zip(keys, d1, strict=True))}


def test_a_steps_hit_rate_is_over_the_prefill_engines_and_the_kv_bytes_over_all():
    step = PLAN["steps"][0]
    seen = counters((600, 450, None, None, None), (400, 50, None, None, None), (1000, 100, 3 * 1048576, 8, 0))
    got = row(step, dict(kept(result(40.0, 150.0)), counters=seen), ROLES)
    assert got["prefill_prefix_hit_rate"] == 0.5 and got["decode_prefix_hit_rate"] == 0.1
    assert got["kv_bytes"] == 3 * 1048576 and got["kv_transfers"] == 8
    # an engine that did not answer counts for nothing; none asked: no rate
    seen = {"http://p1:8000": {"error": "GET: timed out"},
            "http://d1:8000": {"prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0}}
    quiet = row(step, dict(kept(result(40.0, 150.0)), counters=seen), ROLES)
    assert quiet["prefill_prefix_hit_rate"] is None and quiet["decode_prefix_hit_rate"] is None
    # the default's rows are as they were: no counters, no keys of theirs
    assert set(row(step, kept(result(40.0, 150.0)))) == set(row(step, {}))
    assert "prefill_prefix_hit_rate" not in row(step, kept(result(40.0, 150.0)))


def test_the_comparison_puts_the_targets_side_by_side_against_the_first():
    rows = [{"step": "01-pd-round_robin-rate-1", "target": "pd-round_robin", "load": "rate-1", "p50_ttft_ms": 200.0,
             "p99_ttft_ms": 400.0, "completed": 12, "failed": 0, "request_throughput": 0.9, "output_throughput": 14.5,
             "prefill_prefix_hit_rate": 0.4, "decode_prefix_hit_rate": 0.0, "kv_bytes": 2097152.0},
            {"step": "02-pd-cache_aware-rate-1", "target": "pd-cache_aware", "load": "rate-1", "p50_ttft_ms": 120.0,
             "p99_ttft_ms": 390.0, "completed": 12, "failed": 0, "request_throughput": 0.9,
             "output_throughput": 14.4, "prefill_prefix_hit_rate": 0.7, "decode_prefix_hit_rate": 0.0,
             "kv_bytes": 1048576.0},
            {"step": "03-pd-round_robin-rate-4", "target": "pd-round_robin", "load": "rate-4", "p50_ttft_ms": None,
             "p99_ttft_ms": None, "completed": None, "failed": None, "request_throughput": None,
             "output_throughput": None}]
    entries = comparison(rows)
    assert [(e["target"], e["load"]) for e in entries] == [("pd-round_robin", "rate-1"), ("pd-round_robin", "rate-4"),
                                                           ("pd-cache_aware", "rate-1")]
    assert entries[2]["vs_first"] == 0.6 and entries[0]["vs_first"] == 1.0 and entries[1]["vs_first"] is None
    assert entries[2]["kv_mib"] == 1.0 and entries[1]["kv_mib"] is None
    text = table(rows, [], {}, entries)
    lines = text.splitlines()
    start = lines.index("side by side (ms; prefix-cache hits in prompt tokens from the engines' own counters, KV "
                        "moved by NIXL):")
    assert lines[start + 1].split() == ["target", "load", "ok", "fail", "req/s", "out", "tok/s", "ttft", "p50",
                                        "ttft", "p99", "p50", "vs", "first", "prefill", "hit", "%", "decode", "hit",
                                        "%", "KV", "MiB"]
    assert lines[start + 4].split() == ["pd-cache_aware", "rate-1", "12", "0", "0.90", "14.40", "120.0", "390.0",
                                        "0.60", "70.0", "0.0", "1.00"]
    assert "side by side" not in table(rows, [], {})
