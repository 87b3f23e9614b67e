# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Launch records (plugins/module_utils/_discover/records.py, collect_records of _discover/outputs.py) built
from the real fact producers (GPU / RDMA / image / model facts over
real captures and the simulated sysfs trees), their schema, and the discovery_outputs writer end to end. The builders:
tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
from test_support.paths import REAL, REPO
from test_support.records import (
    AMD_SYS,
    BASE,
    CUDA_DISTS,
    IMAGE_ID,
    ROCM_DISTS,
    ROCM_ENV,
    amd,
    build,
    host,
    image,
    interfaces,
    model,
    module_args,
    nv_pair,
    nvidia,
    rdma,
    rdma_pair,
    snapshot,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import policy_changes
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.records import build_record, choose_rdma
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import host as _host
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    FLEET_SCHEMA,
    LAUNCH_CONFIG_SCHEMA,
    RECORD_SCHEMA,
    validation_errors,
)

V100S_UUIDS = [
    "GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e",
    "GPU-bbf7a241-bf9a-eb90-b2fb-d213294faf48",
    "GPU-8f75e71c-23dd-a060-d997-4caf592954db",
    "GPU-3181eb56-505c-8214-ba05-c132f68f89b8",
    "GPU-2aa87d54-d4ff-2900-812b-1a4b7e119583",
    "GPU-39c3a168-9034-0b5a-223a-1042f30a9242",
    "GPU-d2446f91-171e-1b54-515d-9d9b03484ddf",
    "GPU-1d955959-c95b-4f40-2cac-100d3006ffe2",
]


# ------------------------------------------------------------------------------------------------
# small fact builders over the real producers


def refused(extra, hosts, shared=True):
    with pytest.raises(InputError) as err:
        build(extra, hosts, shared)
    return err.value


# ------------------------------------------------------------------------------------------------
# 1. allocation


def test_gpus_per_engine_splits_one_host(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1, 2, 3]
    assert recs["engine-2"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-1"]["tensor_parallel_size"] == 4 and recs["engine-2"]["tensor_parallel_size"] == 4
    assert recs["engine-2"]["accelerator"] == {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4}
    assert "lowest free" in recs["engine-2"]["sources"]["allocation"]


def test_explicit_gpu_ids(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_1_GPU_IDS": "4,5,6,7"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-1"]["sources"]["allocation"] == "NARWHAL_NODE_1_GPU_IDS=4,5,6,7"
    assert recs["engine-2"]["gpu_host_indices"] == [0, 1, 2, 3]


def test_separate_hosts_each_start_at_zero(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2"}, nv_pair(tmp_path), shared=False)
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1] and recs["engine-2"]["gpu_host_indices"] == [0, 1]


def test_overlapping_gpu_ids_name_key_and_other_engine(tmp_path, dev):
    err = refused({"NARWHAL_NODE_1_GPU_IDS": "2,3", "NARWHAL_NODE_2_GPU_IDS": "3,4"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_GPU_IDS"
    assert "engine-1" in str(err) and "GPU 3" in str(err)


def test_explicit_ids_of_a_later_engine_are_reserved(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_GPU_IDS": "0,1,2,3"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-2"]["gpu_host_indices"] == [0, 1, 2, 3]


def test_nonexistent_gpu_index(tmp_path, dev):
    err = refused({"NARWHAL_NODE_1_GPU_IDS": "7,8"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_GPU_IDS" and "GPU index 8 does not exist" in str(err)


def test_fewer_free_gpus_than_requested(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "5"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_GPUS_PER_ENGINE"
    assert "engine-2 needs 5 GPU(s) but its host has only 3 free" in str(err) and "engine-1" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "9"}, nv_pair(tmp_path), shared=False)
    assert err.key == "NARWHAL_GPUS_PER_ENGINE" and "engine-1 needs 9" in str(err)


def test_all_gpus_for_the_first_engine_leaves_none(tmp_path, dev):
    err = refused({}, nv_pair(tmp_path))  # default NARWHAL_GPUS_PER_ENGINE=all
    assert err.key == "NARWHAL_GPUS_PER_ENGINE" and "engine-1" in str(err)


def test_no_gpus_with_cuda_image_names_engine(tmp_path, dev):
    hosts = nv_pair(tmp_path)
    hosts["engine-2"] = host(_gpu.empty_facts("nvidia-smi"), tmp_path)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, hosts, shared=False)
    assert err.key == "engine-2" and "no GPU was found on engine-2" in str(err)


def test_tp_must_match_gpu_count(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_TP_SIZE" and "4 GPU(s)" in str(err)
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_TP_SIZE": "2"}, nv_pair(tmp_path))
    assert recs["engine-2"]["tensor_parallel_size"] == 2


# ------------------------------------------------------------------------------------------------
# 2. visibility


def test_nvidia_engine_on_gpus_4_to_7_uses_their_uuids(tmp_path, dev):
    (dev / "nvidia-uvm-tools").write_text("")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    second = recs["engine-2"]
    assert second["gpu_ids"] == V100S_UUIDS[4:]
    assert second["gpu_host_indices"] == [4, 5, 6, 7]
    assert second["gpu_visibility_env"] == "CUDA_VISIBLE_DEVICES"
    assert second["accelerator_devices"] == ["/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7",
                                             "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert recs["engine-1"]["gpu_ids"] == V100S_UUIDS[:4]
    assert "UUID" in second["sources"]["visibility"]


def test_nvidia_control_nodes_only_when_present(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "1", "NARWHAL_NODE_2_GPU_IDS": "6"}, nv_pair(tmp_path))
    assert recs["engine-2"]["accelerator_devices"] == ["/dev/nvidia6", "/dev/nvidiactl"]


def test_duplicated_uuids_use_container_indices(tmp_path, dev):
    h = host(nvidia(dev, "telegraf__dual_2080-v13.xml", tmp_path), tmp_path)
    recs = build({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert recs["engine-1"]["gpu_ids"] == ["0", "1"]
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1]
    assert recs["engine-1"]["accelerator_devices"] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl",
                                                       "/dev/nvidia-uvm"]
    assert "duplicated" in recs["engine-1"]["sources"]["visibility"]


def test_masked_uuid_capture_uses_container_indices(tmp_path, dev):
    text = (REAL / "nvidia" / "nvgpuexp__linux-x86_64__nvidia-h200__590.48.01.capture.txt").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# idle :: query (-q)"))
    end = next(i for i in range(start + 3, len(lines)) if lines[i].startswith("####"))
    parsed = _gpu.parse_nvidia_smi_text("\n".join(lines[start + 3:end]))
    assert [g["uuid"] for g in parsed["gpus"]] == ["GPU-00000000-0000-0000-0000-000000000000"]
    h = host(_host.nvidia_facts(parsed, str(tmp_path), str(dev), "nvidia-smi -q"), tmp_path)
    recs = build({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert recs["engine-1"]["gpu_ids"] == ["0"]
    assert recs["engine-1"]["accelerator"]["product"] == "NVIDIA H200"


def test_amd_engine_gets_container_indices_and_its_own_nodes(tmp_path):
    h = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2"}, {"engine-1": h, "engine-2": h})
    second = recs["engine-2"]
    assert second["gpu_host_indices"] == [2, 3]
    assert second["gpu_ids"] == ["0", "1"]
    assert second["gpu_visibility_env"] == "ROCR_VISIBLE_DEVICES"
    assert second["accelerator_devices"] == ["/dev/kfd", "/dev/dri/renderD130", "/dev/dri/card2",
                                             "/dev/dri/renderD131", "/dev/dri/card3"]
    assert recs["engine-1"]["accelerator_devices"] == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/card0",
                                                       "/dev/dri/renderD129", "/dev/dri/card1"]
    assert second["accelerator"] == {"vendor": "amd", "product": "Arcturus GL-XL [Instinct MI100]", "count": 2}
    assert second["runtime"]["platform"] == "rocm"


def test_cuda_image_on_amd_gpus_is_refused(tmp_path):
    h = host(amd(), tmp_path)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2"}, {"engine-1": h, "engine-2": h})
    assert err.key == "NARWHAL_IMAGE" and "CUDA image" in str(err) and "AMD GPUs" in str(err)
    rocm = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_NODE_2_IMAGE": "vllm/vllm-openai:v0.33.0"},
                  {"engine-1": rocm, "engine-2": h})
    assert err.key == "NARWHAL_NODE_2_IMAGE"


def test_rocm_image_on_nvidia_gpus_is_refused(tmp_path, dev):
    h = host(nvidia(dev), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, {"engine-1": h, "engine-2": h})
    assert err.key == "NARWHAL_IMAGE" and "ROCM image" in str(err)


# ------------------------------------------------------------------------------------------------
# 3. transport


def test_ucx_tcp(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    assert recs["engine-1"]["transfer"] == {"transport": "ucx_tcp", "net_devices": ["${NARWHAL_FABRIC_INTERFACE}"],
                                            "devices": [], "ucx_tls": ["tcp", "cuda_copy", "cuda_ipc", "sm", "self"]}
    assert "UCX_TLS tcp,cuda_copy,cuda_ipc,sm,self for GPU KV memory on cuda" in recs["engine-1"]["sources"]["ucx_tls"]
    assert recs["engine-1"]["network_mode"] == "host"


# The nvidia-8gpu-rdma tree (tests/harness/profiles/nvidia-8gpu-rdma/sys/README.md): 4 PCIe switches, two per
# NUMA node, each with two second-level switches holding one GPU and one HCA: GPU 0..7 pair with mlx5_0, 1, 4,
# 5 (NUMA 0, uverbs0-3) and mlx5_6..9 (NUMA 1, uverbs4-7), all InfiniBand ACTIVE; the Ethernet mlx5_bond_0
# (NUMA 0, uverbs8) sits alone below a root port.
RAILS = ["mlx5_0:1", "mlx5_1:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_7:1", "mlx5_8:1", "mlx5_9:1"]
SUB_SWITCHES = ["0000:12:00.0", "0000:16:00.0", "0000:22:00.0", "0000:26:00.0",
                "0000:32:00.0", "0000:36:00.0", "0000:42:00.0", "0000:46:00.0"]
UVERBS = ["/dev/infiniband/uverbs%d" % i for i in range(8)]
RDMA_CM = "/dev/infiniband/rdma_cm"


def rails(record):
    """sources.transfer as [(GPU, port, why)]."""
    text = record["sources"]["transfer"]
    assert text.startswith("NARWHAL_RDMA_DEVICES=auto, the nearest active port of each GPU: "), text
    result = []
    for item in text.split(": ", 1)[1].split("; "):
        gpu, rest = item.split(" -> ")
        port, why = rest.split(": ", 1)
        result.append((int(gpu.split()[1]), port, why))
    return result


def test_ucx_rdma_auto_eight_gpus_use_all_eight_rails(tmp_path, dev):
    """The records of the nvidia-8gpu-rdma profile list every rail, each GPU on the HCA of its own switch."""
    recs = build({"NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path), shared=False)
    for record in recs.values():
        assert record["transfer"] == {"transport": "ucx_rdma", "net_devices": RAILS, "devices": UVERBS + [RDMA_CM],
                                      "ucx_tls": ["rc", "ud", "cuda_copy", "cuda_ipc", "sm", "self"]}
        assert rails(record) == [(i, RAILS[i], "same PCIe switch " + SUB_SWITCHES[i]) for i in range(8)]
    assert "GPU 0 (0000:00:0d.0) -> mlx5_0:1: same PCIe switch 0000:12:00.0; GPU 1 (0000:00:0e.0) -> mlx5_1:1" \
        in recs["engine-1"]["sources"]["transfer"]


def test_ucx_rdma_auto_four_gpus_get_their_four_nearest(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path))
    assert recs["engine-1"]["transfer"]["net_devices"] == RAILS[:4]
    assert recs["engine-1"]["transfer"]["devices"] == UVERBS[:4] + [RDMA_CM]
    assert recs["engine-2"]["transfer"] == {"transport": "ucx_rdma", "net_devices": RAILS[4:],
                                            "devices": UVERBS[4:] + [RDMA_CM],
                                            "ucx_tls": ["rc", "ud", "cuda_copy", "cuda_ipc", "sm", "self"]}
    assert [r[:2] for r in rails(recs["engine-2"])] == list(zip(range(4, 8), RAILS[4:], strict=True))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma", "NARWHAL_NODE_1_GPU_IDS": "1,3,5,7"},
                 rdma_pair(tmp_path))
    assert recs["engine-1"]["transfer"]["net_devices"] == ["mlx5_1:1", "mlx5_5:1", "mlx5_7:1", "mlx5_9:1"]
    assert recs["engine-2"]["transfer"]["net_devices"] == ["mlx5_0:1", "mlx5_4:1", "mlx5_6:1", "mlx5_8:1"]


def test_ucx_rdma_auto_inactive_nearest_port_takes_the_next_best(tmp_path, dev):
    rd = copy.deepcopy(rdma(tmp_path / "dev"))
    for hca in rd["hcas"]:
        if hca["name"] == "mlx5_0":
            hca["ports"][0].update(active=False, state="DOWN")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path, rd))
    # GPU 0 falls back to the other HCA of its first-level switch, which GPU 1 (its own nearest) then shares
    assert recs["engine-1"]["transfer"]["net_devices"] == ["mlx5_1:1"]
    assert recs["engine-1"]["transfer"]["devices"] == ["/dev/infiniband/uverbs1", RDMA_CM]
    assert rails(recs["engine-1"]) == [(0, "mlx5_1:1", "same PCIe switch 0000:10:00.0"),
                                       (1, "mlx5_1:1", "same PCIe switch 0000:16:00.0, shared with GPU 0")]
    assert recs["engine-2"]["transfer"]["net_devices"] == ["mlx5_4:1", "mlx5_5:1"]


def test_ucx_rdma_auto_fewer_rails_than_gpus(tmp_path, dev):
    rd = copy.deepcopy(rdma(tmp_path / "dev"))
    for hca in rd["hcas"]:
        if hca["name"] not in ("mlx5_0", "mlx5_6", "mlx5_bond_0"):
            hca["ports"][0].update(active=False, state="DOWN")
    recs = build({"NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path, rd), shared=False)
    record = recs["engine-1"]
    assert record["transfer"]["net_devices"] == ["mlx5_0:1", "mlx5_6:1"]  # InfiniBand before the Ethernet bond
    assert record["transfer"]["devices"] == ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs4", RDMA_CM]
    assert [r[1] for r in rails(record)] == ["mlx5_0:1"] * 4 + ["mlx5_6:1"] * 4
    assert rails(record)[1][2] == "same PCIe switch 0000:10:00.0, shared with GPU 0"
    assert rails(record)[2][2] == "NUMA node 0 (no active port shares its PCIe switch), shared with GPU 0, 1"


def test_ucx_rdma_auto_without_topology_uses_each_gpus_numa_node(tmp_path, dev):
    """No PCI paths (e.g. ibstat facts, a copied tree): today's NUMA rule, per GPU, spread over the rails."""
    rd = copy.deepcopy(rdma(tmp_path / "dev"))
    for hca in rd["hcas"]:
        hca["pci_path"] = None
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path, rd))
    assert recs["engine-1"]["transfer"]["net_devices"] == RAILS[:4]
    assert recs["engine-2"]["transfer"]["net_devices"] == RAILS[4:]
    assert rails(recs["engine-2"])[0] == (4, "mlx5_6:1", "NUMA node 1 (PCIe path of mlx5_6 unknown)")
    gpus = nvidia(dev)
    for gpu in gpus["gpus"]:
        gpu["pci_path"] = None
    h = host(gpus, tmp_path, rd=rdma(tmp_path / "dev"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, {"engine-1": h, "engine-2": h})
    assert recs["engine-2"]["transfer"]["net_devices"] == RAILS[4:]
    assert rails(recs["engine-2"])[1] == (5, "mlx5_7:1", "NUMA node 1 (PCIe path unknown)")


def test_ucx_rdma_auto_gpu_behind_no_shared_switch_uses_its_numa_node(tmp_path, dev):
    """A GPU that shares no switch with an HCA (here GPU 4 moved below a root port of its own) takes the NUMA
    rule; the other GPUs keep their switch-local rails."""
    gpus = nvidia(dev)
    gpus["gpus"][4]["pci_path"] = ["pci0000:00", "0000:00:06.0"]
    h = host(gpus, tmp_path, rd=rdma(tmp_path / "dev"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma", "NARWHAL_NODE_2_GPU_IDS": "4,6,7,5"},
                 {"engine-1": h, "engine-2": h})
    assert rails(recs["engine-2"]) == [(4, "mlx5_6:1", "NUMA node 1 (no active port shares its PCIe switch)"),
                                       (6, "mlx5_8:1", "same PCIe switch 0000:42:00.0"),
                                       (7, "mlx5_9:1", "same PCIe switch 0000:46:00.0"),
                                       (5, "mlx5_7:1", "same PCIe switch 0000:36:00.0")]
    assert recs["engine-2"]["transfer"]["net_devices"] == ["mlx5_6:1", "mlx5_8:1", "mlx5_9:1", "mlx5_7:1"]


def test_ucx_rdma_auto_on_the_amd_profile(tmp_path):
    """amd-4gpu-rdma: each MI100 shares a PCIe switch with one HCA (mlx5_6..9), all on NUMA 1."""
    h = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"), rd=rdma(tmp_path / "dev", AMD_SYS))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_TRANSPORT": "ucx_rdma"}, {"engine-1": h, "engine-2": h})
    assert recs["engine-1"]["transfer"]["net_devices"] == ["mlx5_6:1", "mlx5_7:1"]
    assert recs["engine-2"]["transfer"]["devices"] == ["/dev/infiniband/uverbs6", "/dev/infiniband/uverbs7", RDMA_CM]
    assert rails(recs["engine-2"]) == [(2, "mlx5_8:1", "same PCIe switch 0000:c1:00.0"),
                                       (3, "mlx5_9:1", "same PCIe switch 0000:e1:00.0")]


def test_ucx_rdma_auto_without_gpus_takes_the_first_active_port(tmp_path):
    rd = rdma(tmp_path / "dev")
    site = {"NARWHAL_RDMA_DEVICES": "auto"}
    assert choose_rdma("engine-1", 1, {}, site, rd, []) == (
        ["mlx5_0:1"], ["/dev/infiniband/uverbs0", RDMA_CM],
        "NARWHAL_RDMA_DEVICES=auto, the engine has no GPU: mlx5_0:1, the first active port (InfiniBand first)")


def test_ucx_rdma_explicit_devices(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma",
                  "NARWHAL_RDMA_DEVICES": "mlx5_8:1", "NARWHAL_NODE_1_RDMA_DEVICES": "mlx5_bond_0:1"},
                 rdma_pair(tmp_path))
    assert recs["engine-2"]["transfer"]["net_devices"] == ["mlx5_8:1"]
    assert recs["engine-2"]["transfer"]["devices"] == ["/dev/infiniband/uverbs6", "/dev/infiniband/rdma_cm"]
    assert recs["engine-2"]["sources"]["transfer"] == "NARWHAL_RDMA_DEVICES=mlx5_8:1"
    assert recs["engine-1"]["transfer"]["devices"] == ["/dev/infiniband/uverbs8", "/dev/infiniband/rdma_cm"]


@pytest.mark.parametrize("extra,key", [
    ({"NARWHAL_RDMA_DEVICES": "mlx5_3:1"}, "NARWHAL_RDMA_DEVICES"),
    ({"NARWHAL_RDMA_DEVICES": "mlx5_6:2"}, "NARWHAL_RDMA_DEVICES"),
    ({"NARWHAL_NODE_2_RDMA_DEVICES": "mlx5_6"}, "NARWHAL_NODE_2_RDMA_DEVICES"),
])
def test_ucx_rdma_unknown_hca_port(tmp_path, dev, extra, key):
    err = refused(dict(extra, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_TRANSPORT="ucx_rdma"), rdma_pair(tmp_path))
    assert err.key == key and "is not an HCA:port" in str(err)


def test_ucx_rdma_without_active_port(tmp_path, dev):
    rd = copy.deepcopy(rdma(tmp_path / "dev"))
    for hca in rd["hcas"]:
        for port in hca["ports"]:
            port.update(active=False, state="DOWN")
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path, rd))
    assert err.key == "NARWHAL_TRANSPORT"
    assert "ucx_rdma needs an active HCA port, but engine-1 has none" in str(err)


def test_ucx_rdma_without_rdma_facts(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_TRANSPORT" and "no HCA found" in str(err)


# ------------------------------------------------------------------------------------------------
# 4. runtime


def test_expected_packages_and_environment(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    rt = recs["engine-1"]["runtime"]
    assert rt["expected_packages"] == {"vllm": "0.33.0", "nixl": "0.7.1"}
    assert rt["image_id"] == IMAGE_ID and rt["platform"] == "cuda" and rt["kv_buffer_device"] == "cuda"
    assert rt["model_dtype"] == "bfloat16" and rt["served_model_name"] == "Meta-Llama-3.1-8B"
    assert rt["environment"] == {"CUDA_VERSION": "12.9.1", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
                                 "UCX_HOME": "/usr/local/ucx"}
    assert rt["extra_args"] == [] and rt["derived_environment"] == {}


def test_nixl_wheel_distribution_is_pinned(tmp_path, dev):
    img = image({"vllm": "0.33.0", "nixl-cu13": "0.8.0"})
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=img))
    assert recs["engine-2"]["runtime"]["expected_packages"] == {"vllm": "0.33.0", "nixl-cu13": "0.8.0"}
    assert recs["engine-2"]["runtime"]["nixl_distribution"] == "nixl-cu13"


@pytest.mark.parametrize("dists,needle", [
    ({"nixl": "0.7.1", "nixl-cu12": "0.7.1"}, "no 'vllm' distribution"),
    ({"vllm": "0.33.0+cu129", "torch": "2.9.0"}, "no NIXL distribution"),
])
def test_image_without_vllm_or_nixl(tmp_path, dev, dists, needle):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=image(dists)))
    assert err.key == "NARWHAL_IMAGE" and needle in str(err)


def test_expected_packages_policy(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXPECTED_PACKAGES": "torch"}, nv_pair(tmp_path))
    assert recs["engine-1"]["runtime"]["expected_packages"] == {"vllm": "0.33.0", "nixl": "0.7.1",
                                                                "torch": "2.9.0+cu129"}
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXPECTED_PACKAGES": "torch, flashinfer-python"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXPECTED_PACKAGES" and "flashinfer-python" in str(err)


def test_float32_checkpoint_needs_a_dtype_policy(tmp_path, dev):
    f32 = model(tmp_path, patch={"torch_dtype": "float32"})
    assert f32["dtype"] == "float32"
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=f32))
    assert err.key == "NARWHAL_MODEL_DTYPE" and "float32" in str(err)
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_MODEL_DTYPE": "float16"}, nv_pair(tmp_path, mdl=f32))
    assert recs["engine-1"]["runtime"]["model_dtype"] == "float16"


@pytest.mark.parametrize("src", ["syjjhl__chatglm2-6b", "helpy__DeepSeek-V3"])
def test_trust_remote_code_model(tmp_path, dev, src):
    mdl = model(tmp_path, src)
    assert mdl["trust_remote_code"] is True
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096"},
                 nv_pair(tmp_path, mdl=mdl))
    rt = recs["engine-1"]["runtime"]
    assert rt["extra_args"] == ["--trust-remote-code", "--max-model-len", "4096"]
    assert rt["trust_remote_code"] is True


@pytest.mark.parametrize("src", ["aiconf__meta-llama--Meta-Llama-3.1-8B", "aiconf__Qwen--Qwen2.5-7B",
                                 "aiconf__nvidia--Nemotron-H-56B-Base-8K", "aiconf__mistralai--Mixtral-8x7B-v0.1"])
def test_fp8_ds_mla_cache_for_plain_attention_is_refused(tmp_path, dev, src):
    """Issue 24: vLLM offers the fp8_ds_mla cache only to MLA attention; a plain-attention model is refused by key,
    naming the engine and the model."""
    mdl = model(tmp_path, src)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"}, nv_pair(tmp_path, mdl=mdl))
    assert err.key == "NARWHAL_KV_CACHE_DTYPE", str(err)
    assert "the cache plan for engine-1 (%s, model_type %s) failed" % (mdl["path"], mdl["model_type"]) in str(err)
    assert "only to MLA attention backends" in str(err) and "set NARWHAL_KV_CACHE_DTYPE=auto" in str(err)


@pytest.mark.parametrize("src", ["helpy__DeepSeek-V3", "aiconf__moonshotai--Kimi-K2-Instruct"])
def test_fp8_ds_mla_cache_for_mla_models_is_planned(tmp_path, dev, src):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"},
                 nv_pair(tmp_path, mdl=model(tmp_path, src)))
    rt = recs["engine-1"]["runtime"]
    assert rt["kv_cache_dtype"] == "fp8_ds_mla" and rt["cache_plan"]["bytes_per_token_per_layer"] == 656


# Nemotron-H-56B at TP 4: attention 2 KV heads x 128 x 2 B x (K,V) = 1024 B/token; Mamba2 state per GPU =
# conv 3 x (16384 + 2*8*256)/4 x 2 B = 30720 + SSM 64 heads x 64 x 256 x 2 B = 2097152 -> 2127872 B, so the block
# is raised to 16 * ceil(2127872 / (16 * 1024)) = 2080 tokens (page 2080 * 1024 B). LFM2's short-conv state fits
# one 16-token page, so it keeps 16 but still needs the DS conv-state layout.
@pytest.mark.parametrize("src,block,page", [("aiconf__nvidia--Nemotron-H-56B-Base-8K", 2080, 2129920),
                                            ("fetchwiki__LiquidAI-LFM2-1.2B", 16, 8192)])
def test_conv_ssm_model(tmp_path, dev, src, block, page):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, mdl=model(tmp_path, src)))
    rt = recs["engine-2"]["runtime"]
    assert rt["derived_environment"] == {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}
    assert rt["ssm_conv_state"] is True
    assert rt["block_size"] == 16
    assert (rt["cache_plan"]["block_size"], rt["cache_plan"]["page_bytes"]) == (block, page)
    assert recs["engine-1"]["runtime"]["cache_plan"] == rt["cache_plan"]  # P and D agree


def test_model_path_with_a_trailing_slash_gives_the_same_records(tmp_path, dev):
    """Issue 24: /srv/models/x/ and /srv/models/x are one checkpoint, one served name, one record."""
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    slashed = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_MODEL_PATH": BASE["NARWHAL_MODEL_PATH"] + "/"},
                    nv_pair(tmp_path))
    assert json.dumps(slashed, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert plain["engine-1"]["runtime"]["served_model_name"] == "Meta-Llama-3.1-8B"


def test_attention_model_keeps_requested_block(tmp_path, dev):
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-2"]["runtime"]
    # Llama-3.1-8B at TP 4: 2 KV heads x 128 x 2 B x 2 = 1024 B/token, 16 tokens
    assert (plain["cache_plan"]["block_size"], plain["cache_plan"]["page_bytes"]) == (16, 16384)
    assert plain["derived_environment"] == {} and plain["ssm_conv_state"] is False


@pytest.mark.parametrize("args,flag", [
    ("--port 9000", "--port"),
    ("--max-model-len 4096 --tensor-parallel-size=2", "--tensor-parallel-size"),
    ("--api-key x", "--api-key"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("-tp 2", "-tp"),
])
def test_managed_extra_args_refused(tmp_path, dev, args, flag):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXTRA_ARGS" and "overrides launcher-managed" in str(err) and flag in str(err)


@pytest.mark.parametrize("args", ["--tensor_parallel_size=2", "--api_key x"])
def test_managed_extra_args_with_underscores_refused(tmp_path, dev, args):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXTRA_ARGS"


def test_harmless_extra_args_kept_in_order(tmp_path, dev):
    args = "--max-model-len 8192 --gpu-memory-utilization=0.85 --enable-prefix-caching --chat-template '/a b.j2'"
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert recs["engine-2"]["runtime"]["extra_args"] == [
        "--max-model-len", "8192", "--gpu-memory-utilization=0.85", "--enable-prefix-caching", "--chat-template",
        "/a b.j2"]


def test_managed_and_secret_image_env_dropped(tmp_path, dev):
    img = image()
    img["env"] = {"NVIDIA_VISIBLE_DEVICES": "all", "HF_TOKEN": "x", "GITHUB_TOKEN": "y", "UCX_TLS": "all",
                  "CUDA_VISIBLE_DEVICES": "0", "VLLM_API_KEY": "k", "PATH": "/bin", "UCX_HOME": "/usr/local/ucx",
                  "CUDA_VERSION": "12.9.1"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=img))
    assert recs["engine-1"]["runtime"]["environment"] == {"CUDA_VERSION": "12.9.1", "UCX_HOME": "/usr/local/ucx"}


def test_cpu_image_on_host_without_gpus(tmp_path):
    img = image({"vllm": "0.32.0+cpu", "nixl": "0.7.1", "torch": "2.9.0+cpu"}, ["PATH=/usr/bin"],
                "vllm/vllm-openai-cpu:v0.32.0")
    assert img["platform"] == "cpu"
    h = host(_gpu.empty_facts("none"), tmp_path, img=img)
    # vLLM's CPU attention backend takes multiples of 32 only (the engine dies at start with 16 + NIXL)
    err = refused({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert err.key == "NARWHAL_BLOCK_SIZE" and "set NARWHAL_BLOCK_SIZE=32" in str(err)
    recs = build({"NARWHAL_BLOCK_SIZE": "64"}, {"engine-1": h, "engine-2": h}, shared=False)
    rec = recs["engine-1"]
    assert rec["runtime"]["block_size"] == 64
    assert rec["accelerator"] == {"vendor": "cpu", "product": "cpu", "count": 0}
    assert rec["gpu_ids"] == [] and rec["gpu_host_indices"] == [] and rec["accelerator_devices"] == []
    assert rec["gpu_visibility_env"] is None and rec["tensor_parallel_size"] == 1
    assert rec["runtime"]["kv_buffer_device"] == "cpu"


@pytest.mark.parametrize("vllm,tp,ports", [
    ("0.33.0", 4, ([5600, 5600], [5601, 5601])),
    ("0.11.0", 4, ([5600, 5603], [5604, 5607])),
    ("0.11.0", 2, ([5600, 5601], [5602, 5603])),
])
def test_side_channel_ranges_do_not_overlap(tmp_path, dev, vllm, tp, ports):
    img = image(dict(CUDA_DISTS, vllm=vllm))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": str(tp)}, nv_pair(tmp_path, img=img))
    assert (recs["engine-1"]["node"]["side_channel_ports"], recs["engine-2"]["node"]["side_channel_ports"]) == ports
    assert recs["engine-2"]["node"]["side_channel_port"] == ports[1][0]
    apart = build({"NARWHAL_GPUS_PER_ENGINE": str(tp)}, nv_pair(tmp_path, img=img), shared=False)
    assert apart["engine-2"]["node"]["side_channel_port"] == 5600


@pytest.mark.parametrize("vllm, extra, shared, engine, span, port, key", [
    # the site's side-channel base on every engine's HTTP port, or on its attestation port
    ("0.33.0", {"NARWHAL_SIDE_CHANNEL_PORT": "8000"}, False, "engine-1", "port 8000", "HTTP port 8000",
     "NARWHAL_ENGINE_PORT"),
    ("0.33.0", {"NARWHAL_SIDE_CHANNEL_PORT": "8010"}, False, "engine-1", "port 8010", "attestation port 8010",
     "NARWHAL_ATTEST_PORT"),
    # vLLM <= 0.11: one port per TP worker, 7998-8001 over the HTTP port
    ("0.11.0", {"NARWHAL_SIDE_CHANNEL_PORT": "7998"}, False, "engine-1", "ports 7998-8001", "HTTP port 8000",
     "NARWHAL_ENGINE_PORT"),
    # the second engine of a shared host takes the side channel after the first's: on its own per-node ports
    ("0.33.0", {"NARWHAL_NODE_2_ENGINE_PORT": "5601"}, True, "engine-2", "port 5601", "HTTP port 5601",
     "NARWHAL_NODE_2_ENGINE_PORT"),
    ("0.33.0", {"NARWHAL_NODE_2_ATTEST_PORT": "5601"}, True, "engine-2", "port 5601", "attestation port 5601",
     "NARWHAL_NODE_2_ATTEST_PORT"),
])
def test_a_side_channel_on_the_engines_own_port_is_refused_at_discovery(tmp_path, dev, vllm, extra, shared, engine,
                                                                        span, port, key):
    """Issue 24, checked once where both ports are first known (issue 34): vLLM binds the NIXL side channel next to
    the engine's HTTP server and attestation sidecar on one host (network_mode host)."""
    hosts = nv_pair(tmp_path, img=image(dict(CUDA_DISTS, vllm=vllm)))
    err = refused(dict({"NARWHAL_GPUS_PER_ENGINE": "4"}, **extra), hosts, shared)
    assert err.key == "NARWHAL_SIDE_CHANNEL_PORT"
    assert str(err) == (
        "NARWHAL_SIDE_CHANNEL_PORT: %s would listen for NIXL's side channel on %s (from NARWHAL_SIDE_CHANNEL_PORT, "
        "the first side-channel port of each host), which holds its own %s (%s); one engine cannot bind both: set "
        "NARWHAL_SIDE_CHANNEL_PORT outside the engines' HTTP and attestation ports, or move the engine's %s port "
        "with %s, then rerun discovery" % (engine, span, port, key, port.split(" ")[0], key))


def test_a_side_channel_next_to_the_engines_own_ports_passes(tmp_path, dev):
    hosts = nv_pair(tmp_path, img=image(dict(CUDA_DISTS, vllm="0.11.0")))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_SIDE_CHANNEL_PORT": "8001", "NARWHAL_ATTEST_PORT": "8005"},
                 hosts, shared=False)
    assert recs["engine-1"]["node"]["engine_port"] == 8000
    assert recs["engine-1"]["node"]["side_channel_ports"] == [8001, 8004]


# ------------------------------------------------------------------------------------------------
# 5. schema


def test_schema_rejects_bad_records(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TRANSPORT": "ucx_rdma"}, rdma_pair(tmp_path))
    good = recs["engine-2"]
    assert validation_errors(good, RECORD_SCHEMA) == []
    bad = copy.deepcopy(good)
    bad["transfer"]["transport"] = "tcp"
    assert any(e.startswith("transfer/transport") for e in validation_errors(bad, RECORD_SCHEMA))
    bad = copy.deepcopy(good)
    bad["transfer"]["devices"] = []
    assert any(e.startswith("transfer/devices") for e in validation_errors(bad, RECORD_SCHEMA))
    bad = copy.deepcopy(good)
    bad["transfer"].update(transport="ucx_tcp")  # TCP with RDMA devices
    assert validation_errors(bad, RECORD_SCHEMA) != []
    for path, value in ((("runtime", "model_dtype"), "float32"), (("runtime", "image_id"), "abc"),
                        (("accelerator_devices",), ["nvidia0"]), (("network_mode",), "bridge"),
                        (("gpu_visibility_env",), "HIP_VISIBLE_DEVICES")):
        bad = copy.deepcopy(good)
        target = bad
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert validation_errors(bad, RECORD_SCHEMA) != [], path
    bad = copy.deepcopy(good)
    del bad["sources"]["policy"]
    assert validation_errors(bad, RECORD_SCHEMA) != []


def test_build_record_alone_lacks_the_file_sources(tmp_path, dev):
    # build_record gives allocation/environment/extra_args/transfer/visibility; the writer adds the file references the
    # schema needs
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4"))
    plan = build_fleet(inputs, ["engine-1", "engine-2"], interfaces(False))
    h = nv_pair(tmp_path)["engine-1"]
    record, span = build_record(plan["nodes"][0], inputs["site"], {}, h, h["image"], h["model"], plan["fleet"][0],
                                {}, 5600)
    assert span == 1
    assert sorted(record["sources"]) == ["allocation", "environment", "extra_args", "shutdown", "transfer",
                                         "ucx_tls", "visibility"]
    assert any("sources" in e for e in validation_errors(record, RECORD_SCHEMA))


# ------------------------------------------------------------------------------------------------
# 6. the writer module end to end


@pytest.fixture
def run_module(step_runner):
    return lambda args: step_runner("discovery_outputs", args)


EXPECTED_FILES = ["config/deployment.env", "config/engine-launch.engine-1.inspection.json",
                  "config/engine-launch.engine-2.inspection.json", "config/engine-launch.local.json",
                  "config/engine-launch.policy.json", "config/engine-launch.sources.json", "config/fleet.json"]


def resolve_pointer(document, pointer):
    for part in [p for p in pointer.split("/") if p]:
        document = document[part]
    return document


def test_discovery_refuses_a_block_size_the_launcher_would_refuse(tmp_path, dev, run_module):
    """Discovery checks its document with the launcher's record check: a block size the launcher refuses is never
    written."""
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), {"NARWHAL_BLOCK_SIZE": str(2 ** 40)}))
    assert status == "fail"
    assert "launch record engines/engine-1/runtime/block_size: 1099511627776 is greater than the maximum of 65536" \
        in result["msg"] and "nothing was written" in result["msg"]
    assert not (root / "config").exists() or not any((root / "config").iterdir())


def test_the_extract_carries_the_interface_speed_and_no_record_or_fleet_changes(tmp_path, dev, run_module):
    """The interface's nominal speed (narwhal_interface.speed) goes into each inspection extract (/host), where the
    transfer probe's figures read it; the launch config, the fleet and deployment.env are the same bytes with or
    without it."""
    written = {}
    for label, speed in (("without", None), ("with", {"mbps": 100000, "virtual": False, "why": None})):
        root = tmp_path / label
        root.mkdir()
        args = module_args(root, nv_pair(tmp_path / label))
        for facts in args["interfaces"].values():
            facts["speed"] = speed
        status, result = run_module(args)
        assert status == "exit", result
        config = root / "config"
        inspection = json.loads((config / "engine-launch.engine-1.inspection.json").read_text())
        assert inspection["host"]["interface_speed"] == speed
        written[label] = dict((name, (config / name).read_bytes()) for name in
                              ("engine-launch.local.json", "fleet.json", "deployment.env"))
    assert written["with"] == written["without"]


def test_writer_end_to_end(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    hosts = nv_pair(tmp_path)
    status, result = run_module(module_args(root, hosts))
    assert status == "exit", result
    assert result["changed"] is True
    snap = snapshot(root)
    assert sorted(snap) == EXPECTED_FILES
    assert {mode for _data, _mtime, mode in snap.values()} == {0o600}
    config = root / "config"
    fleet = json.loads((config / "fleet.json").read_text())
    assert validation_errors(fleet, FLEET_SCHEMA) == []
    assert [(f["engine"], f["gpu_count"], f["accelerator"]) for f in fleet] == [
        ("engine-1", 4, {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4}),
        ("engine-2", 4, {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4})]
    launch = json.loads((config / "engine-launch.local.json").read_text())
    assert validation_errors(launch, LAUNCH_CONFIG_SCHEMA) == []
    assert launch["engines"]["engine-2"]["gpu_ids"] == V100S_UUIDS[4:]
    index = json.loads((config / "engine-launch.sources.json").read_text())
    assert index["launch_config"] == str(config / "engine-launch.local.json")
    assert sorted(index["files"]) == ["engine-launch.engine-1.inspection.json",
                                      "engine-launch.engine-2.inspection.json", "engine-launch.policy.json"]
    import hashlib
    for name, digest in index["files"].items():
        assert hashlib.sha256((config / name).read_bytes()).hexdigest() == digest
    assert index["launch_config_sha256"] == hashlib.sha256((config / "engine-launch.local.json")
                                                           .read_bytes()).hexdigest()
    for engine, record in launch["engines"].items():
        assert index["engines"][engine] == dict((k, v) for k, v in record["sources"].items() if isinstance(v, dict))
        for kind in ("host", "image", "model", "policy"):
            ref = record["sources"][kind]
            target = config / ref["file"]
            assert target.exists(), ref
            assert resolve_pointer(json.loads(target.read_text()), ref["pointer"]) is not None
    inspection = json.loads((config / "engine-launch.engine-2.inspection.json").read_text())
    assert inspection["image"]["id"] == IMAGE_ID and len(inspection["host"]["gpus"]["gpus"]) == 8
    policy = json.loads((config / "engine-launch.policy.json").read_text())
    assert policy["site"]["NARWHAL_GPUS_PER_ENGINE"] == 4

    # a second identical run changes nothing
    status, again = run_module(module_args(root, hosts))
    assert status == "exit" and again["changed"] is False
    assert not any(again["files"].values())
    assert snapshot(root) == snap


def test_writer_policy_change_gives_a_fresh_set(tmp_path, dev, run_module):
    hosts = nv_pair(tmp_path)
    root, fresh = tmp_path / "checkout", tmp_path / "fresh"
    root.mkdir()
    fresh.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    before = (root / "config" / "engine-launch.local.json").read_text()
    status, result = run_module(module_args(root, hosts, {"NARWHAL_BLOCK_SIZE": "32"}))
    assert status == "exit" and result["changed"] is True
    after = (root / "config" / "engine-launch.local.json").read_text()
    assert after != before
    launch = json.loads(after)
    assert {r["runtime"]["block_size"] for r in launch["engines"].values()} == {32}
    assert {r["runtime"]["cache_plan"]["block_size"] for r in launch["engines"].values()} == {32}
    assert json.loads((root / "config" / "engine-launch.policy.json").read_text())["site"]["NARWHAL_BLOCK_SIZE"] == 32
    # no stale field: the rerun's launch config equals what a first run with the new input writes
    assert run_module(module_args(fresh, hosts, {"NARWHAL_BLOCK_SIZE": "32"}))[0] == "exit"
    assert after == (fresh / "config" / "engine-launch.local.json").read_text()
    assert sorted(snapshot(root)) == sorted(snapshot(fresh))


def test_writer_removes_extracts_of_an_engine_no_longer_in_the_fleet(tmp_path, dev, run_module):
    hosts = nv_pair(tmp_path)
    root = tmp_path / "checkout"
    root.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    status, result = run_module(module_args(root, hosts, {"NARWHAL_NODE_2_ROLE": "", "NARWHAL_NODE_3_ROLE": "decode",
                                                          "NARWHAL_NODE_3_ENGINE_PORT": "8001",
                                                          "NARWHAL_NODE_3_ATTEST_PORT": "8011",
                                                          "NARWHAL_NODE_2_ENGINE_PORT": "",
                                                          "NARWHAL_NODE_2_ATTEST_PORT": ""},
                                            engines=("engine-1", "engine-3")))
    assert status == "exit", result
    names = sorted(snapshot(root))
    assert "config/engine-launch.engine-2.inspection.json" not in names
    assert "config/engine-launch.engine-3.inspection.json" in names
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert sorted(launch["engines"]) == ["engine-1", "engine-3"]


@pytest.mark.parametrize("extra,key", [
    ({"NARWHAL_NODE_1_GPU_IDS": "8,9,10,11"}, "NARWHAL_NODE_1_GPU_IDS"),
    ({"NARWHAL_GPUS_PER_ENGINE": "5"}, "NARWHAL_GPUS_PER_ENGINE"),
    ({"NARWHAL_TRANSPORT": "ucx_rdma"}, "NARWHAL_TRANSPORT"),
    ({"NARWHAL_KV_CACHE_DTYPE": "fp8_ds_mla"}, "NARWHAL_KV_CACHE_DTYPE"),
])
def test_writer_failure_leaves_everything_untouched(tmp_path, dev, run_module, extra, key):
    hosts = nv_pair(tmp_path)
    root = tmp_path / "checkout"
    root.mkdir()
    assert run_module(module_args(root, hosts))[0] == "exit"
    snap = snapshot(root)
    status, result = run_module(module_args(root, hosts, extra))
    assert status == "fail" and result["input"] == key and "nothing was written" in result["msg"]
    assert snapshot(root) == snap


@pytest.mark.parametrize("key,value,words", [
    ("NARWHAL_EXTRA_ARGS", "--port 9000", "overrides launcher-managed --port"),
    ("NARWHAL_EXTRA_ARGS", "--config x.yaml", "overrides launcher-managed --config"),
    ("NARWHAL_EXTRA_ARGS", "--tensor-parallel 2", "overrides launcher-managed --tensor-parallel-size"),
    ("NARWHAL_EXTRA_ARGS", "--max-model-len '4096", "not valid shell words"),
    ("NARWHAL_ENGINE_ENV", "VLLM_SSM_CONV_STATE_LAYOUT=SD",
     "sets VLLM_SSM_CONV_STATE_LAYOUT, which is launcher-managed"),
    ("NARWHAL_NODE_1_EXTRA_ARGS", "-tp=2", "overrides launcher-managed --tensor-parallel-size"),
])
def test_launcher_refusals_at_the_first_stage(key, value, words):
    """What the launcher would refuse is refused when the inputs are read, in the planner's words."""
    values = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_IMAGE": "i", "NARWHAL_MODEL_PATH": "/m",
              "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode", key: value}
    with pytest.raises(InputError) as err:
        load_inputs(values)
    assert err.value.key == key and words in str(err.value)


def test_writer_check_mode_writes_nothing(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), check=True))
    assert status == "exit" and result["changed"] is True
    assert sorted(os.path.relpath(p, root) for p in result["files"]) == [
        "config/deployment.env", "config/engine-launch.engine-1.inspection.json",
        "config/engine-launch.engine-2.inspection.json", "config/engine-launch.local.json",
        "config/engine-launch.policy.json", "config/engine-launch.sources.json", "config/fleet.json"]
    assert list(root.iterdir()) == []


def test_site_engine_env_recorded_over_the_image_env(tmp_path, dev):
    img = image()
    img["env"] = {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "WARNING"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4",
                  "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG HF_HUB_OFFLINE=1 'X_OPTS=a b'"},
                 nv_pair(tmp_path, img=img))
    for rec in recs.values():
        assert rec["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "DEBUG",
                                                 "HF_HUB_OFFLINE": "1", "X_OPTS": "a b"}
        assert "NARWHAL_ENGINE_ENV (HF_HUB_OFFLINE, VLLM_LOGGING_LEVEL, X_OPTS)" in rec["sources"]["environment"]


@pytest.mark.parametrize("text,word", [
    ("UCX_TLS=rc", "sets UCX_TLS, which is launcher-managed"),
    ("CUDA_VISIBLE_DEVICES=0", "sets CUDA_VISIBLE_DEVICES, which is launcher-managed"),
    ("HF_TOKEN=hf_abc", "sets HF_TOKEN, which looks like a secret"),
    ("VLLM_LOGGING_LEVEL", "is not KEY=VALUE"),
    ("1BAD=x", "is not KEY=VALUE"),
    ("A='unterminated", "not valid shell words"),
])
def test_bad_site_engine_env_refused_by_name(tmp_path, dev, text, word):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": text}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENGINE_ENV" and word in str(err)


# ------------------------------------------------------------------------------------------------
# 7. per-engine policy: NARWHAL_NODE_<n>_EXTRA_ARGS and NARWHAL_NODE_<n>_ENGINE_ENV


def test_node_extra_args_follow_the_site_args_for_that_engine_only(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096 --max-num-seqs 64",
                  "NARWHAL_NODE_2_EXTRA_ARGS": "--max_num_seqs=8 --enable-chunked-prefill"}, nv_pair(tmp_path))
    e1, e2 = recs["engine-1"], recs["engine-2"]
    assert e1["runtime"]["extra_args"] == ["--max-model-len", "4096", "--max-num-seqs", "64"]
    # the node's words last: vLLM's parser keeps the last --max-num-seqs, so the node's 8 wins
    assert e2["runtime"]["extra_args"] == ["--max-model-len", "4096", "--max-num-seqs", "64", "--max_num_seqs=8",
                                           "--enable-chunked-prefill"]
    assert e1["sources"]["extra_args"] == "NARWHAL_EXTRA_ARGS (--max-model-len 4096 --max-num-seqs 64)"
    assert e2["sources"]["extra_args"] == (
        "NARWHAL_EXTRA_ARGS (--max-model-len 4096 --max-num-seqs 64) + NARWHAL_NODE_2_EXTRA_ARGS "
        "(--max_num_seqs=8 --enable-chunked-prefill); the node's --max-num-seqs wins over the site's (vLLM takes "
        "the last)")


def test_node_extra_args_come_after_the_derived_flag(tmp_path, dev):
    mdl = model(tmp_path, "syjjhl__chatglm2-6b")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_NODE_1_EXTRA_ARGS": "--max-num-batched-tokens 16384"},
                 nv_pair(tmp_path, mdl=mdl))
    assert recs["engine-1"]["runtime"]["extra_args"] == ["--trust-remote-code", "--max-num-batched-tokens", "16384"]
    assert recs["engine-2"]["runtime"]["extra_args"] == ["--trust-remote-code"]
    assert recs["engine-1"]["sources"]["extra_args"].startswith("derived --trust-remote-code (auto_map")
    assert "NARWHAL_NODE_1_EXTRA_ARGS (--max-num-batched-tokens 16384)" in recs["engine-1"]["sources"]["extra_args"]
    assert "NARWHAL_NODE_1" not in recs["engine-2"]["sources"]["extra_args"]


def test_no_extra_args_says_so(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    assert recs["engine-2"]["runtime"]["extra_args"] == []
    assert recs["engine-2"]["sources"]["extra_args"] == (
        "none (no derived flag, NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and NARWHAL_NODE_2_EXTRA_ARGS unset)")


def test_node_engine_env_over_the_site_env(tmp_path, dev):
    img = image()
    img["env"] = {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "WARNING"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=INFO HF_HUB_OFFLINE=1",
                  "NARWHAL_NODE_1_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG 'X_OPTS=a b'"}, nv_pair(tmp_path, img=img))
    e1, e2 = recs["engine-1"], recs["engine-2"]
    assert e1["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "DEBUG",
                                            "HF_HUB_OFFLINE": "1", "X_OPTS": "a b"}
    assert e2["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "INFO",
                                            "HF_HUB_OFFLINE": "1"}
    assert e1["sources"]["environment"].endswith(
        " + NARWHAL_ENGINE_ENV (HF_HUB_OFFLINE, VLLM_LOGGING_LEVEL) + NARWHAL_NODE_1_ENGINE_ENV (VLLM_LOGGING_LEVEL, "
        "X_OPTS; over the site's VLLM_LOGGING_LEVEL)")
    assert "NARWHAL_NODE_1" not in e2["sources"]["environment"]


@pytest.mark.parametrize("args,flag", [
    ("--port 9000", "--port"),
    ("--max-num-seqs 8 --tensor_parallel_size=2", "--tensor-parallel-size"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("-tp 2", "-tp"),
])
def test_managed_flag_in_node_extra_args_refused_naming_the_node_key(tmp_path, dev, args, flag):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_EXTRA_ARGS"
    assert str(err).startswith("NARWHAL_NODE_2_EXTRA_ARGS: NARWHAL_NODE_2_EXTRA_ARGS[")
    assert "overrides launcher-managed %s" % flag.replace("-tp", "--tensor-parallel-size") in str(err)


@pytest.mark.parametrize("text,word", [
    ("UCX_TLS=rc", "sets UCX_TLS, which is launcher-managed"),
    ("ROCR_VISIBLE_DEVICES=1", "sets ROCR_VISIBLE_DEVICES, which is launcher-managed"),
    ("PATH=/opt/bin", "sets PATH, which is launcher-managed"),
    ("HF_TOKEN=hf_abc", "sets HF_TOKEN, which looks like a secret"),
    ("MY_API_KEY=abc", "sets MY_API_KEY, which looks like a secret"),
    ("VLLM_LOGGING_LEVEL", "is not KEY=VALUE"),
])
def test_bad_node_engine_env_refused_naming_the_node_key(tmp_path, dev, text, word):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=INFO",
                   "NARWHAL_NODE_1_ENGINE_ENV": text}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_ENGINE_ENV" and word in str(err)


@pytest.mark.parametrize("key", ["NARWHAL_EXTRA_ARGS", "NARWHAL_NODE_2_EXTRA_ARGS"])
def test_extra_args_that_are_not_shell_words_refused_by_name(key):
    with pytest.raises(InputError) as err:
        load_inputs(dict(BASE, **{key: "--chat-template '/a b.j2"}))
    assert err.value.key == key and "not valid shell words" in str(err.value)


def test_writer_records_the_per_node_policy(tmp_path, dev, run_module):

    root = tmp_path / "checkout"
    root.mkdir()
    extra = {"NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8", "NARWHAL_NODE_1_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG"}
    args = module_args(root, nv_pair(tmp_path), extra)
    status, result = run_module(args)
    assert status == "exit", result
    policy = json.loads((root / "config" / "engine-launch.policy.json").read_text())
    assert policy["nodes"]["engine-2"] == {"ATTEST_PORT": 8011, "ENGINE_PORT": 8001,
                                           "EXTRA_ARGS": "--max-num-seqs 8", "ROLE": "decode"}
    assert policy["nodes"]["engine-1"] == {"ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG", "ROLE": "prefill"}
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert launch["engines"]["engine-2"]["runtime"]["extra_args"] == ["--max-num-seqs", "8"]
    # what prepare compares: the same inputs match the extract, a changed per-node input is named
    assert policy_changes(policy, args["site"]) == []
    changed = copy.deepcopy(args["site"])
    changed["nodes"]["2"]["EXTRA_ARGS"] = "--max-num-seqs 4"
    assert policy_changes(policy, changed) == [("NARWHAL_NODE_2_EXTRA_ARGS", "--max-num-seqs 8", "--max-num-seqs 4")]


def test_engine_args_recorded_after_extra_args_and_before_node_args(tmp_path, dev):
    """NARWHAL_ENGINE_ARGS (plugins/module_utils/_inputs/catalogue.py) is a real input: recorded with its source,
    derived flags kept."""
    mdl = model(tmp_path, "syjjhl__chatglm2-6b")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096",
                  "NARWHAL_ENGINE_ARGS": "--max-num-seqs 64", "NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8"},
                 nv_pair(tmp_path, mdl=mdl))
    assert recs["engine-2"]["runtime"]["extra_args"] == ["--trust-remote-code", "--max-model-len", "4096",
                                                         "--max-num-seqs", "64", "--max-num-seqs", "8"]
    assert "NARWHAL_ENGINE_ARGS (--max-num-seqs 64)" in recs["engine-1"]["sources"]["extra_args"]
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_ENGINE_ARGS": "--port 1"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENGINE_ARGS" and "overrides launcher-managed --port" in str(err)


# ------------------------------------------------------------------------------------------------
# 8. hostile inputs at the writer (issue 13): refused by name, the previous set byte for byte intact


def first_set(tmp_path, run_module, root=None):
    hosts = nv_pair(tmp_path)
    root = root or tmp_path / "checkout"
    root.mkdir(exist_ok=True)
    status, result = run_module(module_args(root, hosts))
    assert status == "exit", result
    return root, hosts, snapshot(root)


def writer_refuses(run_module, root, args, snap, key, words):
    status, result = run_module(args)
    assert status == "fail" and result["input"] == key, result
    assert "nothing was written" in result["msg"] and words in result["msg"], result["msg"]
    assert snapshot(root) == snap


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.policy.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the policy extract (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.sources.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the sources index (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.engine-2.inspection.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the inspection extract of engine-2"),
    ({"NARWHAL_LAUNCH_CONFIG": "config/engine-launch.engine-7.inspection.json"}, "NARWHAL_LAUNCH_CONFIG",
     "is named like a file discovery owns in NARWHAL_CONFIG_DIR"),
    ({"NARWHAL_FLEET": "config/deployment.env"}, "NARWHAL_FLEET", "which is also deployment.env (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_LAUNCH_CONFIG": "./config//fleet.json"}, "NARWHAL_LAUNCH_CONFIG",
     "which is also the fleet file (NARWHAL_FLEET)"),
    ({"NARWHAL_FLEET": "config/engine-api.key"}, "NARWHAL_FLEET", "which is also the engine API key file"),
    ({"NARWHAL_FLEET": "config"}, "NARWHAL_FLEET", "which is also the output directory (NARWHAL_CONFIG_DIR)"),
    ({"NARWHAL_RUNS_DIR": "config"}, "NARWHAL_RUNS_DIR", "which is also the output directory"),
    ({"NARWHAL_FLEET": "runs/fleet.json"}, "NARWHAL_FLEET", "inside the run directory"),
    ({"NARWHAL_CONFIG_DIR": "docs"}, "NARWHAL_CONFIG_DIR",
     "deployment.env would be docs/deployment.env inside the checkout, which is not one of the git-ignored"),
    ({"NARWHAL_FLEET": "fleet.json"}, "NARWHAL_FLEET", "not one of the git-ignored site paths"),
])
def test_writer_refuses_output_paths_that_collide_or_go_public(tmp_path, dev, run_module, extra, key, words):
    """Class 3: every output its own path, none an input, inside the checkout only at git-ignored paths (here
    the checkout is no repository: the shipped .gitignore's site paths decide)."""
    root, hosts, snap = first_set(tmp_path, run_module)
    writer_refuses(run_module, root, module_args(root, hosts, extra), snap, key, words)


def test_writer_compares_resolved_paths(tmp_path, dev, run_module):
    root, hosts, _snap = first_set(tmp_path, run_module)
    os.symlink("deployment.env", root / "config" / "fleet.alias.json")
    snap = snapshot(root)
    writer_refuses(run_module, root, module_args(root, hosts, {"NARWHAL_FLEET": "config/fleet.alias.json"}), snap,
                   "NARWHAL_FLEET", "which is also deployment.env")


def test_writer_refuses_the_env_file_as_an_output(tmp_path, dev, run_module):
    root, hosts, snap = first_set(tmp_path, run_module)
    args = module_args(root, hosts, {"NARWHAL_FLEET": str(tmp_path / "site.env")})
    args["site"]["env_file"] = str(tmp_path / "site.env")
    writer_refuses(run_module, root, args, snap, "NARWHAL_FLEET", "which is also the site inputs (.env)")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_writer_asks_git_inside_a_repository(tmp_path, dev, run_module):
    """Class 3 with git: a tracked file is not ignored even where .gitignore matches; config/<site>/ is."""
    import subprocess

    git = shutil.which("git")
    root = tmp_path / "checkout"
    root.mkdir()
    subprocess.run([git, "init", "-q", str(root)], check=True)
    shutil.copyfile(REPO / ".gitignore", root / ".gitignore")
    root, hosts, snap = first_set(tmp_path, run_module, root)
    writer_refuses(run_module, root, module_args(root, hosts, {"NARWHAL_CONFIG_DIR": "docs"}), snap,
                   "NARWHAL_CONFIG_DIR", "docs/deployment.env inside the checkout, which git does not ignore")
    subprocess.run([git, "-C", str(root), "add", "-f", "config/fleet.json"], check=True)
    writer_refuses(run_module, root, module_args(root, hosts), snapshot(root), "NARWHAL_FLEET",
                   "config/fleet.json inside the checkout, which git does not ignore")
    subprocess.run([git, "-C", str(root), "rm", "-q", "--cached", "config/fleet.json"], check=True)
    status, result = run_module(module_args(root, hosts, {"NARWHAL_CONFIG_DIR": "config/site-a",
                                                          "NARWHAL_FLEET": "config/fleet.site-a.json",
                                                          "NARWHAL_LAUNCH_CONFIG": "config/site-a/launch.json"}))
    assert status == "exit", result


@pytest.mark.parametrize("change,key,words", [
    # values that load_inputs refuses, handed to the writer directly: the writer refuses them on its own
    (lambda a: a["site"]["site"].update(NARWHAL_FABRIC_INTERFACE="eth1\nNARWHAL_RUN_DIR=/tmp/evil"),
     "NARWHAL_NODE_1_FABRIC_INTERFACE", "cannot be written into deployment.env as one plain KEY=VALUE line"),
    (lambda a: a["site"]["nodes"]["1"].update(URL="http://10.0.0.11:8000/$(id)"), "NARWHAL_NODE_1_URL",
     "has a path"),
    (lambda a: a["interfaces"]["engine-2"].update(operstate="DOWN"), "NARWHAL_FABRIC_INTERFACE",
     "interface eth1 on host engine-2 is down"),
    (lambda a: a["site"]["nodes"].update({"3": {"IP": "10.0.0.13"}}), "NARWHAL_NODE_3_IP",
     "no host of the inventory's group engines is engine-3"),
])
def test_writer_refuses_injection_and_unchecked_values(tmp_path, dev, run_module, change, key, words):
    """Classes 1 and 4 at the writer: nothing written, the previous set byte for byte intact."""
    root, hosts, snap = first_set(tmp_path, run_module)
    args = module_args(root, hosts)
    change(args)
    writer_refuses(run_module, root, args, snap, key, words)


def test_writer_removes_only_inspection_extracts_an_edited_index_names(tmp_path, dev, run_module):
    root, hosts, _snap = first_set(tmp_path, run_module)
    other = root / "config" / "engine-launch.other-site.json"
    other.write_text("{}\n")
    index_path = root / "config" / "engine-launch.sources.json"
    index = json.loads(index_path.read_text())
    index["files"]["engine-launch.other-site.json"] = "0" * 64
    index_path.write_text(json.dumps(index))
    assert run_module(module_args(root, hosts))[0] == "exit"
    assert other.read_text() == "{}\n"


# ------------------------------------------------------------------------------------------------
# secrets (issue 13, class 5): a token the image bakes never reaches a written file; its name does

IMAGE_SECRETS = ("hf_bakedTokenValue0123456789abcd", "sk-baked-api-key-0123456789abcdef", "s3cr3t-label-value")


def test_image_secrets_never_reach_the_output_set(tmp_path, dev, run_module):
    attrs = {"Id": IMAGE_ID, "RepoTags": ["vllm/vllm-openai:v0.33.0"], "RepoDigests": [], "Architecture": "amd64",
             "Os": "linux",
             "Config": {"Env": ["CUDA_VERSION=12.9.1", "HF_TOKEN=" + IMAGE_SECRETS[0],
                                "VLLM_API_KEY=" + IMAGE_SECRETS[1]],
                        "Entrypoint": ["vllm", "serve"], "Cmd": ["--hf-token", IMAGE_SECRETS[0],
                                                                 "--api-key=" + IMAGE_SECRETS[1]],
                        "Labels": {"org.example.deploy-token": IMAGE_SECRETS[2], "version": "0.33.0"}}}
    img = _image.build_facts("vllm/vllm-openai:v0.33.0", attrs, CUDA_DISTS, False)
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path, img=img)))
    assert status == "exit", result
    for path, (data, _mtime, _mode) in snapshot(root).items():
        for secret in IMAGE_SECRETS:
            assert secret.encode() not in data, (path, secret)
    inspection = json.loads((root / "config" / "engine-launch.engine-1.inspection.json").read_text())
    assert inspection["image"]["withheld_env"] == ["HF_TOKEN", "VLLM_API_KEY"]
    assert inspection["image"]["cmd"] == ["--hf-token", "<redacted>", "--api-key=<redacted>"]
    assert inspection["image"]["labels"] == {"org.example.deploy-token": "<redacted>", "version": "0.33.0"}
    launch = json.loads((root / "config" / "engine-launch.local.json").read_text())
    assert "HF_TOKEN" not in launch["engines"]["engine-1"]["runtime"]["environment"]


@pytest.mark.parametrize("key, value, flag", [
    ("NARWHAL_EXTRA_ARGS", "--hf-token hf_operatorToken0123456789abcdef", "--hf-token"),
    ("NARWHAL_EXTRA_ARGS", "--hf_token=hf_operatorToken0123456789abcdef", "--hf_token"),
    ("NARWHAL_NODE_2_EXTRA_ARGS", "--enforce-eager --hf-tok hf_operatorToken0123456789abcdef", "--hf-tok"),
])
def test_credential_flags_in_extra_args_are_refused_without_their_value(tmp_path, key, value, flag):
    with pytest.raises(InputError) as info:
        build({key: value}, nv_pair(tmp_path))
    assert info.value.key == key
    assert "sets %s, which takes a credential" % flag in str(info.value)
    assert "hf_operatorToken" not in str(info.value)


# ------------------------------------------------------------------------------------------------
# the KV lease and the drain of a stop (NARWHAL_KV_LEASE_SECONDS, NARWHAL_SHUTDOWN_TIMEOUT)

def _cpu_pair(tmp_path, version):
    cpu = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": version + "+cpu", "nixl": "0.7.1"},
                                                             ["PATH=/usr/bin"], "vllm/vllm-openai-cpu:v" + version))
    return {"engine-1": cpu, "engine-2": cpu}


@pytest.mark.parametrize("version,name", [
    ("0.21.0", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT in the environment (vLLM 0.21.0+cpu; its default is 480 s)"),
    ("0.22.0", "kv_connector_extra_config.kv_lease_duration in --kv-transfer-config (vLLM 0.22.0+cpu; its default is "
               "30 s)"),
    ("0.32.0", "kv_connector_extra_config.kv_lease_duration in --kv-transfer-config"),
])
def test_the_lease_is_recorded_with_the_name_of_the_images_vllm(tmp_path, version, name):
    recs = build({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_KV_LEASE_SECONDS": "120"}, _cpu_pair(tmp_path, version),
                 shared=False)
    for record in recs.values():  # every engine, prefill and decode alike
        assert record["runtime"]["kv_lease_seconds"] == 120
        assert record["sources"]["kv_lease"].startswith("NARWHAL_KV_LEASE_SECONDS=120: ")
        assert name in record["sources"]["kv_lease"]


def test_without_the_inputs_only_the_drains_default_is_recorded(tmp_path, dev):
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))["engine-1"]
    assert "kv_lease_seconds" not in record["runtime"] and "kv_lease" not in record["sources"]
    assert record["runtime"]["shutdown_timeout"] == 30
    assert record["sources"]["shutdown"] == ("NARWHAL_SHUTDOWN_TIMEOUT unset: 30 (--shutdown-timeout 30: drain "
                                             "in-flight requests); a stop gives 45 s before SIGKILL")


@pytest.mark.parametrize("value,recorded,words", [
    ("0", 0, "NARWHAL_SHUTDOWN_TIMEOUT=0 (--shutdown-timeout 0: abort in-flight requests); a stop gives 15 s"),
    ("300", 300, "NARWHAL_SHUTDOWN_TIMEOUT=300 (--shutdown-timeout 300: drain in-flight requests); a stop gives 315 s"),
])
def test_the_drain_is_recorded(tmp_path, dev, value, recorded, words):
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_SHUTDOWN_TIMEOUT": value}, nv_pair(tmp_path))["engine-2"]
    assert record["runtime"]["shutdown_timeout"] == recorded
    assert record["sources"]["shutdown"].startswith(words)


def test_an_image_older_than_0_18_gets_no_drain_and_refuses_a_set_one(tmp_path):
    recs = build({"NARWHAL_BLOCK_SIZE": "64"}, _cpu_pair(tmp_path, "0.14.0"), shared=False)
    assert "shutdown_timeout" not in recs["engine-1"]["runtime"]
    assert "has no --shutdown-timeout (from 0.18): not written" in recs["engine-1"]["sources"]["shutdown"]
    err = refused({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_SHUTDOWN_TIMEOUT": "30"}, _cpu_pair(tmp_path, "0.17.1"),
                  shared=False)
    assert err.key == "NARWHAL_SHUTDOWN_TIMEOUT"
    assert str(err).startswith("NARWHAL_SHUTDOWN_TIMEOUT: is 30 but the image's vLLM 0.17.1+cpu on engine-1 has no "
                               "--shutdown-timeout (vLLM's graceful drain exists from 0.18)")


@pytest.mark.parametrize("version,env,key,words", [
    ("0.32.0", {"NARWHAL_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_ENGINE_ENV",
     "the image's vLLM 0.32.0 reads the KV lease from kv_connector_extra_config.kv_lease_duration "
     "(--kv-transfer-config), and would ignore VLLM_NIXL_ABORT_REQUEST_TIMEOUT"),
    ("0.22.0", {"NARWHAL_NODE_2_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_NODE_2_ENGINE_ENV",
     "reads the KV lease from kv_connector_extra_config.kv_lease_duration"),
    ("0.21.0", {"NARWHAL_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_ENGINE_ENV",
     "the image's vLLM 0.21.0 reads the KV lease from VLLM_NIXL_ABORT_REQUEST_TIMEOUT (the environment): set "
     "NARWHAL_KV_LEASE_SECONDS=<seconds> instead"),
])
def test_the_lease_set_by_hand_is_refused_with_the_name_the_image_reads(tmp_path, version, env, key, words):
    from ansible_collections.narwhal.deploy.plugins.module_utils._discover import records as _records

    # the input stage refuses it without the version (test_validate.py); the record stage names the version's name
    with pytest.raises(InputError) as err:
        _records.site_environment(list(env.values())[0], key, release=tuple(int(p) for p in version.split(".")))
    assert err.value.key == key and words in str(err.value)
    # discovery refuses the site with it at the first stage, before it knows the image (both names there)
    whole = refused(dict(env, NARWHAL_BLOCK_SIZE="64"), _cpu_pair(tmp_path, version), shared=False)
    assert whole.key == key
    assert "vLLM <= 0.21 reads the environment variable VLLM_NIXL_ABORT_REQUEST_TIMEOUT" in str(whole)


def test_discovery_warns_of_a_prefill_that_stops_before_its_lease(tmp_path, dev, run_module):
    root = tmp_path / "checkout"
    root.mkdir()
    status, result = run_module(module_args(root, nv_pair(tmp_path), {"NARWHAL_SHUTDOWN_TIMEOUT": "10"}))
    assert status == "exit", result
    warnings = [w for w in result["warnings"] if "KV lease" in w]
    assert warnings == ["engine-1 (prefill): NARWHAL_SHUTDOWN_TIMEOUT=10 is shorter than its KV lease of 30 s "
                        "(vLLM's default): a stop may end the drain before every decode has read the KV it was "
                        "promised, and such a decode request fails; set NARWHAL_SHUTDOWN_TIMEOUT >= 30 or a shorter "
                        "NARWHAL_KV_LEASE_SECONDS"]


def test_prepare_names_the_new_inputs_when_the_records_predate_them(tmp_path, dev):
    inputs = load_inputs(dict(BASE, NARWHAL_GPUS_PER_ENGINE="4", NARWHAL_KV_LEASE_SECONDS="60"))
    recorded = {"site": {k: v for k, v in inputs["site"].items()
                         if k not in ("NARWHAL_KV_LEASE_SECONDS", "NARWHAL_SHUTDOWN_TIMEOUT")}, "nodes": {}}
    changed = [key for key, _before, _after in policy_changes(recorded, inputs)]
    assert "NARWHAL_KV_LEASE_SECONDS" in changed and "NARWHAL_SHUTDOWN_TIMEOUT" in changed


# ------------------------------------------------------------------------------------------------
# data- and expert-parallel engines

MIXTRAL = "aiconf__mistralai--Mixtral-8x7B-v0.1"


def test_dp_engine_gets_dp_x_tp_gpus_and_a_side_channel_port_per_rank(tmp_path, dev):
    hosts = nv_pair(tmp_path, mdl=model(tmp_path, MIXTRAL))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, hosts)
    one, two = recs["engine-1"], recs["engine-2"]
    assert one["gpu_host_indices"] == [0, 1, 2, 3] and two["gpu_host_indices"] == [4, 5, 6, 7]
    assert one["tensor_parallel_size"] == 2 and one["data_parallel_size"] == 2
    assert "enable_expert_parallel" not in one
    # the field sits right after tensor_parallel_size
    keys = list(one)
    assert keys[keys.index("tensor_parallel_size") + 1] == "data_parallel_size"
    # vLLM >= 0.14: base + DP rank, one port per rank; the second engine on the host starts after them
    assert one["node"]["side_channel_ports"] == [5600, 5601] and two["node"]["side_channel_ports"] == [5602, 5603]
    assert "NARWHAL_DATA_PARALLEL_SIZE=2: 2 data-parallel rank(s) of TP 2" in one["sources"]["parallelism"]


def test_dp_side_channel_span_before_0_14_is_one_port_per_worker(tmp_path, dev):
    img = image(dict(CUDA_DISTS, vllm="0.11.0"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, nv_pair(tmp_path, img=img))
    assert recs["engine-1"]["node"]["side_channel_ports"] == [5600, 5603]
    assert recs["engine-2"]["node"]["side_channel_ports"] == [5604, 5607]


def test_dp_1_and_ep_off_leave_the_record_as_it_was(tmp_path, dev):
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    explicit = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "1",
                      "NARWHAL_ENABLE_EXPERT_PARALLEL": "false"}, nv_pair(tmp_path))
    assert json.dumps(plain) == json.dumps(explicit)
    assert "data_parallel_size" not in plain["engine-1"] and "parallelism" not in plain["engine-1"]["sources"]


def test_per_node_dp_and_ep_override_the_site(tmp_path, dev):
    hosts = nv_pair(tmp_path, mdl=model(tmp_path, MIXTRAL))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2", "NARWHAL_DATA_PARALLEL_SIZE": "2",
                  "NARWHAL_ENABLE_EXPERT_PARALLEL": "true", "NARWHAL_NODE_2_GPU_IDS": "4,5",
                  "NARWHAL_NODE_2_DATA_PARALLEL_SIZE": "1", "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL": "false"}, hosts)
    one, two = recs["engine-1"], recs["engine-2"]
    assert one["data_parallel_size"] == 2 and one["enable_expert_parallel"] is True
    assert "data_parallel_size" not in two and "enable_expert_parallel" not in two
    assert "NARWHAL_ENABLE_EXPERT_PARALLEL=true: expert parallelism over the 8 routed experts" in \
        one["sources"]["parallelism"]


def test_expert_parallel_refused_for_a_dense_model(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENABLE_EXPERT_PARALLEL": "true"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENABLE_EXPERT_PARALLEL"
    assert "a dense model" in str(err) and "set NARWHAL_ENABLE_EXPERT_PARALLEL=false" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL": "true"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL" and "engine-2" in str(err)


@pytest.mark.parametrize("src,experts", [
    ("helpy__DeepSeek-V3", 256), ("aiconf__moonshotai--Kimi-K2-Instruct", 384), (MIXTRAL, 8),
    ("aiconf__meta-llama--Meta-Llama-3.1-8B", None), ("aiconf__Qwen--Qwen2.5-7B", None),
])
def test_model_facts_count_experts_as_vllm_does(tmp_path, src, experts):
    assert model(tmp_path, src).get("num_experts") == experts


def test_dp_that_does_not_divide_the_gpus_is_refused(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "3", "NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "2"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_DATA_PARALLEL_SIZE" and "cannot share equally" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_TP_SIZE" and "TP x DP" in str(err)


def test_cpu_engine_with_dp(tmp_path):
    h = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": "0.32.0+cpu", "nixl": "0.7.1"}, ["PATH=/usr/bin"],
                                                           "vllm/vllm-openai-cpu:v0.32.0"))
    recs = build({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, {"engine-1": h, "engine-2": h},
                 shared=False)
    rec = recs["engine-1"]
    assert rec["tensor_parallel_size"] == 1 and rec["data_parallel_size"] == 2 and rec["gpu_ids"] == []
    assert rec["node"]["side_channel_ports"] == [5600, 5601]
