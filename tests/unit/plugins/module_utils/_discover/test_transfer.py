# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's transfer plan (plugins/module_utils/_discover/transfer.py), in the records it builds: ucx_tcp over
the fabric interface, and for ucx_rdma the rails, auto (each GPU's nearest active port by PCIe switch, NUMA node and
link layer, on the simulated hosts' trees) or as given, with the refusals by name. The builders:
tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import copy

import pytest
from test_support.records import (
    AMD_SYS,
    ROCM_DISTS,
    ROCM_ENV,
    amd,
    build,
    host,
    image,
    nv_pair,
    nvidia,
    rdma,
    rdma_pair,
    refused,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.transfer import choose_rdma


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
