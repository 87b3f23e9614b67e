# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure reporting for bench/bench.py: medians, ratios, the goals of issue #7 and the one-screen table.

No I/O here (the PNG is drawn by `plot`, which only writes the file it is given): bench.py collects raw
samples and hands them over as plain dicts, these functions turn them into figures.

Raw samples (the `raw` document bench.py keeps in results JSON):
  discovery: {N: {"forks": int, "rounds": [{"setup_s", "discover_cold_s", "discover_warm_s",
                   "cold_changed", "warm_changed", "cold_containers", "warm_containers",
                   "setup_maxrss_kib", "discover_cold_maxrss_kib", "discover_warm_maxrss_kib", "order"}]},
              "memory": {"setup_pss_kib", "discover_cold_pss_kib", "discover_warm_pss_kib"}}
  launcher:  {"rounds": [{"start_s", "docker_run_s", "check_s", "order"}], ...}
"""

from __future__ import annotations

import statistics

# Goals of issue #7 (ratios from one run).
GOAL_DISCOVER_OVER_SETUP = 1.5     # at N = 16
GOAL_WARM_OVER_COLD = 0.5          # second discover / first, with changed=0
GOAL_GROWTH_4_TO_16 = 2.0          # discover wall time N=16 / N=4 (forks >= N)
GOAL_START_OVER_DOCKER_RUN = 1.3   # launcher start / bare docker run


def median(values):
    """Median of the non-None values, None when there is none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(numerator, denominator):
    """numerator / denominator rounded to 3 places, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _r(value, places=3):
    return None if value is None else round(value, places)


def summarize_discovery(raw):
    """Per N: medians of each command's wall time, ratios, changed counts, inspection containers, memory."""
    result = {}
    for n in sorted(raw, key=int):
        entry = raw[n]
        rounds = entry["rounds"]
        setup = median(r["setup_s"] for r in rounds)
        cold = median(r["discover_cold_s"] for r in rounds)
        warm = median(r["discover_warm_s"] for r in rounds)
        memory = entry.get("memory", {})
        result[str(n)] = {
            "hosts": int(n),
            "forks": entry["forks"],
            "rounds": len(rounds),
            "setup_s": _r(setup),
            "discover_cold_s": _r(cold),
            "discover_warm_s": _r(warm),
            "discover_cold_over_setup": ratio(cold, setup),
            "discover_warm_over_setup": ratio(warm, setup),
            "warm_over_cold": ratio(warm, cold),
            "warm_changed_max": max(r["warm_changed"] for r in rounds),
            "cold_changed_max": max(r["cold_changed"] for r in rounds),
            "cold_inspection_containers_min": min(r["cold_containers"] for r in rounds),
            "warm_inspection_containers_max": max(r["warm_containers"] for r in rounds),
            "maxrss_kib": {
                "setup": max(r["setup_maxrss_kib"] for r in rounds),
                "discover_cold": max(r["discover_cold_maxrss_kib"] for r in rounds),
                "discover_warm": max(r["discover_warm_maxrss_kib"] for r in rounds),
            },
            "tree_pss_peak_kib": dict(memory),
            "spread_s": {
                "setup": [_r(min(r["setup_s"] for r in rounds)), _r(max(r["setup_s"] for r in rounds))],
                "discover_cold": [_r(min(r["discover_cold_s"] for r in rounds)),
                                  _r(max(r["discover_cold_s"] for r in rounds))],
                "discover_warm": [_r(min(r["discover_warm_s"] for r in rounds)),
                                  _r(max(r["discover_warm_s"] for r in rounds))],
            },
        }
    return result


def summarize_launcher(raw):
    """Medians of the launcher's start (image check reused), the bare docker run and the image check."""
    if not raw:
        return None
    rounds = raw["rounds"]
    start = median(r["start_s"] for r in rounds)
    run = median(r["docker_run_s"] for r in rounds)
    return {
        "host": raw.get("host"),
        "engine": raw.get("engine"),
        "rounds": len(rounds),
        "start_s": _r(start),
        "docker_run_s": _r(run),
        "check_s": _r(median(r["check_s"] for r in rounds)),
        "plan_only_s": _r(median(r.get("plan_s") for r in rounds)),
        "import_docker_s": _r(median(r.get("import_docker_s") for r in rounds)),
        "start_over_docker_run": ratio(start, run),
        "all_running": all(r.get("start_running") and r.get("docker_run_running") for r in rounds),
        "start_actions": sorted({r.get("start_action", "") for r in rounds}),
    }


def goals(discovery, launcher):
    """The goals of issue #7: name, figure, limit, met (None when the figure is missing), note."""
    def goal(name, figure, limit, extra_ok=True, note="", reference=False):
        met = None if figure is None or reference else bool(figure <= limit and extra_ok)
        return {"goal": name, "figure": figure, "limit": limit, "met": met, "note": note, "reference": reference}

    out = []
    d16 = discovery.get("16")
    d4 = discovery.get("4")
    ref = d16 or (discovery[max(discovery, key=int)] if discovery else None)
    at = "N=%s" % (ref["hosts"] if ref else "-")
    out.append(goal("disc1 / setup at %s" % at, ref and ref["discover_cold_over_setup"], GOAL_DISCOVER_OVER_SETUP,
                    note="" if d16 or not ref else "no N=16 in this run"))
    out.append(goal("disc2 / setup at %s" % at, ref and ref["discover_warm_over_setup"], GOAL_DISCOVER_OVER_SETUP))
    out.append(goal("disc2 / disc1 at %s" % at, ref and ref["warm_over_cold"], GOAL_WARM_OVER_COLD,
                    extra_ok=bool(ref and ref["warm_changed_max"] == 0 and ref["warm_inspection_containers_max"] == 0),
                    note=ref and "disc2: changed=%d, inspection containers=%d"
                    % (ref["warm_changed_max"], ref["warm_inspection_containers_max"]) or ""))
    if d4 and d16:
        out.append(goal("growth N=4 -> 16, disc1", ratio(d16["discover_cold_s"], d4["discover_cold_s"]),
                        GOAL_GROWTH_4_TO_16, extra_ok=d16["forks"] >= 16, note="forks=%d" % d16["forks"]))
        out.append(goal("growth N=4 -> 16, disc2", ratio(d16["discover_warm_s"], d4["discover_warm_s"]),
                        GOAL_GROWTH_4_TO_16, extra_ok=d16["forks"] >= 16, note="forks=%d" % d16["forks"]))
        out.append(goal("growth N=4 -> 16, setup", ratio(d16["setup_s"], d4["setup_s"]), GOAL_GROWTH_4_TO_16,
                        note="for reference: setup, not a goal", reference=True))
    out.append(goal("launcher start / docker run", launcher and launcher["start_over_docker_run"],
                    GOAL_START_OVER_DOCKER_RUN,
                    note=launcher and "image check %.2f s apart" % launcher["check_s"] or ""))
    return out


def _fmt(value, spec="%.2f"):
    return "-" if value is None else spec % value


def table(discovery, launcher, goal_list, header=""):
    """The one-screen text table (<= 100 columns)."""
    lines = []
    if header:
        lines.append(header)
    lines.append("%-4s %-5s %8s %8s %8s %8s %8s %8s %4s %6s %7s"
                 % ("N", "forks", "setup", "disc1", "disc2", "d1/set", "d2/set", "d2/d1", "chg2", "insp2",
                    "MiB"))
    for n in sorted(discovery, key=int):
        d = discovery[n]
        mem = d["tree_pss_peak_kib"].get("discover_cold_pss_kib")
        lines.append("%-4s %-5d %8s %8s %8s %8s %8s %8s %4d %6d %7s"
                     % (n, d["forks"], _fmt(d["setup_s"]), _fmt(d["discover_cold_s"]), _fmt(d["discover_warm_s"]),
                        _fmt(d["discover_cold_over_setup"]), _fmt(d["discover_warm_over_setup"]),
                        _fmt(d["warm_over_cold"]), d["warm_changed_max"], d["warm_inspection_containers_max"],
                        _fmt(mem and mem / 1024.0, "%.0f")))
    lines.append("  medians in s; setup = ansible -m setup; disc1 = discover.yml, host caches cleared;")
    lines.append("  disc2 = discover.yml again, nothing changed; chg2/insp2 = its changed tasks / inspection")
    lines.append("  containers (max over rounds); MiB = peak PSS of disc1's controller process tree")
    if launcher:
        lines.append("launcher (%s, %d rounds): start %s s, docker run %s s, ratio %s; image check %s s"
                     % (launcher["host"], launcher["rounds"], _fmt(launcher["start_s"]),
                        _fmt(launcher["docker_run_s"]), _fmt(launcher["start_over_docker_run"]),
                        _fmt(launcher["check_s"])))
        lines.append("  of start: 'launch_engine.pyz plan' (no Docker) %s s; python3 -c 'import docker' %s s"
                     % (_fmt(launcher["plan_only_s"]), _fmt(launcher["import_docker_s"])))
    lines.append("goals:")
    for g in goal_list:
        state = "ref" if g.get("reference") else {True: "met", False: "MISSED", None: "n/a"}[g["met"]]
        lines.append("  %-6s %-28s %6s <= %-4s %s" % (state, g["goal"], _fmt(g["figure"]), g["limit"], g["note"]))
    return "\n".join(lines)


def plot(discovery, path, title):
    """PNG of the median wall time against N for setup and both discovers (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(discovery, key=int)
    xs = [int(n) for n in ns]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key, label, style in (("setup_s", "ansible -m setup", "o-"),
                              ("discover_cold_s", "discover.yml, first (cold caches)", "s-"),
                              ("discover_warm_s", "discover.yml, second (nothing changed)", "^--")):
        ax.plot(xs, [discovery[n][key] for n in ns], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("simulated engine hosts N (forks = N)")
    ax.set_ylabel("wall time, median over rounds (s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
