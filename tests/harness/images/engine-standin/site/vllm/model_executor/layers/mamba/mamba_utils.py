"""Stand-in of vllm/model_executor/layers/mamba/mamba_utils.py (0.32): the SSM convolutional-state layout the Mamba
layers use, read from VLLM_SSM_CONV_STATE_LAYOUT ("SD" when unset)."""
from vllm import envs
from vllm.version import __version_tuple__

if __version_tuple__ >= (0, 22, 0):
    def get_conv_state_layout():
        layout = envs.VLLM_SSM_CONV_STATE_LAYOUT
        return layout if layout is not None else "SD"
