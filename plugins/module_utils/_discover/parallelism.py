# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data and expert parallelism as discovery records them (pure): an engine's DP size and EP flag from
NARWHAL_DATA_PARALLEL_SIZE / NARWHAL_ENABLE_EXPERT_PARALLEL (or the node's), the hosts and DP ranks per host of an
engine across hosts (NARWHAL_NODE_<n>_HOSTS), and how many side-channel ports its ranks listen on."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings

__metaclass__ = type


# vLLM's default --data-parallel-rpc-port (ParallelConfig.data_parallel_rpc_port), the catalogue's default too
DP_RPC_PORT = 29550


def engine_parallelism(engine, n, node_policy, site, model, tp, gpus, sources):
    """-> (DP, EP) of one engine from NARWHAL_DATA_PARALLEL_SIZE / NARWHAL_ENABLE_EXPERT_PARALLEL (or the node's),
    EP refused for a dense checkpoint; `sources["parallelism"]` only when either is set, so the records of engines
    without them stay as they were."""
    settings = node_settings(site, node_policy, n)
    dp, ep = settings.get("data_parallel_size") or 1, bool(settings.get("enable_expert_parallel"))
    dp_key, ep_key = settings["inputs"]["data_parallel_size"], settings["inputs"]["enable_expert_parallel"]
    experts = model.get("num_experts") or 0
    if ep and not experts:
        raise InputError(ep_key, "is true but %s serves %s, a dense model (its config.json has no n_routed_experts, "
                                 "num_local_experts, num_experts or moe_num_experts): expert parallelism shards MoE "
                                 "experts only; set %s=false%s"
                         % (engine, model.get("path") or "the checkpoint", ep_key,
                            " (and NARWHAL_NODE_%d_ENABLE_EXPERT_PARALLEL=false if the site sets it)" % n
                            if ep_key == "NARWHAL_ENABLE_EXPERT_PARALLEL" else ""))
    if dp > 1 or ep:
        ranks = "%s=%d: %d data-parallel rank(s) of TP %d%s" % (
            dp_key, dp, dp, tp, " (%d GPUs: rank r on the r-th %d of gpu_ids)" % (len(gpus), tp) if gpus else "")
        sources["parallelism"] = ranks + ("; %s=true: expert parallelism over the %d routed experts of the "
                                          "checkpoint" % (ep_key, experts) if ep else "")
    return dp, ep


def side_channel_span(vllm_version, dp, tp):
    """How many consecutive side-channel ports an engine of `dp` ranks of TP `tp` listens on from
    VLLM_NIXL_SIDE_CHANNEL_PORT: from vLLM 0.14 one per DP rank (base + data_parallel_index, the global DP rank:
    0.32.0 nixl/base_scheduler.py:77-80, config/parallel.py:1029, v1/engine/core.py:1472); up to 0.11 one per
    worker (base + dp_rank * tp_size + tp_rank: vLLM PR 24249's nixl_connector_usage.md, the scheduler's
    base + data_parallel_rank * tensor_parallel_size)."""
    return dp if release_tuple(vllm_version) >= (0, 14, 0) else dp * tp


def local_ranks(site, node_policy, n):
    """(hosts, DP ranks per host) of node `n`: NARWHAL_NODE_<n>_HOSTS and the DP size / hosts (validate.py refuses
    a DP size that is not a multiple of the hosts)."""
    settings = node_settings(site, node_policy, n)
    hosts = settings.get("hosts") or 1
    return hosts, (settings.get("data_parallel_size") or 1) // hosts
