# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery part 2, pure planning: one launch record per engine from host, image and model inspection
plus the launch policy in .env (docs/vllm-requirements.md, "Launch records" and "The runtime object"), and the `members`
of an engine across hosts. The record's parts come from their own files: the GPU allocation
(_discover/gpu_allocation.py), the transfer plan and RDMA rails (_discover/transfer.py), the packages, dtype, cache
plan, KV lease and drain (_discover/runtime.py), data and expert parallelism (_discover/parallelism.py), the extra
arguments and environment (_discover/engine_args.py); the planner then checks the whole record as the launcher
will (_plan/container.py).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.kv_events import (
    KV_AWARE,
    ROUTER_BLOCK_SIZE,
    events_port,
    record_field,
    role_policy,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.images import repo_digest
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.engine_args import (
    engine_args,
    engine_environment,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import check_own_ports
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.gpu_allocation import engine_allocation
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.members import (
    check_member,
    member_address,
    member_entry,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.parallelism import (
    DP_RPC_PORT,
    engine_parallelism,
    local_ranks,
    side_channel_span,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.runtime import (
    cache_pages,
    expected_packages,
    lifecycle_fields,
    log_fields,
    resolve_dtype,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.transfer import transfer_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import record_geometry
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import VISIBILITY_BY_VENDOR
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import role_environment

__metaclass__ = type


def build_record(node, site, node_policy, host, image, model, fleet_entry, taken, side_port, kv_port=None):
    """One engine's launch record. `host` = {"gpus": narwhal_gpus, "rdma": narwhal_rdma}; `taken` = GPUs of
    engines already placed on this physical host (mutated); `kv_port`: its first KV events port (the plan of
    _discover/outputs.py), used while KV events are on. The refusals come in this order: allocation, transfer,
    packages, dtype, cache pages, extra arguments, environment, KV events, then the planner's own."""
    engine, n = node["engine"], node["n"]
    platform = image.get("platform")
    image_key = node_settings(site, node_policy, n)["inputs"]["image"]
    sources = {}
    vendor, gpus, gpu_ids, reason_vis, tp, accelerator_devices = engine_allocation(
        engine, n, node_policy, site, host, image, image_key, taken, sources)
    transfer, kv_buffer_device = transfer_plan(engine, n, node, node_policy, site, host, gpus, platform, image_key,
                                               sources)
    expected, nixl = expected_packages(engine, site, image, image_key)
    dp, ep = engine_parallelism(engine, n, node_policy, site, model, tp, gpus, sources)
    model_dtype = resolve_dtype(site, model)
    pages = cache_pages(engine, site, image, model, tp, model_dtype)
    extra_args, sources["extra_args"] = engine_args(n, node_policy, site, model)
    environment = engine_environment(n, node_policy, site, image, sources)
    derived_env = {}
    if model.get("ssm_conv_state"):
        derived_env["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
    vllm_version = image["distributions"]["vllm"]
    lifecycle = lifecycle_fields(engine, site, vllm_version, sources)
    hosts, local = local_ranks(site, node_policy, n)
    span = side_channel_span(vllm_version, local, tp)  # the head's own ranks (all of them on one host)
    served = site.get("NARWHAL_SERVED_MODEL_NAME") or site["NARWHAL_MODEL_PATH"].rstrip("/").rsplit("/", 1)[-1]
    record = {
        "engine": engine,
        "iid": fleet_entry["iid"],
        "role": node["role"],
        "accelerator": {"vendor": vendor, "product": gpus[0].get("name") if gpus else "cpu", "count": len(gpus)},
        "gpu_ids": gpu_ids,
        "gpu_host_indices": [g["index"] for g in gpus],
        "tensor_parallel_size": tp,
        "gpu_visibility_env": VISIBILITY_BY_VENDOR.get(vendor),
        "accelerator_devices": accelerator_devices,
        "network_mode": "host",
        "transfer": transfer,
        "node": {"address": node["address"], "bind_family": site["NARWHAL_BIND_FAMILY"],
                 "engine_port": node["engine_port"], "attest_port": node["attest_port"],
                 "fabric_interface": node["interface"], "side_channel_port": side_port,
                 "side_channel_ports": [side_port, side_port + span - 1], "host_id": node["host_id"]},
        "runtime": {
            "image": image.get("image"),
            "image_id": image.get("id"),
            **_image_digest(image),
            "platform": platform,
            "vllm_version": vllm_version,
            "nixl_distribution": nixl,
            "kv_buffer_device": kv_buffer_device,
            "kv_load_failure_policy": site.get("NARWHAL_KV_LOAD_FAILURE_POLICY") or "fail",
            "expected_packages": expected,
            "model_path": site["NARWHAL_MODEL_PATH"],
            "served_model_name": served,
            "model_dtype": model_dtype,
            "kv_cache_dtype": site["NARWHAL_KV_CACHE_DTYPE"],
            "block_size": site["NARWHAL_BLOCK_SIZE"],
            "cache_plan": pages,
            "environment": environment,
            "derived_environment": derived_env,
            "extra_args": extra_args,
            "trust_remote_code": bool(model.get("trust_remote_code")),
            "ssm_conv_state": bool(model.get("ssm_conv_state")),
            "model_geometry": record_geometry(model.get("kv_geometry")),
        },
        "sources": dict(sources, visibility=reason_vis),
    }
    if model.get("manifest"):  # the deliver stage's STAMP (_facts/checkpoint.py::read_stamp); none: as before
        record["runtime"]["model_manifest"] = model["manifest"]["digest"]
    record["runtime"].update(lifecycle)
    record["runtime"]["log"] = log_fields(site)
    if dp > 1 or ep:
        record = _with_parallelism(record, node, site, dp, ep, hosts, local)
    record = _with_kv_events(record, site, kv_port)
    check_own_ports(record, node_settings(site, node_policy, n)["inputs"])  # its side channel and RPC port on its own
    _refused_by_the_planner(record, site, engine)
    return record, span


def _image_digest(image):
    """{"image_digest": the image's RepoDigest of its reference's repository} when it has one (pulled from a
    registry), else {} (a locally built or loaded image: the record stays as it was; docs/launch-record.md)."""
    digest = repo_digest(image.get("image"), image.get("repo_digests"))
    return {"image_digest": digest} if digest else {}


def _with_parallelism(record, node, site, dp, ep, hosts, local):
    """The record with its DP size and EP flag (and, for an engine across hosts, the ranks of each host and where
    they meet the head) after tensor_parallel_size: only for an engine that has them, and in this place, so that
    other records stay byte for byte."""
    extra = ([("data_parallel_size", dp)] if dp > 1 else []) + ([("enable_expert_parallel", True)] if ep else [])
    if hosts > 1:  # an engine across hosts: the ranks of each host and where they meet the head
        rpc = site.get("NARWHAL_DATA_PARALLEL_RPC_PORT") or DP_RPC_PORT
        extra[1:1] = [("data_parallel_size_local", local), ("data_parallel_rpc_port", rpc)]
        record["sources"]["parallelism"] += (
            "; NARWHAL_NODE_%d_HOSTS=%d: %d rank(s) on each host, the head (%s) serving the HTTP API and meeting "
            "the others on %s:%d (NARWHAL_DATA_PARALLEL_RPC_PORT)"
            % (node["n"], hosts, local, node["address"], node["address"], rpc))
    items = list(record.items())
    at = [k for k, _v in items].index("tensor_parallel_size") + 1
    return dict(items[:at] + extra + items[at:])


def _with_kv_events(record, site, port):
    """The record with `kv_events` (_common/kv_events.py::record_field) before `sources` while KV events are on, else
    as it was (byte for byte). A prefill engine under a kv_aware prefill policy must use the router's block size."""
    field = record_field(site, port if port is not None else events_port(site))
    if field is None:
        return record
    _check_router_block_size(record, site)
    sources = record.pop("sources")
    record["kv_events"] = field
    record["sources"] = sources
    record["sources"]["kv_events"] = ("NARWHAL_KV_EVENTS=%s, port %d (NARWHAL_KV_EVENTS_PORT and the engines before it "
                                      "on its host) + the data-parallel rank, PYTHONHASHSEED=%s (NARWHAL_KV_HASH_SEED)"
                                      % (site.get("NARWHAL_KV_EVENTS") or "auto", field["port"], field["hash_seed"]))
    return record


def _check_router_block_size(record, site):
    """vllm-router 0.1.17 reads static KV event sources (--pd-kv-events) as 16-token blocks: a prefill engine whose
    blocks are another size (runtime.cache_plan.block_size: what vLLM will use, raised for hybrid models; the
    planner always passes --block-size, so vLLM's CPU default of 128 for an unset size, platforms/cpu.py, never
    applies) is refused under a kv_aware prefill policy, naming the input to change."""
    policy, key = role_policy(site, "prefill")
    runtime = record["runtime"]
    block, requested = runtime["cache_plan"]["block_size"], runtime["block_size"]
    if record["role"] != "prefill" or policy != KV_AWARE or block == ROUTER_BLOCK_SIZE:
        return
    if runtime.get("platform") == "cpu":
        fix = ("a CPU image's attention backend takes only multiples of 32 tokens (NARWHAL_BLOCK_SIZE), so no CPU "
               "prefill engine can serve kv_aware: pick another prefill policy (%s=cache_aware)" % key)
    elif block != requested:
        fix = ("vLLM raises this model's block from NARWHAL_BLOCK_SIZE=%d to %d (%s), so kv_aware cannot serve it: "
               "pick another prefill policy (%s=cache_aware)"
               % (requested, block, "; ".join(runtime["cache_plan"].get("notes") or []) or "its cache plan", key))
    else:
        key, fix = "NARWHAL_BLOCK_SIZE", ("set NARWHAL_BLOCK_SIZE=16, or pick another prefill policy (%s=cache_aware)"
                                          % key)
    raise InputError(key, "prefill engine %s uses KV blocks of %d tokens (runtime.cache_plan.block_size) under the "
                          "kv_aware prefill policy, but vllm-router 0.1.17 reads the engines' KV events as 16-token "
                          "blocks (--pd-kv-events: \"Block size is 16\"), so it would match no prefix; %s, then rerun "
                          "discovery" % (record["engine"], block, fix))


def _refused_by_the_planner(record, site, engine):
    """Refuse now what the launcher would refuse at start: the same planner, on a provisional role environment.
    (The launcher's record check, _outputs/schemas.py::check_record, runs on the finished document in
    _discover/outputs.py, once `sources` is complete.)"""
    try:
        container_spec(record, role_environment(
            record, site.get("NARWHAL_ENGINE_CHECKOUT") or "/opt/narwhal", "run-discovery"))
    except PlanError as exc:
        raise InputError(exc.key if str(exc.key).startswith("NARWHAL_") else engine,
                         "the launcher would refuse the record of %s: %s" % (engine, exc))


def build_members(node, site, node_policy, record, head, spread, taken_on, span):
    """The `members` of the record of an engine across hosts: one entry per host after the head, in narwhal_rank
    order (`spread`: [{host, interface, inspection}] as discovery gathered them; `head`: the head's inspection;
    `taken_on(host_id)`: the GPUs already given on that host, {index: engine}, mutated; `span`: the side-channel
    ports of one host's ranks). The image, GPUs and checkpoint of each host are checked against the head's."""
    engine, n = node["engine"], node["n"]
    settings = node_settings(site, node_policy, n)
    image_key, interface_key = settings["inputs"]["image"], settings["inputs"]["fabric_interface"]
    image = head.get("image") or {}
    local = local_ranks(site, node_policy, n)[1]
    entries = []
    for rank, found in enumerate(spread, 1):
        host, facts = found["host"], found.get("inspection") or {}
        check_member(engine, engine, head, host, facts, image_key)
        interface = settings["fabric_interface"]
        interface_facts = found.get("interface") or {}
        address = member_address(n, host, interface, interface_facts, site["NARWHAL_BIND_FAMILY"], interface_key)
        sources = {}
        taken = taken_on(interface_facts.get("host_id") or host)
        allocation = engine_allocation(engine, n, node_policy, site, facts, image, image_key, taken, sources)
        transfer, _device = transfer_plan(engine, n, {"interface": interface}, node_policy, site, facts,
                                          allocation[1], image.get("platform"), image_key, sources)
        entries.append(member_entry(engine, n, rank, local, record, host,
                                    (address, interface, interface_facts.get("host_id") or host), allocation,
                                    transfer, span, sources))
    return entries
