# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RDMA fixtures shared by the parser and module tests (_facts/test_rdma.py) and the sysfs reader's
(_facts/test_rdma_reader.py): the real dump of /sys/class/infiniband of an H100 host, the simulated host's tree
(nvidia-8gpu-rdma) and where its HCAs sit, and a summary of read HCAs to compare."""

from __future__ import annotations

import os

from test_support.paths import PROFILES, REAL

REAL_TREE = REAL / "net" / "gpud__sys-class-infiniband-h100.0"
SIM_SYS = PROFILES / "nvidia-8gpu-rdma" / "sys"
SIM_DEVICES = PROFILES / "nvidia-8gpu-rdma" / "devices"

H100_HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]


def summary(hcas):
    """(name, type, firmware, board, [(port, state, phys_state, link layer, rate, active)]) of each HCA."""
    return [
        (
            h["name"],
            h["hca_type"],
            h["fw_ver"],
            h["board_id"],
            [(p["port"], p["state"], p["phys_state"], p["link_layer"], p["rate"], p["active"]) for p in h["ports"]],
        )
        for h in hcas
    ]


SIM_PLACEMENT = [
    ("mlx5_0", 0, "0000:00:15.0", "/dev/infiniband/uverbs0"),
    ("mlx5_1", 0, "0000:00:16.0", "/dev/infiniband/uverbs1"),
    ("mlx5_4", 0, "0000:00:17.0", "/dev/infiniband/uverbs2"),
    ("mlx5_5", 0, "0000:00:18.0", "/dev/infiniband/uverbs3"),
    ("mlx5_6", 1, "0000:00:19.0", "/dev/infiniband/uverbs4"),
    ("mlx5_7", 1, "0000:00:1a.0", "/dev/infiniband/uverbs5"),
    ("mlx5_8", 1, "0000:00:1b.0", "/dev/infiniband/uverbs6"),
    ("mlx5_9", 1, "0000:00:1c.0", "/dev/infiniband/uverbs7"),
    ("mlx5_bond_0", 0, "0000:00:1d.0", "/dev/infiniband/uverbs8"),
]


def sim_hca_path(rail):
    """nvidia-8gpu-rdma (tests/harness/profiles/nvidia-8gpu-rdma/sys/README.md): rail i shares the second-level
    PCIe switch of GPU i."""
    k, j = divmod(rail, 2)
    base, sub = 0x10 * (k + 1), 0x10 * (k + 1) + 2 + 4 * j
    return ["pci0000:00", "0000:00:%02x.0" % (k + 1), "0000:%02x:00.0" % base, "0000:%02x:%02x.0" % (base + 1, j),
            "0000:%02x:00.0" % sub, "0000:%02x:01.0" % (sub + 1)]


def real_sysfs_root(tmp_path):
    """A sysfs root holding the real dump of /sys/class/infiniband at <root>/class/infiniband."""
    (tmp_path / "class").mkdir()
    os.symlink(REAL_TREE, tmp_path / "class" / "infiniband")
    return tmp_path
