#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/prepare_run.py does the work in the
# controller's process, with the step plugins/module_utils/_prepare/run.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: prepare_run
short_description: Validate the assigned launch records and write a prepared run under runs/
version_added: 0.1.0
description:
  - Runs on the controller, inside the controller's Ansible process (an action plugin, no module process).
  - Loads the fleet and the launch config, refuses records older than their inputs (the launch policy discovery
    recorded in C(engine-launch.policy.json), verified against the sha256 in C(engine-launch.sources.json), must
    equal the policy of the current site inputs; every changed input is named with both values), validates the
    documents against their schemas, checks that every engine in the play has a record, and applies the
    prefill/decode compatibility gate (every pair must pass vLLM's NIXL handshake as predicted from the records,
    i.e. the factors of its compatibility hash such as vLLM version, model, dtype, KV geometry, attention backend
    and KV cache dtype, and its checks of block size, TP ratio and KV layout) and the shared-host gate (no
    overlapping GPUs, HTTP, attestation or side-channel ports).
  - Who gets in - every engine's role environment names the address it binds (C(NARWHAL_ENGINE_BIND), else its
    advertised address), the key guard (its sha256) and, with TLS (O(tls)), its certificate; a mode of O(tls) that
    is not C(NARWHAL_TLS), or an engine host without a certificate in it, is refused before anything is created.
  - With O(stage=validate) it only returns the records and the derived values. With O(stage=write) it also compares
    each record with the current host inspection (stale records are refused), checks the API key file, and only
    then creates C(runs/<run-id>/) with the manifest, each engine's record copy, role environment and derived
    environment, and the launcher snapshot with its sha256.
  - The run ID is a hash of what was prepared, so preparing unchanged inputs again changes nothing.
  - The fleet and the launch config are read under discovery's lock of C(NARWHAL_CONFIG_DIR), after completing
    an interrupted discovery write. The run is written under a lock of C(NARWHAL_RUNS_DIR) (a second prepare waits
    up to 60 s, then is refused naming the lock and its holder); a new run directory is built next to its place and
    renamed into it, so it appears complete or not at all; a full disk or a permission problem is refused naming
    the file (see docs/outputs.md).
  - Before reading anything, refuses a run directory (C(NARWHAL_RUNS_DIR)) or input path that collides with
    another output or input, or a run directory inside the checkout that git does not ignore.
  - The application revision comes from C(git rev-parse HEAD) and C(git status) in O(root); each git command may
    take 60 seconds, a git that does not answer by then is killed and fails the module naming it.
options:
  site:
    description: The validated inputs, as returned by M(narwhal.deploy.site_inputs).
    type: dict
    required: true
  engines:
    description: The engines of the play (C(engine-<n>)).
    type: list
    elements: str
    required: true
  root:
    description: Checkout directory that relative paths are relative to.
    type: path
    required: true
  collection:
    description:
      - Root of the narwhal.deploy collection. The launcher snapshot (one zipapp, C(launch_engine.pyz)) is built
        deterministically from its C(roles/install/files/launcher) parts and the planner in
        C(plugins/module_utils); its sha256 is the launcher digest.
    type: path
    required: true
  stage:
    description: C(validate) validates and derives only; C(write) also checks the host inspection and writes the run.
    type: str
    choices: [validate, write]
    default: validate
  hosts:
    description:
      - Current inspection per engine for O(stage=write), each with C(gpus) (M(narwhal.deploy.gpu_facts)),
        C(interface) (the C(narwhal_interface) fact M(narwhal.deploy.engine_prereqs) returns, shaped as
        M(narwhal.deploy.interface_facts) returns it) and C(image_id) (M(narwhal.deploy.engine_prereqs)).
      - When not given with O(stage=write), read from each engine's host variables C(narwhal_gpus),
        C(narwhal_interface) and the C(image_id) of C(prepare_prereqs) (the result of
        M(narwhal.deploy.engine_prereqs) registered under that name, as the prepare role does).
      - The other hosts of an engine across hosts are keyed C(<engine>#<k>) (C(k) its C(narwhal_rank)); each is
        compared with its host's own part of the record (C(members)).
    type: dict
    default: {}
  from_run:
    description:
      - Prepare a new run from an earlier one (a relaunch, e.g. a rollback) instead of the current fleet and launch
        config. Its manifest, record copies, role environments and launcher snapshot are read from
        C(<NARWHAL_RUNS_DIR>/<from_run>/) and checked against the manifest's own digests; every engine of the play
        must be in it. The schema, the prefill/decode compatibility gate, the shared-host gate, the API key file and
        (O(stage=write)) the host inspection are applied; the check against the current C(.env) launch policy is
        not (the point of a rollback). The launcher snapshot is reused byte for byte (same sha256), the manifest
        records C(relaunched_from), and the return values have the shape of a normal prepare.
    type: str
  tls:
    description:
      - The result of M(narwhal.deploy.tls_material) for the engine hosts of the play (the prepare role runs it first
        and passes it) - C(mode) (C(site), C(operator) or C(off)), C(ca) (the controller path of the CA certificate)
        and C(hosts), per inventory host C({cert, key, sha256, not_after, days_left, names}).
      - Its C(mode) must be C(NARWHAL_TLS); without it C(NARWHAL_TLS) must be C(off). With TLS each engine's role
        environment names its TLS directory C(<checkout>/tls/<engine>) and the sha256 of the certificate of the
        inventory host that runs it (the head's, for an engine across hosts), so a new certificate is a new run and
        replaces the engine; C(install_sources) names the controller files install copies there. Every engine binds
        C(NARWHAL_ENGINE_BIND) (empty - its advertised address) and runs the key guard whether TLS is on or off.
    type: dict
  engine_hosts:
    description:
      - The inventory host that runs each engine, by engine name (the head for an engine across hosts), to find its
        certificate in O(tls). An engine not in it is run by the host of its name.
      - When not given, read from the facts C(narwhal_engines) and C(narwhal_members) of the opening play.
    type: dict
    default: {}
attributes:
  check_mode:
    description: Validates and reports the run that would be written, writes nothing.
  diff_mode:
    description: Lists the files of a new run.
  idempotent:
    description: Unchanged inputs give the same run ID and change nothing.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.writer
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Relaunch an earlier run's records and launcher (a rollback), as a new run
  narwhal.deploy.prepare_run:
    site: "{{ narwhal_site }}"
    engines: "{{ ansible_play_hosts_all }}"
    root: "{{ playbook_dir | dirname }}"
    collection: "{{ playbook_dir | dirname }}"
    from_run: run-3f2a9c0d1e4b
  delegate_to: localhost
  run_once: true

- name: Validate first
  narwhal.deploy.prepare_run:
    site: "{{ narwhal_site }}"
    engines: "{{ ansible_play_hosts_all }}"
    root: "{{ playbook_dir | dirname }}"
    collection: "{{ playbook_dir | dirname }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
run_id:
  description: The run ID (a hash of what was prepared).
  returned: success
  type: str
  sample: run-3f2a9c0d1e4b
run_dir:
  description: The controller's run directory.
  returned: stage is write
  type: str
  sample: /srv/narwhal/runs/run-3f2a9c0d1e4b
records:
  description: The records of the engines in the play, by engine name.
  returned: success
  type: dict
derived:
  description: Per engine, C(environment), C(vllm_args), C(role_env) and the install C(paths) on the engine host.
  returned: success
  type: dict
launcher_sha256:
  description: sha256 of the launcher snapshot (with O(from_run), the earlier run's).
  returned: success
  type: str
role_env_texts:
  description:
    - Per engine, the text of each host's role environment as the write stage writes it, by C(narwhal_rank) as a
      string (C("0") the head, C("<k>") the other hosts of an engine across hosts). The prepare role builds
      install's wanted list from it before the write, so that the host checks also read what install would write.
  returned: success
  type: dict
  sample: {"engine-1": {"0": "# Role environment of engine-1, written by narwhal.deploy prepare/install...\n"}}
install_sources:
  description:
    - Per engine and C(narwhal_rank) (as a string, like C(role_env_texts)), what install takes from the controller
      besides the run - C(guard_sha256), the sha256 of the key guard (C(roles/install/files/guard/narwhal_guard.py)),
      and C(tls), C({cert, key, ca}), the controller files of the engine's certificate, key and CA (null when TLS is
      off, and for the hosts after the head of an engine across hosts, which serve no HTTP). The filter
      C(narwhal.deploy.install_plan) takes it as its C(sources).
  returned: success
  type: dict
  sample: {"engine-1": {"0": {"guard_sha256": "3f1c...", "tls": {"cert": "/srv/p/config/tls/hosts/engine-1.crt",
           "key": "/srv/p/config/tls/hosts/engine-1.key", "ca": "/srv/p/config/tls/ca.crt"}}}}
manifest:
  description: The run's manifest; with O(from_run) it has C(relaunched_from) (the earlier run ID) and the earlier
    run's C(inputs).
  returned: stage is write
  type: dict
"""
