"""narwhal.deploy.bench_report: one benchmark run's figures written as runs/bench-<stamp>/ whole (JSON, table, a
real matplotlib PNG) or not at all (module_utils step run the way its action plugin runs it; the playbook path is
the real scenario's verify_benchmark.yml)."""
from __future__ import annotations

import json
import os
import stat

from test_support.bench import lengths

from ansible_collections.narwhal.deploy.plugins.module_utils._bench import results as step
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_plan, bench_routers
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import run_step

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
SITE = load_inputs({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                    "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_BENCH_RATES": "1,4"})["site"]
PLAN = bench_plan(SITE, fleet_workers(FLEET), "http://r:30000", "http://r:30001", "tiny", "/models/tiny",
                  "20261202T201500Z", False, lengths(FLEET))


def figures(scale):
    out = {"completed": 64, "failed": 0, "num_prompts": 64, "request_throughput": 3.9, "output_throughput": 500.0,
           "request_goodput": None, "errors": []}
    for metric, base in (("ttft", 20.0), ("tpot", 5.0), ("itl", 5.0), ("e2el", 700.0)):
        for p, factor in ((50, 1.0), (90, 1.3), (99, 1.8)):
            out["p%d_%s_ms" % (p, metric)] = base * factor * scale
    return out


RESULTS = dict((s["id"], figures({"pd": 1.2, "direct": 1.0, "router": 1.05}[s["target"]])) for s in PLAN["steps"])


def _run(runs, results=None, check_mode=False, failures=None):
    args = {"runs_dir": str(runs), "plan": PLAN, "results": RESULTS if results is None else results}
    if failures:
        args["failures"] = failures
    return run_step(step.bench_report, step.module_spec(), args, "narwhal.deploy.bench_report", check_mode=check_mode)


def test_writes_the_run_whole_with_a_real_plot(tmp_path):
    result = _run(tmp_path)
    dest = tmp_path / "bench-20261202T201500Z"
    assert not result.get("failed") and result["problems"] == [] and result["dest"] == str(dest)
    assert sorted(os.listdir(dest)) == ["bench.json", "latency.png", "table.txt"]
    assert os.listdir(tmp_path) == ["bench-20261202T201500Z"]  # no hidden directory left
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(dest / f).st_mode) for f in os.listdir(dest)} == {0o600}
    assert (dest / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((dest / "bench.json").read_text())
    assert document["ok"] and len(document["rows"]) == 9 and document["overhead"][0]["p50_ttft_ms"] == 1.0
    assert (dest / "table.txt").read_text() == result["table"] and "router overhead" in result["table"]


def test_a_run_of_that_stamp_is_kept_and_check_mode_writes_nothing(tmp_path):
    assert not _run(tmp_path, check_mode=True).get("failed") and os.listdir(tmp_path) == []
    _run(tmp_path)
    again = _run(tmp_path)
    assert again["failed"] and "already exists" in again["msg"]


def test_failed_steps_are_kept_and_named(tmp_path):
    results = dict(RESULTS)
    results.pop("02-direct-rate-1")
    results["01-pd-rate-1"] = dict(RESULTS["01-pd-rate-1"], failed=3, completed=61, errors=["HTTP 500"])
    result = _run(tmp_path, results, failures={"02-direct-rate-1": "vllm bench serve exited 1"})
    assert [line.split(" ", 1)[0] for line in result["problems"]] == ["01-pd-rate-1", "02-direct-rate-1"]
    assert not json.loads((tmp_path / "bench-20261202T201500Z" / "bench.json").read_text())["ok"]


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def broken(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(step, "plot", broken)
    try:
        _run(tmp_path)
    except KeyboardInterrupt:
        pass
    assert os.listdir(tmp_path) == []


def test_without_matplotlib_the_fix_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(step, "plotting", lambda: None)
    result = _run(tmp_path)
    assert result["failed"] and "pip install -r requirements.txt" in result["msg"] and os.listdir(tmp_path) == []


FLEET_2P = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000", "kv_events": ["tcp://x:1"]},
            {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"},
            {"engine": "engine-3", "role": "prefill", "url": "http://10.0.0.13:8000", "kv_events": ["tcp://y:1"]}]
POLICY_SITE = load_inputs({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                           "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_BENCH_RATES": "1,4", "NARWHAL_TLS": "off",
                           "NARWHAL_BENCH_WORKLOAD": "prefix",
                           "NARWHAL_BENCH_POLICIES": "round_robin,kv_aware"})["site"]
ROUTER_RECORD = {"url": "http://10.0.0.21:30000", "image": "sha256:abc", "vllm_router_version": "0.1.17"}
POLICY_PLAN = bench_plan(POLICY_SITE, fleet_workers(FLEET_2P), "http://10.0.0.21:30000", "", "tiny", "/models/tiny",
                         "20261202T201500Z", False, lengths(FLEET_2P),
                         bench_routers(ROUTER_RECORD, POLICY_SITE, FLEET_2P))


def with_counters(figures_of, hits):
    out = dict(figures_of)
    out["counters"] = {"http://10.0.0.11:8000": {"prefix_cache_queries": 1000.0, "prefix_cache_hits": hits,
                                                 "kv_bytes": None, "kv_transfers": None},
                       "http://10.0.0.12:8000": {"prefix_cache_queries": 1000.0, "prefix_cache_hits": 0.0,
                                                 "kv_bytes": 4194304.0, "kv_transfers": 64.0},
                       "http://10.0.0.13:8000": {"error": "GET http://10.0.0.13:8000/metrics: timed out"}}
    return out


def test_with_policies_the_run_has_them_side_by_side_and_their_plot(tmp_path):
    results = dict((s["id"], with_counters(figures(1.0 if s["target"] == "pd-round_robin" else 0.6),
                                           300.0 if s["target"] == "pd-round_robin" else 700.0))
                   for s in POLICY_PLAN["steps"])
    result = run_step(step.bench_report, step.module_spec(),
                      {"runs_dir": str(tmp_path), "plan": POLICY_PLAN, "results": results, "engines": FLEET_2P},
                      "narwhal.deploy.bench_report")
    dest = tmp_path / "bench-20261202T201500Z"
    assert not result.get("failed") and result["problems"] == []
    assert sorted(os.listdir(dest)) == ["bench.json", "latency.png", "policies.png", "table.txt"]
    assert (dest / "policies.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stat.S_IMODE(os.stat(dest / "policies.png").st_mode) == 0o600
    document = json.loads((dest / "bench.json").read_text())
    kv = [e for e in document["comparison"] if e["target"] == "pd-kv_aware"]
    assert [e["load"] for e in kv] == ["rate-1", "rate-4", "concurrency-8"]
    assert {e["vs_first"] for e in kv} == {0.6} and {e["prefill_prefix_hit_rate"] for e in kv} == {0.7}
    assert {e["kv_mib"] for e in kv} == {4.0}
    assert document["engines"] == [dict((k, e[k]) for k in ("engine", "role", "url")) for e in FLEET_2P]
    assert "side by side" in result["table"] and "router overhead" not in result["table"]
