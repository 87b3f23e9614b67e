#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_facts
short_description: Describe a Hugging Face checkpoint for launch planning
version_added: 0.1.0
description:
  - Public API for an operator's own playbooks (for example a checkpoint inventory or check). It is the same read, with
    the same code and refusals, as M(narwhal.deploy.engine_host_facts), which reads all five in one module run.
  - Reads C(config.json) and C(tokenizer_config.json) of a checkpoint directory and reports the weights
    dtype, model type, architectures, whether remote code is needed (an C(auto_map) in either file), whether
    the model has convolutional SSM state, the quantization method and the KV-cache geometry used by cache
    planning.
  - A C(config.json) without C(model_type) and C(architectures) is not a Hugging Face config and fails the
    module, as do a missing directory, a missing C(config.json) and invalid JSON.
  - When the directory holds C(.narwhal-manifest.json), the manifest the deliver stage wrote after its full check
    of the checkpoint, it is read as C(manifest); one that is not JSON, has no files map or records a digest that is
    not its files' fails the module, naming the file and the fix (rerun the deliver stage).
  - Read-only; never reports a change.
options:
  path:
    description: The checkpoint directory (the one that holds C(config.json)).
    type: path
    required: true
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.facts
  - narwhal.deploy.attributes.engine_host
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Describe the checkpoint
  narwhal.deploy.model_facts:
    path: /models/Meta-Llama-3.1-8B-Instruct

- name: Decide on remote code
  ansible.builtin.debug:
    msg: "--trust-remote-code needed: {{ ansible_facts.narwhal_model.trust_remote_code }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the checkpoint.
  returned: always
  type: dict
  contains:
    narwhal_model:
      description: Checkpoint description.
      returned: always
      type: dict
      contains:
        path:
          description: The checkpoint directory.
          type: str
          returned: always
          sample: /models/Meta-Llama-3.1-8B
        dtype:
          description:
            - Weights dtype from C(dtype) or C(torch_dtype) (top level, then C(text_config)), normalised to
              C(bfloat16), C(float16) or C(float32); null when the config has none.
          type: str
          returned: always
          sample: bfloat16
        model_type:
          description: The C(model_type) of the config.
          type: str
          returned: always
          sample: llama
        architectures:
          description: The C(architectures) of the config.
          type: list
          elements: str
          returned: always
          sample: [LlamaForCausalLM]
        trust_remote_code:
          description: True when C(config.json) or C(tokenizer_config.json) carries an C(auto_map).
          type: bool
          returned: always
          sample: false
        auto_map_sources:
          description: The files that carry an C(auto_map).
          type: list
          elements: str
          returned: always
          sample: [config.json, tokenizer_config.json]
        ssm_conv_state:
          description:
            - True when the (text) config has C(conv_kernel), C(mamba_d_conv), C(conv_L_cache),
              C(linear_conv_kernel_dim) or C(linear_attn_config.short_conv_kernel_size).
          type: bool
          returned: always
          sample: false
        quantization:
          description: C(quantization_config.quant_method), null when not quantised.
          type: str
          returned: always
          sample: fp8
        config_sha256:
          description: SHA-256 of the bytes of C(config.json).
          type: str
          returned: always
          sample: 398adf8b93f20e64d3a2b1c0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0
        tokenizer_files:
          description: Tokenizer files present in the directory.
          type: list
          elements: str
          returned: always
          sample: [tokenizer.json, tokenizer_config.json]
        kv_geometry:
          description:
            - C(num_layers), C(num_attention_layers) (layers that hold a KV cache), C(attention_layer_rule)
              (which config key decided it), C(num_attention_heads), C(num_kv_heads), C(head_dim), C(mla),
              C(kv_lora_rank), C(qk_rope_head_dim), C(sliding_window) and C(mamba).
            - For MLA C(num_kv_heads) is 1 and C(head_dim) is C(kv_lora_rank + qk_rope_head_dim), as vLLM caches it.
            - C(mamba) is null for pure attention models, else C(kind) (C(mamba1), C(mamba2),
              C(gated_delta_net), C(short_conv) or C(kda)), C(d_conv), C(d_state), C(n_heads), C(head_dim),
              C(n_groups), C(expand), C(intermediate_size), C(num_layers), C(ssm_cache_dtype) (and
              C(n_k_heads), C(head_k_dim) for gated delta net).
          type: dict
          returned: always
          sample:
            num_layers: 32
            num_attention_layers: 32
            attention_layer_rule: all layers
            num_attention_heads: 32
            num_kv_heads: 8
            head_dim: 128
            mla: false
            kv_lora_rank: null
            qk_rope_head_dim: null
            sliding_window: null
            mamba: null
        max_model_len:
          description:
            - The longest sequence (prompt and output tokens) the checkpoint's documents allow, the smallest of the
              text config's C(max_position_embeddings), C(n_positions), C(max_seq_len), C(seq_length),
              C(max_target_positions), C(max_sequence_length), C(max_seq_length) and C(seq_len) (the keys vLLM
              derives its default C(--max-model-len) from) and the tokenizer's C(model_max_length); null when none
              names one. vLLM's own default can only be longer (RoPE scaling).
            - The transfer probe bounds its long prompt by it where the engine's record sets no C(--max-model-len).
          type: int
          returned: always
          sample: 131072
        manifest:
          description:
            - The checkpoint's manifest as the deliver stage stamped it (C(.narwhal-manifest.json)), with C(digest)
              (C(sha256:) and the sha256 of the canonical JSON of the files map, recomputed here from the files) and
              C(files) (each file's path relative to the directory, with its C(size) and C(sha256)).
            - Discovery records the digest as the launch record's C(runtime.model_manifest); prepare compares it
              across engines and with the source's manifest (docs/launch-record.md).
          type: dict
          returned: when the directory holds C(.narwhal-manifest.json)
          sample:
            digest: sha256:5d41402abc4b2a76b9719d911017c592ae2c5d3a3c1e5b7b8a9f0e1d2c3b4a59
            files: {config.json: {size: 654, sha256: 398adf8b93f20e64d3a2b1c0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_model


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    facts = read_model(module, module.params["path"])
    module.exit_json(changed=False, ansible_facts={"narwhal_model": facts})


if __name__ == "__main__":
    main()
