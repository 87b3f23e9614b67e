# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""JSON Schemas of the generated files: the fleet, the launch record (docs/vllm-requirements.md, "Allocation and
transport fields" and "The runtime object") and the run manifest, and the one validator of them (docs/architecture.md,
"One record check").

Every step that writes or reads them validates with `validation_errors`, a standard-library interpreter of the JSON
Schema keywords these schemas use, so that the launcher on the engine host (no jsonschema there) checks a record
exactly as discovery and prepare do. `record_errors` adds what a schema cannot say (fields that must agree with
each other), and `check_record` turns both into one refusal naming the file and every failed field.
tests/unit/plugins/module_utils/_outputs/test_schemas.py keeps the interpreter's verdicts equal to jsonschema's.
"""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import HASH_SEED_MAX, bind_endpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_PATTERN

__metaclass__ = type

_STR = {"type": "string", "minLength": 1}

_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}

_PATHS = {"type": "array", "items": {"type": "string", "pattern": "^/dev/"}}

_COUNT = {"type": ["integer", "null"], "minimum": 1}

# The value of the visibility variable (CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES) holds the record's gpu_ids
# joined by commas, so one entry is one GPU: a container-relative index or an NVIDIA GPU UUID
# (_discover/gpu_allocation.py::visibility_ids), never a list ("0,1") that would widen the visibility past the GPUs the
# container is given.
GPU_ID_PATTERN = ("^(0|[1-9][0-9]{0,3}|GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                  "[0-9a-fA-F]{12})$")

# The largest KV block (tokens) a record may request. Not a vLLM rule: a bound far above any block vLLM uses
# (hybrid models raise theirs to a few hundred or thousand tokens, in runtime.cache_plan), so that a hand-edited
# record cannot hand vLLM an absurd size.
MAX_BLOCK_SIZE = 65536

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
            # only while KV events are on: where a subscriber reaches the engine's ranks, by DP rank
            # (_common/kv_events.py::subscriber_endpoints)
            "kv_events": {"type": "array", "minItems": 1,
                          "items": {"type": "string", "pattern": "^tcp://[^\\s/]+:[0-9]{1,5}$"}},
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
        "gpu_ids": {"type": "array", "items": {"type": "string", "pattern": GPU_ID_PATTERN}, "uniqueItems": True},
        "gpu_host_indices": {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True},
        "tensor_parallel_size": {"type": "integer", "minimum": 1},
        # present only when above 1 / true, so that the records of engines without them stay as they were
        "data_parallel_size": {"type": "integer", "minimum": 2},
        "enable_expert_parallel": {"const": True},
        # an engine across hosts only (NARWHAL_NODE_<n>_HOSTS > 1): the ranks of each host, where they meet the head,
        # and what each host after the head runs of its own (_discover/members.py)
        "data_parallel_size_local": {"type": "integer", "minimum": 1},
        "data_parallel_rpc_port": _PORT,
        "members": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object",
                "required": ["member", "host", "data_parallel_start_rank", "gpu_ids", "gpu_host_indices",
                             "accelerator_devices", "transfer", "node", "sources"],
                "properties": {
                    "member": {"type": "integer", "minimum": 1},
                    "host": _STR,
                    "data_parallel_start_rank": {"type": "integer", "minimum": 1},
                    "gpu_ids": {"type": "array", "items": {"type": "string", "pattern": GPU_ID_PATTERN},
                                "uniqueItems": True},
                    "gpu_host_indices": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                         "uniqueItems": True},
                    "accelerator_devices": _PATHS,
                    "transfer": {"type": "object", "required": ["transport", "net_devices", "devices", "ucx_tls"]},
                    "node": {"type": "object", "required": ["address", "fabric_interface", "side_channel_ports",
                                                            "host_id"],
                             "properties": {"address": _STR, "fabric_interface": _STR, "host_id": _STR}},
                    "sources": {"type": "object"},
                },
            },
        },
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
                "image_digest": {"type": "string", "pattern": "^[^@\\s]+@sha256:[0-9a-f]{64}$"},
                "vllm_version": _STR,
                "nixl_distribution": _STR,
                "expected_packages": {"type": "object", "required": ["vllm"],
                                      "additionalProperties": _STR, "minProperties": 2},
                "model_dtype": {"enum": ["bfloat16", "float16"]},
                "kv_cache_dtype": _STR,
                "platform": {"enum": ["cuda", "rocm", "cpu"]},
                "kv_buffer_device": {"enum": ["cuda", "cpu"]},
                "served_model_name": _STR,
                "block_size": {"type": "integer", "minimum": 1, "maximum": MAX_BLOCK_SIZE},
                "cache_plan": {"type": "object", "required": ["block_size", "page_bytes"],
                               "properties": {"block_size": {"type": "integer", "minimum": 1},
                                              "requested_block_size": {"type": "integer", "minimum": 1}}},
                "environment": {"type": "object", "additionalProperties": {"type": "string"}},
                "derived_environment": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra_args": {"type": "array", "items": {"type": "string"}},
                "trust_remote_code": {"type": "boolean"},
                "ssm_conv_state": {"type": "boolean"},
                "kv_lease_seconds": {"type": "integer", "minimum": 1, "maximum": 86400},
                "shutdown_timeout": {"type": "integer", "minimum": 0, "maximum": 3600},
                "log": {"type": "object", "required": ["driver", "max_size", "max_file"], "additionalProperties": False,
                        "properties": {"driver": {"enum": ["json-file", "local"]},
                                       "max_size": {"type": "string", "pattern": "^[1-9][0-9]{0,5}[kmg]$"},
                                       "max_file": {"type": "integer", "minimum": 1}}},
                "model_path": {"type": "string", "pattern": "^/"},
                "model_geometry": {
                    "type": "object",
                    "required": ["num_kv_heads", "head_size", "num_hidden_layers", "sliding_window", "use_mla",
                                 "ssm_state"],
                    "properties": {"num_kv_heads": _COUNT, "head_size": _COUNT, "num_hidden_layers": _COUNT,
                                   "sliding_window": _COUNT, "use_mla": {"type": "boolean"},
                                   "ssm_state": {"type": ["string", "null"]}},
                },
                # the digest of the checkpoint's manifest the deliver stage stamped (_deliver/manifest.py); absent
                # when the checkpoint has none
                "model_manifest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
            },
        },
        # only while KV events are on (_common/kv_events.py::record_field), so the records of a fleet without them stay
        # as they were: the endpoint the engine's publisher binds, its first port (rank r: + r), PYTHONHASHSEED
        "kv_events": {"type": "object", "required": ["endpoint", "port", "hash_seed"], "additionalProperties": False,
                      "properties": {"endpoint": {"type": "string", "pattern": "^tcp://\\*:[0-9]{1,5}$"},
                                     "port": _PORT,
                                     "hash_seed": {"type": "string", "pattern": "^(0|[1-9][0-9]{0,9})$"}}},
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
        "collection": {"type": "object", "required": ["name", "version", "build"],
                       "properties": {"name": _STR, "version": _STR, "build": _STR}},
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


# ------------------------------------------------------------------------------------------------ the validator

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),  # 16.0 is no block size: stricter
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}

# Keywords that only annotate; every other keyword a schema here uses must be one _errors knows (a unit test walks
# the schemas), so a new keyword cannot be ignored silently.
ANNOTATIONS = ("$schema", "title", "description")

KEYWORDS = ANNOTATIONS + (
    "type", "enum", "const", "required", "properties", "patternProperties", "additionalProperties", "minProperties",
    "items", "minItems", "maxItems", "uniqueItems", "pattern", "minLength", "minimum", "maximum", "allOf", "if",
    "then")


def _search(pattern, value):
    """JSON Schema's pattern (ECMA-262, unanchored): a final `$` is the end of the string, not the place before a
    final newline (Python's `$`), so "engine-1\\n" does not pass as an engine name."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.search(pattern, value) is not None


def _equal(a, b):
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(a[i], b[i]) for i in range(len(a)))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _errors(value, schema, path, out):
    """Append (path, message) for every way `value` breaks `schema` (the keywords of KEYWORDS)."""
    for keyword in schema:
        if keyword not in KEYWORDS:
            raise ValueError("schema keyword %s is not one validation_errors knows" % keyword)
    kinds = schema.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_TYPES[k](value) for k in names):
            out.append((path, "%r is not of type %s" % (value, ", ".join(repr(k) for k in names))))
            return
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        out.append((path, "%r is not one of %r" % (value, schema["enum"])))
    if "const" in schema and not _equal(value, schema["const"]):
        out.append((path, "%r was expected" % (schema["const"],)))
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                out.append((path, "%r is a required property" % key))
        if len(value) < schema.get("minProperties", 0):
            out.append((path, "%r does not have enough properties" % (value,)))
        properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        for key in sorted(value):
            matched = key in properties
            if matched:
                _errors(value[key], properties[key], path + [key], out)
            for pattern, sub in sorted(patterns.items()):
                if _search(pattern, key):
                    matched = True
                    _errors(value[key], sub, path + [key], out)
            extra = schema.get("additionalProperties", True)
            if not matched and extra is False:
                out.append((path, "Additional properties are not allowed (%r was unexpected)" % key))
            elif not matched and isinstance(extra, dict):
                _errors(value[key], extra, path + [key], out)
    if isinstance(value, list):
        if "items" in schema:
            for index, item in enumerate(value):
                _errors(item, schema["items"], path + [index], out)
        if len(value) < schema.get("minItems", 0):
            out.append((path, "%r is too short" % (value,)))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append((path, "%r is too long" % (value,)))
        if schema.get("uniqueItems") and any(_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
            out.append((path, "%r has non-unique elements" % (value,)))
    if isinstance(value, str):
        if "pattern" in schema and not _search(schema["pattern"], value):
            out.append((path, "%r does not match %r" % (value, schema["pattern"])))
        if len(value) < schema.get("minLength", 0):
            out.append((path, "%r is too short" % value))
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            out.append((path, "%r is less than the minimum of %r" % (value, schema["minimum"])))
        if "maximum" in schema and value > schema["maximum"]:
            out.append((path, "%r is greater than the maximum of %r" % (value, schema["maximum"])))
    for sub in schema.get("allOf", ()):
        _errors(value, sub, path, out)
    if "if" in schema:
        probe = []
        _errors(value, schema["if"], path, probe)
        if not probe and "then" in schema:
            _errors(value, schema["then"], path, out)


def _pairs(document, schema):
    out = []
    _errors(document, schema, [], out)
    return sorted(out, key=lambda e: [str(p) for p in e[0]])


def validation_errors(document, schema):
    """-> list of 'path: message' strings (empty when valid); path parts joined by '/' ('(top)' for the document)."""
    return ["%s: %s" % ("/".join(str(p) for p in path) or "(top)", message)
            for path, message in _pairs(document, schema)]


def _field(path):
    """runtime.block_size, gpu_ids[0]: how the planner's refusals name a record field."""
    text = ""
    for part in path:
        text += "[%d]" % part if isinstance(part, int) else ("." if text else "") + part
    return text or "(the record)"


def _semantic_errors(record):
    """(field, message) for what RECORD_SCHEMA cannot say: fields that must agree with each other, as discovery
    writes them (_discover/records.py::build_record). Run only on a record that passes the schema."""
    out = []
    vendor, runtime = record["accelerator"]["vendor"], record["runtime"]
    gpu_ids, host_indices = record["gpu_ids"], record.get("gpu_host_indices")
    tp = record["tensor_parallel_size"]
    dp = record.get("data_parallel_size", 1)
    if host_indices is not None and len(host_indices) != len(gpu_ids):
        out.append(("gpu_host_indices", "%r has %d entries but gpu_ids has %d: one host index per GPU"
                    % (host_indices, len(host_indices), len(gpu_ids))))
    if record["accelerator"]["count"] != len(gpu_ids):
        out.append(("accelerator.count", "%d is not the number of gpu_ids (%d)"
                    % (record["accelerator"]["count"], len(gpu_ids))))
    members = record.get("members") or []
    view = record.get("member")  # one host's view of an engine across hosts (_plan/parallel.py::member_view)
    hosts = 1 + len(members) if view is None else dp // max(1, record.get("data_parallel_size_local") or 1)
    if gpu_ids and tp * dp != len(gpu_ids) * hosts:
        out.append(("tensor_parallel_size", "%d%s is not the number of gpu_ids (%d%s): vLLM runs one rank per GPU"
                    % (tp, " x data_parallel_size %d" % dp if dp > 1 else "", len(gpu_ids),
                       " on each of %d hosts" % hosts if hosts > 1 else "")))
    if view is None:
        out += _member_errors(record, members, dp, hosts)
    if vendor in ("nvidia", "amd") and not gpu_ids:
        out.append(("gpu_ids", "is empty, but accelerator.vendor is %s" % vendor))
    if vendor == "cpu" and gpu_ids:
        out.append(("gpu_ids", "%r names GPUs, but accelerator.vendor is cpu" % (gpu_ids,)))
    relative = [g for g in gpu_ids if g.isdigit()]
    if relative and len(relative) != len(gpu_ids):
        out.append(("gpu_ids", "%r mixes container-relative indices and GPU UUIDs" % (gpu_ids,)))
    elif relative and sorted(int(g) for g in relative) != list(range(len(gpu_ids))):
        out.append(("gpu_ids", "%r: container-relative indices must be 0..%d, the container sees only its %d GPU(s)"
                    % (gpu_ids, len(gpu_ids) - 1, len(gpu_ids))))
    if vendor == "amd" and len(relative) != len(gpu_ids):
        out.append(("gpu_ids", "%r: ROCR_VISIBLE_DEVICES takes container-relative indices here" % (gpu_ids,)))
    block, plan = runtime["block_size"], runtime["cache_plan"]
    requested = plan.get("requested_block_size", block)
    if requested != block:
        out.append(("runtime.block_size", "%d is not the block size the cache plan was made for "
                    "(runtime.cache_plan.requested_block_size=%r)" % (block, requested)))
    if plan["block_size"] < block:
        out.append(("runtime.cache_plan.block_size", "%d is smaller than the requested runtime.block_size %d"
                    % (plan["block_size"], block)))
    ports = record["node"].get("side_channel_ports")
    port = record["node"]["side_channel_port"]
    if ports is not None and (not isinstance(ports, list) or len(ports) != 2 or ports[0] != port
                              or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports)
                              or not port <= ports[1] <= 65535):
        out.append(("node.side_channel_ports", "%r must be [first, last] with first = node.side_channel_port %d"
                    % (ports, port)))
    return out + _kv_events_errors(record, dp)


def _kv_events_errors(record, dp):
    """(field, message) of a record's kv_events: the endpoint binds its port, every rank's port exists, the seed is
    one Python takes."""
    kv = record.get("kv_events")
    if kv is None:
        return []
    out = []
    if kv["endpoint"] != bind_endpoint(kv["port"]):
        out.append(("kv_events.endpoint", "%s is not %s: the engine publishes on every interface at kv_events.port"
                    % (kv["endpoint"], bind_endpoint(kv["port"]))))
    if kv["port"] + dp - 1 > 65535:
        out.append(("kv_events.port", "%d + %d data-parallel ranks passes port 65535" % (kv["port"], dp)))
    if int(kv["hash_seed"]) > HASH_SEED_MAX:
        out.append(("kv_events.hash_seed", "%s is more than %d, which Python refuses as PYTHONHASHSEED"
                    % (kv["hash_seed"], HASH_SEED_MAX)))
    return out


def _member_errors(record, members, dp, hosts):
    """(field, message) of the fields of an engine across hosts that must agree (_discover/members.py)."""
    out = []
    local, rpc = record.get("data_parallel_size_local"), record.get("data_parallel_rpc_port")
    if not members:
        if local is not None or rpc is not None:
            out.append(("data_parallel_size_local", "is set but the record has no members: an engine on one host "
                                                    "has neither data_parallel_size_local nor data_parallel_rpc_port"))
        return out
    if local is None or rpc is None or local * hosts != dp:
        out.append(("data_parallel_size_local", "%r x %d hosts (the head and %d member(s)) is not data_parallel_size "
                                                "%d, or data_parallel_rpc_port is missing"
                    % (local, hosts, hosts - 1, dp)))
        return out
    ports = record["node"].get("side_channel_ports") or [0, 0]
    span = ports[1] - ports[0] + 1
    machines = [record["node"].get("host_id")]
    for index, member in enumerate(members):
        rank = index + 1
        where = "members[%d]" % index
        if member["member"] != rank or member["data_parallel_start_rank"] != rank * local:
            out.append((where + ".member", "member %r with start rank %r: members are ranks 1 .. %d in order, member "
                                           "k starting at DP rank k x data_parallel_size_local (%d)"
                        % (member["member"], member["data_parallel_start_rank"], hosts - 1, local)))
        counts = (len(member["gpu_ids"]), len(member["gpu_host_indices"]))
        if counts != (len(record["gpu_ids"]), len(record["gpu_ids"])):
            out.append((where + ".gpu_ids", "has %d GPU(s) (%d host indices) but the head has %d: every host of the "
                                            "engine has as many" % (len(member["gpu_ids"]),
                                                                    len(member["gpu_host_indices"]),
                                                                    len(record["gpu_ids"]))))
        first = ports[0] + rank * span
        if member["node"]["side_channel_ports"] != [first, first + span - 1]:
            out.append((where + ".node.side_channel_ports", "%r must be [%d, %d]: the base port + the global DP ranks "
                                                            "of this host" % (member["node"]["side_channel_ports"],
                                                                              first, first + span - 1)))
        if member["node"]["host_id"] in machines:
            out.append((where + ".node.host_id", "%s is the machine of another host of the engine"
                        % member["node"]["host_id"]))
        machines.append(member["node"]["host_id"])
    return out


def record_errors(record):
    """-> [(field, message)] of one launch record: RECORD_SCHEMA, then (when the schema holds) the fields that must
    agree with each other. Empty when the record is one discovery could have written."""
    errors = [(_field(path), message) for path, message in _pairs(record, RECORD_SCHEMA)]
    return errors or _semantic_errors(record)


def check_record(record, where):
    """Refuse (PlanError, key = the first failed field) a record that record_errors faults, naming `where` (the
    file) and every failed field. Discovery, prepare and the launcher all call this before planning."""
    errors = record_errors(record)
    if errors:
        raise PlanError("launch record %s: %s; the launcher plans only what discovery writes: %s"
                        % (where, "; ".join("field %s: %s" % e for e in errors[:8]), RERUN), errors[0][0])
    return record


def launch_config_errors(document):
    """-> 'path: message' strings of a launch config: LAUNCH_CONFIG_SCHEMA, then record_errors of each record."""
    errors = validation_errors(document, LAUNCH_CONFIG_SCHEMA)
    if errors:
        return errors
    return ["engines/%s/%s: %s" % (engine, field, message) for engine, record in sorted(document["engines"].items())
            for field, message in record_errors(record)]
