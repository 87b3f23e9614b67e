# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Site inputs shared by the input, fleet and site_inputs tests: a minimal two-engine site and a
token in the controller's environment."""

BASE = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode",
        "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_MODEL_PATH": "/srv/models/tiny"}
# a secret of the controller environment (HF_TOKEN) that errors must never repeat
TOKEN = "hf_controllerToken0123456789abcdef"
