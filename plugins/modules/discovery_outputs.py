#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/discovery_outputs.py does the work in the
# controller's process, with the step plugins/module_utils/_discover/outputs.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: discovery_outputs
short_description: Plan the fleet from discovered facts and write deployment.env and the fleet file as one set
version_added: 0.1.0
description:
  - Runs once on the controller at the end of discovery, inside the controller's Ansible process (an action plugin,
    no module process); it reads each engine's facts from the engines' host variables.
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
    description:
      - The C(narwhal_interface) facts of each engine, by engine name.
      - When not given, each engine's C(narwhal_interface) host variable (the fact
        M(narwhal.deploy.engine_host_facts) or M(narwhal.deploy.interface_facts) set on it).
    type: dict
  root:
    description: Checkout directory that relative output paths are relative to.
    type: path
    required: true
  hosts:
    description:
      - Host, image and model inspection of each engine, by engine name, each a dict with C(gpus)
        (M(narwhal.deploy.gpu_facts)), C(rdma) (M(narwhal.deploy.rdma_facts)), C(image)
        (M(narwhal.deploy.image_facts)) and C(model) (M(narwhal.deploy.model_facts)).
      - The launch records (C(NARWHAL_LAUNCH_CONFIG)), their inspection and policy extracts and
        C(engine-launch.sources.json) are planned, schema-validated and written with the same set.
      - When not given, each engine's host variables C(narwhal_gpus), C(narwhal_rdma), C(narwhal_image) and
        C(narwhal_model) (the facts M(narwhal.deploy.engine_host_facts) set on it). V(null) plans no launch records,
        only C(deployment.env) and the fleet.
    type: dict
  members:
    description:
      - The other hosts of each engine across hosts (C(NARWHAL_NODE_<n>_HOSTS) > 1), by engine name, each a list in
        C(narwhal_rank) order (1, 2, ...) of dicts with C(host) (the inventory host), C(interface) (its
        C(narwhal_interface)) and C(inspection) (its C(gpus), C(rdma), C(image) and C(model), as in O(hosts)).
      - The engine's record gets C(members) (each host's own GPUs, devices, rails, address and side-channel ports)
        and each host an inspection extract C(engine-launch.<engine>.member-<k>.inspection.json). A host whose
        image, GPUs or checkpoint differ from the head's, or a count of hosts other than
        C(NARWHAL_NODE_<n>_HOSTS), is refused by name.
      - When not given, read from the host variables of the hosts the fact C(narwhal_members) lists after each
        engine's head.
    type: dict
  lost:
    description:
      - Inventory hosts unreachable in this run (the opening play's C(narwhal_lost.hosts)). Hosts of no engine of
        O(engines) (routers) are ignored.
      - An engine with a lost host (any host of an engine across hosts) keeps its previous outputs as they are, byte
        for byte - its C(deployment.env) lines, its fleet entry, its launch record and its inspection extracts -
        while the other engines are discovered; the set is still written as one set. Its address, host, GPUs and
        side-channel ports are its kept record's, so the engines discovered around it take others.
      - Refused by name, before anything is written, naming the host, the engine and the fix (bring the host back
        and rerun discovery, or take the engine out of the fleet) - when the engine has no earlier outputs (first
        discovery), when they are incomplete or not the ones discovery wrote (checked against the sources index), or
        when they were discovered from other inputs (a site policy input, or one of the engine's own
        C(NARWHAL_NODE_<n>_*)) than today's C(.env).
    type: list
    elements: str
    default: []
  lost_engines:
    description:
      - The engines of O(lost), by engine name, each the list of its lost inventory hosts.
      - When not given, the action plugin maps O(lost) to engines with the facts C(narwhal_engines) and
        C(narwhal_members); without them a lost host is the engine of its name, or a host O(members) lists.
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
- name: Write config/deployment.env, config/fleet.json and the launch records from the engines' facts
  narwhal.deploy.discovery_outputs:
    site: "{{ narwhal_site }}"
    engines: "{{ ansible_play_hosts_all }}"
    root: "{{ playbook_dir | dirname }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
table:
  description: One row per engine with engine, interface, address, url, attestation_url and role, and a kept
    engine's note.
  returned: success
  type: list
  elements: dict
  sample: [{"engine": "engine-1", "interface": "eth1", "address": "10.0.0.11", "url": "http://10.0.0.11:8000",
            "attestation_url": "http://10.0.0.11:8010/v1/attestation", "role": "prefill"},
           {"engine": "engine-2", "interface": "eth1", "address": "10.0.0.12", "url": "http://10.0.0.12:8000",
            "attestation_url": "http://10.0.0.12:8010/v1/attestation", "role": "decode",
            "note": "unreachable: kept its last record"}]
kept:
  description: >-
    The engines with a host unreachable in this run whose last record discovery kept, in fleet order; their rows of
    the table end with the note C(unreachable: kept its last record).
  returned: success
  type: list
  elements: str
  sample: ["engine-2"]
files:
  description: The output files of the set and whether each changed.
  returned: success
  type: dict
  sample: {"/srv/narwhal/config/deployment.env": false, "/srv/narwhal/config/fleet.json": true}
"""
