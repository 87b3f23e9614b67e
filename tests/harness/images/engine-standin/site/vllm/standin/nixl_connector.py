"""Stand-in of vLLM's NixlConnector module: importing it imports the NIXL module this image's vLLM uses
(nixl._api on CUDA, nixl_rocm._api on ROCm >= 0.28), as vLLM does."""
import importlib

from vllm.standin.nixl_module import NIXL_API

nixl_agent = importlib.import_module(NIXL_API).nixl_agent


class NixlConnector:
    pass
