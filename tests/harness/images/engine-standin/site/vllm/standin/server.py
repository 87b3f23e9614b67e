"""Stand-in vLLM OpenAI server (narwhal.deploy test harness; NOT an inference engine).

Replays the HTTP surface and P/D flow of vLLM with NixlConnector (docs/architecture.md, "The P/D request flow"):
  GET /health, /version, /metrics (open); GET /v1/models, POST /v1/completions (API key when set).
  Producer request with kv_transfer_params.do_remote_decode -> answers with kv_transfer_params that
  name this engine's side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, advertised exactly as set).
  Consumer request with do_remote_prefill -> connects to remote_host:remote_port over TCP through the
  UCX_NET_DEVICES interface, performs vLLM's NIXL handshake (the producer answers with its compatibility
  hash and agent metadata; the consumer compares the hash with its own and validates TP, block size and KV
  layout: vllm.standin.handshake), then reads the blocks; a failed handshake or load ends the request with
  HTTP 500 (kv_load_failure_policy=fail). /metrics counts vllm:nixl_bytes_transferred and failed transfers
  (failed handshakes included, as vLLM 0.33 counts them).
The "KV" is a deterministic function of the prompt, so the consumer checks what it received.
With --enable-prompt-tokens-details the answer carries usage.prompt_tokens_details.cached_tokens, the request's
num_cached_tokens as vLLM 0.32/0.33 report it (prompt_details below). The stand-in has no prefix cache: a
request's cached tokens are the tokens it loaded by KV transfer.
"""
import hashlib
import json
import os
import socket
import socketserver
import sys
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm.standin import handshake
from vllm.version import __version__

BYTES_PER_TOKEN = 256


def release(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


# vLLM 0.32.0 and 0.33.0 (v1/core/sched/scheduler.py): a producer that finishes a request with do_remote_decode
# adds its own prefix-cache hits to the kv_transfer_params it returns, and a consumer that receives an int there
# reports it as the request's num_cached_tokens (v1/engine/output_processor.py) instead of its own count.
REMOTE_CACHED = release(__version__) >= (0, 32)


def prompt_details(args, num_cached_tokens):
    """usage.prompt_tokens_details of a non-streaming completion (entrypoints/openai/completion/serving.py): only
    with --enable-prompt-tokens-details; vLLM 0.32/0.33 include it whenever num_cached_tokens is not None (so also
    0), older releases only when it is non-zero."""
    if not getattr(args, "enable_prompt_tokens_details", False):
        return None
    if not REMOTE_CACHED and not num_cached_tokens:
        return None
    return {"cached_tokens": num_cached_tokens}


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


class State:
    def __init__(self, args, kv, model_config=None):
        self.args = args
        self.kv = kv
        self.served = (args.served_model_name or [args.model])[0]
        self.api_keys = list(args.api_key or []) or [k for k in [os.environ.get("VLLM_API_KEY")] if k]
        self.engine_id = (kv.engine_id if kv and kv.engine_id else str(uuid.uuid4()))
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
        self.side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
        self.block_size = args.block_size or 16
        self.compat_hash, self.meta = agent_metadata(args, model_config or {}, self.engine_id)
        self.blocks = OrderedDict()
        self.next_block = 0
        self.lock = threading.Lock()
        self.metrics = {"bytes_sum": 0, "bytes_count": 0, "xfer_time_sum": 0.0, "failed_transfers": 0,
                        "failed_notifications": 0, "external_prompt_tokens": 0, "local_prompt_tokens": 0,
                        "requests_ok": 0, "requests_error": 0}


def kv_payload(prompt):
    tokens = prompt.split() or [""]
    seed = hashlib.sha256(prompt.encode()).digest()
    return len(tokens), seed * (len(tokens) * BYTES_PER_TOKEN // len(seed))


def completion_text(prompt, max_tokens):
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    return "".join(f" t{digest[(i * 4) % 60:(i * 4) % 60 + 4]}" for i in range(max(1, max_tokens)))


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


def fetch_blocks(state, params):
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
        nixl_handshake(state, sock, reader, params)
        sock.sendall(json.dumps({"engine_id": params.get("remote_engine_id"),
                                 "block_ids": params.get("remote_block_ids")}).encode() + b"\n")
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


def nixl_handshake(state, sock, reader, params):
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
        handshake.validate_remote(state.meta, meta)
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
        try:
            req = json.loads(self.rfile.readline())
            if req.get("get_meta"):
                self.wfile.write(json.dumps({"compatibility_hash": state.compat_hash,
                                             "agent_metadata": state.meta}).encode() + b"\n")
                self.wfile.flush()
                req = json.loads(self.rfile.readline())
            if req.get("engine_id") != state.engine_id:
                self.wfile.write(b"NO" + b"engine"[:7].ljust(7))
                return
            with state.lock:
                parts = [state.blocks[b] for b in req["block_ids"]]
            data = b"".join(parts)
            self.wfile.write(b"OK" + len(data).to_bytes(7, "big") + data)
        except (KeyError, ValueError, TypeError):
            self.wfile.write(b"NO" + b"blocks".ljust(7))


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stdout.write("INFO:     %s - \"%s\"\n" % (self.client_address[0], fmt % args))
            sys.stdout.flush()

        def send(self, code, body=None, ctype="application/json"):
            data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self):
            if not state.api_keys or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization", "") in [f"Bearer {key}" for key in state.api_keys]:
                return True
            self.send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            if self.path == "/health":
                return self.send(200)
            if self.path == "/version":
                return self.send(200, {"version": __version__})
            if self.path == "/metrics":
                return self.send(200, metrics_text(state).encode(), "text/plain; version=0.0.4")
            if not self.authorized():
                return None
            if self.path == "/v1/models":
                return self.send(200, {"object": "list", "data": [{
                    "id": state.served, "object": "model", "created": int(time.time()),
                    "owned_by": "vllm", "root": state.args.model, "parent": None,
                    "max_model_len": max(state.args.max_model_len or 0, 0) or 2048}]})
            return self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self.authorized():
                return None
            length = int(self.headers.get("content-length", "0"))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.send(400, {"object": "error", "message": "invalid JSON", "code": 400})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.send(404, {"detail": "Not Found"})
            if body.get("model") not in (None, state.served):
                return self.send(404, {"object": "error", "code": 404,
                                       "message": f"The model `{body.get('model')}` does not exist."})
            return self.complete(body)

        def complete(self, body):
            prompt = body.get("prompt")
            if prompt is None:
                prompt = " ".join(m.get("content", "") for m in body.get("messages", []))
            if isinstance(prompt, list):
                prompt = " ".join(map(str, prompt))
            n_tokens, payload = kv_payload(prompt)
            params = body.get("kv_transfer_params") or {}
            rid = self.headers.get("X-Request-Id") or uuid.uuid4().hex
            out = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                   "model": state.served,
                   "usage": {"prompt_tokens": n_tokens, "completion_tokens": 0, "total_tokens": n_tokens}}
            cached = 0  # no prefix cache in the stand-in: local hits are always 0
            if params.get("do_remote_prefill"):
                started = time.time()
                try:
                    data = fetch_blocks(state, params)
                    if data != payload:
                        raise OSError("received KV blocks do not match the prompt")
                except OSError as exc:
                    with state.lock:
                        state.metrics["failed_transfers"] += 1
                        state.metrics["requests_error"] += 1
                    print(f"ERROR KV load failed for request {rid}: {exc}", flush=True)
                    return self.send(500, {"object": "error", "type": "InternalServerError", "code": 500,
                                           "message": f"KV transfer failed (finish_reason=error): {exc}"})
                with state.lock:
                    state.metrics["bytes_sum"] += len(data)
                    state.metrics["bytes_count"] += 1
                    state.metrics["xfer_time_sum"] += time.time() - started
                    state.metrics["external_prompt_tokens"] += n_tokens
                cached = n_tokens  # the scheduler's PrefillStats: local + external cached tokens
                remote = params.get("remote_prefill_cached_tokens")
                if REMOTE_CACHED and isinstance(remote, int):
                    cached = remote  # the producer's hits reported in its place (output_processor)
            else:
                with state.lock:
                    state.metrics["local_prompt_tokens"] += n_tokens
            max_tokens = int(body.get("max_tokens") or 16)
            text = completion_text(prompt, max_tokens)
            out["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                               "stop_reason": None}]
            out["usage"]["completion_tokens"] = max_tokens
            out["usage"]["total_tokens"] = n_tokens + max_tokens
            details = prompt_details(state.args, cached)
            if details is not None:
                out["usage"]["prompt_tokens_details"] = details
            if params.get("do_remote_decode"):
                n_blocks = -(-n_tokens // state.block_size)
                step = len(payload) // n_blocks if n_blocks else len(payload)
                with state.lock:
                    ids = []
                    for i in range(n_blocks):
                        state.blocks[state.next_block] = payload[i * step:(i + 1) * step if i < n_blocks - 1 else None]
                        ids.append(state.next_block)
                        state.next_block += 1
                    while len(state.blocks) > 4096:
                        state.blocks.popitem(last=False)
                out["kv_transfer_params"] = {
                    "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": ids,
                    "remote_engine_id": state.engine_id, "remote_request_id": rid,
                    "remote_host": state.side_host, "remote_port": state.side_port,
                    "tp_size": state.args.tensor_parallel_size}
                if REMOTE_CACHED:
                    out["kv_transfer_params"]["remote_prefill_cached_tokens"] = 0  # this engine's own hits
            with state.lock:
                state.metrics["requests_ok"] += 1
            return self.send(200, out)

    return Handler


def metrics_text(state):
    m = dict(state.metrics)
    name = state.served
    lines = [
        "# TYPE vllm:nixl_bytes_transferred histogram",
        f'vllm:nixl_bytes_transferred_sum{{model_name="{name}"}} {float(m["bytes_sum"])}',
        f'vllm:nixl_bytes_transferred_count{{model_name="{name}"}} {float(m["bytes_count"])}',
        "# TYPE vllm:nixl_xfer_time_seconds histogram",
        f'vllm:nixl_xfer_time_seconds_sum{{model_name="{name}"}} {m["xfer_time_sum"]}',
        f'vllm:nixl_xfer_time_seconds_count{{model_name="{name}"}} {float(m["bytes_count"])}',
        "# TYPE vllm:nixl_num_failed_transfers counter",
        f'vllm:nixl_num_failed_transfers_total{{model_name="{name}"}} {float(m["failed_transfers"])}',
        "# TYPE vllm:nixl_num_failed_notifications counter",
        f'vllm:nixl_num_failed_notifications_total{{model_name="{name}"}} {float(m["failed_notifications"])}',
        "# TYPE vllm:prompt_tokens_by_source counter",
        f'vllm:prompt_tokens_by_source_total{{model_name="{name}",source="external_kv_transfer"}} '
        f'{float(m["external_prompt_tokens"])}',
        f'vllm:prompt_tokens_by_source_total{{model_name="{name}",source="local_compute"}} '
        f'{float(m["local_prompt_tokens"])}',
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{model_name="{name}",finished_reason="length"}} {float(m["requests_ok"])}',
    ]
    return "\n".join(lines) + "\n"


def _server_class(host, base):
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    attrs = {"address_family": family, "allow_reuse_address": True, "daemon_threads": True}
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
    if "auto_map" in model_config and not args.trust_remote_code:
        print(f"ERROR: The repository {args.model} contains custom code which must be executed to "
              "correctly load the model. Please pass the argument `trust_remote_code=True`.", file=sys.stderr)
        return 1
    refused = register_kv_memory(kv)
    if refused:
        print("ERROR %s" % refused, file=sys.stderr, flush=True)
        return 1
    state = State(args, kv, model_config)
    if kv is not None:
        side_cls = _server_class(state.side_host if state.side_host != "localhost" else "127.0.0.1",
                                 socketserver.ThreadingTCPServer)
        side_bind = "127.0.0.1" if state.side_host == "localhost" else state.side_host
        side = side_cls((side_bind, state.side_port), SideChannel)
        side.state = state
        threading.Thread(target=side.serve_forever, daemon=True).start()
        print(f"INFO NIXL side channel listening on {side_bind}:{state.side_port} "
              f"(engine_id={state.engine_id}, kv_role={kv.kv_role})", flush=True)
        print(f"INFO NIXL compatibility hash: {state.compat_hash} (model={args.model}, "
              f"attn_backend={state.meta['attn_backend_name']}, cache_dtype={args.kv_cache_dtype})", flush=True)
    host = args.host if args.host is not None else "0.0.0.0"
    http_cls = _server_class(host, ThreadingHTTPServer)
    httpd = http_cls((host, args.port), make_handler(state))
    print(f"INFO vLLM API server version {__version__} (narwhal.deploy stand-in)", flush=True)
    print(f"INFO Uvicorn running on http://{host}:{args.port}", flush=True)
    httpd.serve_forever()
    return 0
