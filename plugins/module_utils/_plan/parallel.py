# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data and expert parallelism in the planner (pure): a record's DP size and EP flag, the `vllm serve` flags they
give, and the record as one host of an engine across hosts runs it (member_view, member_record: the host the role
environment names, with its own GPUs, devices, rails, address and side-channel ports). Every refusal raises
PlanError(message, key) naming the record field or role-environment key."""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError

__metaclass__ = type


def parallelism(record):
    """(data-parallel size, expert parallelism) of a record: `data_parallel_size` (present only above 1) and
    `enable_expert_parallel` (present only when true); a record without them is DP 1 without EP."""
    dp = record.get("data_parallel_size", 1)
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise PlanError("launch record data_parallel_size=%r must be a whole number >= 1; %s" % (dp, RERUN),
                        "data_parallel_size")
    ep = record.get("enable_expert_parallel", False)
    if not isinstance(ep, bool):
        raise PlanError("launch record enable_expert_parallel=%r must be true or false; %s" % (ep, RERUN),
                        "enable_expert_parallel")
    return dp, ep


def parallel_flags(record):
    """The vllm serve flags of data and expert parallelism, after --tensor-parallel-size: `--data-parallel-size N`
    for DP > 1 (vLLM starts N engine cores behind the one API port, each on TP consecutive GPUs of the visibility
    list: v1/engine/utils.py get_physical_gpu_ids_for_local_dp_rank) and `--enable-expert-parallel`; nothing for
    DP 1 without EP, so those commands (and plan hashes) stay as they were.

    A host of an engine across hosts (a member view, `member` set: member_record) adds where its ranks are and where
    they meet (vLLM docs/serving/data_parallel_deployment.md, "Multi-node"): `--data-parallel-size-local L
    --data-parallel-address <head> --data-parallel-rpc-port P` on every host, and on the hosts after the head
    `--data-parallel-start-rank k*L --headless` (engine cores only, no API server: 0.32.0 entrypoints/cli/serve.py
    run_headless)."""
    dp, ep = parallelism(record)
    flags = ["--data-parallel-size", str(dp)] if dp > 1 else []
    member = record.get("member")
    if member is not None:
        flags += ["--data-parallel-size-local", str(record["data_parallel_size_local"]),
                  "--data-parallel-address", member["head_address"],
                  "--data-parallel-rpc-port", str(record["data_parallel_rpc_port"])]
        if member["rank"]:
            flags += ["--data-parallel-start-rank", str(member["start_rank"]), "--headless"]
    return flags + (["--enable-expert-parallel"] if ep else [])


MEMBER_ENV = "NARWHAL_ENGINE_MEMBER"
# the fields of a record that a host after the head of an engine across hosts has of its own (`members[]`; the rest is
# the head's, the same on every host: _discover/members.py)
MEMBER_FIELDS = ("gpu_ids", "gpu_host_indices", "accelerator_devices", "transfer")
MEMBER_NODE_FIELDS = ("address", "fabric_interface", "side_channel_ports", "host_id")


def member_view(record, rank):
    """The record as host `rank` of its engine runs it: the head's record for rank 0 (or an engine on one host),
    else the head's record with that member's own fields (MEMBER_FIELDS, MEMBER_NODE_FIELDS) in their places and
    `member` = {rank, start_rank, head_address}; `members` is dropped from the view. Raises KeyError for a rank the
    record does not have."""
    members = record.get("members") or []
    view = dict((k, v) for k, v in record.items() if k != "members")
    if not rank:
        if members or "data_parallel_size_local" in record:
            view["member"] = {"rank": 0, "start_rank": 0, "head_address": record["node"]["address"]}
        return view
    entry = next((m for m in members if m.get("member") == rank), None)
    if entry is None:
        raise KeyError(rank)
    for field in MEMBER_FIELDS:
        view[field] = entry[field]
    view["node"] = dict(record["node"])
    for field in MEMBER_NODE_FIELDS:
        view["node"][field] = entry["node"][field]
    view["member"] = {"rank": rank, "start_rank": entry["data_parallel_start_rank"],
                      "head_address": record["node"]["address"]}
    return view


def member_record(record, role_env):
    """The record as this host runs it: for an engine across hosts (`members` in the record) the view of the host
    the role environment names (NARWHAL_ENGINE_MEMBER=k for the k-th host after the head, unset for the head:
    member_view); any other record as it is. A member the record does not have, or a member
    for a record of one host, is refused."""
    raw = role_env.get(MEMBER_ENV)
    if raw in (None, "") and not record.get("members") and "data_parallel_size_local" not in record:
        return record
    if raw not in (None, "") and not re.match(r"^[1-9][0-9]?\Z", str(raw)):
        raise PlanError("role env %s=%r must be the host's narwhal_rank 1 .. 99 (unset for the head); prepare a new "
                        "run" % (MEMBER_ENV, raw), MEMBER_ENV)
    rank = int(raw) if raw not in (None, "") else 0
    try:
        return member_view(record, rank)
    except KeyError:
        raise PlanError("role env %s=%d names host %d of %s but its launch record has %s; the record and the role "
                        "environment come from different runs or inventories: prepare a new run"
                        % (MEMBER_ENV, rank, rank, record.get("engine"),
                           "members 1 .. %d" % len(record.get("members") or []) if record.get("members")
                           else "no members (an engine on one host)"), MEMBER_ENV)


def local_parallel(record):
    """The DP ranks this host runs: data_parallel_size_local of a member view, else the record's DP size."""
    return record["data_parallel_size_local"] if record.get("member") is not None else parallelism(record)[0]
