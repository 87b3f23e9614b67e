# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine's lifecycle settings, as the planner writes them (pure, standard library only): the KV lease (how long
a prefill keeps KV a decode has not read: NARWHAL_KV_LEASE_SECONDS, written under the name the image's vLLM reads)
and the graceful stop (`--shutdown-timeout`: NARWHAL_SHUTDOWN_TIMEOUT; the grace between Docker's SIGTERM and
SIGKILL; the warning for a prefill whose drain is shorter than its lease). Discovery, the planner and the launcher's
start read them from here. Every refusal raises PlanError(message, key) naming the record field or input."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import version_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import (
    LEASE_ENV,
    LEASE_EXTRA_KEY,
    LEASE_INPUT,
    LEASE_KEY_VERSION,
)

__metaclass__ = type

LEASE_MAX = 86400  # seconds; NARWHAL_KV_LEASE_SECONDS is 1..LEASE_MAX

SHUTDOWN_TIMEOUT_MAX = 3600  # seconds; NARWHAL_SHUTDOWN_TIMEOUT is 0..SHUTDOWN_TIMEOUT_MAX


# The lease vLLM applies when nothing sets it: 30 s from 0.22 (get_from_extra_config("kv_lease_duration", 30),
# 0.22.0 nixl/scheduler.py:72-76, 0.32.0 nixl/base_scheduler.py:82-88); 480 s up to 0.21 (0.21.0 vllm/envs.py:205,
# 1472-1474: VLLM_NIXL_ABORT_REQUEST_TIMEOUT, "480"); 120 before vLLM PR 25897 of 2025-09-29 (taken here as from
# 0.11; the release that first had 480 was not checked).
def default_lease(release):
    if tuple(release)[:2] >= LEASE_KEY_VERSION:
        return 30
    return 480 if tuple(release)[:2] >= (0, 11) else 120


# `vllm serve --shutdown-timeout N` ("Shutdown timeout in seconds. 0 = abort, >0 = wait", vLLM 0.32.0
# engine/arg_utils.py:1901-1906; present in 0.21.0 arg_utils.py:1472, added by vLLM PRs 34730/36666 for 0.18.0): on
# SIGTERM the API server asks EngineCore to drain, which keeps stepping until no request is left or N seconds
# passed, then aborts the rest (0.32.0 entrypoints/launchers/launcher.py:257-289, v1/engine/core.py:1625-1664).
SHUTDOWN_FLAG = "--shutdown-timeout"
SHUTDOWN_FLAG_VERSION = (0, 18)
DEFAULT_SHUTDOWN_TIMEOUT = 30  # NARWHAL_SHUTDOWN_TIMEOUT unset, on vLLM >= 0.18 (docs/inputs.md says why)

# After the drain, vLLM's worker processes get VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5, 0.32.0
# envs.py:253,1875-1878) to exit; the stop then waits STOP_MARGIN more before Docker's SIGKILL.
WORKER_SHUTDOWN_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
WORKER_SHUTDOWN_DEFAULT = 5
STOP_MARGIN = 10
LEGACY_STOP_GRACE = 30  # a container started without --shutdown-timeout: the grace every stop gave before


def _seconds(value, where, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError("%s=%r must be a whole number of seconds from %d to %d; %s" % (where, value, low, high, RERUN),
                        where)
    return value


def kv_lease(record):
    """-> None (vLLM's own lease: nothing written), or (name, seconds) with name `kv_lease_duration` (vLLM >= 0.22,
    in kv_connector_extra_config) or VLLM_NIXL_ABORT_REQUEST_TIMEOUT (<= 0.21, in the environment)."""
    runtime = record.get("runtime") or {}
    if runtime.get("kv_lease_seconds") is None:
        return None
    seconds = _seconds(runtime["kv_lease_seconds"], "launch record runtime.kv_lease_seconds", 1, LEASE_MAX)
    version = version_tuple(runtime.get("vllm_version", ""))
    return (LEASE_EXTRA_KEY if version[:2] >= LEASE_KEY_VERSION else LEASE_ENV), seconds


def effective_lease(record):
    """The seconds a prefill keeps unread KV: the record's lease, else the default of the image's vLLM."""
    lease = kv_lease(record)
    if lease is not None:
        return lease[1]
    return default_lease(version_tuple((record.get("runtime") or {}).get("vllm_version", "")))


def shutdown_timeout(record):
    """The record's runtime.shutdown_timeout (None: a record from before the input, no flag written). A vLLM
    older than 0.18 has no --shutdown-timeout: refused by name."""
    runtime = record.get("runtime") or {}
    if runtime.get("shutdown_timeout") is None:
        return None
    seconds = _seconds(runtime["shutdown_timeout"], "launch record runtime.shutdown_timeout", 0,
                       SHUTDOWN_TIMEOUT_MAX)
    version = version_tuple(runtime.get("vllm_version", ""))
    if version[:2] < SHUTDOWN_FLAG_VERSION:
        raise PlanError("launch record runtime.shutdown_timeout=%d but the image's vLLM %s has no %s (it exists from "
                        "vLLM 0.18); unset NARWHAL_SHUTDOWN_TIMEOUT or use an image with vLLM >= 0.18, then %s"
                        % (seconds, runtime.get("vllm_version"), SHUTDOWN_FLAG, RERUN), "NARWHAL_SHUTDOWN_TIMEOUT")
    return seconds


def stop_grace(command, environment=None):
    """The seconds between Docker's SIGTERM and SIGKILL for a container running `command` (its vllm serve
    arguments) with `environment` ({name: value}): --shutdown-timeout N + VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5
    unless set) + STOP_MARGIN; LEGACY_STOP_GRACE for a command without the flag (vLLM's default 0 aborts)."""
    drain = None
    words = [str(w) for w in command or []]
    for index, word in enumerate(words):
        value = words[index + 1] if word == SHUTDOWN_FLAG and index + 1 < len(words) else \
            word[len(SHUTDOWN_FLAG) + 1:] if word.startswith(SHUTDOWN_FLAG + "=") else None
        if value is not None and value.isdigit():
            drain = int(value)
    if drain is None:
        return LEGACY_STOP_GRACE
    worker = str((environment or {}).get(WORKER_SHUTDOWN_ENV, ""))
    return drain + (int(worker) if worker.isdigit() else WORKER_SHUTDOWN_DEFAULT) + STOP_MARGIN


def drain_warning(record):
    """For a prefill engine whose drain is shorter than its KV lease: the warning line, else None. Such a stop can
    end before every decode read the KV it was promised (a decode reading after that fails its request, HTTP 500
    with kv_load_failure_policy=fail); a warning, not a refusal: vLLM 0.21's 480 s lease would otherwise make every
    stop wait eight minutes."""
    if record.get("role") != "prefill":
        return None
    drain = shutdown_timeout(record)
    if drain is None:
        return None
    lease = effective_lease(record)
    if drain >= lease:
        return None
    source = "NARWHAL_KV_LEASE_SECONDS" if kv_lease(record) else "vLLM's default"
    return ("%s (prefill): NARWHAL_SHUTDOWN_TIMEOUT=%d is shorter than its KV lease of %d s (%s): a stop may end the "
            "drain before every decode has read the KV it was promised, and such a decode request fails; set "
            "NARWHAL_SHUTDOWN_TIMEOUT >= %d or a shorter %s"
            % (record.get("engine"), drain, lease, source, lease, LEASE_INPUT))
