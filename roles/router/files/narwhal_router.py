"""narwhal.deploy's start of vLLM's P/D router (the `vllm-router` distribution) in its container.

    python3 /narwhal/narwhal_router.py /narwhal/router.json

router.json (written by the router role, no secret) holds the vllm-router command line, the path of the engines'
API key file and the engine URLs a client's key is checked against. This script only does what the upstream CLI
cannot do without putting the key in the process list or the container's environment:

- it reads the key from the file (mode 0600, mounted read-only) and hands it to the router in this process:
  as OPENAI_API_KEY, which the P/D router sends to the workers as "Authorization: Bearer ..." (vllm-router 0.1.17,
  routers/http/vllm_pd_router.rs), set with os.environ after exec, so /proc/<pid>/environ, `ps e` and
  `docker inspect` never show it; and as the Router's api_key;
- it passes api_key_validation_urls, which the Rust router accepts but the CLI does not expose
  (vllm_router_rs.Router's signature): every client request must carry a key that one of these engine URLs accepts
  (src/server.rs: "You must provide a valid API key"), so the router is no open proxy in front of keyed engines.

Everything else is upstream: the command line is parsed by vllm-router's own parser (vllm_router/launch_router.py,
parse_router_args; an unknown option is refused with its usage error), and the router is built by its own
Router.from_args (vllm_router/router.py).
"""
import json
import os
import stat
import sys


def fail(message):
    print("narwhal_router: %s" % message, file=sys.stderr, flush=True)
    sys.exit(2)


def read_key(path):
    try:
        st = os.stat(path)
        with open(path, "rb") as handle:
            raw = handle.read(4097)
    except OSError as exc:
        fail("cannot read the API key file %s: %s; rerun the router stage" % (path, exc.strerror or exc))
    if stat.S_IMODE(st.st_mode) & 0o077:
        fail("the API key file %s is readable by others (mode %o); the router stage writes it 0600"
             % (path, stat.S_IMODE(st.st_mode)))
    lines = raw.decode("utf-8", "replace").strip().splitlines()
    if len(lines) != 1 or not lines[0].strip():
        fail("the API key file %s must hold one non-empty line" % path)
    return lines[0].strip()


def main(argv):
    if len(argv) != 2:
        fail("usage: narwhal_router.py ROUTER_JSON")
    try:
        with open(argv[1], encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        fail("cannot read %s: %s; rerun the router stage" % (argv[1], exc))
    key = read_key(config["api_key_file"])

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


if __name__ == "__main__":
    main(sys.argv)
