from vllm.config.kv_transfer import KVTransferConfig  # noqa: F401
