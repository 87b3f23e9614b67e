"""Stand-in of vLLM 0.32.0's KV event publisher (vllm/distributed/kv_events.py, ZmqEventPublisher), one per engine core
(DP rank), for --kv-events-config (vllm.config.kv_events.KVEventsConfig).

Replayed from the source (the narwhal-sim/vllm-cpu image):
- EventPublisherFactory.create: no publisher unless enable_kv_cache_events and publisher "zmq" (the config's default
  publisher once events are enabled).
- the endpoint: offset_endpoint_port adds the DP rank to a tcp port (rank 0 and port 0 unchanged), appends _dp<r> to
  an inproc name and raises ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'") for anything else (an ipc
  endpoint) of a rank > 0; the PUB socket (high-water mark hwm) BINDS an endpoint with "*" or "::" in it or an
  ipc:// / inproc:// one (_is_bind_endpoint) and CONNECTS to any other. replay_endpoint: a ROUTER socket bound at
  that endpoint (offset the same way), answering [client, b"", start seq (8 bytes big-endian)] with every buffered
  batch from that seq ([client, b"", topic, seq, payload]) then [client, b"", b"", END_SEQ, b""]; the last
  buffer_steps batches are kept.
- the wire: each batch is one multipart message [topic (utf-8), seq (8 bytes big-endian, from 0), payload], the
  payload msgspec's msgpack of KVEventBatch: an array [ts, events, data_parallel_rank] (EventBatch is array_like; the
  publisher sets the rank), each event a map (KVCacheEvent is a tagged struct, not array_like: "type" first, then the
  fields in order, defaults that are None omitted: omit_defaults). vllm.standin.prefix_cache writes the event maps;
  msgpack.packb writes them as msgspec does (tests/fixtures/recorded/vllm-0.32.0-kv-events: bytes the real classes
  encoded, compared by the unit tests).
- a batch per scheduler step that has events (v1/core/sched/scheduler.py update_from_output: KVEventBatch(ts=
  time.time(), events)); the stand-in's step is one request's prefill. The queue holds max_queue_size batches (a full
  queue blocks the engine, as Queue.put does).
- /kv_event_sources (entrypoints/serve/instrumentator/basic.py): {rank: the publisher's config, its endpoint the
  resolved one} for the ranks with a ZMQ publisher, {} without.
Not modelled: tcp://*:0 (vLLM binds the node's IP on a free port), refused at start (config_error)."""
import queue
import threading
import time
from collections import deque

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def is_bind_endpoint(endpoint):
    """ZmqEventPublisher._is_bind_endpoint."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint_port(endpoint, rank):
    """ZmqEventPublisher.offset_endpoint_port (ValueError as vLLM raises it)."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        if ":" in endpoint:
            cut = endpoint.rfind(":")
            port = int(endpoint[cut + 1:])
            return endpoint if port == 0 else f"{endpoint[:cut]}:{port + rank}"
        return endpoint
    raise ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'")


def publishes(config):
    """EventPublisherFactory.create: a ZMQ publisher, or none (NullEventPublisher)."""
    return config is not None and config.enable_kv_cache_events and config.publisher == "zmq"


def config_warnings(config, prefix_caching):
    """The warnings vLLM 0.32.0 logs for the config (config/vllm.py:1971-1990)."""
    if config is None:
        return []
    out = []
    if config.enable_kv_cache_events and not prefix_caching:
        out.append("KV cache events are on, but prefix caching is not enabled. Use --enable-prefix-caching to "
                   "enable.")
    if config.publisher != "null" and not config.enable_kv_cache_events:
        out.append("KV cache events are disabled, but the scheduler is configured to publish them. Modify "
                   "KVEventsConfig.enable_kv_cache_events to True to enable.")
    return out


def config_error(config, ranks):
    """What ends the start for these DP rank indexes (None: fine): vLLM's ValueError, or what is not modelled."""
    if not publishes(config):
        return None
    for endpoint in (config.endpoint, config.replay_endpoint):
        for rank in ranks:
            try:
                resolved = offset_endpoint_port(endpoint, rank)
            except (ValueError, TypeError) as exc:
                return f"ValueError: {exc}"
            if resolved and resolved.startswith("tcp://") and resolved.rsplit(":", 1)[-1] == "0":
                return (f"ERROR narwhal stand-in: the KV events endpoint {resolved} (a port the OS picks) is not "
                        "modelled: name a port")
    return None


def encode_batch(ts, events, rank):
    """msgspec's msgpack of KVEventBatch(ts, events, data_parallel_rank=rank): the payload frame."""
    import msgpack  # python3-msgpack: only an engine with KV events needs it

    return msgpack.packb([ts, events, rank])


class Publisher:
    """ZmqEventPublisher of DP rank `rank`: its sockets made at once (a taken port ends the start, as in vLLM), a
    thread that sends the queued batches and answers replay requests."""

    def __init__(self, config, rank):
        import zmq  # python3-zmq: only an engine with KV events needs it

        self.zmq, self.rank, self.config = zmq, rank, config
        self.endpoint = offset_endpoint_port(config.endpoint, rank)
        self.replay_endpoint = offset_endpoint_port(config.replay_endpoint, rank)
        self.topic = config.topic.encode("utf-8")
        self.queue = queue.Queue(maxsize=config.max_queue_size)
        self.buffer = deque(maxlen=config.buffer_steps)  # (seq, payload) of the last batches, for replay
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(config.hwm)
        if is_bind_endpoint(self.endpoint):
            self.pub.bind(self.endpoint)
        else:
            self.pub.connect(self.endpoint)
        self.replay = None
        if self.replay_endpoint is not None:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.bind(self.replay_endpoint)
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True, name="zmq-publisher-%d" % rank)
        self.thread.start()

    def source(self):
        """get_publisher_config: the config with the endpoints this rank uses (/kv_event_sources)."""
        out = self.config.asdict()
        out.update(enable_kv_cache_events=True, publisher="zmq", endpoint=self.endpoint,
                   replay_endpoint=self.replay_endpoint)
        return out

    def publish(self, events):
        """One scheduler step's events (none: nothing is published)."""
        if events:
            self.queue.put((time.time(), events))

    def _run(self):
        seq = 0
        while self.running or not self.queue.empty():
            if self.replay is not None and self.replay.poll(0):
                self._serve_replay()
            try:
                item = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                break
            payload = encode_batch(item[0], item[1], self.rank)
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            self.buffer.append((seq, payload))
            seq += 1
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)

    def _serve_replay(self):
        frame = self.replay.recv_multipart()
        if len(frame) != 3:
            print("WARNING Invalid replay request: %s" % frame, flush=True)
            return
        client, _empty, start = frame
        first = int.from_bytes(start, "big")
        for seq, payload in list(self.buffer):
            if seq >= first:
                self.replay.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
        self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self):
        """shutdown(): what is queued is still sent, then the sockets close."""
        self.running = False
        self.queue.put(None)
        self.thread.join(timeout=2)
