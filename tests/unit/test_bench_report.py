"""bench/report.py (the pure part of `make bench`): medians, ratios, goals and the table from raw samples.
The benchmark itself needs a simulated site and is not run by the suite (docs/benchmarks.md)."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import report  # noqa: E402 - bench/report.py


def _round(setup, cold, warm, warm_changed=0, warm_containers=0):
    return {"setup_s": setup, "discover_cold_s": cold, "discover_warm_s": warm, "cold_changed": 0,
            "warm_changed": warm_changed, "cold_containers": 4, "warm_containers": warm_containers,
            "setup_maxrss_kib": 60000, "discover_cold_maxrss_kib": 70000, "discover_warm_maxrss_kib": 69000,
            "order": "setup-first"}


RAW = {
    "4": {"forks": 4, "rounds": [_round(4.0, 8.0, 4.0), _round(5.0, 9.0, 5.0), _round(100.0, 7.0, 3.0)],
          "memory": {"setup_pss_kib": 100000, "discover_cold_pss_kib": 150000, "discover_warm_pss_kib": 140000}},
    "16": {"forks": 16, "rounds": [_round(10.0, 14.0, 7.0), _round(12.0, 16.0, 8.0), _round(11.0, 15.0, 7.5)],
           "memory": {}},
}
LAUNCH = {"host": "engine-1", "engine": "engine-1", "rounds": [
    {"start_s": 0.5, "docker_run_s": 0.4, "check_s": 1.0, "plan_s": 0.1, "import_docker_s": 0.2,
     "start_running": True, "docker_run_running": True, "start_action": "started"},
    {"start_s": 0.7, "docker_run_s": 0.5, "check_s": 1.2, "plan_s": 0.1, "import_docker_s": 0.2,
     "start_running": True, "docker_run_running": True, "start_action": "started"}]}


def test_summaries_take_medians_and_ratios():
    d = report.summarize_discovery(RAW)
    assert list(d) == ["4", "16"]
    assert (d["4"]["setup_s"], d["4"]["discover_cold_s"], d["4"]["discover_warm_s"]) == (5.0, 8.0, 4.0)
    assert d["4"]["warm_over_cold"] == 0.5 and d["16"]["discover_cold_over_setup"] == pytest.approx(15 / 11, 1e-3)
    assert d["4"]["tree_pss_peak_kib"]["discover_cold_pss_kib"] == 150000 and d["16"]["tree_pss_peak_kib"] == {}
    launcher = report.summarize_launcher(LAUNCH)
    assert launcher["start_over_docker_run"] == pytest.approx(0.6 / 0.45, 1e-3)
    assert launcher["all_running"] is True and launcher["check_s"] == 1.1
    assert report.summarize_launcher(None) is None


def test_goals_and_table():
    d = report.summarize_discovery(RAW)
    goals = {g["goal"]: g for g in report.goals(d, report.summarize_launcher(LAUNCH))}
    assert goals["disc1 / setup at N=16"]["met"] is True
    assert goals["growth N=4 -> 16, disc1"]["figure"] == pytest.approx(15 / 8, 1e-3)
    assert goals["launcher start / docker run"]["met"] is False
    second = [g for g in goals.values() if g["goal"].startswith("disc2 / disc1")][0]
    assert second["figure"] == pytest.approx(7.5 / 15, 1e-3) and second["met"] is True
    text = report.table(d, report.summarize_launcher(LAUNCH), list(goals.values()), header="bench")
    assert len(text.splitlines()) <= 25 and max(len(line) for line in text.splitlines()) <= 100
    assert "MISSED" in text and "16   16" in text


def test_a_changed_second_discover_misses_the_goal():
    raw = {"16": {"forks": 16, "rounds": [_round(10.0, 20.0, 5.0, warm_containers=1)], "memory": {}}}
    second = [g for g in report.goals(report.summarize_discovery(raw), None) if g["goal"].startswith("disc2 / disc1")]
    assert second[0]["met"] is False and "inspection containers=1" in second[0]["note"]
