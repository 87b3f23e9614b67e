# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch policy: the `.env` inputs the launch records are built from, as discovery records them in
`engine-launch.policy.json`, and the check that records still match the current inputs (docs/vllm-requirements.md,
"Launch records": "correct the named input, regenerate, prepare a new run so the manifest records the corrected
state" only holds when prepare notices records older than their inputs).

Pure code: discovery (plugins/module_utils/_discover/outputs.py) writes `launch_policy(...)`; prepare
(plugins/module_utils/_prepare/run.py) verifies the written extract against the sources index and compares it
with `launch_policy(...)` of the current inputs.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import (
    events_on,
    events_port,
    hash_seed,
    role_policy,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME, POLICY_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS

__metaclass__ = type


# Site inputs the records (and the fleet) are derived from (NARWHAL_TLS: the scheme of the engines' URLs in
# deployment.env, _discover/fleet.py). Every per-node input (NARWHAL_NODE_<n>_*) of an engine is policy too. Inputs
# that prepare, install and launch read directly (paths, checkout, API key file, ready timeout) are not: they take
# effect without rerunning discovery.
POLICY_KEYS = ("NARWHAL_IMAGE", "NARWHAL_MODEL_PATH", "NARWHAL_SERVED_MODEL_NAME", "NARWHAL_MODEL_DTYPE",
               "NARWHAL_GPUS_PER_ENGINE", "NARWHAL_TP_SIZE", "NARWHAL_TRANSPORT", "NARWHAL_RDMA_DEVICES",
               "NARWHAL_KV_CACHE_DTYPE", "NARWHAL_KV_LOAD_FAILURE_POLICY", "NARWHAL_BLOCK_SIZE",
               "NARWHAL_SIDE_CHANNEL_PORT", "NARWHAL_EXTRA_ARGS", "NARWHAL_ENGINE_ARGS", "NARWHAL_ENGINE_ENV",
               "NARWHAL_EXPECTED_PACKAGES", "NARWHAL_BIND_FAMILY", "NARWHAL_FABRIC_INTERFACE", "NARWHAL_ENGINE_PORT",
               "NARWHAL_ATTEST_PORT", "NARWHAL_KV_LEASE_SECONDS", "NARWHAL_SHUTDOWN_TIMEOUT",
               "NARWHAL_DATA_PARALLEL_SIZE", "NARWHAL_ENABLE_EXPERT_PARALLEL", "NARWHAL_DATA_PARALLEL_RPC_PORT",
               "NARWHAL_TLS", "NARWHAL_LOG_DRIVER", "NARWHAL_LOG_MAX_SIZE", "NARWHAL_LOG_MAX_FILE")


# What the records take from the KV events inputs (_common/kv_events.py), recorded only while events are on (so the
# extract of a fleet without them stays as it was): whether they are on (NARWHAL_KV_EVENTS=on, or auto with a kv_aware
# prefill policy), their port and seed, and the prefill policy (kv_aware asks discovery for 16-token blocks).
KV_POLICY_KEYS = ("NARWHAL_KV_EVENTS", "NARWHAL_KV_EVENTS_PORT", "NARWHAL_KV_HASH_SEED",
                  "NARWHAL_ROUTER_PREFILL_POLICY")

RERUN = "rerun discovery (ansible-playbook narwhal.deploy.discover), then prepare a new run"

_NOT_RECORDED = object()
_KV_OFF = object()  # a KV_POLICY_KEYS entry of an extract without KV events
# Policy keys whose default writes nothing into a record (DP 1, EP off, the rendezvous port of engines across
# hosts): an extract written before such a key existed is unchanged while the key keeps its catalogue default.
_SILENT_DEFAULTS = dict((spec["name"], spec.get("default")) for spec in INPUTS if spec["name"] in (
    "NARWHAL_DATA_PARALLEL_SIZE", "NARWHAL_ENABLE_EXPERT_PARALLEL", "NARWHAL_DATA_PARALLEL_RPC_PORT"))


class StaleRecordsError(InputError):
    """Records older than their inputs; the message starts with the changed key (no `key:` prefix)."""

    def __init__(self, key, text):
        super().__init__(key, text)
        self.args = (redact_text(text),)  # the message without the `key:` prefix, still redacted


def launch_policy(inputs, engines):
    """-> {"site": {key: value for POLICY_KEYS}, "nodes": {engine: its NARWHAL_NODE_<n>_* inputs}}.

    `inputs` as load_inputs returns it (node numbers may be int or, through Ansible, str); `engines` the
    engine-<n> names, in the order the extract lists them."""
    site = inputs["site"]
    nodes = dict((int(n), v) for n, v in (inputs.get("nodes") or {}).items())
    return {"site": dict([(k, site.get(k)) for k in POLICY_KEYS] + list(kv_policy(site).items())),
            "nodes": dict((e, dict(nodes.get(_number(e), {}))) for e in engines)}


def kv_policy(site):
    """{KV_POLICY_KEYS: value} while KV events are on (NARWHAL_KV_EVENTS as "on" whether set so or auto, the prefill
    policy from NARWHAL_ROUTER_PREFILL_POLICY or else NARWHAL_ROUTER_POLICY), else {}."""
    if not events_on(site):
        return {}
    return {"NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_EVENTS_PORT": events_port(site),
            "NARWHAL_KV_HASH_SEED": int(hash_seed(site)),
            "NARWHAL_ROUTER_PREFILL_POLICY": role_policy(site, "prefill")[0]}


def _number(engine):
    m = ENGINE_NAME.match(engine or "")
    if not m:
        raise InputError(engine, "%r is not named engine-<n>; %s" % (engine, RERUN))
    return int(m.group(1))


def _plain(document):
    return json.loads(json.dumps(document))


def _blank(value):
    return value is None or value == "" or value == []


def _show(value):
    if value is _NOT_RECORDED:
        return "not recorded"
    if value is _KV_OFF:
        return "KV events off"
    if _blank(value):
        return "unset"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, str):
        return shlex.quote(value)
    return json.dumps(value)


def policy_changes(recorded, inputs):
    """-> [(key, recorded value, current value)] for every policy input whose current value differs from the one
    discovery recorded, site keys first (in POLICY_KEYS order), then per node; [] when the records match.

    The engines compared are those of the recorded extract plus any node the current inputs give a role (a new
    engine needs discovery too)."""
    recorded = _plain(recorded)
    engines = list(recorded.get("nodes") or {})
    for n, node in sorted((int(n), v) for n, v in (inputs.get("nodes") or {}).items()):
        if node.get("ROLE") and "engine-%d" % n not in engines:
            engines.append("engine-%d" % n)
    current = _plain(launch_policy(inputs, engines))
    changes = []
    site = recorded.get("site") or {}
    for key in POLICY_KEYS:
        before, after = site.get(key, _NOT_RECORDED), current["site"][key]
        if before is _NOT_RECORDED and after == _SILENT_DEFAULTS.get(key, _NOT_RECORDED):
            # an extract written before this key existed: its records were planned as with the key's default
            continue
        if before is _NOT_RECORDED or (before != after and not (_blank(before) and _blank(after))):
            changes.append((key, before, after))
    for key in KV_POLICY_KEYS:  # recorded only while events are on: absent is off
        before, after = site.get(key, _KV_OFF), current["site"].get(key, _KV_OFF)
        if before != after:
            changes.append((key, before, after))
    for engine in sorted(engines, key=_number):
        before_node = (recorded.get("nodes") or {}).get(engine) or {}
        after_node = current["nodes"][engine]
        for name in sorted(set(before_node) | set(after_node)):
            before, after = before_node.get(name), after_node.get(name)
            if before != after and not (_blank(before) and _blank(after)):
                changes.append(("NARWHAL_NODE_%d_%s" % (_number(engine), name), before, after))
    return changes


def check_policy(recorded, inputs, discovered=None):
    """Refuse records discovered from other policy inputs than the current ones, naming every changed key with
    both values. `discovered` says which discovery wrote the records (the launch config and its sha256 from the
    sources index; no timestamp: discovery writes byte-identical files for unchanged inputs)."""
    changes = policy_changes(recorded, inputs)
    if not changes:
        return
    text = "; ".join("%s changed since discovery (records: %s, .env now: %s)" % (key, _show(before), _show(after))
                     for key, before, after in changes)
    if discovered:
        text += "; the records (%s) were discovered from the old values" % discovered
    raise StaleRecordsError(changes[0][0], "%s; %s" % (text, RERUN))


def verify_extract(index, raw, index_path, extract_path):
    """The policy extract must be the one discovery indexed: its sha256 in the sources index. -> the extract."""
    fix = RERUN
    files = index.get("files") if isinstance(index, dict) else None
    expected = files.get(POLICY_FILE) if isinstance(files, dict) else None
    if not expected:
        raise InputError("NARWHAL_CONFIG_DIR", "the sources index %s lists no %s, so prepare cannot tell whether the "
                                               "records match .env; %s" % (index_path, POLICY_FILE, fix))
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected:
        raise InputError("NARWHAL_CONFIG_DIR", "the policy extract %s was changed after discovery (sha256 %s, the "
                                               "sources index %s records %s); %s"
                         % (extract_path, actual[:12], index_path, str(expected)[:12], fix))
    try:
        extract = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError("NARWHAL_CONFIG_DIR", "the policy extract %s is not JSON (%s); %s" % (extract_path, exc, fix))
    if not isinstance(extract, dict) or not isinstance(extract.get("site"), dict) \
            or not isinstance(extract.get("nodes"), dict):
        raise InputError("NARWHAL_CONFIG_DIR", "the policy extract %s has no site and nodes policy; %s"
                         % (extract_path, fix))
    return extract
