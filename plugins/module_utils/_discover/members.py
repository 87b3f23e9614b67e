# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery, pure planning: the hosts of an engine across hosts (NARWHAL_NODE_<n>_HOSTS > 1; docs/vllm-requirements.md,
"Engines across hosts").

vLLM runs such an engine as one head and headless workers (vLLM docs/serving/data_parallel_deployment.md; 0.32.0
entrypoints/cli/serve.py run_headless): every host runs --data-parallel-size-local of the engine's DP ranks, the
head (narwhal_rank 0) ranks 0 .. L-1 and the HTTP API, the host of narwhal_rank k the ranks k*L .. (k+1)*L-1
(--data-parallel-start-rank k*L), and all meet the head at --data-parallel-address:--data-parallel-rpc-port. Each
host's ranks have their own NIXL agents with side channels on that host's address, at base + global rank (vLLM 0.32.0
nixl/base_scheduler.py:77-80).

The record of such an engine is the head's record (what the head runs) plus `members`, one entry per other host with
what differs there: its GPUs, devices, rails, fabric address and side-channel ports. The image, the GPU product and
count and the checkpoint must be the same on every host (its manifest too, when the deliver stage stamped it):
anything else is refused by name here.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import INSPECTION_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import STAMP, describe_difference
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import USABLE_OPERSTATES, select_address
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import record_geometry

__metaclass__ = type


def member_inspection(engine, rank):
    """The name of the inspection extract of host `rank` of an engine across hosts (rank 0: the engine's own)."""
    return INSPECTION_FILE % (engine if not rank else "%s.member-%d" % (engine, rank))


def member_address(n, host, interface, facts, family, key):
    """The fabric address of a member host: the one usable global address of the bind family on the engine's
    fabric interface (NARWHAL_NODE_<n>_IP names the head's only)."""
    facts = dict(facts or {})
    state = str(facts.get("operstate") or "").upper()
    if state and state not in USABLE_OPERSTATES:
        raise InputError(key, "interface %s on host %s (a host of engine-%d) is down (ip reports operstate %s), so its "
                              "addresses carry no traffic; bring the link up or choose another interface, then rerun "
                              "discovery" % (interface, host, n, facts["operstate"]))
    facts["per_node"] = key != "NARWHAL_FABRIC_INTERFACE"
    return select_address(n, host, interface, facts, family)


def _same(engine, what, key, head_host, head_value, host, value, fix):
    if value != head_value:
        raise InputError(key, "the hosts of %s differ in %s: its head %s has %s, %s has %s; every host of an engine "
                              "across hosts runs the same engine: %s" % (engine, what, head_host, head_value, host,
                                                                         value, fix))


def check_member(engine, head_host, head, host, facts, image_key):
    """Refuse a member host whose image, GPUs or checkpoint differ from the head's (`head`, `facts`: the
    inspections {gpus, rdma, image, model} of the head and of the member)."""
    head_image, image = head.get("image") or {}, facts.get("image") or {}
    _same(engine, "the engine image (ID)", image_key, head_host, head_image.get("id"), host, image.get("id"),
          "pull the same image (%s) on every host of the engine, or set %s to an image ID every host has"
          % (head_image.get("image"), image_key))
    _same(engine, "the image's packages", image_key, head_host, head_image.get("distributions"), host,
          image.get("distributions"), "pull the same image on every host of the engine")
    head_model, model = head.get("model") or {}, facts.get("model") or {}
    _same(engine, "the checkpoint's geometry (config.json of NARWHAL_MODEL_PATH)", "NARWHAL_MODEL_PATH", head_host,
          record_geometry(head_model.get("kv_geometry")), host, record_geometry(model.get("kv_geometry")),
          "copy the same checkpoint to NARWHAL_MODEL_PATH on every host of the engine")
    _same(engine, "the checkpoint's dtype", "NARWHAL_MODEL_PATH", head_host, head_model.get("dtype"), host,
          model.get("dtype"), "copy the same checkpoint to NARWHAL_MODEL_PATH on every host of the engine")
    check_member_manifest(engine, head_host, head_model.get("manifest"), host, model.get("manifest"))


def check_member_manifest(engine, head_host, head, host, found):
    """Refuse a member host whose checkpoint manifest (the deliver stage's STAMP: narwhal_model.manifest, {digest,
    files} or None) is not the head's, naming both digests and the files that differ (_deliver/manifest.py)."""
    digest, other = (head or {}).get("digest"), (found or {}).get("digest")
    if digest == other:
        return
    if digest and other:
        what = "files that differ: %s" % describe_difference(head["files"], found["files"])
    else:
        what = "%s holds no manifest (%s)" % (head_host if other else host, STAMP)
    raise InputError("NARWHAL_MODEL_PATH", "the hosts of %s differ in the checkpoint's manifest (%s of "
                                           "NARWHAL_MODEL_PATH): its head %s has %s, %s has %s; %s; every host of an "
                                           "engine across hosts serves the same weights: run the deliver stage "
                                           "(NARWHAL_MODEL_SOURCE) so every host holds the source's checkpoint, then "
                                           "rerun discovery (ansible-playbook narwhal.deploy.site)"
                     % (engine, STAMP, head_host, digest or "none", host, other or "none", what))


def member_entry(engine, n, rank, local, record, host, where, allocation, transfer, span, sources):
    """One entry of a record's `members`: what host `host` (narwhal_rank `rank`) runs of the engine.
    `where` = (address, fabric interface, host_id) of the host; `allocation` = (vendor, gpus, gpu_ids, reason, tp,
    accelerator_devices) of _discover/gpu_allocation.py::engine_allocation; `span`: the side-channel ports of one
    host's ranks."""
    address, interface, host_id = where
    vendor, gpus, gpu_ids, reason_vis, _tp, accelerator_devices = allocation
    head = record["accelerator"]
    product = gpus[0].get("name") if gpus else "cpu"
    if (vendor, product, len(gpus)) != (head["vendor"], head["product"], head["count"]):
        raise InputError("NARWHAL_NODE_%d_HOSTS" % n,
                         "the hosts of %s differ in their GPUs: its head has %d x %s (%s), %s (narwhal_rank %d) was "
                         "given %d x %s (%s); every host of an engine across hosts needs the same GPUs, as many on "
                         "each: set NARWHAL_GPUS_PER_ENGINE (or NARWHAL_NODE_%d_GPU_IDS) so each host gives the same, "
                         "or use hosts of one GPU product" % (engine, head["count"], head["product"], head["vendor"],
                                                              host, rank, len(gpus), product, vendor, n))
    first = record["node"]["side_channel_port"] + rank * span
    return {
        "member": rank,
        "host": host,
        "data_parallel_start_rank": rank * local,
        "gpu_ids": gpu_ids,
        "gpu_host_indices": [g["index"] for g in gpus],
        "accelerator_devices": accelerator_devices,
        "transfer": transfer,
        "node": {"address": address, "fabric_interface": interface, "side_channel_ports": [first, first + span - 1],
                 "host_id": host_id},
        "sources": dict(sources, visibility=reason_vis,
                        host={"file": member_inspection(engine, rank), "pointer": "/host"}),
    }
