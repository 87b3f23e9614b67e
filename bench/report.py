# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure reporting for bench/bench.py: medians, ratios, the goals of issues #16 and #25 and the one-screen table.

No I/O here (the PNG is drawn by `plot`, which only writes the file it is given): bench.py collects raw
samples and hands them over as plain dicts, these functions turn them into figures.

Raw samples (the `raw` document bench.py keeps in results JSON):
  discovery: {N: {"forks": int, "rounds": [{"setup_s", "discover_cold_s", "discover_warm_s",
                   "cold_changed", "warm_changed", "cold_containers", "warm_containers",
                   "setup_maxrss_kib", "discover_cold_maxrss_kib", "discover_warm_maxrss_kib", "order",
                   "status_s", "site_s", "site_changed" (the day-two rerun measures; absent in older runs),
                   "site_probe_pairs" (the pairs the rerun's probe stage probed; absent in older runs: every pair),
                   "probe_s", "probe_pairs", "probe_rounds", "probe_cover_s", "probe_cover_pairs",
                   "probe_cover_rounds", "router_s" (the probe and router stages alone; absent in older runs)}]},
              "memory": {"setup_pss_kib", "discover_cold_pss_kib", "discover_warm_pss_kib", "status_pss_kib"}}
  launcher:  {"rounds": [{"start_s", "docker_run_s", "check_s", "order"}], ...}
"""

from __future__ import annotations

import statistics

# Goals of issue #16 (ratios from one run).
GOAL_COLD_OVER_SETUP = 1.3         # first discover / ansible -m setup, at N = 16
GOAL_WARM_OVER_SETUP = 0.8         # second discover (nothing changed) / setup, at every N >= 8
GOAL_WARM_OVER_COLD = 0.5          # second discover / first, with changed=0, at N = 16
GOAL_STATUS_OVER_SETUP = 0.5       # status.yml / setup, at N = 16 (issue #25; #16 asked 0.8)
GOAL_START_OVER_DOCKER_RUN = 1.3   # launcher start / bare docker run
GROWTH_FROM, GROWTH_TO = 4, 32     # growth of the second discover <= setup's own growth over the same N
# Goals of issue #25 item 2 (a site.yml rerun with nothing changed).
GOAL_SITE_OVER_SETUP = 3.0         # site.yml again / setup, at N = 16
GOAL_SITE_GROWTH_OVER_SETUP = 1.5  # growth N=4 -> 32 of the site rerun <= 1.5 x setup's growth


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
        status = median(r.get("status_s") for r in rounds)
        site = median(r.get("site_s") for r in rounds)
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
            "status_s": _r(status),
            "site_s": _r(site),
            "status_over_setup": ratio(status, setup),
            "site_over_setup": ratio(site, setup),
            "site_changed_max": max((r["site_changed"] for r in rounds if "site_changed" in r), default=None),
            "site_probe_pairs": max((r["site_probe_pairs"] for r in rounds if "site_probe_pairs" in r), default=None),
            "probe_s": _r(median(r.get("probe_s") for r in rounds)),
            "probe_pairs": max((r["probe_pairs"] for r in rounds if "probe_pairs" in r), default=None),
            "probe_rounds": max((r["probe_rounds"] for r in rounds if "probe_rounds" in r), default=None),
            "probe_cover_s": _r(median(r.get("probe_cover_s") for r in rounds)),
            "probe_cover_pairs": max((r["probe_cover_pairs"] for r in rounds if "probe_cover_pairs" in r),
                                     default=None),
            "probe_cover_rounds": max((r["probe_cover_rounds"] for r in rounds if "probe_cover_rounds" in r),
                                      default=None),
            "router_s": _r(median(r.get("router_s") for r in rounds)),
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
    """The goals of issue #16: name, figure, limit, met (None when the figure is missing), note."""
    def goal(name, figure, limit, extra_ok=True, note="", reference=False):
        met = None if figure is None or reference else bool(figure <= limit and extra_ok)
        return {"goal": name, "figure": figure, "limit": limit, "met": met, "note": note, "reference": reference}

    out = []
    d16 = discovery.get("16")
    ref = d16 or (discovery[max(discovery, key=int)] if discovery else None)
    at = "N=%s" % (ref["hosts"] if ref else "-")
    out.append(goal("disc1 / setup at %s" % at, ref and ref["discover_cold_over_setup"], GOAL_COLD_OVER_SETUP,
                    note="" if d16 or not ref else "no N=16 in this run"))
    for n in sorted(discovery, key=int):
        if int(n) >= 8:
            out.append(goal("disc2 / setup at N=%s" % n, discovery[n]["discover_warm_over_setup"],
                            GOAL_WARM_OVER_SETUP))
    out.append(goal("disc2 / disc1 at %s" % at, ref and ref["warm_over_cold"], GOAL_WARM_OVER_COLD,
                    extra_ok=bool(ref and ref["warm_changed_max"] == 0 and ref["warm_inspection_containers_max"] == 0),
                    note=ref and "disc2: changed=%d, inspection containers=%d"
                    % (ref["warm_changed_max"], ref["warm_inspection_containers_max"]) or ""))
    if ref and ref.get("status_s") is not None:
        out.append(goal("status / setup at %s" % at, ref["status_over_setup"], GOAL_STATUS_OVER_SETUP))
    if ref and ref.get("site_s") is not None:
        out.append(goal("site / setup at %s" % at, ref["site_over_setup"], GOAL_SITE_OVER_SETUP,
                        extra_ok=not ref["site_changed_max"], note="site: changed=%s" % ref["site_changed_max"]))
    low, high = discovery.get(str(GROWTH_FROM)), discovery.get(str(GROWTH_TO))
    if low and high:
        setup_growth = ratio(high["setup_s"], low["setup_s"])
        out.append(goal("growth N=%d -> %d, disc2" % (GROWTH_FROM, GROWTH_TO),
                        ratio(high["discover_warm_s"], low["discover_warm_s"]), setup_growth,
                        extra_ok=high["forks"] >= GROWTH_TO, note="limit: setup's growth; forks=%d" % high["forks"]))
        out.append(goal("growth N=%d -> %d, disc1" % (GROWTH_FROM, GROWTH_TO),
                        ratio(high["discover_cold_s"], low["discover_cold_s"]), setup_growth,
                        note="for reference, not a goal", reference=True))
        if low.get("site_s") is not None and high.get("site_s") is not None:
            out.append(goal("growth N=%d -> %d, site" % (GROWTH_FROM, GROWTH_TO),
                            ratio(high["site_s"], low["site_s"]),
                            setup_growth and _r(setup_growth * GOAL_SITE_GROWTH_OVER_SETUP),
                            extra_ok=high["forks"] >= GROWTH_TO,
                            note="limit: %.1f x setup's growth" % GOAL_SITE_GROWTH_OVER_SETUP))
    out.append(goal("launcher start / docker run", launcher and launcher["start_over_docker_run"],
                    GOAL_START_OVER_DOCKER_RUN,
                    note=launcher and "image check %.2f s apart" % launcher["check_s"] or ""))
    big = discovery.get(str(GROWTH_TO))
    if big and big["tree_pss_peak_kib"].get("setup_pss_kib"):
        mem = big["tree_pss_peak_kib"]
        worst = max(mem.get(k) or 0 for k in ("discover_cold_pss_kib", "discover_warm_pss_kib", "status_pss_kib"))
        out.append(goal("MiB at N=%d vs setup's" % GROWTH_TO, _r(worst / 1024.0, 0),
                        _r(mem["setup_pss_kib"] / 1024.0, 0),
                        note="peak PSS, worst of disc1/disc2/status"))
    return out


def fit_line(points):
    """Least-squares (intercept, slope) of [(x, y)], None with fewer than two distinct x."""
    points = [(float(x), float(y)) for x, y in points if y is not None]
    if len({x for x, _y in points}) < 2:
        return None
    mx = sum(x for x, _y in points) / len(points)
    my = sum(y for _x, y in points) / len(points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _y in points)
    return my - slope * mx, slope


PROJECT_TO = (64, 256, 1000)       # engines of the projection (half prefill, half decode, as the bench site)
PROJECT_FROM = 8                   # fit over the measured N >= this (below it the fixed costs dominate)


def _site_probe_kind(d):
    """What the site rerun's probe stage probed, from the pairs it recorded: "the cover" (narwhal_probe_pairs=auto on
    an unchanged fleet), "every pair" (older runs record nothing: they probed every pair), or None (another set)."""
    pairs = d.get("site_probe_pairs")
    if pairs is None or pairs == d.get("probe_pairs"):
        return "every pair"
    return "the cover" if pairs == d.get("probe_cover_pairs") else None


def _site_probe_s(d):
    """The probe stage's time inside the site rerun: probe.yml alone with the same pairs (None for another set)."""
    return {"every pair": d.get("probe_s"), "the cover": d.get("probe_cover_s")}.get(_site_probe_kind(d))


def projection(discovery, to=PROJECT_TO):
    """Wall time of each measure projected to `to` engines from a straight line fitted over the measured N >= 8 (the
    controller's CPU is the bound on 2 cores: each host adds the same work whatever the forks), and the probe stage
    from its cost per pair (every pair: P x D = N^2 / 4 pairs; cover: as measured, ~N); `site_pairs_s` is a site
    rerun with every pair (narwhal_probe_pairs=all): its other stages on a line plus that probe. Pure; a measure with
    fewer than two points is left out."""
    ns = [n for n in sorted(discovery, key=int) if int(n) >= PROJECT_FROM] or sorted(discovery, key=int)
    out = {"fitted_over": [int(n) for n in ns], "to": list(to), "lines": {}, "projected": {}}
    for key in ("setup_s", "discover_cold_s", "discover_warm_s", "status_s", "site_s", "router_s",
                "probe_cover_s"):
        line = fit_line((int(n), discovery[n].get(key)) for n in ns)
        if line:
            out["lines"][key] = {"intercept_s": _r(line[0]), "per_host_s": _r(line[1], 4)}
            out["projected"][key] = [_r(line[0] + line[1] * n, 1) for n in to]
    # every pair: the cost grows with the pairs, not the hosts
    line = fit_line((discovery[n].get("probe_pairs"), discovery[n].get("probe_s")) for n in ns
                    if discovery[n].get("probe_pairs"))
    if line:
        out["lines"]["probe_s"] = {"intercept_s": _r(line[0]), "per_pair_s": _r(line[1], 5)}
        out["projected"]["probe_s"] = [_r(line[0] + line[1] * (n // 2) * (n - n // 2), 1) for n in to]
        # a site rerun that probes every pair (narwhal_probe_pairs=all): its other stages on a line, plus the probe's
        # pairs; its other stages are the rerun less the probe stage it ran (the cover, or every pair before auto)
        rest = fit_line((int(n), discovery[n]["site_s"] - _site_probe_s(discovery[n])) for n in ns
                        if discovery[n].get("site_s") is not None and _site_probe_s(discovery[n]) is not None)
        if rest:
            out["lines"]["site_without_probe_s"] = {"intercept_s": _r(rest[0]), "per_host_s": _r(rest[1], 4)}
            probe = out["projected"]["probe_s"]
            out["projected"]["site_pairs_s"] = [_r(rest[0] + rest[1] * n + probe[i], 1) for i, n in enumerate(to)]
    return out


def _site_probe_text(discovery):
    """What the site reruns' probe stage probed (_site_probe_kind), over every N."""
    return ", ".join(sorted(set(_site_probe_kind(d) or "%d pairs at N=%s" % (d["site_probe_pairs"], n)
                                for n, d in discovery.items())))


def _fmt(value, spec="%.2f"):
    return "-" if value is None else spec % value


def table(discovery, launcher, goal_list, header=""):
    """The one-screen text table (<= 100 columns)."""
    lines = []
    if header:
        lines.append(header)
    lines.append("%-3s %6s %6s %6s %5s %5s %5s %6s %5s %6s %5s %3s %3s %5s"
                 % ("N", "setup", "disc1", "disc2", "d1/st", "d2/st", "d2/d1", "status", "sts/s", "site",
                    "ste/s", "ch2", "in2", "MiB"))
    for n in sorted(discovery, key=int):
        d = discovery[n]
        mem = d["tree_pss_peak_kib"].get("discover_cold_pss_kib")
        lines.append("%-3s %6s %6s %6s %5s %5s %5s %6s %5s %6s %5s %3d %3d %5s"
                     % (n, _fmt(d["setup_s"]), _fmt(d["discover_cold_s"]), _fmt(d["discover_warm_s"]),
                        _fmt(d["discover_cold_over_setup"]), _fmt(d["discover_warm_over_setup"]),
                        _fmt(d["warm_over_cold"]), _fmt(d.get("status_s")), _fmt(d.get("status_over_setup")),
                        _fmt(d.get("site_s"), "%.1f"), _fmt(d.get("site_over_setup")),
                        d["warm_changed_max"] + (d.get("site_changed_max") or 0),
                        d["warm_inspection_containers_max"], _fmt(mem and mem / 1024.0, "%.0f")))
    lines.append("  medians in s, forks = N; setup = ansible -m setup; disc1 = discover.yml, host caches cleared;")
    lines.append("  disc2 = discover.yml again, nothing changed; status = status.yml; site = site.yml again (nothing")
    lines.append("  changed; its probe stage: %s); ch2/in2 = changed tasks of disc2+site /"
                 % _site_probe_text(discovery))
    lines.append("  inspection containers of disc2 (max over rounds); MiB = peak PSS of disc1's controller tree")
    if any(discovery[n].get("probe_s") is not None or discovery[n].get("router_s") is not None for n in discovery):
        lines.append("stages alone, nothing changed (s): probe = probe.yml, every pair (pairs=all); cover =")
        lines.append("  narwhal_probe_pairs=cover; pairs/rounds as the probe module ran them; router = router.yml")
        heads = ("N", "probe", "pairs", "rounds", "cover", "pairs", "rounds", "router")
        lines.append("  %-3s %7s %5s %6s %7s %5s %6s %7s" % heads)
        for n in sorted(discovery, key=int):
            d = discovery[n]
            lines.append("  %-3s %7s %5s %6s %7s %5s %6s %7s"
                         % (n, _fmt(d.get("probe_s")), _fmt(d.get("probe_pairs"), "%d"),
                            _fmt(d.get("probe_rounds"), "%d"), _fmt(d.get("probe_cover_s")),
                            _fmt(d.get("probe_cover_pairs"), "%d"), _fmt(d.get("probe_cover_rounds"), "%d"),
                            _fmt(d.get("router_s"))))
    proj = projection(discovery)
    if proj["projected"]:
        lines.append("projected (s) to N = %s from a line over N = %s (probe: per pair, N^2/4 pairs):"
                     % ("/".join(map(str, proj["to"])), ",".join(map(str, proj["fitted_over"]))))
        row = ""
        for key, values in proj["projected"].items():
            entry = "%s %s" % (key[:-2], "/".join(_fmt(v, "%.0f") for v in values))
            if row and len(row) + 2 + len(entry) > 98:
                lines.append("  " + row)
                row = ""
            row = "%s  %s" % (row, entry) if row else entry
        lines.append("  " + row)
    if launcher:
        lines.append("launcher (%s, %d rounds): start %s s, docker run %s s, ratio %s; image check %s s"
                     % (launcher["host"], launcher["rounds"], _fmt(launcher["start_s"]),
                        _fmt(launcher["docker_run_s"]), _fmt(launcher["start_over_docker_run"]),
                        _fmt(launcher["check_s"])))
        lines.append("  parts: 'launch_engine.pyz plan' (no Docker) %s s; 'import docker' (start before #16) %s s"
                     % (_fmt(launcher["plan_only_s"]), _fmt(launcher["import_docker_s"])))
    lines.append("goals:")
    for g in goal_list:
        state = "ref" if g.get("reference") else {True: "met", False: "MISSED", None: "n/a"}[g["met"]]
        spec = "%.0f" if g["goal"].startswith("MiB") else "%.2f"
        figure, limit = _fmt(g["figure"], spec), _fmt(g["limit"], spec)
        lines.append("  %-6s %-28s %6s <= %-5s %s" % (state, g["goal"], figure, limit, g["note"]))
    return "\n".join(lines)


def plot(discovery, path, title):
    """PNG of the median wall time against N of setup, both discovers, status, site and probe (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(discovery, key=int)
    xs = [int(n) for n in ns]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key, label, style in (("setup_s", "ansible -m setup", "o-"),
                              ("discover_cold_s", "discover.yml, first (cold caches)", "s-"),
                              ("discover_warm_s", "discover.yml, second (nothing changed)", "^--"),
                              ("status_s", "status.yml", "d:"),
                              ("site_s", "site.yml again (nothing changed)", "v-."),
                              ("probe_s", "probe.yml, every pair", "x-")):
        if all(discovery[n].get(key) is not None for n in ns):
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
