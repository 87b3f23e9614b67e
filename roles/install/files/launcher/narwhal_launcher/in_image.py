"""The image check's observer: runs INSIDE the recorded engine image (`python3 -c <this file> SPEC_JSON`, no
network, the model mounted read-only). Python 3.8+ standard library plus the image's own packages. It only
observes and prints one JSON document after a marker line; the launcher decides (image_check.decide_check).
"""
import contextlib
import importlib
import importlib.metadata as md
import io
import json
import os
import re
import sys


def err(exc):
    if isinstance(exc, ParserRefusedError):
        return str(exc)[:600]
    return ("%s: %s" % (type(exc).__name__, exc))[:600]


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except BaseException as exc:  # noqa: B036 - SystemExit from argparse and anything an import raises
        return {"ok": False, "error": err(exc)}


def vllm_version():
    from vllm.version import __version__
    return __version__


def kv_config(spec):
    try:
        from vllm.config.kv_transfer import KVTransferConfig
        where = "vllm.config.kv_transfer.KVTransferConfig"
    except ImportError:
        from vllm.config import KVTransferConfig
        where = "vllm.config.KVTransferConfig"
    KVTransferConfig(**spec["kv_transfer_config"])
    return where


def serve_parser():
    """The parser `vllm serve` uses, built the way vllm/entrypoints/cli/main.py builds it (prog "vllm", the serve
    subcommand's own subparser "vllm serve"; argparse's prefix abbreviations stay on, as vLLM leaves them)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # vLLM >= 0.11
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.cli import serve
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for command in serve.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    return parser, commands


class ParserRefusedError(Exception):
    """The parser's own error line ("vllm: error: unrecognized arguments: ..."), reported without a type name."""


PARSER_ERROR = re.compile(r"^vllm(?: [\w-]+)?: error: ")


def parser_message(text, code):
    """argparse's `PROG: error: MESSAGE` from what the parser wrote to stderr (usage first, perhaps a hint after);
    other lines (warnings) are ignored."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if PARSER_ERROR.match(lines[index]):
            return " ".join(lines[index:])
    if code == 0:
        return "the parser printed its help or version and exited (code 0) instead of parsing; remove --help/--version"
    return lines[-1] if lines else "the parser exited with code %s and no message" % code


def serve_args(spec):
    """Parse the complete recorded `vllm serve` argv with the image's own parser and run the serve command's
    validate(), as `vllm` does before it builds anything (in vLLM 0.32 validate checks the chat template, the gRPC
    port and flag combinations: no model files, no GPU). Unknown flags, bad values and ambiguous abbreviations raise
    ParserRefusedError with the parser's own words. vLLM's logger keeps writing to the real stdout (its handler
    holds that stream): harmless, the launcher reads only the last marker line."""
    parser, commands = serve_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(list(spec["serve_argv"]))
    except SystemExit as exc:
        raise ParserRefusedError(parser_message(stderr.getvalue(), exc.code))
    command = commands.get(getattr(args, "subparser", None))
    if command is None:
        raise ParserRefusedError("the parser did not select the serve command (argv %r)" % spec["serve_argv"][:1])
    command.validate(args)
    return {"model": getattr(args, "model_tag", None) or getattr(args, "model", None)}


def auto_map(mount):
    result = {}
    for fname in ("config.json", "tokenizer_config.json"):
        path = os.path.join(mount, fname)
        if not os.path.isfile(path):
            result[fname] = {"present": False, "auto_map": False}
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            result[fname] = {"present": True, "auto_map": bool(isinstance(data, dict) and data.get("auto_map"))}
        except BaseException as exc:  # noqa: B036
            result[fname] = {"present": True, "auto_map": False, "error": err(exc)}
    return result


def tokenizer(spec):
    from transformers import AutoTokenizer
    return type(AutoTokenizer.from_pretrained(spec["mount"], trust_remote_code=spec["trust_remote_code"])).__name__


def ssm_layout(spec):
    """The SSM convolutional-state layout this image resolves under the plan's environment (the check container
    runs with it): vLLM's own reading of the variable (vllm/envs.py: env_with_choices("VLLM_SSM_CONV_STATE_LAYOUT",
    None, ["SD", "DS"]) raises on a value outside the choices), then the layout the Mamba layers take from it
    (vllm/model_executor/layers/mamba/mamba_utils.py: get_conv_state_layout, "SD" when unset), where the image has
    that function."""
    import vllm.envs
    if spec["ssm_env"] not in vllm.envs.environment_variables:
        raise LookupError("vllm.envs does not know %s" % spec["ssm_env"])
    value = vllm.envs.environment_variables[spec["ssm_env"]]()
    try:
        from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout
    except ImportError:
        return {"env": value, "layout": value, "resolver": "vllm.envs"}
    return {"env": value, "layout": get_conv_state_layout(), "resolver": "mamba_utils.get_conv_state_layout"}


def kv_lease_read(spec):
    """Where the image's vLLM reads the KV lease name the plan wrote: for the connector's extra-config key, the
    NixlConnector source files that name it (the module, or the files of its package, and the nixl* files beside
    it); for the variable, whether vllm.envs knows it. -> a list of files, or True/False."""
    lease = spec["kv_lease"]
    if lease["where"] == "env":
        import vllm.envs
        return lease["name"] in vllm.envs.environment_variables
    module = importlib.import_module(spec["connector_module"])
    top = os.path.dirname(os.path.abspath(module.__file__))
    root = os.path.dirname(top) if hasattr(module, "__path__") else top
    quoted = ('"%s"' % lease["name"], "'%s'" % lease["name"])
    found = []
    for folder, _dirs, files in os.walk(root):
        for fname in sorted(files):
            path = os.path.join(folder, fname)
            if not fname.endswith(".py") or not os.path.relpath(path, root).startswith("nixl"):
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if any(q in text for q in quoted):
                found.append(os.path.relpath(path, root))
    return sorted(found)


async def _request(guard_class, path, key=None):
    """The status the middleware class answers GET `path` with (with `key`: `Authorization: Bearer <key>`, else no
    such header), the app behind it answering 200: one ASGI request driven with asyncio, as uvicorn drives vLLM's
    app."""
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode("ascii"), "root_path": "", "query_string": b"",
             "headers": [(b"authorization", ("Bearer " + key).encode("latin-1"))] if key else []}
    await guard_class(app)(scope, receive, send)
    return next((m.get("status") for m in sent if m.get("type") == "http.response.start"), None)


def _keyed(guard_class):
    """The status GET /v1/models with the engine's key answers through the guard, or why it could not be asked: the
    key is the first line of the file NARWHAL_GUARD_KEY_FILE names (the plan's environment and mount), read as the
    image's user reads it, as the guard does. Only the status is reported, never the key."""
    import asyncio
    path = os.environ.get("NARWHAL_GUARD_KEY_FILE", "")
    if not path:
        return "NARWHAL_GUARD_KEY_FILE is not set"
    try:
        with open(path, "rb") as handle:
            key = handle.read(65537).decode("utf-8", "replace").split("\n", 1)[0].strip()
    except OSError as exc:
        return "cannot read %s: %s" % (path, exc.strerror or exc)
    return asyncio.run(_request(guard_class, "/v1/models", key))


def key_guard(spec):
    """Each --middleware of the plan (the key guard) imported as vLLM 0.32.0 imports it
    (entrypoints/serve/middleware/register.py: module_path, object_name = rsplit("."); getattr(import_module(...));
    a class is added with app.add_middleware), from the plan's PYTHONPATH and mounts; then a request without the key
    (GET /v1/models), one with the engine's key (_keyed) and one to /health through it."""
    import asyncio
    import inspect
    found = []
    for name in spec["middleware"]:
        module_path, object_name = name.rsplit(".", 1)
        imported = getattr(importlib.import_module(module_path), object_name)
        if not inspect.isclass(imported):
            raise TypeError("%s is not a class" % name)
        found.append({"middleware": name, "file": inspect.getsourcefile(imported),
                      "refused": asyncio.run(_request(imported, "/v1/models")), "keyed": _keyed(imported),
                      "open": asyncio.run(_request(imported, "/health"))})
    return found


def main(argv):
    spec = json.loads(argv[1])
    out = {"python": sys.version.split()[0], "packages": {}}
    for name in spec["packages"]:
        try:
            out["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            out["packages"][name] = None
    out["vllm_api_version"] = attempt(vllm_version)
    out["kv_transfer_config"] = attempt(lambda: kv_config(spec))
    out["connector_module"] = attempt(lambda: importlib.import_module(spec["connector_module"]).__name__)
    out["nixl_module"] = attempt(lambda: importlib.import_module(spec["nixl_module"]).__name__)
    out["serve_args"] = attempt(lambda: serve_args(spec))
    if spec.get("middleware"):
        out["key_guard"] = attempt(lambda: key_guard(spec))
    out["auto_map"] = auto_map(spec["mount"])
    out["tokenizer"] = attempt(lambda: tokenizer(spec))
    if spec["ssm_conv_state"]:
        out["ssm_layout"] = attempt(lambda: ssm_layout(spec))
    if spec.get("kv_lease"):
        out["kv_lease_read"] = attempt(lambda: kv_lease_read(spec))
    sys.stdout.write("\n" + spec["marker"] + json.dumps(out, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv)
