"""Stand-in of vllm.entrypoints.cli.main: the `vllm` command, built as vLLM builds it (a FlexibleArgumentParser
with one subparser per command; the stand-in knows only `serve`). An unknown flag or a bad value exits 2 with
argparse's error before anything starts, as real vLLM does."""
import importlib.metadata


def main():
    import vllm.entrypoints.cli.serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=importlib.metadata.version("vllm"))
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for command in vllm.entrypoints.cli.serve.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    args = parser.parse_args()
    if args.subparser in commands:
        commands[args.subparser].validate(args)
    if hasattr(args, "dispatch_function"):
        return args.dispatch_function(args)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
