# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plan's identity (pure, standard library only): its hash (sha256 of the canonical JSON, which holds no key:
the same on the controller and the host) and the labels its container carries (the engine, the plan hash, the run
that created it), which the launcher's start, status and preview read back."""

from __future__ import annotations

import copy
import hashlib
import json

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import API_KEY_ENV, REDACTED

__metaclass__ = type


PLAN_HASH_LABEL = "org.narwhal.plan-hash"

ENGINE_LABEL = "org.narwhal.engine"

# In the plan (so in its hash): the sha256 of the key guard the engine runs and of the certificate it serves, so that
# a new guard or certificate replaces the engine (_plan/container.py)
GUARD_LABEL = "org.narwhal.guard-sha256"
TLS_CERT_LABEL = "org.narwhal.tls-cert-sha256"

# In the plan (so in its hash) when the record has runtime.model_manifest: the digest of the checkpoint's manifest
# (_deliver/manifest.py), so that new weights delivered to the hosts replace the engine (_plan/container.py)
MODEL_MANIFEST_LABEL = "org.narwhal.model-manifest"


# The run that created the container: set at create time next to the plan hash, never part of the plan (so the
# hash stays run-independent and an unchanged engine survives a new run); `status` reads it to say which run serves.
RUN_ID_LABEL = "org.narwhal.run-id"


def redacted(plan):
    """A copy of `plan` with a VLLM_API_KEY value shown as <redacted>. A plan of today carries none (VLLM_API_KEY
    empty: the key guard reads the key file, _plan/container.py), a plan before issue 36 carried the placeholder."""
    plan = copy.deepcopy(plan)
    if plan.get("environment", {}).get(API_KEY_ENV):
        plan["environment"][API_KEY_ENV] = REDACTED
    return plan


def plan_hash(plan):
    """sha256 of the canonical JSON of the plan (no key in it: a new key changes no plan), the same on the controller
    and host."""
    canonical = json.dumps(redacted(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def create_labels(plan, run_id=None, digest=None):
    """The container's labels: the plan's, the plan hash (`digest` when the caller has it), and the run that
    creates it (RUN_ID_LABEL, when given). The last two are added at create time, outside the hashed plan."""
    labels = dict(plan["labels"])
    labels[PLAN_HASH_LABEL] = digest or plan_hash(plan)
    if run_id:
        labels[RUN_ID_LABEL] = run_id
    return labels
