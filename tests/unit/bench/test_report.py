"""bench/report.py (the pure part of `make bench`): medians, ratios, goals and the table from raw samples.
The benchmark itself needs a simulated site and is not run by the suite (docs/benchmarks.md)."""
from __future__ import annotations

import sys

import pytest
from test_support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))

import report  # noqa: E402 - bench/report.py


def _round(setup, cold, warm, warm_changed=0, warm_containers=0, status=None, site=None, site_changed=0):
    row = {"setup_s": setup, "discover_cold_s": cold, "discover_warm_s": warm, "cold_changed": 0,
           "warm_changed": warm_changed, "cold_containers": 4, "warm_containers": warm_containers,
           "setup_maxrss_kib": 60000, "discover_cold_maxrss_kib": 70000, "discover_warm_maxrss_kib": 69000,
           "order": "setup-first"}
    if status is not None:
        row.update(status_s=status, site_s=site, site_changed=site_changed)
    return row


RAW = {
    "4": {"forks": 4, "rounds": [_round(4.0, 8.0, 4.0), _round(5.0, 9.0, 5.0), _round(100.0, 7.0, 3.0)],
          "memory": {"setup_pss_kib": 100000, "discover_cold_pss_kib": 150000, "discover_warm_pss_kib": 140000}},
    "16": {"forks": 16, "rounds": [_round(10.0, 14.0, 7.0, status=6.0, site=40.0),
                                   _round(12.0, 16.0, 8.0, status=9.0, site=44.0),
                                   _round(11.0, 15.0, 7.5, status=10.0, site=42.0, site_changed=1)],
           "memory": {}},
    "32": {"forks": 32, "rounds": [_round(20.0, 24.0, 12.0)],
           "memory": {"setup_pss_kib": 900 * 1024, "discover_cold_pss_kib": 600 * 1024,
                      "discover_warm_pss_kib": 580 * 1024, "status_pss_kib": 950 * 1024}},
}
LAUNCH = {"host": "engine-1", "engine": "engine-1", "rounds": [
    {"start_s": 0.5, "docker_run_s": 0.4, "check_s": 1.0, "plan_s": 0.1, "import_docker_s": 0.2,
     "start_running": True, "docker_run_running": True, "start_action": "started"},
    {"start_s": 0.7, "docker_run_s": 0.5, "check_s": 1.2, "plan_s": 0.1, "import_docker_s": 0.2,
     "start_running": True, "docker_run_running": True, "start_action": "started"}]}


def test_summaries_take_medians_and_ratios():
    d = report.summarize_discovery(RAW)
    assert list(d) == ["4", "16", "32"]
    assert (d["4"]["setup_s"], d["4"]["discover_cold_s"], d["4"]["discover_warm_s"]) == (5.0, 8.0, 4.0)
    assert d["4"]["warm_over_cold"] == 0.5 and d["16"]["discover_cold_over_setup"] == pytest.approx(15 / 11, 1e-3)
    assert d["4"]["tree_pss_peak_kib"]["discover_cold_pss_kib"] == 150000 and d["16"]["tree_pss_peak_kib"] == {}
    launcher = report.summarize_launcher(LAUNCH)
    assert launcher["start_over_docker_run"] == pytest.approx(0.6 / 0.45, 1e-3)
    assert launcher["all_running"] is True and launcher["check_s"] == 1.1
    assert report.summarize_launcher(None) is None


def test_goals_and_table():
    d = report.summarize_discovery(RAW)
    assert (d["16"]["status_s"], d["16"]["site_s"], d["16"]["site_changed_max"]) == (9.0, 42.0, 1)
    assert d["4"]["status_s"] is None and d["4"]["site_changed_max"] is None
    goals = {g["goal"]: g for g in report.goals(d, report.summarize_launcher(LAUNCH))}
    assert goals["disc1 / setup at N=16"]["figure"] == pytest.approx(15 / 11, 1e-3)
    assert goals["disc1 / setup at N=16"]["met"] is False  # 1.36 > 1.3
    assert goals["disc2 / setup at N=16"]["met"] is True and goals["disc2 / setup at N=32"]["met"] is True
    assert "disc2 / setup at N=4" not in goals  # the goal holds at N >= 8
    assert goals["status / setup at N=16"]["figure"] == pytest.approx(9 / 11, 1e-3)
    assert goals["status / setup at N=16"]["met"] is False
    growth = goals["growth N=4 -> 32, disc2"]
    assert growth["figure"] == pytest.approx(12 / 4, 1e-3) and growth["limit"] == pytest.approx(20 / 5, 1e-3)
    assert growth["met"] is True and goals["growth N=4 -> 32, disc1"]["met"] is None
    memory = goals["MiB at N=32 vs setup's"]
    assert (memory["figure"], memory["limit"], memory["met"]) == (950, 900, False)  # status is the worst
    assert goals["launcher start / docker run"]["met"] is False
    second = [g for g in goals.values() if g["goal"].startswith("disc2 / disc1")][0]
    assert second["figure"] == pytest.approx(7.5 / 15, 1e-3) and second["met"] is True
    text = report.table(d, report.summarize_launcher(LAUNCH), list(goals.values()), header="bench")
    assert len(text.splitlines()) <= 30 and max(len(line) for line in text.splitlines()) <= 100
    assert "MISSED" in text
    row16 = [line for line in text.splitlines() if line.startswith("16 ")][0].split()
    assert row16[7:12] == ["9.00", "0.82", "42.0", "3.82", "1"], row16  # status, ratio, site, ratio, changed


def test_a_changed_second_discover_misses_the_goal():
    raw = {"16": {"forks": 16, "rounds": [_round(10.0, 20.0, 5.0, warm_containers=1)], "memory": {}}}
    second = [g for g in report.goals(report.summarize_discovery(raw), None) if g["goal"].startswith("disc2 / disc1")]
    assert second[0]["met"] is False and "inspection containers=1" in second[0]["note"]


def test_the_goals_of_issue_25_and_the_stages_alone():
    # site / setup <= 3 at N=16 (and changed=0), growth 4 -> 32 of the site rerun <= 1.5 x setup's, status <= 0.5
    def day_two(setup, site, status, changed=0, probe=None):
        row = _round(setup, setup * 1.2, setup * 0.7, status=status, site=site, site_changed=changed)
        if probe:
            row.update(probe)
        return row

    stages = {"probe_s": 6.0, "probe_pairs": 128, "probe_rounds": 16, "probe_cover_s": 1.5,
              "probe_cover_pairs": 16, "probe_cover_rounds": 2, "router_s": 4.0}
    raw = {"4": {"forks": 4, "rounds": [day_two(4.0, 10.0, 1.0)], "memory": {}},
           "16": {"forks": 16, "rounds": [day_two(5.0, 15.0, 2.5, probe=stages)], "memory": {}},
           "32": {"forks": 32, "rounds": [day_two(10.0, 31.0, 4.0)], "memory": {}}}
    d = report.summarize_discovery(raw)
    goals = {g["goal"]: g for g in report.goals(d, None)}
    assert goals["site / setup at N=16"]["figure"] == 3.0 and goals["site / setup at N=16"]["met"] is True
    assert goals["status / setup at N=16"]["figure"] == 0.5 and goals["status / setup at N=16"]["met"] is True
    growth = goals["growth N=4 -> 32, site"]
    assert growth["figure"] == 3.1 and growth["limit"] == 3.75 and growth["met"] is True  # setup grew 2.5x
    raw["32"]["rounds"] = [day_two(10.0, 38.0, 4.0)]
    assert {g["goal"]: g for g in report.goals(report.summarize_discovery(raw), None)}[
        "growth N=4 -> 32, site"]["met"] is False
    raw["16"]["rounds"] = [day_two(5.0, 15.0, 2.6, changed=1)]
    goals = {g["goal"]: g for g in report.goals(report.summarize_discovery(raw), None)}
    assert goals["site / setup at N=16"]["met"] is False and "changed=1" in goals["site / setup at N=16"]["note"]
    assert goals["status / setup at N=16"]["met"] is False
    assert (d["16"]["probe_pairs"], d["16"]["probe_rounds"], d["16"]["probe_cover_rounds"]) == (128, 16, 2)
    assert d["4"]["probe_s"] is None and d["4"]["probe_pairs"] is None
    text = report.table(d, None, report.goals(d, None))
    row16 = [line.split() for line in text.splitlines() if line.startswith("  16 ")][0]
    assert row16 == ["16", "6.00", "128", "16", "1.50", "16", "2", "4.00"], row16
    assert [line.split()[1] for line in text.splitlines() if line.startswith("  4 ")] == ["-"]
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_projection_fits_a_line_per_host_and_a_cost_per_pair():
    assert report.fit_line([(4, 1.0)]) is None and report.fit_line([(4, 1.0), (4, 2.0)]) is None
    assert report.fit_line([(8, 3.0), (16, 5.0), (32, 9.0)]) == pytest.approx((1.0, 0.25))

    def row(n, site, probe, pairs):
        r = _round(n / 4.0, n / 3.0, n / 5.0, status=n / 8.0, site=site)
        r.update(probe_s=probe, probe_pairs=pairs, probe_rounds=n, probe_cover_s=1.0 + n / 16.0,
                 probe_cover_pairs=n, probe_cover_rounds=2, router_s=3.0)
        return r

    raw = {str(n): {"forks": n, "rounds": [row(n, 10.0 + 2.0 * n, 2.0 + 0.01 * (n // 2) ** 2, (n // 2) ** 2)],
                    "memory": {}} for n in (4, 8, 16, 32)}
    raw["4"]["rounds"][0]["site_s"] = 99.0  # below PROJECT_FROM: not fitted
    d = report.summarize_discovery(raw)
    proj = report.projection(d)
    assert proj["fitted_over"] == [8, 16, 32] and proj["to"] == [64, 256, 1000]
    assert proj["lines"]["site_s"] == {"intercept_s": 10.0, "per_host_s": 2.0}
    assert proj["projected"]["site_s"] == [138.0, 522.0, 2010.0]
    assert proj["lines"]["probe_s"] == {"intercept_s": 2.0, "per_pair_s": 0.01}
    assert proj["projected"]["probe_s"] == [12.2, 165.8, 2502.0]  # 2 + 0.01 x (N/2)^2, to 0.1 s
    assert proj["projected"]["router_s"] == [3.0, 3.0, 3.0]
    # site minus probe = 10 + 2N - 2 - 0.01 (N/2)^2 over the fitted N: its line, plus the probe's pairs
    rest = report.fit_line([(n, 10.0 + 2.0 * n - 2.0 - 0.01 * (n // 2) ** 2) for n in (8, 16, 32)])
    assert proj["projected"]["site_pairs_s"][2] == pytest.approx(rest[0] + rest[1] * 1000 + 2502.0, abs=0.1)
    text = report.table(d, None, report.goals(d, None))
    assert "projected (s) to N = 64/256/1000 from a line over N = 8,16,32" in text
    assert "site 138/522/2010" in text and max(len(line) for line in text.splitlines()) <= 100


def test_a_site_rerun_that_probed_the_cover_subtracts_the_cover():
    """narwhal_probe_pairs=auto: an unchanged fleet's rerun probes the cover, so its other stages are the rerun less
    the cover's probe, and a rerun with every pair adds the probe of every pair to them."""
    def row(n, site_probe_pairs):
        r = _round(n / 4.0, n / 3.0, n / 5.0, status=n / 8.0, site=20.0 + 1.0 * n)
        r.update(probe_s=2.0 + 0.01 * (n // 2) ** 2, probe_pairs=(n // 2) ** 2, probe_rounds=n,
                 probe_cover_s=1.0 + n / 16.0, probe_cover_pairs=n, probe_cover_rounds=2, router_s=3.0,
                 site_probe_pairs=site_probe_pairs)
        return r

    raw = {str(n): {"forks": n, "rounds": [row(n, n)], "memory": {}} for n in (8, 16, 32)}
    d = report.summarize_discovery(raw)
    assert d["16"]["site_probe_pairs"] == 16
    rest = report.fit_line([(n, 20.0 + 1.0 * n - 1.0 - n / 16.0) for n in (8, 16, 32)])
    proj = report.projection(d)
    assert proj["lines"]["site_without_probe_s"]["per_host_s"] == pytest.approx(rest[1], abs=1e-4)
    assert proj["projected"]["site_pairs_s"][2] == pytest.approx(rest[0] + rest[1] * 1000 + 2502.0, abs=0.1)
    assert "its probe stage: the cover" in report.table(d, None, report.goals(d, None))
    # a rerun that probed every pair (an older run, or narwhal_probe_pairs=all) subtracts every pair's probe
    for n in raw:
        raw[n]["rounds"][0]["site_probe_pairs"] = (int(n) // 2) ** 2
    d = report.summarize_discovery(raw)
    rest = report.fit_line([(n, 20.0 + 1.0 * n - 2.0 - 0.01 * (n // 2) ** 2) for n in (8, 16, 32)])
    assert report.projection(d)["lines"]["site_without_probe_s"]["per_host_s"] == pytest.approx(rest[1], abs=1e-4)
