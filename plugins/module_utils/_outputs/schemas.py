# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""JSON Schemas of the generated files: the fleet, the launch record (docs/architecture.md, "Allocation and transport
fields" and "The runtime object") and the run manifest.
Every step that writes or reads them validates against these (jsonschema on the controller).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_PATTERN

__metaclass__ = type

_STR = {"type": "string", "minLength": 1}

_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}

_PATHS = {"type": "array", "items": {"type": "string", "pattern": "^/dev/"}}

_COUNT = {"type": ["integer", "null"], "minimum": 1}

FLEET_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "narwhal.deploy fleet",
    "type": "array",
    "minItems": 2,
    "items": {
        "type": "object",
        "required": ["iid", "url", "attestation_url", "role"],
        "properties": {
            "iid": {"type": "string", "pattern": "^n[1-9][0-9]*$"},
            "engine": {"type": "string", "pattern": ENGINE_PATTERN},
            "url": _STR,
            "attestation_url": _STR,
            "role": {"enum": ["prefill", "decode"]},
            "accelerator": {"type": "object"},
            "gpu_count": {"type": "integer", "minimum": 0},
        },
    },
}

RECORD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "narwhal.deploy engine launch record",
    "type": "object",
    "required": ["engine", "iid", "role", "accelerator", "gpu_ids", "tensor_parallel_size", "gpu_visibility_env",
                 "accelerator_devices", "network_mode", "transfer", "node", "runtime", "sources"],
    "properties": {
        "engine": {"type": "string", "pattern": ENGINE_PATTERN},
        "iid": {"type": "string", "pattern": "^n[1-9][0-9]*$"},
        "role": {"enum": ["prefill", "decode"]},
        "accelerator": {
            "type": "object",
            "required": ["vendor", "product", "count"],
            "properties": {"vendor": {"enum": ["nvidia", "amd", "cpu"]}, "product": _STR,
                           "count": {"type": "integer", "minimum": 0}},
        },
        "gpu_ids": {"type": "array", "items": _STR, "uniqueItems": True},
        "gpu_host_indices": {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True},
        "tensor_parallel_size": {"type": "integer", "minimum": 1},
        "gpu_visibility_env": {"enum": ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", None]},
        "accelerator_devices": _PATHS,
        "network_mode": {"const": "host"},
        "transfer": {
            "type": "object",
            "required": ["transport", "net_devices", "devices", "ucx_tls"],
            "properties": {
                "transport": {"enum": ["ucx_tcp", "ucx_rdma"]},
                "net_devices": {"type": "array", "items": _STR, "minItems": 1},
                "devices": _PATHS,
                "ucx_tls": {"type": "array", "items": _STR, "minItems": 1},
            },
            "allOf": [{"if": {"properties": {"transport": {"const": "ucx_tcp"}}},
                       "then": {"properties": {"devices": {"maxItems": 0}}}},
                      {"if": {"properties": {"transport": {"const": "ucx_rdma"}}},
                       "then": {"properties": {"devices": {"minItems": 1}}}}],
        },
        "node": {
            "type": "object",
            "required": ["address", "bind_family", "engine_port", "attest_port", "fabric_interface",
                         "side_channel_port"],
            "properties": {"engine_port": _PORT, "attest_port": _PORT, "side_channel_port": _PORT,
                           "bind_family": {"enum": ["ipv4", "ipv6"]}},
        },
        "runtime": {
            "type": "object",
            "required": ["image", "image_id", "expected_packages", "model_dtype", "kv_cache_dtype", "block_size",
                         "cache_plan", "environment", "extra_args", "model_path", "served_model_name",
                         "vllm_version", "nixl_distribution"],
            "properties": {
                "image_id": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
                "vllm_version": _STR,
                "nixl_distribution": _STR,
                "expected_packages": {"type": "object", "required": ["vllm"],
                                      "additionalProperties": _STR, "minProperties": 2},
                "model_dtype": {"enum": ["bfloat16", "float16"]},
                "kv_cache_dtype": _STR,
                "block_size": {"type": "integer", "minimum": 1},
                "cache_plan": {"type": "object", "required": ["block_size", "page_bytes"]},
                "environment": {"type": "object", "additionalProperties": {"type": "string"}},
                "derived_environment": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra_args": {"type": "array", "items": {"type": "string"}},
                "model_path": {"type": "string", "pattern": "^/"},
                "model_geometry": {
                    "type": "object",
                    "required": ["num_kv_heads", "head_size", "num_hidden_layers", "sliding_window", "use_mla",
                                 "ssm_state"],
                    "properties": {"num_kv_heads": _COUNT, "head_size": _COUNT, "num_hidden_layers": _COUNT,
                                   "sliding_window": _COUNT, "use_mla": {"type": "boolean"},
                                   "ssm_state": {"type": ["string", "null"]}},
                },
            },
        },
        "sources": {"type": "object", "required": ["host", "image", "model", "policy", "allocation", "transfer"]},
    },
}

LAUNCH_CONFIG_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "narwhal.deploy launch config (records keyed by engine name)",
    "type": "object",
    "required": ["version", "engines"],
    "properties": {
        "version": {"const": 1},
        "engines": {"type": "object", "minProperties": 1,
                    "patternProperties": {ENGINE_PATTERN: RECORD_SCHEMA},
                    "additionalProperties": False},
    },
}


def validation_errors(document, schema):
    """-> list of 'path: message' strings (empty when valid). Needs jsonschema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        path = "/".join(str(p) for p in err.absolute_path) or "(top)"
        out.append("%s: %s" % (path, err.message))
    return out


MANIFEST_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "narwhal.deploy prepared run manifest",
    "type": "object",
    "required": ["run_id", "application", "launcher", "inputs", "engines"],
    "properties": {
        "run_id": {"type": "string", "pattern": "^run-[0-9a-f]{12}$"},
        "application": {"type": "object", "required": ["revision", "dirty"],
                        "properties": {"revision": {"type": ["string", "null"]},
                                       "dirty": {"type": ["boolean", "null"]}}},
        "launcher": {"type": "object", "required": ["file", "sha256"],
                     "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}},
        "inputs": {"type": "object", "required": ["env_file_sha256", "fleet_sha256", "launch_config_sha256"]},
        "engines": {
            "type": "object", "minProperties": 1,
            "patternProperties": {ENGINE_PATTERN: {
                "type": "object",
                "required": ["host", "role", "record_sha256", "environment", "vllm_args", "role_env", "install"],
                "properties": {"vllm_args": {"type": "array", "items": {"type": "string"}},
                               "environment": {"type": "object", "additionalProperties": {"type": "string"}},
                               "role_env": {"type": "object", "additionalProperties": {"type": "string"}}},
            }},
            "additionalProperties": False,
        },
    },
}
