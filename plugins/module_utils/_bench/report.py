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
from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import scan

__metaclass__ = type

SUMMARY_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_concurrent_requests", "request_rate", "max_concurrency", "num_prompts", "date", "label")
# the per-request lists --save-detailed adds (vllm/benchmarks/serve.py, the fields removed without it)
DETAIL_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors",
               "latencies", "queue_times")


# The engines' own counters read before and after each step (bench_serve's metrics_urls): vLLM 0.32.0's prefix
# cache counters, in prompt tokens (v1/metrics/loggers.py: counters vllm:prefix_cache_queries and
# vllm:prefix_cache_hits, per engine core, which prometheus_client exposes with _total), and the KV bytes and
# transfers the NIXL connector read (the vllm:nixl_bytes_transferred histogram's _sum and _count, recorded by the
# engine that reads: _common/nixl_metrics.py), and its failed transfers. Every label set (DP ranks) is summed.
COUNTERS = (("prefix_cache_queries", "vllm:prefix_cache_queries_total"),
            ("prefix_cache_hits", "vllm:prefix_cache_hits_total"),
            ("kv_bytes", "vllm:nixl_bytes_transferred_sum"),
            ("kv_transfers", "vllm:nixl_bytes_transferred_count"),
            ("kv_failed_transfers", "vllm:nixl_num_failed_transfers_total"))


def engine_counters(text):
    """{name: value, or None when the engine has no such family} of one /metrics document (COUNTERS)."""
    found = scan(text, [metric for _name, metric in COUNTERS])
    return dict((name, sum(v for _labels, v in found[metric]) if metric in found else None)
                for name, metric in COUNTERS)


def counter_deltas(before, after):
    """What each counter grew by between two readings (engine_counters); None where either lacks it or it went
    back (the engine restarted during the step: its counters began again)."""
    out = {}
    for name, _metric in COUNTERS:
        a, b = before.get(name), after.get(name)
        out[name] = b - a if a is not None and b is not None and b >= a else None
    return out


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


def _total(counters, urls, name):
    values = [(counters.get(url) or {}).get(name) for url in urls]
    values = [v for v in values if _num(v) is not None]
    return sum(values) if values else None


def engine_figures(counters, roles):
    """The engines' own figures of one step from its counters ({engine URL: counter_deltas}; `roles`: {engine URL:
    prefill or decode}): the prefix-cache hit rate over the prefill engines (hits / queries, in prompt tokens; None
    when they were asked nothing), that of the decode engines, and the KV bytes and transfers NIXL moved (every
    engine)."""
    out = {}
    for role in ("prefill", "decode"):
        urls = [url for url in counters if roles.get(url) == role]
        queries, hits = _total(counters, urls, "prefix_cache_queries"), _total(counters, urls, "prefix_cache_hits")
        out["%s_prefix_hit_rate" % role] = round(hits / queries, 4) if queries and hits is not None else None
    out["kv_bytes"] = _total(counters, list(counters), "kv_bytes")
    out["kv_transfers"] = _total(counters, list(counters), "kv_transfers")
    return out


def row(step, result, roles=None):
    """One line of the table: the step's target and load with its latencies, throughput and failures; with the
    engines' counters (bench_serve's `counters`) their figures too (engine_figures; `roles`: {engine URL: role})."""
    load = step["load"]
    out = {"step": step["id"], "target": step["target"], "load": load["label"],
           "rate": load["rate"], "concurrency": load.get("concurrency")}
    for key in ("completed", "failed", "request_throughput", "request_goodput", "output_throughput", "duration"):
        out[key] = _num(result.get(key))
    for metric in METRICS:
        for p in PERCENTILES:
            out["p%d_%s_ms" % (p, metric)] = _num(result.get("p%d_%s_ms" % (p, metric)))
    if isinstance(result.get("counters"), dict):
        out.update(engine_figures(result["counters"], roles or {}))
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


COMPARED = (("target", "target"), ("load", "load"), ("completed", "ok"), ("failed", "fail"),
            ("request_throughput", "req/s"), ("output_throughput", "out tok/s"), ("p50_ttft_ms", "ttft p50"),
            ("p99_ttft_ms", "ttft p99"), ("vs_first", "p50 vs first"), ("prefill_prefix_hit_rate", "prefill hit %"),
            ("decode_prefix_hit_rate", "decode hit %"), ("kv_mib", "KV MiB"))


def comparison(rows):
    """The targets side by side (the prefix workload, the policies): a line per target and load with TTFT p50/p99,
    throughput, the prefill and decode engines' prefix-cache hit rates and the KV MiB NIXL moved; `vs_first` is the
    TTFT p50 over the first target's at the same load (with NARWHAL_BENCH_POLICIES, the first policy's)."""
    order = []
    for r in rows:
        if r["target"] not in order:
            order.append(r["target"])
    first = order[0] if order else None
    base = dict((r["load"], r.get("p50_ttft_ms")) for r in rows if r["target"] == first)
    out = []
    for r in sorted(rows, key=lambda r: (order.index(r["target"]), r["step"])):
        entry = dict((key, r.get(key)) for key, _title in COMPARED if key in r)
        ref = base.get(r["load"])
        entry["vs_first"] = round(r["p50_ttft_ms"] / ref, 3) if ref and r.get("p50_ttft_ms") is not None else None
        entry["kv_mib"] = round(r["kv_bytes"] / 1048576.0, 2) if _num(r.get("kv_bytes")) is not None else None
        out.append(entry)
    return out


def _percent(value):
    return "-" if _num(value) is None else "%.1f" % (100.0 * value)


def comparison_table(entries):
    """The comparison's lines (comparison), grouped by target."""
    lines = []
    for e in entries:
        lines.append([_cell(e.get("target")), _cell(e.get("load")), _cell(e.get("completed")), _cell(e.get("failed")),
                      _cell(e.get("request_throughput"), 2), _cell(e.get("output_throughput"), 2),
                      _cell(e.get("p50_ttft_ms")), _cell(e.get("p99_ttft_ms")), _cell(e.get("vs_first"), 2),
                      _percent(e.get("prefill_prefix_hit_rate")), _percent(e.get("decode_prefix_hit_rate")),
                      _cell(e.get("kv_mib"), 2)])
    head = [title for _key, title in COMPARED]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: B905
            for cells in [head] + lines]


def table(rows, over, slo, compare=None):
    """The one-screen table: a line per step (ms; req/s and output tok/s), then the router's overhead; with
    `compare` (comparison) the targets side by side."""
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
    if compare:
        out.append("")
        out.append("side by side (ms; prefix-cache hits in prompt tokens from the engines' own counters, "
                   "KV moved by NIXL):")
        out.extend("  " + line for line in comparison_table(compare))
    if slo:
        out.append("goodput SLOs: %s" % ", ".join("%s <= %s ms" % (k, slo[k]) for k in sorted(slo)))
    return "\n".join(out) + "\n"


def progress(step, result):
    """The progress line of one finished step."""
    return "%s %-40s %s" % (step["id"], step["title"], "ok %s fail %s, %s req/s, ttft p50 %s ms, e2el p50 %s ms" % (
        _cell(_num(result.get("completed"))), _cell(_num(result.get("failed"))),
        _cell(_num(result.get("request_throughput")), 2), _cell(_num(result.get("p50_ttft_ms"))),
        _cell(_num(result.get("p50_e2el_ms"))))) if result else "%s %s: no result" % (step["id"], step["title"])
