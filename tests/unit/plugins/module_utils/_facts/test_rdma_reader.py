# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RDMA reader's sysfs read (plugins/module_utils/_facts/rdma_reader.py::read_sysfs_hcas): the real dump of
/sys/class/infiniband, the simulated hosts' trees (HCAs, NUMA nodes, PCI bus ids and paths, uverbs), dereferenced
links, ndevs and natural order. (Its tool fallbacks are tested through the module: test_rdma.py.)"""

from __future__ import annotations

import shutil

import pytest
from test_support.rdma import (
    H100_HCAS,
    SIM_PLACEMENT,
    SIM_SYS,
    real_sysfs_root,
    sim_hca_path,
    summary,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma_reader as _rdma_reader

CX7_SYSFS = (
    "MT4129",
    "28.41.1000",
    "MT_0000000838",
    [(1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)", True)],
)
BF3_SYSFS = (
    "MT41692",
    "32.38.3056",
    "MT_0000000884",
    [(1, "ACTIVE", "LinkUp", "Ethernet", "200 Gb/sec (2X NDR)", True)],
)
SYSFS_EXPECTED = [(name, *CX7_SYSFS) for name in H100_HCAS[:-1]] + [("mlx5_bond_0", *BF3_SYSFS)]


@pytest.fixture
def real_sysfs(tmp_path):
    """The real dump of /sys/class/infiniband placed at <root>/class/infiniband."""
    return real_sysfs_root(tmp_path)


def test_real_sysfs_dump(real_sysfs):
    hcas = _rdma_reader.read_sysfs_hcas(str(real_sysfs))
    assert summary(hcas) == SYSFS_EXPECTED
    # a plain dump: no device links, no infiniband_verbs, no ndevs
    for hca in hcas:
        assert (hca["numa_node"], hca["pci_bus_id"], hca["pci_path"], hca["uverbs"]) == (None, None, None, None)
        assert hca["ports"][0]["netdev"] is None


def test_no_infiniband_class(tmp_path):
    assert _rdma_reader.read_sysfs_hcas(str(tmp_path)) is None


def test_simulated_host_tree():
    hcas = _rdma_reader.read_sysfs_hcas(str(SIM_SYS))
    assert summary(hcas) == SYSFS_EXPECTED
    assert [(h["name"], h["numa_node"], h["pci_bus_id"], h["uverbs"]) for h in hcas] == SIM_PLACEMENT


def test_simulated_host_pci_paths():
    hcas = _rdma_reader.read_sysfs_hcas(str(SIM_SYS))
    assert [h["pci_path"] for h in hcas] == [sim_hca_path(i) for i in range(8)] + [["pci0000:00", "0000:00:05.0"]]


def test_amd_profile_pci_paths():
    """amd-4gpu-rdma: mlx5_6..9 share a PCIe switch with the MI100s (bus 83, a3, c3, e3), the rest stand alone."""
    hcas = _rdma_reader.read_sysfs_hcas(str(SIM_SYS.parent.parent / "amd-4gpu-rdma" / "sys"))
    assert [(h["name"], h["numa_node"], h["pci_bus_id"], h["uverbs"]) for h in hcas] == [
        (name, numa, bdf, uverbs) for (name, numa, _bdf, uverbs), bdf in zip(SIM_PLACEMENT, (
            "0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",
            "0000:84:00.0", "0000:a4:00.0", "0000:c4:00.0", "0000:e4:00.0", "0000:02:00.0"), strict=True)]
    paths = {h["name"]: h["pci_path"] for h in hcas}
    assert paths["mlx5_6"] == ["pci0000:80", "0000:80:01.1", "0000:81:00.0", "0000:82:01.0"]
    assert paths["mlx5_9"] == ["pci0000:e0", "0000:e0:01.1", "0000:e1:00.0", "0000:e2:01.0"]
    assert paths["mlx5_1"] == ["pci0000:20", "0000:20:01.1"]
    assert paths["mlx5_bond_0"] == ["pci0000:00", "0000:00:03.1"]


def test_dereferenced_links_fall_back_to_uevent(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SIM_SYS / "bus", root / "bus")
    shutil.copytree(
        SIM_SYS / "class" / "infiniband" / "mlx5_6", root / "class" / "infiniband" / "mlx5_6", symlinks=False
    )
    hca = _rdma_reader.read_sysfs_hcas(str(root))[0]
    assert (hca["numa_node"], hca["pci_bus_id"], hca["uverbs"]) == (1, "0000:00:19.0", None)
    assert hca["pci_path"] is None  # no devices/ tree to place it in


def test_ndevs_netdev_and_natural_order(tmp_path):
    for name, state in (("mlx5_10", "1: DOWN"), ("mlx5_2", "4: ACTIVE")):
        port = tmp_path / "class" / "infiniband" / name / "ports" / "1"
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "link_layer").write_text("Ethernet\n")
        (port / "gid_attrs" / "ndevs" / "0").write_text(f"ens{name[-1]}\n")
    hcas = _rdma_reader.read_sysfs_hcas(str(tmp_path))
    assert [h["name"] for h in hcas] == ["mlx5_2", "mlx5_10"]
    assert [(h["ports"][0]["netdev"], h["ports"][0]["active"]) for h in hcas] == [("ens2", True), ("ens0", False)]
