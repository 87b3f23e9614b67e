"""Stand-in of vLLM's NixlConnector module: importing it imports the NIXL module this image's vLLM uses
(nixl._api on CUDA, nixl_rocm._api on ROCm >= 0.28), as vLLM does."""
import importlib

from vllm.standin.nixl_module import NIXL_API

nixl_agent = importlib.import_module(NIXL_API).nixl_agent


class NixlConnector:
    pass


def lease_seconds(kv_transfer_config, key, default):
    """KVTransferConfig.get_from_extra_config(key, default) (vllm/config/kv_transfer.py): a free dict read with
    .get, so a key this version does not read is ignored, not refused."""
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
    return extra.get(key, default)
