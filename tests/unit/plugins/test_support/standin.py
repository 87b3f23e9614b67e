"""The stand-in engine (tests/harness/images/engine-standin) served in-process for the tests: its `vllm` package
loaded from the sources at a claimed version (as make_dists.py writes vllm.version), and engines started on
127.0.0.1 (HTTP and NIXL side channel on free ports) with the stand-in's own strict `vllm serve` parser."""
import argparse
import contextlib
import hashlib
import importlib
import json
import socket
import socketserver
import sys
import threading
import types
from http.server import ThreadingHTTPServer

from test_support.paths import GUARD, REPO, STANDIN_SITE

# the geometry of tests/harness/models/tiny-llama
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 128, "torch_dtype": "bfloat16", "model_type": "llama"}
KEY = "sk-narwhal-probe-test-key-0123456789"


@contextlib.contextmanager
def loaded(version, monkeypatch):
    """-> (server module, serve module) of the stand-in claiming `version`; sys.modules restored after."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    saved = {n: m for n, m in sys.modules.items() if n == "vllm" or n.startswith("vllm.")}
    for name in saved:
        del sys.modules[name]
    package = types.ModuleType("vllm")
    package.__path__ = [str(STANDIN_SITE / "vllm")]
    module = types.ModuleType("vllm.version")
    module.__version__ = version
    module.__version_tuple__ = tuple(int(p) for p in version.split("."))
    sys.modules.update({"vllm": package, "vllm.version": module,
                        "vllm.standin.nixl_module": types.SimpleNamespace(NIXL_API="nixl._api")})
    for name in ("UCX_TLS", "UCX_NET_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield importlib.import_module("vllm.standin.server"), importlib.import_module("vllm.entrypoints.cli.serve")
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def start_engine(modules, monkeypatch, servers, *flags, model_config=None, tokenizer_config=None):
    """One stand-in engine on 127.0.0.1 -> (base URL, State); its servers are appended to `servers`."""
    server, serve = modules
    parser = serve.add_flags(argparse.ArgumentParser(), serve.load_flags())
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
    args = parser.parse_args(["/models/tiny", "--served-model-name", "tiny", "--kv-transfer-config", kv,
                              "--api-key", KEY] + list(flags))
    args.model = args.model_tag if getattr(args, "model_tag", None) else "/models/tiny"
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_ports(getattr(args, "data_parallel_size", 1) or 1)))
    state = server.State(args, args.kv_transfer_config, TINY if model_config is None else model_config,
                         tokenizer_config)
    sides = []
    for rank in state.ranks:  # one side channel per DP rank, on base + rank
        side = type("Side", (socketserver.ThreadingTCPServer,), {"allow_reuse_address": True,
                                                                 "daemon_threads": True})(
            ("127.0.0.1", rank.side_port), server.SideChannel)
        side.state, side.rank = state, rank
        sides.append(side)
    http = ThreadingHTTPServer(("127.0.0.1", 0), server.make_handler(state))
    http.daemon_threads = True
    for srv in sides + [http]:
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
    return "http://127.0.0.1:%d" % http.server_address[1], state


def stop(servers):
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count, hosts=("127.0.0.1",)):
    """-> a base port whose `count` consecutive ports are free on each of `hosts` (loopback addresses: a DP engine's
    side channels, on each of its simulated hosts)."""
    for _attempt in range(50):
        base = free_port()
        try:
            with contextlib.ExitStack() as stack:
                for host in hosts:
                    for port in range(base, base + count):
                        sock = stack.enter_context(socket.socket())
                        sock.bind((host, port))
            return base
        except OSError:
            continue
    raise AssertionError("no %d consecutive free ports" % count)


# One stand-in engine as a process of its own (a stop is a real stop: its connections close with it).
ENGINE_MAIN = r"""
import argparse, json, os, sys, types
sys.dont_write_bytecode = True
site, version, model = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, site)
package = types.ModuleType("vllm"); package.__path__ = [os.path.join(site, "vllm")]
module = types.ModuleType("vllm.version"); module.__version__ = version
module.__version_tuple__ = tuple(int(p) for p in version.split("."))
sys.modules.update({"vllm": package, "vllm.version": module,
                    "vllm.standin.nixl_module": types.SimpleNamespace(NIXL_API="nixl._api")})
from vllm.entrypoints.cli import serve
from vllm.standin import server
args = serve.add_flags(argparse.ArgumentParser(), serve.load_flags()).parse_args([model] + sys.argv[4:])
args.model = model
sys.exit(server.serve(args, args.kv_transfer_config))
"""


def _dp_size(flags):
    flags = list(flags)
    for flag in ("--data-parallel-size", "-dp"):
        if flag in flags[:-1]:
            return int(flags[flags.index(flag) + 1])
    return 1


def engine_key_file(tmp_path, name):
    """The key file of engine_process `name` (install's <checkout>/secrets/engine-api.key, read by its key guard)."""
    return tmp_path / ("secrets-%s" % name) / "engine-api.key"


def write_key_file(path, text):
    """A key file written as install's copy writes it: a new 0600 file renamed over the old one (a new inode)."""
    import os

    path.parent.mkdir(mode=0o700, exist_ok=True)
    new = path.with_name(path.name + ".new")
    with open(os.open(str(new), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)
    os.replace(str(new), str(path))


def engine_process(tmp_path, name, key, *flags, version="0.33.0", port=None, side_host="127.0.0.1", side_port=None,
                   env=None, wait=True, model_config=None, guard=True):
    """-> (url, Popen) of a stand-in engine serving the tiny model config on free loopback ports (or HTTP on
    `port`: an engine replaced at its URL). Its NIXL side channels on `side_host` (a loopback address standing for
    the engine's host) from `side_port` (default: free ports); `env`: more environment; `wait`: until its HTTP port
    accepts connections (False: return at once, for a headless worker or a head that waits for its workers);
    `model_config`: another checkpoint config (tmp_path/model-<hash>) instead of the tiny one. `guard` (default):
    as the launcher starts an engine - the collection's key guard (--middleware narwhal_guard.KeyGuard, first on
    PYTHONPATH) reading `key` from engine_key_file (rewrite it with write_key_file: a rotation), VLLM_API_KEY empty
    so that vLLM's own check is off; guard=False: no guard, `key` in VLLM_API_KEY (vLLM's own check, /v1 only)."""
    import os
    import subprocess
    import time

    model = tmp_path / "tiny"  # one checkpoint for all: the NIXL compatibility hash covers the model
    if model_config is not None:  # one checkpoint per config
        model = tmp_path / ("model-%s" % hashlib.sha256(json.dumps(model_config, sort_keys=True).encode()
                                                        ).hexdigest()[:12])
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY if model_config is None else model_config))
    # the harness checkpoint's tokenizer config: its chat template lets the stand-in answer chat completions
    (model / "tokenizer_config.json").write_text((REPO / "tests" / "harness" / "models" / "tiny-llama" /
                                                  "tokenizer_config.json").read_text())
    port = port or free_port()
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("UCX_", "VLLM_", "NARWHAL_STANDIN_", "NARWHAL_GUARD_"))}
    environ.update(VLLM_NIXL_SIDE_CHANNEL_HOST=side_host,
                   VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port or free_ports(_dp_size(flags), (side_host,))),
                   VLLM_API_KEY="" if guard else key)
    if guard:  # the key in a file the guard reads, never in the environment (the launcher's plan)
        key_file = engine_key_file(tmp_path, name)
        write_key_file(key_file, key + "\n")
        environ.update(NARWHAL_GUARD_KEY_FILE=str(key_file), PYTHONPATH=str(GUARD.parent))
        flags = ("--middleware", "narwhal_guard.KeyGuard") + tuple(flags)
    environ.update(env or {})
    log = open(tmp_path / ("engine-%s.log" % name), "wb")
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_MAIN, str(STANDIN_SITE), version, str(model),
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--kv-transfer-config", kv] + list(flags),
                            stdout=log, stderr=subprocess.STDOUT, env=environ)
    log.close()
    url = "http://127.0.0.1:%d" % port
    if not wait:
        return url, proc
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError((tmp_path / ("engine-%s.log" % name)).read_text())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return url, proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("stand-in engine %s did not listen on %s" % (name, url))


def engine_log(tmp_path, name):
    """The output so far of engine_process `name`."""
    path = tmp_path / ("engine-%s.log" % name)
    return path.read_text() if path.exists() else ""


def wait_for_log(tmp_path, name, text, proc=None, timeout=20):
    """Wait until engine_process `name` has written `text` -> its output; AssertionError (with the output) when it
    does not in time, or when `proc` ended first without writing it."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        out = engine_log(tmp_path, name)
        if text in out:
            return out
        if proc is not None and proc.poll() is not None:
            out = engine_log(tmp_path, name)
            if text in out:
                return out
            raise AssertionError("engine %s exited (%s) without %r:\n%s" % (name, proc.returncode, text, out))
        time.sleep(0.05)
    raise AssertionError("engine %s did not write %r in %s s:\n%s" % (name, text, timeout, engine_log(tmp_path, name)))
