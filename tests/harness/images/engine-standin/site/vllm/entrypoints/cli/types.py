"""Stand-in of vllm.entrypoints.cli.types.CLISubcommand."""


class CLISubcommand:
    """Base class for CLI argument handlers."""

    name = None

    @staticmethod
    def cmd(args):
        raise NotImplementedError("Subclasses should implement this method")

    def validate(self, args):
        pass

    def subparser_init(self, subparsers):
        raise NotImplementedError("Subclasses should implement this method")
