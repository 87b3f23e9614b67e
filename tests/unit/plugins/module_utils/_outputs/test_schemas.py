# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch config schema (plugins/module_utils/_outputs/schemas.py) accepts the docs' example (discovery's output,
scripts/gen-example-record.py) and the hand-shaped records of the tests, and docs/launch-record.md documents every
field; the one record check (check_record) refuses hand edits by field, and
its standard-library validator agrees with jsonschema."""

import copy
import json

import pytest
from test_support.paths import HAND_LAUNCH_CONFIG, REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    FLEET_SCHEMA,
    KEYWORDS,
    LAUNCH_CONFIG_SCHEMA,
    MANIFEST_SCHEMA,
    RECORD_SCHEMA,
    check_record,
    launch_config_errors,
    record_errors,
    validation_errors,
)


def test_the_docs_example_validates_and_every_field_is_documented():
    example = json.loads((REPO / "docs" / "examples" / "engine-launch.example.json").read_text())
    assert validation_errors(example, LAUNCH_CONFIG_SCHEMA) == []
    doc = (REPO / "docs" / "launch-record.md").read_text()
    record = example["engines"]["engine-1"]
    runtime = ["runtime." + k for k in record["runtime"] if k not in ("trust_remote_code", "ssm_conv_state")]
    undocumented = [f for f in list(record) + runtime if f not in ("engine", "iid", "role", "runtime")
                    and "`%s`" % f not in doc]
    # the sources row of the table names every reason and every file pointer discovery writes
    sources = next(line for line in doc.splitlines() if line.startswith("| `sources` |"))
    undocumented += ["sources." + k for k in record["sources"] if "`%s`" % k not in sources]
    assert undocumented == []


def test_the_hand_shaped_records_validate():
    """The tests' hand-shaped pair (tests/fixtures/hand-shaped: NVIDIA ucx_tcp prefill, AMD ucx_rdma decode) is one
    the record check accepts, so the tests that start from it start from a valid record."""
    hand = json.loads(HAND_LAUNCH_CONFIG.read_text())
    assert launch_config_errors(hand) == []
    transports = sorted(r["transfer"]["transport"] for r in hand["engines"].values())
    vendors = sorted(r["accelerator"]["vendor"] for r in hand["engines"].values())
    assert transports == ["ucx_rdma", "ucx_tcp"] and vendors == ["amd", "nvidia"]


# ------------------------------------------------------------------------------ the one validator of records

def _hand_record(name="engine-1"):
    return copy.deepcopy(json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"][name])


def _set(record, dotted, value):
    """Set (or with value MISSING, delete) the field `dotted` (runtime.block_size) of `record`."""
    parts = dotted.split(".")
    target = record
    for part in parts[:-1]:
        target = target[part]
    if value is MISSING:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value
    return record


class _Missing:
    """A field left out of a record; its repr is stable, so test IDs are the same in every process (pytest-xdist)."""

    def __repr__(self):
        return "<missing>"


MISSING = _Missing()

# (field edited, value, the field the refusal names): hand edits of a record on the engine host
HOSTILE = [
    ("runtime.block_size", -16, "runtime.block_size"),
    ("runtime.block_size", 0, "runtime.block_size"),
    ("runtime.block_size", 2 ** 40, "runtime.block_size"),
    ("runtime.block_size", "16", "runtime.block_size"),
    ("runtime.block_size", 16.0, "runtime.block_size"),
    ("runtime.block_size", True, "runtime.block_size"),
    ("runtime.block_size", 32, "runtime.block_size"),  # not the size the cache plan was made for
    ("runtime.block_size", MISSING, "runtime"),
    ("gpu_ids", ["0,1"], "gpu_ids[0]"),
    ("gpu_ids", ["0 1"], "gpu_ids[0]"),
    ("gpu_ids", [" 0", "1"], "gpu_ids[0]"),
    ("gpu_ids", ["-1", "0"], "gpu_ids[0]"),
    ("gpu_ids", ["0", "0"], "gpu_ids"),
    ("gpu_ids", ["0", "2"], "gpu_ids"),  # the container sees only its 2 GPUs, numbered 0 and 1
    ("gpu_ids", ["1\n"], "gpu_ids[0]"),
    ("gpu_ids", [0, 1], "gpu_ids[0]"),
    ("gpu_ids", "0,1", "gpu_ids"),
    ("gpu_ids", MISSING, "(the record)"),
    ("tensor_parallel_size", "2", "tensor_parallel_size"),
    ("tensor_parallel_size", 4, "tensor_parallel_size"),
    ("gpu_host_indices", [0, 0], "gpu_host_indices"),
    ("gpu_host_indices", [-1, 0], "gpu_host_indices[0]"),
    ("accelerator.count", 8, "accelerator.count"),
    ("runtime.platform", "metal", "runtime.platform"),
    ("runtime.trust_remote_code", "yes", "runtime.trust_remote_code"),
    ("runtime.cache_plan.block_size", 8, "runtime.cache_plan.block_size"),
    ("node.side_channel_ports", [5601, 5601], "node.side_channel_ports"),
    ("engine", "engine-2\n", "engine"),
    # KV events (issue 38): the publisher binds a wildcard at its port, and Python takes the seed
    ("kv_events", {"endpoint": "tcp://10.0.0.11:5557", "port": 5557, "hash_seed": "0"}, "kv_events.endpoint"),
    ("kv_events", {"endpoint": "tcp://*:5558", "port": 5557, "hash_seed": "0"}, "kv_events.endpoint"),
    ("kv_events", {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "4294967296"}, "kv_events.hash_seed"),
    ("kv_events", {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "-1"}, "kv_events.hash_seed"),
    ("kv_events", {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": 0}, "kv_events.hash_seed"),
    ("kv_events", {"endpoint": "tcp://*:5557", "port": 5557}, "kv_events"),
    ("kv_events", {"endpoint": "tcp://*:5557", "port": 5557, "hash_seed": "0", "replay": "x"}, "kv_events"),
]


@pytest.mark.parametrize("dotted,value,field", HOSTILE, ids=["%s=%r" % (h[0], h[1]) for h in HOSTILE])
def test_record_check_refuses_hand_edits_by_field(dotted, value, field):
    record = _set(_hand_record("engine-2"), dotted, value)  # AMD, two GPUs, gpu_ids 0 and 1
    errors = record_errors(record)
    assert errors and errors[0][0] == field, errors
    with pytest.raises(PlanError) as info:
        check_record(record, "/opt/narwhal/config/engine-launch.engine-2.json")
    assert info.value.key == field
    assert str(info.value).startswith("launch record /opt/narwhal/config/engine-launch.engine-2.json: field %s: "
                                      % field)


def test_record_check_refuses_a_uuid_list_on_nvidia():
    record = _hand_record("engine-1")
    record["gpu_ids"][0] = record["gpu_ids"][0] + "," + record["gpu_ids"][1]
    assert record_errors(record)[0][0] == "gpu_ids[0]"
    record = _hand_record("engine-1")
    record["gpu_ids"][1] = "1"
    assert record_errors(record) == [("gpu_ids", "%r mixes container-relative indices and GPU UUIDs"
                                      % (record["gpu_ids"],))]


def test_record_check_passes_the_hand_shaped_records():
    for name in ("engine-1", "engine-2"):
        assert record_errors(_hand_record(name)) == []


def _keywords(schema):
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("properties", "patternProperties"):
                for sub in value.values():
                    yield from _keywords(sub)
            elif key in ("enum", "const", "required"):
                yield key
                continue
            else:
                yield key
                yield from _keywords(value)
    elif isinstance(schema, list):
        for sub in schema:
            yield from _keywords(sub)


@pytest.mark.parametrize("schema", [FLEET_SCHEMA, RECORD_SCHEMA, LAUNCH_CONFIG_SCHEMA, MANIFEST_SCHEMA])
def test_the_validator_knows_every_keyword_the_schemas_use(schema):
    assert sorted(set(_keywords(schema)) - set(KEYWORDS)) == []


@pytest.mark.parametrize("dotted,value,field", HOSTILE, ids=["%s=%r" % (h[0], h[1]) for h in HOSTILE])
def test_the_validator_agrees_with_jsonschema(dotted, value, field):
    """The standard-library validator and jsonschema find the same failing paths, except where it is stricter on
    purpose: 16.0 is no integer and a pattern's final $ is the end of the string (ECMA-262)."""
    jsonschema = pytest.importorskip("jsonschema")
    record = _set(_hand_record("engine-2"), dotted, value)
    ours = sorted(set(e.split(": ", 1)[0] for e in validation_errors(record, RECORD_SCHEMA)))
    theirs = sorted(set("/".join(str(p) for p in e.absolute_path) or "(top)"
                        for e in jsonschema.Draft202012Validator(RECORD_SCHEMA).iter_errors(record)))
    if value == 16.0 or (isinstance(value, str) and value.endswith("\n")) or value == ["1\n"]:
        assert theirs == [] and ours != []
    else:
        assert ours == theirs


def test_launch_config_errors_name_engine_and_field():
    document = json.loads(HAND_LAUNCH_CONFIG.read_text())
    assert launch_config_errors(document) == []
    document["engines"]["engine-2"]["gpu_ids"] = ["0,1", "1"]
    assert launch_config_errors(document)[0].startswith("engines/engine-2/gpu_ids/0: '0,1' does not match")
    document["engines"]["engine-2"]["gpu_ids"] = ["0", "2"]
    assert launch_config_errors(document) == [
        "engines/engine-2/gpu_ids: ['0', '2']: container-relative indices must be 0..1, the container sees only "
        "its 2 GPU(s)"]
