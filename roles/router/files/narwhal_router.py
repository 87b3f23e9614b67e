"""narwhal.deploy's start of vLLM's P/D router (the `vllm-router` distribution) in its container.

    python3 /narwhal/narwhal_router.py /narwhal/router.json

router.json (written by the router role, no secret) holds the vllm-router command line, the path of the engines'
API key file, the engine URLs a client's key is checked against and, with TLS, the TLS fronts. This script only does
what the upstream CLI cannot do without putting the key in the process list or the container's environment, and the
TLS listener vllm-router lacks:

- it reads the key from the file (mode 0600, mounted read-only) and hands it to the router in this process:
  as OPENAI_API_KEY, which the P/D router sends to the workers as "Authorization: Bearer ..." (vllm-router 0.1.17,
  routers/http/vllm_pd_router.rs), set with os.environ after exec, so /proc/<pid>/environ, `ps e` and
  `docker inspect` never show it; and as the Router's api_key;
- it passes api_key_validation_urls, which the Rust router accepts but the CLI does not expose
  (vllm_router_rs.Router's signature): every client request must carry a key that one of these engine URLs accepts
  (src/server.rs: "You must provide a valid API key"), so the router is no open proxy in front of keyed engines;
- with "tls" in router.json, it runs a TLS front: vllm-router 0.1.17 has no TLS listener (vllm_router/router_args.py:
  RouterArgs and its parser have --host and --port and no certificate or key option), so vllm-router binds 127.0.0.1
  and the front binds the router's address on the same port numbers (the client port and the metrics port), ends
  TLS (1.2 or later; tls/server.crt and tls/server.key of the router directory) and pumps bytes both ways between
  the client and vllm-router on loopback: nothing is parsed or buffered, so Server-Sent-Event streams pass as they
  come. Standard library only (asyncio, ssl). Its cost per request is measured by bench/router_tls_front.py.

Process layout with TLS: the parent process runs the front and the forked child the router. vllm-router's
Router.start() blocks in Rust until the server ends, so the router cannot share a process with an asyncio loop that
must keep running; and the process that must notice the other's end is the one that can: the front's loop waits
for the child (os.waitpid in a thread) and ends the container with the router's exit status when the router ends,
while a failure of the front (its loop raising, a bind refused) kills the router and exits non-zero. Either way the
container's main process ends and Docker's restart policy (unless-stopped) starts both again. The child asks the
kernel to kill it when the parent dies (prctl PR_SET_PDEATHSIG), so a router never outlives its front outside a
container either. The listening sockets, the certificate and the key are opened before the fork, so a bad
certificate or an address the host lacks is refused once, by name, before the router starts. SIGTERM and SIGINT
(docker stop) reach the parent, PID 1, which passes them to the router and waits for it.

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
import sys
import threading

# bytes read at once from either side of a TLS front connection (a read returns what has arrived, up to this)
CHUNK = 65536
# seconds a client has to finish its TLS handshake
HANDSHAKE_S = 10
# seconds the router has to end after SIGTERM before the front kills it (docker stop waits 10 s, then SIGKILL)
STOP_S = 8


def fail(message):
    print("narwhal_router: %s" % message, file=sys.stderr, flush=True)
    sys.exit(2)


def private_bytes(path, what, limit):
    """The bytes of a file that must be readable by its owner only (the role writes it 0600)."""
    try:
        st = os.stat(path)
        with open(path, "rb") as handle:
            raw = handle.read(limit)
    except OSError as exc:
        fail("cannot read the %s %s: %s; rerun the router stage" % (what, path, exc.strerror or exc))
    if stat.S_IMODE(st.st_mode) & 0o077:
        fail("the %s %s is readable by others (mode %o); the router stage writes it 0600"
             % (what, path, stat.S_IMODE(st.st_mode)))
    return raw


def read_key(path):
    lines = private_bytes(path, "API key file", 4097).decode("utf-8", "replace").strip().splitlines()
    if len(lines) != 1 or not lines[0].strip():
        fail("the API key file %s must hold one non-empty line" % path)
    return lines[0].strip()


def server_context(tls):
    """The front's TLS context: TLS 1.2 or later, the router host's certificate and key."""
    private_bytes(tls["key"], "TLS private key", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls["cert"], tls["key"])
    except (OSError, ssl.SSLError) as exc:
        fail("cannot load the TLS certificate %s with its key %s: %s; rerun the router stage, which installs them"
             % (tls["cert"], tls["key"], exc))
    return context


def listen(host, port):
    """A listening TCP socket on host:port (IPv6 only for an IPv6 address), refused by name when the host lacks it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (asyncio/base_events.py::_set_nodelay), and an accepted connection inherits the listener's proto; with Nagle
    # left on, a small TLS record waits for the client's delayed ACK (40 ms per request, measured)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        fail("the TLS front cannot listen on %s port %s: %s; NARWHAL_ROUTER_BIND (or the router host's "
             "router_address) must be an address of this host, and the port free" % (host, port, exc.strerror or exc))
    sock.setblocking(False)
    return sock


async def pump(reader, writer):
    """Bytes from `reader` to `writer` as they arrive, until the reader's end (then the writer's end: a half-close
    where the transport has one, else close) or an error (close)."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
            return
    except (OSError, asyncio.IncompleteReadError):
        pass
    writer.close()


# The relays in flight, held here: the event loop keeps only weak references to tasks, and asyncio's stream protocol
# drops its reference to the connection's task when the client's side closes (asyncio/streams.py,
# StreamReaderProtocol.connection_lost) and holds the readers weakly, so a relay whose client has gone while it waits
# for vllm-router's end was garbage: collected pending ("Task was destroyed but it is pending!", seen under
# bench/router_tls_front.py) without closing its connection to vllm-router.
RELAYS = set()


async def relay(upstream, client_reader, client_writer):
    """One client connection (its TLS handshake done) to vllm-router on loopback, both ways."""
    task = asyncio.current_task()
    RELAYS.add(task)
    try:
        try:
            up_reader, up_writer = await asyncio.open_connection(upstream[0], int(upstream[1]))
        except OSError:
            client_writer.close()  # vllm-router does not listen (yet): the client sees the connection closed
            return
        try:
            await asyncio.gather(pump(client_reader, up_writer), pump(up_reader, client_writer))
        finally:
            up_writer.close()
            client_writer.close()
    finally:
        RELAYS.discard(task)


def quiet(loop, context):
    """The loop's exception handler: a client that drops, resets or fails its handshake is no news; anything else is
    printed (one line)."""
    exc = context.get("exception")
    if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
        return
    print("narwhal_router: TLS front: %s" % (context.get("message") or exc), file=sys.stderr, flush=True)


async def open_fronts(fronts, sockets, context):
    """Start serving each front (router.json's tls.fronts: listen, upstream) on its listening socket -> the servers."""
    servers = []
    for i, front in enumerate(fronts):
        servers.append(await asyncio.start_server(
            lambda r, w, up=tuple(front["upstream"]): relay(up, r, w), sock=sockets[i], ssl=context,
            ssl_handshake_timeout=HANDSHAKE_S))
        print("narwhal_router: TLS front on %s port %s -> vllm-router on %s port %s"
              % (front["listen"][0], front["listen"][1], front["upstream"][0], front["upstream"][1]), flush=True)
    return servers


def exit_code(status):
    """os.waitstatus_to_exitcode (Python 3.9) for Python 3.8: a signal's death as 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def run_front(child, reaped, fronts, sockets, context):
    """The parent: serve every TLS front until the router (`child`) ends or a signal asks to stop -> exit status.
    `reaped` is set once the router's exit status is collected."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(quiet)
    ended = loop.create_future()

    def end(why):
        if not ended.done():
            ended.set_result(why)

    def wait_child():
        _pid, status = os.waitpid(child, 0)
        reaped.set()
        loop.call_soon_threadsafe(end, ("router", status))

    threading.Thread(target=wait_child, name="wait-router", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, end, ("signal", sig))
    loop.run_until_complete(open_fronts(fronts, sockets, context))
    how, what = loop.run_until_complete(ended)
    if how == "router":
        print("narwhal_router: vllm-router ended (exit status %d); the TLS front ends with it" % exit_code(what),
              file=sys.stderr, flush=True)
        return exit_code(what) or 1
    stop_router(child, reaped, what)
    return 0


def stop_router(child, reaped, sig=signal.SIGTERM):
    """Pass `sig` to the router and give it STOP_S seconds to end (`reaped`), then kill it."""
    try:
        os.kill(child, sig)
    except OSError:
        return
    if not reaped.wait(STOP_S):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass


def die_with_parent(parent):
    """The router process dies when the front's process does (Linux prctl PR_SET_PDEATHSIG); best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def start_router(config, key):
    """vllm-router in this process, built as its CLI builds it, plus the key and api_key_validation_urls; blocks."""
    import setproctitle
    from vllm_router import router as upstream
    from vllm_router.launch_router import parse_router_args

    args = parse_router_args(config["args"])
    args.api_key = key
    os.environ["OPENAI_API_KEY"] = key  # putenv: this process's environment, not the one exec recorded
    validation = list(config.get("api_key_validation_urls") or [])
    rust_router = upstream._Router

    def with_validation(**kwargs):
        kwargs["api_key_validation_urls"] = validation
        return rust_router(**kwargs)

    upstream._Router = with_validation  # Router.from_args builds the Rust router through this name
    setproctitle.setproctitle("vllm::router")
    args._validate_router_args()
    upstream.Router.from_args(args).start()


def main(argv):
    if len(argv) != 2:
        fail("usage: narwhal_router.py ROUTER_JSON")
    try:
        with open(argv[1], encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        fail("cannot read %s: %s; rerun the router stage" % (argv[1], exc))
    key = read_key(config["api_key_file"])
    tls = config.get("tls")
    if not tls:
        start_router(config, key)
        return
    context = server_context(tls)
    sockets = [listen(*front["listen"]) for front in tls["fronts"]]
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        for sock in sockets:
            sock.close()
        die_with_parent(parent)
        start_router(config, key)
        os._exit(0)
    del key
    try:
        import setproctitle

        setproctitle.setproctitle("vllm::router-tls-front")
    except ImportError:
        pass
    reaped = threading.Event()
    try:
        code = run_front(child, reaped, tls["fronts"], sockets, context)
    except BaseException as exc:  # noqa: BLE001 - whatever ends the front ends the router with it
        print("narwhal_router: the TLS front failed: %r; the router ends with it" % (exc,), file=sys.stderr,
              flush=True)
        stop_router(child, reaped)
        code = 1
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
