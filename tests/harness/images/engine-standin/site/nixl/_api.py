"""Stand-in of nixl._api: importable, as NIXL's is on a CUDA image."""
import nixl_cu12  # noqa: F401  # pylint: disable=unused-import


class nixl_agent:  # noqa: N801 - NIXL's own spelling
    def __init__(self, name, config=None):
        self.name = name
