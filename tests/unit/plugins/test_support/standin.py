# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in engines in-process (tests/harness/images/engine-standin, no Docker): the stand-in's `vllm` package at a
claimed version, and one engine (HTTP and NIXL side channel on free loopback ports, parsed by its strict parser)."""
import argparse
import contextlib
import importlib
import json
import socket
import socketserver
import sys
import threading
import types
from http.server import ThreadingHTTPServer

from test_support.paths import STANDIN_SITE

TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 128, "torch_dtype": "bfloat16", "model_type": "llama"}


@contextlib.contextmanager
def standin_package(version, monkeypatch):
    """Yields (version, vllm.standin.server, vllm.entrypoints.cli.serve) of the stand-in claiming `version`."""
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
        yield version, importlib.import_module("vllm.standin.server"), \
            importlib.import_module("vllm.entrypoints.cli.serve")
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(standin, monkeypatch, servers, key, *flags):
    """One stand-in engine on 127.0.0.1 -> (url, state); its servers are appended to `servers` (shut down by the
    caller)."""
    _version, server, serve = standin
    parser = serve.add_flags(argparse.ArgumentParser(), serve.load_flags())
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
    args = parser.parse_args(["/models/tiny", "--served-model-name", "tiny", "--kv-transfer-config", kv,
                              "--api-key", key] + list(flags))
    args.model = args.model_tag if getattr(args, "model_tag", None) else "/models/tiny"
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    state = server.State(args, args.kv_transfer_config, TINY)
    side = type("Side", (socketserver.ThreadingTCPServer,), {"allow_reuse_address": True, "daemon_threads": True})(
        ("127.0.0.1", state.side_port), server.SideChannel)
    side.state = state
    http = ThreadingHTTPServer(("127.0.0.1", 0), server.make_handler(state))
    http.daemon_threads = True
    for srv in (side, http):
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
    return "http://127.0.0.1:%d" % http.server_address[1], state


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


def engine_process(tmp_path, name, key, *flags, version="0.33.0"):
    """-> (url, Popen) of a stand-in engine serving the tiny model config on free loopback ports."""
    import os
    import subprocess
    import time

    model = tmp_path / "tiny"  # one checkpoint for all: the NIXL compatibility hash covers the model
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY))
    port = free_port()
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "VLLM_"))}
    # the key by environment, as the launcher passes it (never in the process list)
    env.update(VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
               VLLM_API_KEY=key)
    log = open(tmp_path / ("engine-%s.log" % name), "wb")
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_MAIN, str(STANDIN_SITE), version, str(model),
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--kv-transfer-config", kv] + list(flags),
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    url = "http://127.0.0.1:%d" % port
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
