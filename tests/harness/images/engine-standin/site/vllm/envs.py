"""Stand-in of vllm.envs: the environment variables this vLLM version knows."""
import os

from vllm.version import __version_tuple__


def env_with_choices(env_name, default, choices):
    """vllm/envs.py (0.32): the variable's value, `default` when unset, ValueError when outside `choices`."""
    def _get_validated_env():
        value = os.getenv(env_name)
        if value is None:
            return default
        if value not in choices:
            raise ValueError(f"Invalid value '{value}' for {env_name}. Valid options: {choices}.")
        return value
    return _get_validated_env


environment_variables = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": lambda: "localhost",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": lambda: "5600" if __version_tuple__ >= (0, 14, 0) else "5557",
    "VLLM_API_KEY": lambda: None,
}
if __version_tuple__ >= (0, 22, 0):
    # vllm/envs.py (0.32): env_with_choices("VLLM_SSM_CONV_STATE_LAYOUT", None, ["SD", "DS"])
    environment_variables["VLLM_SSM_CONV_STATE_LAYOUT"] = env_with_choices("VLLM_SSM_CONV_STATE_LAYOUT", None,
                                                                           ["SD", "DS"])
else:
    # the KV lease of a prefill up to 0.21 (vLLM 0.21.0 vllm/envs.py:205,1472-1474, default "480"); from 0.22 it is
    # kv_connector_extra_config.kv_lease_duration and the variable is gone from envs.py (0.22.0-0.32.0: no match)
    environment_variables["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = lambda: 480
# the worker processes' exit window after a drain (vLLM 0.32.0 vllm/envs.py:253,1875-1878, default 5)
environment_variables["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"] = lambda: 5


def __getattr__(name):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
