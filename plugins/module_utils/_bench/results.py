# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench_report, the step (plugins/modules/bench_report.py documents it; plugins/action/bench_report.py runs it in
the controller's process): one benchmark run's figures written as one directory, runs/bench-<stamp>/ - bench.json,
table.txt and latency.png, and with NARWHAL_BENCH_POLICIES policies.png - all of it or nothing: the files go to a
hidden directory beside it, which is renamed into place at the end, so an interrupted run leaves no
runs/bench-<stamp>/.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import (
    comparison,
    overhead,
    problems,
    row,
    table,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError

FILES = ("bench.json", "table.txt", "latency.png")
POLICY_PLOT = "policies.png"


def module_spec():
    """The argument spec of bench_report (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            runs_dir=dict(type="path", required=True),
            plan=dict(type="dict", required=True),
            results=dict(type="dict", required=True),
            failures=dict(type="dict", default={}),
            context=dict(type="dict", default={}),
            engines=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )


def plotting():
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel

        matplotlib.use("Agg")
        from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return pyplot


def _loads(rows):
    loads = []
    for r in rows:
        if r["load"] not in loads:
            loads.append(r["load"])
    return loads


def _load_labels(loads):
    return [lo.replace("rate-", "").replace("concurrency-", "c=") for lo in loads]


def plot(pyplot, rows, path, title, targets):
    """Latency against request rate, one line per target (`targets`: [(target, title)]): TTFT and end-to-end latency
    (p50 solid, p99 dashed); the closed-loop step at the right, after the rates."""
    loads = _loads(rows)
    figure, axes = pyplot.subplots(1, 3, figsize=(15, 4.5))
    for ax, metric, label in ((axes[0], "ttft", "time to first token (ms)"),
                              (axes[1], "tpot", "time per output token (ms)"),
                              (axes[2], "e2el", "end-to-end latency (ms)")):
        for target, name in targets:
            mine = dict((r["load"], r) for r in rows if r["target"] == target)
            if not mine:
                continue
            xs = [i for i, load in enumerate(loads) if load in mine]
            for p, style in ((50, "-"), (99, "--")):
                ys = [mine[loads[i]].get("p%d_%s_ms" % (p, metric)) for i in xs]
                pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
                if pairs:
                    ax.plot([x for x, _y in pairs], [y for _x, y in pairs], style, marker="o",
                            label="%s p%d" % (name, p))
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels(_load_labels(loads))
        ax.set_xlabel("request rate (req/s); c=N: max concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[2].legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
    os.chmod(path, 0o600)


def plot_policies(pyplot, rows, path, title, targets):
    """TTFT p50 and p99 by policy and load: one group of bars per load, one bar per policy (`targets`: [(target,
    title)]), the prefill engines' prefix-cache hit rate written over each p50 bar."""
    loads = _loads(rows)
    by = dict(((r["target"], r["load"]), r) for r in rows)
    figure, axes = pyplot.subplots(1, 2, figsize=(14, 4.5))
    width = 0.8 / max(1, len(targets))
    for ax, p in ((axes[0], 50), (axes[1], 99)):
        for i, (target, _name) in enumerate(targets):
            xs = [j + (i - (len(targets) - 1) / 2.0) * width for j in range(len(loads))]
            ys = [(by.get((target, load)) or {}).get("p%d_ttft_ms" % p) for load in loads]
            bars = ax.bar(xs, [y or 0 for y in ys], width, label=target.replace("pd-", ""))
            for drawn, load in zip(bars, loads, strict=True):
                rate = (by.get((target, load)) or {}).get("prefill_prefix_hit_rate")
                if p == 50 and rate is not None:
                    ax.annotate("%.0f%%" % (100 * rate), (drawn.get_x() + drawn.get_width() / 2, drawn.get_height()),
                                ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels(_load_labels(loads))
        ax.set_xlabel("request rate (req/s); c=N: max concurrency")
        ax.set_ylabel("time to first token p%d (ms)" % p)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=max(1, len(targets)), fontsize=8,
                  title="prefill policy (over the p50 bars: the prefill engines' prefix-cache hits)", title_fontsize=8)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
    os.chmod(path, 0o600)


def _write(path, data):
    with open(path, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def bench_report(task):
    p = task.params
    plan, results = p["plan"], p["results"]
    steps = plan.get("steps") or []
    stamp = plan.get("stamp")
    if not steps or not stamp:
        raise StepError("bench_report: the plan has no steps or no stamp (the narwhal.deploy.bench_plan filter "
                        "makes it)")
    dest = os.path.join(p["runs_dir"], "bench-%s" % stamp)
    if os.path.lexists(dest):
        raise StepError("%s already exists: a benchmark run of this stamp is kept there; rerun the benchmark "
                        "(a new stamp) or remove it" % dest, dest=dest)
    roles = dict((str(e.get("url") or "").rstrip("/"), e.get("role")) for e in p["engines"])
    rows = [row(step, results.get(step["id"]) or {}, roles) for step in steps]
    over = overhead(rows)
    found = problems(steps, results, p["failures"])
    compare = comparison(rows) if plan.get("workload") else None  # the prefix workload or the policies
    text = table(rows, over, plan.get("slo") or {}, compare)
    document = {"stamp": stamp, "ok": not found, "problems": found, "plan": plan, "context": p["context"],
                "rows": rows, "overhead": over, "results": results, "failures": p["failures"]}
    files = FILES + ((POLICY_PLOT,) if plan.get("policies") else ())
    out = {"changed": True, "dest": dest, "table": text, "rows": rows, "overhead": over, "problems": found,
           "files": [os.path.join(dest, f) for f in files]}
    if compare is not None:
        document["comparison"] = out["comparison"] = compare
    if p["engines"]:
        document["engines"] = [dict((k, e.get(k)) for k in ("engine", "role", "url")) for e in p["engines"]]
    pyplot = plotting()
    if pyplot is None:
        raise StepError("matplotlib is not importable on the controller, and the benchmark's plot needs it: "
                        "pip install -r requirements.txt (it pins matplotlib), then rerun the benchmark", **out)
    if task.check_mode:
        return out
    if not os.path.isdir(p["runs_dir"]):
        raise StepError("NARWHAL_RUNS_DIR %s is not a directory; run prepare first or create it" % p["runs_dir"])
    tmp = tempfile.mkdtemp(prefix=".bench-%s." % stamp, dir=p["runs_dir"])
    try:
        _write(os.path.join(tmp, "bench.json"), (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
        _write(os.path.join(tmp, "table.txt"), text.encode("utf-8"))
        targets = [(t["target"], t["title"]) for t in plan.get("targets") or []]
        title = "narwhal.deploy fleet benchmark %s: %d in / %d out tokens, %d requests per step" % (
            stamp, plan["shape"]["input_len"], plan["shape"]["output_len"], plan["shape"]["prompts"])
        if plan.get("workload") == "prefix":
            title += " (%d prefixes of %d tokens)" % (plan["shape"]["prefixes"], plan["shape"]["prefix_len"])
        plot(pyplot, rows, os.path.join(tmp, "latency.png"), title, targets)
        if plan.get("policies"):
            plot_policies(pyplot, rows, os.path.join(tmp, POLICY_PLOT), title, targets)
        os.chmod(tmp, 0o700)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
