"""narwhal.deploy.bench_report: one benchmark run's figures written as runs/bench-<stamp>/ whole (JSON, table, a
real matplotlib PNG) or not at all (module_utils step run the way its action plugin runs it; the playbook path is
the real scenario's verify_benchmark.yml)."""
from __future__ import annotations

import json
import os
import stat

from ansible_collections.narwhal.deploy.plugins.module_utils._bench import results as step
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import run_step

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
SITE = load_inputs({"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_MODEL_PATH": "/models/tiny",
                    "NARWHAL_IMAGE": "vllm/vllm:1", "NARWHAL_BENCH_RATES": "1,4"})["site"]
PLAN = bench_plan(SITE, fleet_workers(FLEET), "http://r:30000", "http://r:30001", "tiny", "/models/tiny",
                  "20261202T201500Z")


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
