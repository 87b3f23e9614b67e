# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark's figures (docs/fleet-benchmark.md), pure: one step's `vllm bench serve` result reduced to what is
kept, the rows of every step, the router's overhead at each load, the problems, and the one-screen table.

The result keys are vllm bench serve's own (vllm/benchmarks/serve.py, benchmark(): "completed", "failed",
"request_throughput", "request_goodput", "output_throughput", "mean_/median_/p<N>_<metric>_ms"; with
--save-detailed also "errors", the per-request error texts).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import METRICS, PERCENTILES

__metaclass__ = type

SUMMARY_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_concurrent_requests", "request_rate", "max_concurrency", "num_prompts", "date", "label")
# the per-request lists --save-detailed adds (vllm/benchmarks/serve.py, the fields removed without it)
DETAIL_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors",
               "latencies", "queue_times")


def kept(result):
    """The figures of one step's result JSON (every summary and percentile key) and its distinct errors (at most
    five, each cut to 300 characters); the per-request lists are dropped."""
    if not isinstance(result, dict):
        return {}
    out = dict((k, result[k]) for k in SUMMARY_KEYS if k in result)
    for metric in METRICS:
        for prefix in ["mean", "median", "std"] + ["p%d" % p for p in PERCENTILES]:
            key = "%s_%s_ms" % (prefix, metric)
            if key in result:
                out[key] = result[key]
    errors = []
    for error in result.get("errors") or []:
        text = str(error).strip()[:300]
        if text and text not in errors:
            errors.append(text)
    out["errors"] = errors[:5]
    return out


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row(step, result):
    """One line of the table: the step's target and load with its latencies, throughput and failures."""
    load = step["load"]
    out = {"step": step["id"], "target": step["target"], "load": load["label"],
           "rate": load["rate"], "concurrency": load.get("concurrency")}
    for key in ("completed", "failed", "request_throughput", "request_goodput", "output_throughput", "duration"):
        out[key] = _num(result.get(key))
    for metric in METRICS:
        for p in PERCENTILES:
            out["p%d_%s_ms" % (p, metric)] = _num(result.get("p%d_%s_ms" % (p, metric)))
    return out


def overhead(rows):
    """The router's own cost at each load: `router` minus `direct` (p50 and p99 TTFT and end-to-end latency, ms)."""
    by = dict(((r["target"], r["load"]), r) for r in rows)
    out = []
    for r in rows:
        if r["target"] != "direct" or ("router", r["load"]) not in by:
            continue
        via = by[("router", r["load"])]
        entry = {"load": r["load"]}
        for key in ("p50_ttft_ms", "p99_ttft_ms", "p50_e2el_ms", "p99_e2el_ms"):
            a, b = via.get(key), r.get(key)
            entry[key] = round(a - b, 3) if a is not None and b is not None else None
        out.append(entry)
    return out


def problems(steps, results, failures=None):
    """What makes the benchmark fail: a step without a result (with the load generator's refusal), or with failed
    requests (named with their errors)."""
    lines, failures = [], failures or {}
    for step in steps:
        result = results.get(step["id"])
        if not result:
            lines.append("%s (%s at %s): no result%s" % (step["id"], step["title"], step["url"],
                                                         ": %s" % failures[step["id"]] if failures.get(step["id"])
                                                         else ""))
            continue
        failed = _num(result.get("failed")) or 0
        if failed or not _num(result.get("completed")):
            lines.append("%s (%s at %s): %s of %s requests failed%s" % (
                step["id"], step["title"], step["url"], failed, result.get("num_prompts", "?"),
                ": %s" % " | ".join(result.get("errors") or []) if result.get("errors") else ""))
    return lines


def _cell(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.*f" % (digits, value)
    return str(value)


def table(rows, over, slo):
    """The one-screen table: a line per step (ms; req/s and output tok/s), then the router's overhead."""
    head = ["step", "target", "load", "ok", "fail", "req/s", "good/s" if slo else None, "out tok/s",
            "ttft p50", "ttft p90", "ttft p99", "tpot p50", "tpot p99", "itl p50", "itl p99",
            "e2el p50", "e2el p90", "e2el p99"]
    keys = ["step", "target", "load", "completed", "failed", "request_throughput",
            "request_goodput" if slo else None, "output_throughput",
            "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms",
            "p50_e2el_ms", "p90_e2el_ms", "p99_e2el_ms"]
    head = [h for h in head if h]
    keys = [k for k in keys if k]
    lines = [[_cell(r.get(k), 2 if k.endswith("throughput") or k == "request_goodput" else 1) for k in keys]
             for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: B905 - Python 3.8

    out = [fmt(head)] + [fmt(line) for line in lines]
    if over:
        out.append("")
        out.append("router overhead (router minus direct, ms):")
        for entry in over:
            out.append("  %-16s ttft p50 %s  p99 %s   e2el p50 %s  p99 %s" % (
                entry["load"], _cell(entry["p50_ttft_ms"]), _cell(entry["p99_ttft_ms"]),
                _cell(entry["p50_e2el_ms"]), _cell(entry["p99_e2el_ms"])))
    if slo:
        out.append("goodput SLOs: %s" % ", ".join("%s <= %s ms" % (k, slo[k]) for k in sorted(slo)))
    return "\n".join(out) + "\n"


def progress(step, result):
    """The progress line of one finished step."""
    return "%s %-40s %s" % (step["id"], step["title"], "ok %s fail %s, %s req/s, ttft p50 %s ms, e2el p50 %s ms" % (
        _cell(_num(result.get("completed"))), _cell(_num(result.get("failed"))),
        _cell(_num(result.get("request_throughput")), 2), _cell(_num(result.get("p50_ttft_ms"))),
        _cell(_num(result.get("p50_e2el_ms"))))) if result else "%s %s: no result" % (step["id"], step["title"])
