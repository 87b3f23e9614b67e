"""Stand-in of vLLM's NixlConnector module: importing it imports NIXL the way vLLM does."""
from nixl._api import nixl_agent  # noqa: F401  # pylint: disable=unused-import


class NixlConnector:
    pass
