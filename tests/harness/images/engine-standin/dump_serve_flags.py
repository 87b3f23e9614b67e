"""Dump the option table of a REAL vLLM image's `vllm serve` parser into site/vllm/standin/serve_flags.json, from
which the stand-in builds its own strict parser (site/vllm/entrypoints/cli/serve.py). Runs inside the real image,
with no network; the table goes to the file named by the first argument (vLLM logs to stdout):

    IMAGE=narwhal-sim/vllm-cpu:latest
    docker run --rm --network none --entrypoint python3 \\
      -v "$PWD/tests/harness/images/engine-standin:/standin:ro" -v "$OUT_DIR:/out" "$IMAGE" \\
      /standin/dump_serve_flags.py /out/serve_flags.json "$(docker image inspect -f '{{.Id}}' "$IMAGE")"

The parser is built the way vllm/entrypoints/cli/main.py builds it (FlexibleArgumentParser, the serve command's
subparser_init), as the launcher's image check does (roles/install/files/launcher/narwhal_launcher/in_image.py).
"""
import argparse
import importlib.metadata as md
import json
import sys

STANDIN_VLLM = "0.33.0"  # what the stand-in images claim (Dockerfile, Dockerfile.rocm: VLLM_VERSION)


def json_safe(value):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        items = [json_safe(v) for v in value]
        if all(v is None or isinstance(v, bool | int | float | str) for v in items):
            return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return None


def free_variable(fn, name):
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    for var, cell in zip(names, getattr(fn, "__closure__", None) or (), strict=False):
        if var == name:
            return cell.cell_contents
    return None


def describe_type(fn):
    """The value type as the stand-in rebuilds it: int, float, str, json, human_readable_int[_or_auto],
    optional:<type>, parse:<type>, dataclass:<Config>, union_dict_and_str, other:<name>, or None."""
    if fn is None:
        return None
    if fn in (int, float, str):
        return fn.__name__
    name = getattr(fn, "__name__", type(fn).__name__)
    if fn is json.loads:
        return "json"
    if name in ("human_readable_int", "human_readable_int_or_auto", "union_dict_and_str"):
        return name
    if name in ("_optional_type", "_parse_type"):
        inner = describe_type(free_variable(fn, "return_type"))
        return "%s:%s" % ("optional" if name == "_optional_type" else "parse", inner)
    if name == "parse_dataclass":
        defaults = fn.__defaults__ or ()
        return "dataclass:%s" % (defaults[0].__name__ if defaults else "?")
    return "other:%s" % name


def main(argv):
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.version import __version__

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve_parser = None
    for command in serve.cmd_init():
        sub = command.subparser_init(subparsers)
        if command.name == "serve":
            serve_parser = sub
    deprecated = getattr(serve_parser, "_deprecated", set())
    flags = []
    for action in serve_parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags.append({
            "options": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "takes_value": action.nargs != 0,
            "nargs": action.nargs,
            "type": describe_type(action.type),
            "choices": None if action.choices is None else json_safe(list(action.choices)),
            "default": json_safe(action.default),
            "const": json_safe(action.const),
            "required": bool(action.required),
            "deprecated": action in deprecated,
        })
    document = {
        "about": "The option table of `vllm serve` dumped from the REAL vLLM CPU image narwhal-sim/vllm-cpu "
                 "(vllm-cpu %s, Python %s) by tests/harness/images/engine-standin/dump_serve_flags.py (see its "
                 "docstring for the command). The stand-in images claim vLLM %s, but no 0.33 build runs on these "
                 "CPU machines: their parser knows 0.32.0's flags, not 0.33.0's (flags added or removed in 0.33 "
                 "are not modelled)." % (__version__, sys.version.split()[0], STANDIN_VLLM),
        "dumped_from": {"image": "narwhal-sim/vllm-cpu:latest", "image_id": argv[2] if len(argv) > 2 else None,
                        "vllm_distribution": md.version("vllm"), "vllm_version": __version__,
                        "python": sys.version.split()[0]},
        "standin_claims_vllm": STANDIN_VLLM,
        "prog": serve_parser.prog,
        "usage": serve_parser.usage,
        "allow_abbrev": serve_parser.allow_abbrev,
        "flags": flags,
    }
    lines = ["{"]
    for key in ("about", "dumped_from", "standin_claims_vllm", "prog", "usage", "allow_abbrev"):
        lines.append("  %s: %s," % (json.dumps(key), json.dumps(document[key], sort_keys=True)))
    lines.append('  "flags": [')
    lines.append(",\n".join("    " + json.dumps(flag, sort_keys=True) for flag in flags))
    lines.append("  ]")
    lines.append("}")
    with open(argv[1], "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print("wrote %d flags (%d option strings) to %s" % (len(flags), sum(len(f["options"]) for f in flags), argv[1]),
          file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
