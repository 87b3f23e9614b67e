"""STAND-IN for vLLM (narwhal.deploy test harness): metadata, config validation and HTTP behaviour only."""
from vllm.version import __version__  # noqa: F401
