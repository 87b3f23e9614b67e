"""The stand-in engine (tests/harness/images/engine-standin) served in-process for the tests: its `vllm` package
loaded from the sources at a claimed version (as make_dists.py writes vllm.version), and engines started on
127.0.0.1 (HTTP and NIXL side channel on free ports) with the stand-in's own strict `vllm serve` parser."""
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(s.getsockname()[1]))
    state = server.State(args, args.kv_transfer_config, TINY if model_config is None else model_config,
                         tokenizer_config)
    side = type("Side", (socketserver.ThreadingTCPServer,), {"allow_reuse_address": True, "daemon_threads": True})(
        ("127.0.0.1", state.side_port), server.SideChannel)
    side.state = state
    http = ThreadingHTTPServer(("127.0.0.1", 0), server.make_handler(state))
    http.daemon_threads = True
    for srv in (side, http):
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
    return "http://127.0.0.1:%d" % http.server_address[1], state


def stop(servers):
    for srv in servers:
        srv.shutdown()
        srv.server_close()
