#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: discovery_outputs
short_description: Plan the fleet from discovered facts and write deployment.env and the fleet file as one set
version_added: 0.1.0
description:
  - Runs once on the controller at the end of discovery.
  - Picks each node's fabric address (an explicit C(NARWHAL_NODE_<n>_IP) wins, otherwise exactly one usable global
    address of the bind family), derives engine and attestation URLs (IPv6 in brackets), honours full-URL
    overrides whose port matches the node's port, and refuses a bad input with a message naming it.
  - Writes C(deployment.env) and the fleet file (C(NARWHAL_FLEET)) as one set, only after everything was planned
    and validated; a failure leaves the previous set byte-for-byte intact. Unchanged outputs are not touched.
  - The set is written under a lock in C(NARWHAL_CONFIG_DIR) (a second discovery waits up to 60 s, then is
    refused naming the lock and its holder) and swapped through a journal, so that a run killed at any instant
    leaves, once the next discovery or prepare has started, either the complete previous or the complete new set
    (see docs/outputs.md). A full disk or a permission problem is refused naming the file.
  - Refuses, before planning, output paths that collide (with each other, after resolving symbolic links, or with
    the C(.env) file or the API key file) or that lie inside the checkout at a place git does not ignore
    (C(git check-ignore), or the shipped C(.gitignore)'s site paths without git); settings for an C(engine-<n>)
    the inventory lacks; a fabric interface whose link is down; and a C(deployment.env) value that could add a
    line or be expanded.
options:
  site:
    description: The validated inputs, as returned by M(narwhal.deploy.site_inputs).
    type: dict
    required: true
  engines:
    description: Inventory names of the engines (C(engine-<n>)).
    type: list
    elements: str
    required: true
  interfaces:
    description: The C(narwhal_interface) facts of each engine, by engine name.
    type: dict
    required: true
  root:
    description: Checkout directory that relative output paths are relative to.
    type: path
    required: true
  hosts:
    description:
      - Host, image and model inspection of each engine, by engine name, each a dict with C(gpus)
        (M(narwhal.deploy.gpu_facts)), C(rdma) (M(narwhal.deploy.rdma_facts)), C(image)
        (M(narwhal.deploy.image_facts)) and C(model) (M(narwhal.deploy.model_facts)).
      - When given, the launch records (C(NARWHAL_LAUNCH_CONFIG)), their inspection and policy extracts and
        C(engine-launch.sources.json) are planned, schema-validated and written with the same set.
    type: dict
attributes:
  diff_mode:
    description: Returns the before and after text of every output file that changes.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.writer
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Write config/deployment.env and config/fleet.json
  narwhal.deploy.discovery_outputs:
    site: "{{ narwhal_site }}"
    engines: "{{ ansible_play_hosts_all }}"
    interfaces: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'narwhal_interface'))) }}"
    root: "{{ playbook_dir | dirname }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
table:
  description: One row per engine with engine, interface, address, url, attestation_url and role.
  returned: success
  type: list
  elements: dict
  sample: [{"engine": "engine-1", "interface": "eth1", "address": "10.0.0.11", "url": "http://10.0.0.11:8000",
            "attestation_url": "http://10.0.0.11:8010/v1/attestation", "role": "prefill"}]
files:
  description: The output files of the set and whether each changed.
  returned: success
  type: dict
  sample: {"/srv/narwhal/config/deployment.env": false, "/srv/narwhal/config/fleet.json": true}
"""

import fnmatch
import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._fleet import plan_fleet, render_env
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs import OutputError, OutputSet
from ansible_collections.narwhal.deploy.plugins.module_utils._paths import (
    DEPLOYMENT_ENV,
    INSPECTION_FILE,
    check_paths,
    git_ignore_checker,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._policy import POLICY_FILE, SOURCES_FILE, launch_policy
from ansible_collections.narwhal.deploy.plugins.module_utils._records import build_record
from ansible_collections.narwhal.deploy.plugins.module_utils._schema import (
    FLEET_SCHEMA,
    LAUNCH_CONFIG_SCHEMA,
    validation_errors,
)

ENV_HEADER = [
    "Generated by narwhal.deploy discovery (playbooks/discover.yml) from .env and the engine hosts.",
    "Do not edit: change .env and rerun discovery. Fleet values reference these as ${NAME}.",
]


def dump(document):
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def stale_extracts(index_path, config_dir, files, read):
    """Extracts of the previous set that the new set no longer has (a fresh output set never keeps them).
    read(path) -> bytes or None: how the previous index is read (OutputSet.read: as recovery will leave it)."""
    try:
        raw = read(index_path)
        previous = json.loads(raw).get("files", {}) if raw is not None else {}
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    paths = [os.path.join(config_dir, os.path.basename(name)) for name in previous]
    # only inspection extracts: an edited index must not make discovery remove another file of the directory
    return [path for path in paths if path not in files
            and fnmatch.fnmatchcase(os.path.basename(path), INSPECTION_FILE % "*")]


def plan_records(plan, inputs, hosts):
    site = inputs["site"]
    taken, next_port, records, extracts = {}, {}, {}, {}
    # the policy the records come from; prepare compares it with the inputs of its day (_policy.check_policy)
    policy = launch_policy(inputs, [node["engine"] for node in plan["nodes"]])
    # GPUs named explicitly (NARWHAL_NODE_<n>_GPU_IDS) are reserved for their engine before any engine of the
    # same host takes GPUs by count.
    reserved = {}
    for node in plan["nodes"]:
        for index in inputs["nodes"].get(node["n"], {}).get("GPU_IDS") or []:
            reserved.setdefault(node["host_id"], {}).setdefault(index, node["engine"])
    for i, node in enumerate(plan["nodes"]):
        fleet_entry = plan["fleet"][i]
        engine = node["engine"]
        facts = hosts.get(engine)
        if not facts:
            raise InputError(engine, "no host inspection was gathered for %s; rerun discovery on every engine"
                                     % engine)
        node_policy = inputs["nodes"].get(node["n"], {})
        host_key = node["host_id"]
        port = next_port.get(host_key, site["NARWHAL_SIDE_CHANNEL_PORT"])
        busy = dict((i, e) for i, e in reserved.get(host_key, {}).items() if e != engine)
        busy.update(taken.setdefault(host_key, {}))
        record, span = build_record(node, site, node_policy, facts, facts.get("image") or {}, facts.get("model") or {},
                                    fleet_entry, busy, port)
        for index in record["gpu_host_indices"]:
            taken[host_key][index] = engine
        next_port[host_key] = port + span
        inspection = INSPECTION_FILE % engine
        record["sources"].update({
            "host": {"file": inspection, "pointer": "/host"},
            "image": {"file": inspection, "pointer": "/image"},
            "model": {"file": inspection, "pointer": "/model"},
            "policy": {"file": POLICY_FILE, "pointer": "/nodes/%s" % engine,
                       "site_pointer": "/site"},
        })
        extracts[inspection] = {"engine": engine,
                                "host": {"interface": node["interface"], "address": node["address"],
                                         "host_id": host_key, "gpus": facts.get("gpus"), "rdma": facts.get("rdma")},
                                "image": dict((k, v) for k, v in (facts.get("image") or {}).items() if k != "cached"),
                                "model": facts.get("model")}
        fleet_entry["accelerator"] = record["accelerator"]
        fleet_entry["gpu_count"] = record["accelerator"]["count"]
        records[engine] = record
    extracts[POLICY_FILE] = policy
    return {"version": 1, "engines": records}, extracts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            site=dict(type="dict", required=True),
            engines=dict(type="list", elements="str", required=True),
            interfaces=dict(type="dict", required=True),
            root=dict(type="path", required=True),
            hosts=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    inputs = {"site": p["site"]["site"], "nodes": {int(k): v for k, v in p["site"]["nodes"].items()}}
    root = p["root"]
    try:
        site = inputs["site"]
        # every output path of its own, none an input, git-ignored inside the checkout: before any planning
        paths = check_paths(root, site, p["engines"], p["site"].get("env_file"), git_ignore_checker(module, root),
                            os.path.realpath)
        config_dir, fleet_path, launch_path = paths["config_dir"], paths["fleet"], paths["launch_config"]
        plan = plan_fleet(inputs, p["engines"], p["interfaces"])
        env_text = render_env(plan["deployment_env"], ENV_HEADER)
        records = None
        if p["hosts"] is not None:
            records = plan_records(plan, inputs, p["hosts"])
    except InputError as exc:
        module.fail_json(msg="discovery refused its inputs, nothing was written: %s" % exc, input=exc.key)
    files = {
        os.path.join(config_dir, DEPLOYMENT_ENV): (env_text, 0o600),
        fleet_path: (dump(plan["fleet"]), 0o600),
    }
    errors = validation_errors(plan["fleet"], FLEET_SCHEMA)
    remove = []
    if records is not None:
        document, extracts = records
        errors += ["launch record %s" % e for e in validation_errors(document, LAUNCH_CONFIG_SCHEMA)]
        index_path = os.path.join(config_dir, SOURCES_FILE)
        index = {"launch_config": launch_path, "files": {}, "engines": {}}
        for name, content in sorted(extracts.items()):
            text = dump(content)
            files[os.path.join(config_dir, name)] = (text, 0o600)
            index["files"][name] = hashlib.sha256(text.encode()).hexdigest()
        for engine, record in sorted(document["engines"].items()):
            index["engines"][engine] = dict((k, v) for k, v in record["sources"].items() if isinstance(v, dict))
        launch_text = dump(document)
        index["launch_config_sha256"] = hashlib.sha256(launch_text.encode()).hexdigest()
        files[launch_path] = (launch_text, 0o600)
        files[index_path] = (dump(index), 0o600)
    if errors:
        module.fail_json(msg="discovery produced output that fails its schema, nothing was written: %s"
                             % "; ".join(errors[:10]))
    # One lock for the set (a second discovery waits, then is refused by name); an interrupted write of a previous
    # run is completed or undone first; the swap is journaled (plugins/module_utils/_outputs.py, docs/outputs.md).
    try:
        with OutputSet(config_dir, "discovery", check_mode=module.check_mode) as outputs:
            if records is not None:
                remove = stale_extracts(index_path, config_dir, files, outputs.read)
            changes = outputs.plan(files, remove)
            if changes and not module.check_mode:
                outputs.apply(changes)
    except OutputError as exc:
        module.fail_json(msg="discovery: %s" % exc, path=exc.path)
    for note in outputs.notes:
        module.warn(note)
    result = {"changed": bool(changes), "table": plan["table"],
              "files": dict((path, any(c[0] == path for c in changes)) for path in files)}
    if module._diff:
        result["diff"] = [{"before_header": c[0], "after_header": c[0], "before": c[1] or "", "after": c[2] or ""}
                          for c in changes]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
