"""Stand-in of the `vllm` command: `vllm serve MODEL [flags]` starts the stand-in server."""
import argparse
import json
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options]  (narwhal.deploy stand-in)", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--kv-transfer-config")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--block-size", type=int)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float)
    # what the NIXL handshake hashes or checks (vllm.standin.handshake)
    p.add_argument("--attention-backend")
    p.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--speculative-config")
    p.add_argument("--decode-context-parallel-size", "-dcp", type=int, default=1)
    args, unknown = p.parse_known_args(argv[1:])
    kv = None
    if args.kv_transfer_config:
        from vllm.config.kv_transfer import KVTransferConfig
        try:
            kv = KVTransferConfig(**json.loads(args.kv_transfer_config))
        except (ValueError, TypeError) as exc:
            print(f"ERROR --kv-transfer-config: {exc}", file=sys.stderr)
            return 1
    from vllm.standin.server import serve
    return serve(args, kv, unknown)
