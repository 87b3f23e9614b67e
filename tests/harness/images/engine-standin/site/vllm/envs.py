"""Stand-in of vllm.envs: the environment variables this vLLM version knows."""
from vllm.version import __version_tuple__

environment_variables = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": lambda: "localhost",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": lambda: "5600" if __version_tuple__ >= (0, 14, 0) else "5557",
    "VLLM_API_KEY": lambda: None,
}
if __version_tuple__ >= (0, 22, 0):
    environment_variables["VLLM_SSM_CONV_STATE_LAYOUT"] = lambda: "SD"
