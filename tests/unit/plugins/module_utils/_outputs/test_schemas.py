# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch config schema (plugins/module_utils/_outputs/schemas.py)
accepts the example record, and docs/launch-record.md documents every field."""

import json

from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    LAUNCH_CONFIG_SCHEMA,
    validation_errors,
)


def test_example_record_validates_and_every_field_is_documented():

    example = json.loads((REPO / "docs" / "examples" / "engine-launch.example.json").read_text())
    assert validation_errors(example, LAUNCH_CONFIG_SCHEMA) == []
    transports = sorted(r["transfer"]["transport"] for r in example["engines"].values())
    vendors = sorted(r["accelerator"]["vendor"] for r in example["engines"].values())
    assert transports == ["ucx_rdma", "ucx_tcp"] and vendors == ["amd", "nvidia"]
    doc = (REPO / "docs" / "launch-record.md").read_text()
    record = example["engines"]["engine-1"]
    runtime = ["runtime." + k for k in record["runtime"] if k not in ("trust_remote_code", "ssm_conv_state")]
    undocumented = [f for f in list(record) + runtime if f not in ("engine", "iid", "role", "runtime")
                    and "`%s`" % f not in doc]
    assert undocumented == []
