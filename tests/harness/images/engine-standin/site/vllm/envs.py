"""Stand-in of vllm.envs: the environment variables this vLLM version knows."""
from vllm.version import __version_tuple__

environment_variables = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": lambda: "localhost",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": lambda: "5600" if __version_tuple__ >= (0, 14, 0) else "5557",
    "VLLM_API_KEY": lambda: None,
}
if __version_tuple__ >= (0, 22, 0):
    environment_variables["VLLM_SSM_CONV_STATE_LAYOUT"] = lambda: "SD"
else:
    # the KV lease of a prefill up to 0.21 (vLLM 0.21.0 vllm/envs.py:205,1472-1474, default "480"); from 0.22 it is
    # kv_connector_extra_config.kv_lease_duration and the variable is gone from envs.py (0.22.0-0.32.0: no match)
    environment_variables["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = lambda: 480
# the worker processes' exit window after a drain (vLLM 0.32.0 vllm/envs.py:253,1875-1878, default 5)
environment_variables["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"] = lambda: 5
