"""The benchmark's figures (plugins/module_utils/_bench/report.py): a real `vllm bench serve` result reduced, the
rows, the router's overhead, the problems and the table."""

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import kept, overhead, problems, row, table
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
SITE = load_inputs({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                    "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_BENCH_RATES": "2"})["site"]
PLAN = bench_plan(SITE, fleet_workers(FLEET), "http://r:30000", "http://r:30001", "tiny", "/models/tiny",
                  "20261202T201500Z")


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
