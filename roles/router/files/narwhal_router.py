"""narwhal.deploy's start of vLLM's P/D router (the `vllm-router` distribution) in its container.

    python3 /narwhal/narwhal_router.py /narwhal/router.json

router.json (written by the router role, no secret) holds the vllm-router command line, the path of the engines'
API key file, the fronts (the addresses clients and Prometheus reach), the TLS certificate and key when the router
serves TLS, and for the fleet's router the path of workers.json, the worker set. This script does what the upstream
CLI cannot do without putting the key in the process list or the container's environment, the TLS listener
vllm-router lacks, and a change of the worker set that closes no listening socket:

- The parent process (the container's PID 1) always runs the fronts: one listening socket per entry of router.json
  `fronts` ({"listen": [address, port], "to": "port" | "prometheus_port"}), TLS (1.2 or later; router.json `tls`:
  cert and key) when router.json has `tls`, plain TCP otherwise. A front pumps bytes both ways between the client
  and the serving vllm-router on loopback: nothing is parsed or buffered, so Server-Sent-Event streams pass as they
  come. Standard library only (asyncio, ssl). The TLS front's cost per request is measured by
  bench/router_tls_front.py, a reload's by bench/router_reload.py. vllm-router 0.1.17 has no TLS listener
  (vllm_router/router_args.py: RouterArgs and its parser have --host and --port and no certificate or key option).
- vllm-router runs as a child process (this script again, `--child`) on 127.0.0.1, on two free loopback ports chosen
  for each child (--port, --prometheus-port): its command line is router.json `args` + those four options + one
  `--prefill URL` / `--decode URL` per URL of router.json `workers_file` (NARWHAL_ROUTER_DIR/workers.json,
  {"prefill": [url, ...], "decode": [url, ...]}, written by the controller side). The child gets the key, the
  command line and the parent's pid through a pipe (its stdin), never argv or environment. With a kv_aware prefill
  policy workers.json also maps each prefill URL to its engine's KV events endpoints ("kv_events": {url: [tcp://...,
  ...]}), and the child gets one `--pd-kv-events URL=EP[,EP...]` per prefill URL it is given (kv_event_sources).
- The child reads the key from the file the parent read (mode 0600, mounted read-only) and hands it to the router in
  its own process: as OPENAI_API_KEY, which the P/D router sends to the workers as "Authorization: Bearer ..."
  (vllm-router 0.1.17, routers/http/vllm_pd_router.rs), set with os.environ after exec, so /proc/<pid>/environ,
  `ps e` and `docker inspect` never show it; and as the Router's api_key.
- It passes api_key_validation_urls, which the Rust router accepts but the CLI does not expose
  (vllm_router_rs.Router's signature): every client request must carry a key that one of these engine URLs accepts
  (src/server.rs: "You must provide a valid API key"), so the router is no open proxy in front of keyed engines.
  router.json `api_key_validation_urls` when given, else every URL of workers.json (decode first) + /v1/models.

Reload (SIGHUP to the parent, e.g. `docker kill -s HUP narwhal-router`, which the router_members module sends):
router.json, workers.json and the key file are read again and a new child is started; once it accepts connections on
its loopback port and every worker of the set answers /health (bounded by router.json `ready_timeout`) the fronts
send NEW connections to it, the previous child gets SIGTERM a second later (SWITCH_GRACE_S; vllm-router then
accepts no new connection and ends once its in-flight requests are done) and SIGKILL after router.json
`drain_timeout` seconds. Connections already relayed stay with the child they reached; a kept-alive one that is idle
when that child drains is closed by it (a client opens a new one, as HTTP clients do for a closed idle connection).
A reload whose files are wrong or whose new child does not come up in time changes nothing: the previous child keeps
serving, and the reason is printed (stderr, `docker logs`: a line "narwhal_router: reload <n> failed: ...";
success prints "narwhal_router: reload <n> done: ..."). The router directory is mounted read-only, so there is no
status file: a reload is observed done when the router's /workers reports the new worker set (router_members waits
for exactly that). A SIGHUP during a reload asks for one more after it.

Stop (SIGTERM or SIGINT, `docker stop`): the fronts stop listening, every child gets SIGTERM and drains as above
(SIGKILL after `drain_timeout`), then the parent exits 0; the role's stop gives `docker stop` drain_timeout + a
margin. When another router listens on a front's address and port (a hand-over, below), the front first takes what
already reached it: it closes its listening socket once at least QUIET_S have passed and its accept queue is empty
(at most CLOSE_S), since Linux resets the connections still queued on a closed listener. When the serving child ends
on its own, the parent ends with its exit status, so Docker's restart policy (unless-stopped) starts both again; a
failure of the fronts (a bind refused, the loop raising) kills the children and exits non-zero. A child asks the
kernel to kill it when the parent dies (prctl PR_SET_PDEATHSIG), so a router never outlives its front outside a
container either. The fronts' sockets are bound, the certificate and the key read before any child starts, so a bad
certificate, an address the host lacks or a port another program holds is refused once, by name.

Hand-over (a replaced or restarted router container, router_container): the fronts' sockets are bound with
SO_REUSEPORT, so a second router (the new container, same user on the host network) binds the same address and port
while the first listens; a process without SO_REUSEPORT on that port is refused by name, as before. A front listens
only once its first vllm-router accepts connections on loopback and, when another router already listens on its
address (read from /proc/net/tcp or tcp6), every worker of the set answers /health (bounded by `ready_timeout`; when
it is not met the script exits non-zero naming why). Then it takes every new connection from the other router: a
classic BPF program on the port's SO_REUSEPORT group (SO_ATTACH_REUSEPORT_CBPF) that returns this socket's index
(socket(7): sockets are numbered in the order of their listen() calls, an invalid index falls back to the hash; the
last socket moves into a closed socket's place: net/core/sock_reuseport.c). Once it listens it prints a line that
starts with "narwhal_router: serving" (SERVING; router_container waits for it in the new container's log), and the
previous router, stopped then, finds nothing new in its accept queue and closes an empty one. The kernel's
alternative, net.ipv4.tcp_migrate_req=1 (Linux 5.14; Documentation/networking/ip-sysctl.rst: "When a listener is
closed, in-flight request sockets during the handshake and established sockets in the accept queue are aborted"
unless it is set), is a host setting, off by default, and not needed here.

Everything else is upstream: the command line is parsed by vllm-router's own parser (vllm_router/launch_router.py,
parse_router_args; an unknown option is refused with its usage error), and the router is built by its own
Router.from_args (vllm_router/router.py).
"""
import asyncio
import json
import os
import signal
import socket
import ssl
import stat
import struct
import subprocess
import sys
import threading

# bytes read at once from either side of a front connection (a read returns what has arrived, up to this)
CHUNK = 65536
# seconds a client has to finish its TLS handshake
HANDSHAKE_S = 10
# router.json's defaults: seconds a stopped child has to finish its in-flight requests before SIGKILL
# (NARWHAL_ROUTER_DRAIN_TIMEOUT's default), and seconds a new child has to accept connections (the plan's
# --worker-startup-timeout-secs: vllm-router gives up on its workers then)
DRAIN_S = 120
READY_S = 600
# where every child listens, and how often a starting child's port is tried
LOOPBACK = "127.0.0.1"
POLL_S = 0.1
# seconds between the switch (or the fronts' close) and the previous child's SIGTERM: a front connection opened just
# before the switch may still sit in that vllm-router's accept queue, and vllm-router's shutdown closes what it has not
# accepted and what carries no request yet (measured by bench/router_reload.py without it: 3 of 440 requests on new
# connections ended "Remote end closed connection without response")
SWITCH_GRACE_S = 1.0
# the options the parent sets for each child (its loopback ports); router.json's args must not hold them
CHILD_OPTIONS = ("--host", "--port", "--prometheus-host", "--prometheus-port")
# What the script says once its fronts listen (the log line "narwhal_router: serving: ...": router_container's
# hand-over waits for it in the new container's log, _router/container.py SERVING), and how often a front that waits
# for its workers says what it waits for.
SERVING = "serving"
PROGRESS_S = 10
# A stop while another router listens on a front's address (a hand-over): the front keeps its listening socket at
# least QUIET_S (a handshake begun before the other router took the new connections completes within a round trip,
# a lost SYN-ACK is sent again after 1 s: RFC 6298's initial RTO) and until its accept queue is empty, at most CLOSE_S.
QUIET_S = 1.0
CLOSE_S = 5.0
# setsockopt SO_ATTACH_REUSEPORT_CBPF (include/uapi/asm-generic/socket.h; Python's socket module has no name for it)
# and the one classic BPF instruction "ret #k" (BPF_RET | BPF_K, include/uapi/linux/bpf_common.h)
SO_ATTACH_REUSEPORT_CBPF = 51
BPF_RET_K = 0x06
# TCP_INFO (include/uapi/linux/tcp.h) and where struct tcp_info holds tcpi_unacked, which Linux reports for a listener
# as its accept queue's length (net/ipv4/tcp.c, tcp_get_info: "tcpi_unacked -> Number of children ready for accept()")
TCP_INFO = getattr(socket, "TCP_INFO", 11)
TCPI_UNACKED = 24


def say(message):
    print("narwhal_router: %s" % message, file=sys.stderr, flush=True)


def fail(message):
    say(message)
    sys.exit(2)


class Refused(Exception):  # noqa: N818 - what the process says it did
    """A router.json or workers.json the router cannot use (at start: the process fails; at a reload: the previous
    child keeps serving)."""


def private_bytes(path, what, limit):
    """The bytes of a file that must be readable by its owner only (the role writes it 0600)."""
    try:
        st = os.stat(path)
        with open(path, "rb") as handle:
            raw = handle.read(limit)
    except OSError as exc:
        raise Refused("cannot read the %s %s: %s; rerun the router stage" % (what, path, exc.strerror or exc))
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise Refused("the %s %s is readable by others (mode %o); the router stage writes it 0600"
                      % (what, path, stat.S_IMODE(st.st_mode)))
    return raw


def read_key(path):
    """The key the router sends to the workers (and its Router's api_key): the file's first line. During a rotation
    the file (a copy of NARWHAL_API_KEY_FILE, held to plugins/module_utils/_common/api_key.py's rule by prepare) holds
    the previous key on a second line: the engines accept both, and a client's key is checked against the engines
    (api_key_validation_urls), so the router itself needs only the first."""
    lines = [line.strip() for line in private_bytes(path, "API key file", 4097).decode("utf-8", "replace").strip()
             .splitlines()]
    if not 1 <= len(lines) <= 2 or not all(lines):
        raise Refused("the API key file %s must hold the key on one line (during a rotation the previous key on a "
                      "second); rerun the router stage" % path)
    return lines[0]


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise Refused("cannot read the %s %s: %s; rerun the router stage" % (what, path, exc))


def read_config(path):
    """router.json, checked: args (a list without the per-child options), api_key_file, fronts."""
    config = read_json(path, "router configuration")
    if not isinstance(config, dict) or not isinstance(config.get("args"), list) or not config.get("api_key_file"):
        raise Refused("%s holds no args list and api_key_file; rerun the router stage" % path)
    fronts = config.get("fronts")
    if not isinstance(fronts, list) or not fronts or not all(
            isinstance(f, dict) and f.get("to") in ("port", "prometheus_port") and len(f.get("listen") or ()) == 2
            for f in fronts):
        raise Refused("%s: fronts must list {listen: [address, port], to: port|prometheus_port}; rerun the router "
                      "stage" % path)
    taken = [a for a in config["args"] if str(a).split("=", 1)[0] in CHILD_OPTIONS]
    if taken:
        raise Refused("%s: args hold %s, which the start script sets for each vllm-router (loopback, free ports); "
                      "rerun the router stage" % (path, ", ".join(taken)))
    return config


def read_workers(path):
    """workers.json -> {"prefill": [url, ...], "decode": [url, ...]}, each role non-empty (a P/D router needs one of
    each), every URL http(s) and once; and "kv_events" ({prefill url: [tcp://host:port, ...]}) when the file has
    it (a kv_aware prefill policy: the router plan writes it)."""
    workers = read_json(path, "worker set")
    if not isinstance(workers, dict) or set(workers) - {"kv_events"} != {"prefill", "decode"}:
        raise Refused("%s must be {\"prefill\": [url, ...], \"decode\": [url, ...]} (and \"kv_events\"); rerun the "
                      "router stage" % path)
    kv = workers.get("kv_events", {})
    if not isinstance(kv, dict) or not all(
            isinstance(eps, list) and eps and all(isinstance(e, str) and e.startswith("tcp://") and "," not in e
                                                  for e in eps) for eps in kv.values()):
        raise Refused("%s: kv_events must be {prefill url: [tcp://host:port, ...]}; rerun the router stage" % path)
    seen = set()
    for role in ("prefill", "decode"):
        urls = workers[role]
        if not isinstance(urls, list) or not urls:
            raise Refused("%s: no %s worker; vllm-router's P/D mode needs at least one prefill and one decode"
                          % (path, role))
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")) or url in seen:
                raise Refused("%s: %s worker %r is not an http(s) URL or is listed twice" % (path, role, url))
            seen.add(url)
    return workers


def free_port():
    """A TCP port free on loopback now (the kernel's pick); the child binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def child_plan(config):
    """What one child runs -> {args, validation, ports}: router.json's args, the child's loopback ports and, with
    workers_file, the worker set and the key validation URLs from it."""
    ports = {"port": free_port(), "prometheus_port": free_port()}
    while ports["prometheus_port"] == ports["port"]:
        ports["prometheus_port"] = free_port()
    args = [str(a) for a in config["args"]] + [
        "--host", LOOPBACK, "--port", str(ports["port"]),
        "--prometheus-host", LOOPBACK, "--prometheus-port", str(ports["prometheus_port"])]
    validation, urls = config.get("api_key_validation_urls"), []
    if config.get("workers_file"):
        workers = read_workers(config["workers_file"])
        urls = workers["prefill"] + workers["decode"]
        for url in workers["prefill"]:
            args += ["--prefill", url]
        for url in workers["decode"]:
            args += ["--decode", url]
        args += kv_event_sources(config["args"], workers)
        if validation is None:
            validation = [u.rstrip("/") + "/v1/models" for u in workers["decode"] + workers["prefill"]]
    return {"args": args, "validation": list(validation or []), "ports": ports, "workers": urls}


def kv_event_sources(args, workers):
    """`--pd-kv-events <url>=<endpoint>[,<endpoint>...]` for each prefill URL of the worker set that workers.json's
    kv_events maps (its endpoints by DP rank, the base URL as key: vllm-router 0.1.17 refuses a worker it does not
    route to, and a `<url>@<rank>` key), only under a kv_aware prefill policy (router.json's args: vllm-router takes
    --pd-kv-events with no other). Then every prefill URL needs its endpoints: a worker without them is refused, not
    left to a discovery vLLM does not serve."""
    kv = workers.get("kv_events") or {}
    policy = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--prefill-policy"]
    if not policy or policy[-1] != "kv_aware":
        return []
    lacking = [u for u in workers["prefill"] if u not in kv]
    if lacking:
        raise Refused("the prefill policy is kv_aware but workers.json has no kv_events for prefill worker(s) %s; "
                      "rerun the router stage" % ", ".join(lacking))
    out = []
    for url in workers["prefill"]:
        if url in kv:
            out += ["--pd-kv-events", "%s=%s" % (url, ",".join(kv[url]))]
    return out


def not_answering(urls, timeout=5):
    """The worker URLs whose GET /health does not answer 200 now. A reload's own check: vllm-router 0.1.17 may bind its
    port before every worker answers (seen: with two decode workers, one on a dead port, it logged "1 out of 2 unique
    hosts are healthy" (src/routers/http/router.rs:1100) and then "Router ready", the dead worker listed healthy), so
    its port alone does not say every new worker serves. https URLs are verified against the container's SSL_CERT_FILE
    (the site CA, as vllm-router's), which ssl's default context reads."""
    import urllib.request

    bad = []
    for url in urls:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    bad.append(url)
        except Exception:  # noqa: BLE001 - whatever the reason, it does not serve
            bad.append(url)
    return bad


def server_context(tls):
    """The front's TLS context: TLS 1.2 or later, the router host's certificate and key."""
    private_bytes(tls["key"], "TLS private key", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls["cert"], tls["key"])
    except (OSError, ssl.SSLError) as exc:
        raise Refused("cannot load the TLS certificate %s with its key %s: %s; rerun the router stage, which "
                      "installs them" % (tls["cert"], tls["key"], exc))
    return context


def listen(host, port):
    """A TCP socket bound to host:port with SO_REUSEPORT (IPv6 only for an IPv6 address other than the wildcard),
    refused by name when the host lacks the address or another process holds the port without SO_REUSEPORT (or as
    another user). It listens later, once a vllm-router serves (open_fronts: asyncio's server calls listen()): a bound
    socket that does not listen gets no connection, while another router may still listen on the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (asyncio/base_events.py::_set_nodelay), and an accepted connection inherits the listener's proto; with Nagle
    # left on, a small TLS record waits for the client's delayed ACK (40 ms per request, measured)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the hand-over's second router binds it too
        if family == socket.AF_INET6 and host != "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        fail("the router's front cannot listen on %s port %s: %s; NARWHAL_ROUTER_BIND (or the router host's "
             "router_address) must be an address of this host, and the port free" % (host, port, exc.strerror or exc))
    sock.setblocking(False)
    return sock


def listeners(sock):
    """How many TCP sockets listen on `sock`'s address and port in this network namespace (the host's, on the host
    network), `sock` included when it listens: the LISTEN (0A) rows of /proc/net/tcp (tcp6) whose local address is
    its own, written as the kernel writes it (each 32-bit word of the address in host byte order, then the port)."""
    try:
        host, port = sock.getsockname()[:2]
        if sock.family == socket.AF_INET6:
            words = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, host))
            path, local = "/proc/net/tcp6", "%08X%08X%08X%08X:%04X" % (words + (port,))
        else:
            path, local = "/proc/net/tcp", "%08X:%04X" % (struct.unpack("=I", socket.inet_aton(host))[0], port)
        with open(path) as handle:
            rows = [line.split() for line in handle.readlines()[1:]]
    except OSError:
        return 0
    return sum(1 for row in rows if len(row) > 3 and row[1] == local and row[3] == "0A")


def queued(sock):
    """Connections waiting in a listening socket's accept queue (TCP_INFO)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 32)
    except OSError:
        return 0
    return struct.unpack_from("=I", info, TCPI_UNACKED)[0] if len(info) >= TCPI_UNACKED + 4 else 0


def steer(sock):
    """Every new connection to `sock`'s address and port to `sock` (it listens, added last to the port's SO_REUSEPORT
    group: index = listeners - 1) -> the index, or None when it is alone or the kernel refused. A classic BPF program
    attached to the group returns that index for each SYN (socket(7), SO_ATTACH_REUSEPORT_CBPF; no capability needed).
    It stays with the group: when the previous router's socket closes this one moves to index 0 and the index is out
    of range, so the kernel falls back to its hash over the one socket left (net/core/sock_reuseport.c,
    run_bpf_filter and __reuseport_detach_sock)."""
    index = listeners(sock) - 1
    if index < 1:
        return None
    import ctypes

    code = ctypes.create_string_buffer(struct.pack("=HBBI", BPF_RET_K, 0, 0, index))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, struct.pack("@HP", 1, ctypes.addressof(code)))
    except OSError as exc:
        say("the front on %s port %s cannot take the new connections from the other router (%s): the kernel shares "
            "them until that one stops listening" % (sock.getsockname()[0], sock.getsockname()[1], exc))
        return None
    return index


# The relays in flight, held here: the event loop keeps only weak references to tasks, and asyncio's stream protocol
# drops its reference to the connection's task when the client's side closes (asyncio/streams.py,
# StreamReaderProtocol.connection_lost) and holds the readers weakly, so a relay whose client has gone while it waits
# for vllm-router's end was garbage: collected pending ("Task was destroyed but it is pending!", seen under
# bench/router_tls_front.py) without closing its connection to vllm-router.
RELAYS = set()


# A request the draining vllm-router closed unread is sent again to the serving one (Link.replay): at most this many
# bytes of a request are kept until the first byte of its answer.
REPLAY_MAX = 1 << 20


class Link:
    """One client connection relayed to vllm-router, with what it sent since the last byte that came back.

    A reload drains the previous vllm-router (SIGTERM): it finishes what it holds and closes its idle kept-alive
    connections. A client that sends its next request on such a connection at that moment (HTTP/1.1 keep-alive's
    race, RFC 9112 section 9.3.1) gets the connection closed with no answer: measured once in 390 requests of
    bench/day_two.py's replace-prefill (the OpenAI client with max_retries=0: "Server disconnected without sending a
    response"). The front owns the client's connection, so it closes nothing: when the connection to a vllm-router
    that is no longer the serving one ends with bytes sent and not one byte answered since, those bytes (the request
    it never read) go to the serving vllm-router on a new connection, and the client's connection goes on. Only then:
    a vllm-router that is still the serving one and ends a connection unanswered (it failed) ends the client's as
    before, and so does one that answered part of it. (A request the draining one held unanswered until it was
    killed, NARWHAL_ROUTER_DRAIN_TIMEOUT later, is sent again too: the serving one answers it.)"""

    def __init__(self, upstream, client_reader, client_writer):
        self.upstream, self.client_reader, self.client_writer = upstream, client_reader, client_writer
        self.target, self.up_writer, self.pending, self.keep = None, None, bytearray(), True

    async def connect(self):
        """A connection to the serving vllm-router -> its reader (self.target, self.up_writer set), or None."""
        target = self.upstream()
        if target is None:
            return None
        try:
            reader, writer = await asyncio.open_connection(target[0], int(target[1]))
        except OSError:
            return None
        self.target, self.up_writer = target, writer
        return reader

    async def from_client(self):
        """The client's bytes to the vllm-router of the moment, kept until an answer starts (within REPLAY_MAX)."""
        try:
            while True:
                data = await self.client_reader.read(CHUNK)
                if not data:
                    break
                if self.keep and len(self.pending) + len(data) <= REPLAY_MAX:
                    self.pending += data
                else:
                    self.keep, self.pending = False, bytearray()
                try:
                    self.up_writer.write(data)
                    await self.up_writer.drain()
                except OSError:
                    if not self.keep:
                        raise
            if self.up_writer.can_write_eof():
                self.up_writer.write_eof()
                return
        except (OSError, asyncio.IncompleteReadError):
            pass
        self.up_writer.close()

    async def to_client(self, reader):
        """vllm-router's bytes to the client; a connection the draining vllm-router ended unanswered is replayed."""
        while True:
            try:
                data = await reader.read(CHUNK)
            except (OSError, asyncio.IncompleteReadError):
                data = b""
            if data:
                self.pending, self.keep = bytearray(), True  # an answer started: what was sent is being answered
                try:
                    self.client_writer.write(data)
                    await self.client_writer.drain()
                except OSError:
                    break
                continue
            if self.pending and self.keep and self.upstream() not in (None, self.target):
                old = self.up_writer
                reader = await self.connect()
                old.close()
                if reader is not None:
                    self.up_writer.write(bytes(self.pending))
                    say("front: a request the previous vllm-router closed unread went to the serving one")
                    continue
            if self.client_writer.can_write_eof() and not self.client_writer.is_closing():
                try:
                    self.client_writer.write_eof()
                    return
                except OSError:
                    pass
            break
        self.client_writer.close()


async def relay(upstream, client_reader, client_writer):
    """One client connection (its TLS handshake done) to vllm-router on loopback, both ways. `upstream`: a
    function -> (host, port) of the serving child, or None when none serves; asked when the client connects, and
    again for a request the draining child closed unread (Link)."""
    task = asyncio.current_task()
    RELAYS.add(task)
    link = Link(upstream, client_reader, client_writer)
    try:
        reader = await link.connect()
        if reader is None:
            client_writer.close()  # vllm-router does not listen (yet): the client sees the connection closed
            return
        try:
            await asyncio.gather(link.from_client(), link.to_client(reader))
        finally:
            link.up_writer.close()
            client_writer.close()
    finally:
        RELAYS.discard(task)


def quiet(loop, context):
    """The loop's exception handler: a client that drops, resets or fails its handshake is no news; anything else is
    printed (one line)."""
    exc = context.get("exception")
    if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
        return
    say("front: %s" % (context.get("message") or exc))


async def open_fronts(fronts, sockets, context, upstream):
    """Start serving each front (router.json's fronts: listen, to) on its listening socket -> the servers.
    `upstream(to)` -> (host, port) of the serving child's `to` port, or None."""
    servers = []
    for i, front in enumerate(fronts):
        extra = {"ssl": context, "ssl_handshake_timeout": HANDSHAKE_S} if context else {}
        servers.append(await asyncio.start_server(
            lambda r, w, to=front["to"]: relay(lambda: upstream(to), r, w), sock=sockets[i], backlog=1024, **extra))
        say("%s front on %s port %s -> vllm-router's %s on loopback"
            % ("TLS" if context else "TCP", front["listen"][0], front["listen"][1], front["to"]))
    return servers


def exit_code(status):
    """os.waitstatus_to_exitcode (Python 3.9) for Python 3.8: a signal's death as 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


class Child:
    """One vllm-router process: its generation (1 at start, +1 per reload), Popen, loopback ports and a future of
    its exit status."""

    def __init__(self, number, proc, plan, exited):
        self.number, self.proc, self.ports, self.exited = number, proc, plan["ports"], exited
        self.workers = plan["workers"]
        self.draining = False


class Supervisor:
    """The parent's children: the serving one (`current`), a starting one during a reload, draining ones after it.
    `ended`: a future of the parent's exit status."""

    def __init__(self, loop, path, config, key):
        self.loop, self.path, self.config, self.key = loop, path, config, key
        self.current, self.children, self.generation = None, set(), 0
        self.reloading = self.again = self.stopping = False
        self.servers, self.sockets = [], []
        self.ended = loop.create_future()

    def upstream(self, to):
        child = self.current  # until it drains: a stop's fronts relay what reaches them before they close
        return (LOOPBACK, child.ports[to]) if child is not None and not child.draining else None

    def spawn(self, plan):
        self.generation += 1
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"], stdin=subprocess.PIPE)
        message = {"args": plan["args"], "key": self.key, "validation": plan["validation"], "parent": os.getpid()}
        try:
            proc.stdin.write(json.dumps(message).encode("utf-8"))
            proc.stdin.close()
        except OSError:
            pass  # the child died at once: its exit is reported as any other
        child = Child(self.generation, proc, plan, self.loop.create_future())
        self.children.add(child)
        threading.Thread(target=self._wait, args=(child,), name="wait-router-%d" % child.number, daemon=True).start()
        return child

    def _wait(self, child):
        code = child.proc.wait()
        self.loop.call_soon_threadsafe(self._child_ended, child, 128 - code if code < 0 else code)

    def _child_ended(self, child, code):
        self.children.discard(child)
        if not child.exited.done():
            child.exited.set_result(code)
        if child is self.current and not self.stopping:
            say("vllm-router (pid %d) ended (exit status %d); the router's front ends with it" % (child.proc.pid, code))
            self.finish(code or 1)
        elif child.draining:
            say("the previous vllm-router (pid %d) ended (exit status %d)" % (child.proc.pid, code))

    def finish(self, code):
        if not self.ended.done():
            self.ended.set_result(code)

    async def ready(self, child, timeout, workers=True, progress=False):
        """None once `child` accepts connections on its port (vllm-router binds it once its workers answered /health)
        and, with `workers`, every worker of its set answers /health (not_answering), else why not: it exited, or
        `timeout` seconds passed. `progress`: say what it waits for every PROGRESS_S seconds."""
        deadline, bad, accepts = self.loop.time() + timeout, None, False
        shown = self.loop.time()
        while not child.exited.done():
            try:
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, child.ports["port"]), 2)
            except (OSError, asyncio.TimeoutError):  # noqa: UP041 - Python 3.8 in a router image
                accepts = False
            else:
                writer.close()
                accepts = True
                bad = await self.loop.run_in_executor(None, not_answering, child.workers) if workers else None
                if not bad:
                    return None
            waits = ""
            if bad:
                waits = ": not answering /health: %s" % ", ".join(bad)
            elif not accepts:
                waits = ": vllm-router does not accept connections on loopback port %d yet" % child.ports["port"]
            if self.loop.time() > deadline:
                return "did not serve within %s s (ready_timeout)%s" % (timeout, waits)
            if progress and self.loop.time() - shown >= PROGRESS_S:
                shown = self.loop.time()
                say("vllm-router (pid %d) does not serve yet%s" % (child.proc.pid, waits))
            await asyncio.sleep(POLL_S)
        return "ended (exit status %d) before it served" % child.exited.result()

    def drain(self, child, timeout):
        """SIGTERM: vllm-router accepts no new connection and ends once its requests are done; SIGKILL after
        `timeout` seconds."""
        child.draining = True
        if child.exited.done():
            return
        try:
            child.proc.send_signal(signal.SIGTERM)
        except OSError:
            return
        self.loop.call_later(timeout, self.kill, child, timeout)

    def kill(self, child, timeout=None):
        if not child.exited.done():
            if timeout is not None:
                say("vllm-router (pid %d) did not end within %s s (drain_timeout): killed" % (child.proc.pid, timeout))
            child.proc.kill()

    async def reload(self):
        """SIGHUP: one reload at a time; a SIGHUP during one asks for one more after it (the files may have changed
        again)."""
        if self.reloading:
            self.again = True
            return
        self.reloading = True
        try:
            self.again = True
            while self.again and not self.stopping:
                self.again = False
                await self.reload_once()
        finally:
            self.reloading = False

    async def reload_once(self):
        number, started, previous = self.generation + 1, self.loop.time(), self.current
        keeps = "vllm-router pid %d keeps serving" % previous.proc.pid if previous else "no vllm-router serves"
        try:
            config = read_config(self.path)
            key = read_key(config["api_key_file"])
            plan = child_plan(config)
        except Refused as exc:
            say("reload %d failed: %s; %s" % (number, exc, keeps))
            return
        self.key = key
        child = self.spawn(plan)
        why = await self.ready(child, config.get("ready_timeout", READY_S))
        if why or self.stopping:
            self.kill(child)
            if why:
                say("reload %d failed: the new vllm-router (pid %d) %s; %s" % (number, child.proc.pid, why, keeps))
            return
        self.current, self.config = child, config
        say("reload %d done: vllm-router pid %d serves (loopback ports %d, %d; ready in %.1f s)%s"
            % (number, child.proc.pid, child.ports["port"], child.ports["prometheus_port"],
               self.loop.time() - started, "; pid %d drains (at most %s s)"
               % (previous.proc.pid, config.get("drain_timeout", DRAIN_S)) if previous else ""))
        if previous is not None:
            self.loop.call_later(SWITCH_GRACE_S, self.drain, previous, config.get("drain_timeout", DRAIN_S))

    async def start(self, context):
        """The fronts listen once the first vllm-router serves (ready: with another router on a front's address, a
        hand-over, once every worker answers /health too; then the new connections are taken from it: steer) ->
        None, or the exit status when it does not serve."""
        child, began = self.current, self.loop.time()
        handover = any(listeners(sock) for sock in self.sockets)
        why = await self.ready(child, self.config.get("ready_timeout", READY_S), workers=handover, progress=True)
        if self.stopping:
            return None
        if why:
            say("vllm-router (pid %d) %s; the fronts do not listen" % (child.proc.pid, why))
            return self.ended.result() if self.ended.done() else 1
        try:
            self.servers = await open_fronts(self.config["fronts"], self.sockets, context, self.upstream)
        except OSError as exc:  # e.g. a program bound the port with SO_REUSEADDR meanwhile and listens on it
            say("the router's front cannot listen: %s; the port must be free" % (exc.strerror or exc))
            return 2
        steered = [steer(sock) for sock in self.sockets] if handover else []
        say("%s: vllm-router pid %d ready in %.1f s%s" % (
            SERVING, child.proc.pid, self.loop.time() - began,
            "; hand-over: every new connection comes here (reuseport index %s), the router that listened before "
            "may stop" % ", ".join(str(i) for i in steered) if handover else ""))
        return None

    async def quiesce(self):
        """Before a stop closes the fronts while another router listens on their addresses: at least QUIET_S, then
        until no connection waits in their accept queues, at most CLOSE_S (a closed listener's queued connections
        are reset)."""
        deadline = self.loop.time() + CLOSE_S
        await asyncio.sleep(QUIET_S)
        while any(queued(sock) for sock in self.sockets) and self.loop.time() < deadline:
            await asyncio.sleep(POLL_S)

    async def stop(self, sig):
        """SIGTERM/SIGINT: stop listening (after quiesce in a hand-over), drain every child, end with status 0."""
        if self.stopping:
            return
        self.stopping = True
        if self.servers and any(listeners(sock) > 1 for sock in self.sockets):
            say("signal %d: another router listens on the fronts' addresses; the fronts take what reached them, then "
                "stop listening" % sig)
            await self.quiesce()
        for server in self.servers:
            server.close()
        timeout = self.config.get("drain_timeout", DRAIN_S)
        say("signal %d: the fronts stop listening; vllm-router drains (at most %s s)" % (sig, timeout))
        await asyncio.sleep(SWITCH_GRACE_S)
        children = list(self.children)
        for child in children:
            self.drain(child, timeout)
        await asyncio.gather(*(c.exited for c in children))
        self.finish(0)


def serve(path, config, key, context, sockets):
    """The parent: the first child, the fronts, the signals; until the serving child ends or a stop -> exit status."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(quiet)
    supervisor = Supervisor(loop, path, config, key)
    supervisor.sockets = sockets
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: asyncio.ensure_future(supervisor.stop(s)))
        supervisor.current = supervisor.spawn(child_plan(config))
        code = loop.run_until_complete(supervisor.start(context))
        if code is not None:
            return code
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(supervisor.reload()))
        return loop.run_until_complete(supervisor.ended)
    except BaseException as exc:  # noqa: BLE001 - whatever ends the front ends the routers with it
        say("the front failed: %r; vllm-router ends with it" % (exc,))
        return 1
    finally:
        for child in list(supervisor.children):
            supervisor.kill(child)


def die_with_parent(parent):
    """The router process dies when the front's process does (Linux prctl PR_SET_PDEATHSIG); best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def start_router(argv, key, validation):
    """vllm-router in this process, built as its CLI builds it, plus the key and api_key_validation_urls; blocks."""
    import setproctitle
    from vllm_router import router as upstream
    from vllm_router.launch_router import parse_router_args

    args = parse_router_args(argv)
    args.api_key = key
    os.environ["OPENAI_API_KEY"] = key  # putenv: this process's environment, not the one exec recorded
    rust_router = upstream._Router

    def with_validation(**kwargs):
        kwargs["api_key_validation_urls"] = list(validation)
        return rust_router(**kwargs)

    upstream._Router = with_validation  # Router.from_args builds the Rust router through this name
    setproctitle.setproctitle("vllm::router")
    args._validate_router_args()
    upstream.Router.from_args(args).start()


def child_main():
    """`--child`: the message on stdin (args, key, validation, parent) -> vllm-router in this process."""
    message = json.loads(sys.stdin.read())
    sys.stdin.close()
    die_with_parent(message["parent"])
    start_router(message["args"], message["key"], message["validation"])


def main(argv):
    if argv[1:] == ["--child"]:
        child_main()
        return
    if len(argv) != 2:
        fail("usage: narwhal_router.py ROUTER_JSON")
    # a SIGHUP before the loop's handler (a reload asked while the container starts) must not end the container: the
    # first vllm-router reads the files anyway (an ignored SIGHUP stays ignored in the children: nothing sends them one)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = read_config(argv[1])
        key = read_key(config["api_key_file"])
        context = server_context(config["tls"]) if config.get("tls") else None
        child_plan(config)  # workers.json checked before anything listens
    except Refused as exc:
        fail(str(exc))
    sockets = [listen(*front["listen"]) for front in config["fronts"]]
    try:
        import setproctitle

        setproctitle.setproctitle("vllm::router-front")
    except ImportError:
        pass
    code = serve(argv[1], config, key, context, sockets)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
