# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU reader (plugins/module_utils/_facts/gpu_reader.py) over the simulated trees: the KFD topology and DRM
class of the AMD profile, each GPU's device nodes, NUMA node and PCI path, for AMD and NVIDIA. (Its tool runs and
refusals are tested through the module: test_gpu.py.)"""

from __future__ import annotations

import os
import shutil

from test_support.gpu import AMD_SYS, NVIDIA, NVIDIA_SYS, amd_profile_facts

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import (
    nvidia_facts,
    read_drm_nodes,
    read_kfd_topology,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.sysfs import read_pci_path


def test_kfd_topology_of_the_amd_profile():
    nodes = read_kfd_topology(str(AMD_SYS))
    assert [(n["node"], n["drm_render_minor"], n["pci_bus_id"]) for n in nodes] == [
        (2, 128, "0000:83:00.0"),
        (3, 129, "0000:a3:00.0"),
        (4, 130, "0000:c3:00.0"),
        (5, 131, "0000:e3:00.0"),
    ]
    assert nodes[0]["unique_id"] == 0x79CCD55167A2124A


def test_drm_class_of_the_amd_profile():
    assert read_drm_nodes(str(AMD_SYS)) == {
        "0000:83:00.0": {"render": [128], "card": [0]},
        "0000:a3:00.0": {"render": [129], "card": [1]},
        "0000:c3:00.0": {"render": [130], "card": [2]},
        "0000:e3:00.0": {"render": [131], "card": [3]},
    }


def test_amd_facts_topology_first(tmp_path):
    facts = amd_profile_facts(AMD_SYS)
    assert facts["vendor"] == "amd" and facts["devices"] == ["/dev/kfd"]
    assert [g["devices"] for g in facts["gpus"]] == [
        ["/dev/dri/renderD128", "/dev/dri/card0"],
        ["/dev/dri/renderD129", "/dev/dri/card1"],
        ["/dev/dri/renderD130", "/dev/dri/card2"],
        ["/dev/dri/renderD131", "/dev/dri/card3"],
    ]
    assert {g["device_source"] for g in facts["gpus"]} == {"kfd-topology+drm-class"}
    assert {g["numa_node"] for g in facts["gpus"]} == {1}


def test_amd_facts_drm_class_only(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=True)
    shutil.rmtree(root / "class" / "kfd")
    facts = amd_profile_facts(root)
    assert facts["gpus"][2]["devices"] == ["/dev/dri/renderD130", "/dev/dri/card2"]
    assert facts["gpus"][2]["device_source"] == "drm-class"


def test_amd_facts_topology_only(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=True)
    shutil.rmtree(root / "class" / "drm")
    facts = amd_profile_facts(root)
    assert facts["gpus"][3]["devices"] == ["/dev/dri/renderD131"]
    assert facts["gpus"][3]["device_source"] == "kfd-topology"


def test_amd_facts_with_dereferenced_links_use_uevent(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=False)  # what a naive copy does to the device links
    shutil.rmtree(root / "class" / "kfd")
    assert not os.path.islink(root / "class" / "drm" / "card1" / "device")
    facts = amd_profile_facts(root)
    assert facts["gpus"][1]["devices"] == ["/dev/dri/renderD129", "/dev/dri/card1"]


def test_amd_facts_without_sysfs_keep_capture_numa(tmp_path):
    facts = amd_profile_facts(tmp_path)
    assert [g["devices"] for g in facts["gpus"]] == [[], [], [], []]
    assert {g["numa_node"] for g in facts["gpus"]} == {1}


def test_nvidia_facts_numa_and_devices(tmp_path):
    (tmp_path / "nvidiactl").write_text("")
    (tmp_path / "nvidia-uvm").write_text("")
    parsed = _gpu.parse_nvidia_smi_xml((NVIDIA / "datakit__gtx-8card.xml").read_text())
    facts = nvidia_facts(parsed, str(NVIDIA_SYS), str(tmp_path), "nvidia-smi -q -x")
    assert facts["devices"] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert [g["numa_node"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["devices"] for g in facts["gpus"]] == [[f"/dev/nvidia{i}"] for i in range(8)]


def test_nvidia_profile_pci_paths():
    """nvidia-8gpu-rdma: root port 00:0k.0 per pair of GPUs, a first-level switch per root port, one
    second-level switch per GPU (its HCA behind the same one, see test_rdma_reader.py)."""
    parsed = _gpu.parse_nvidia_smi_xml((NVIDIA / "datakit__gtx-8card.xml").read_text())
    facts = nvidia_facts(parsed, str(NVIDIA_SYS), str(NVIDIA_SYS), "nvidia-smi -q -x")
    for gpu in facts["gpus"]:
        k, j = divmod(gpu["index"], 2)
        base, sub = 0x10 * (k + 1), 0x10 * (k + 1) + 2 + 4 * j
        assert gpu["pci_path"] == ["pci0000:00", "0000:00:%02x.0" % (k + 1), "0000:%02x:00.0" % base,
                                   "0000:%02x:%02x.0" % (base + 1, j), "0000:%02x:00.0" % sub,
                                   "0000:%02x:00.0" % (sub + 1)]


def test_amd_profile_pci_paths():
    """amd-4gpu-rdma: one root complex per GPU (pci0000:80/a0/c0/e0), root port, one switch."""
    paths = [g["pci_path"] for g in amd_profile_facts(AMD_SYS)["gpus"]]
    assert paths == [["pci0000:%02x" % r, "0000:%02x:01.1" % r, "0000:%02x:00.0" % (r + 1), "0000:%02x:00.0" % (r + 2)]
                     for r in (0x80, 0xA0, 0xC0, 0xE0)]


def test_pci_path_unknown_without_a_devices_tree(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=False)  # bus/pci/devices/<bdf> now real directories
    assert [g["pci_path"] for g in amd_profile_facts(root)["gpus"]] == [None] * 4
    assert [g["pci_path"] for g in amd_profile_facts(tmp_path / "none")["gpus"]] == [None] * 4
    assert read_pci_path(str(AMD_SYS), None) is None


def test_nvidia_device_node_follows_minor_number(tmp_path):
    parsed = _gpu.parse_nvidia_smi_xml((NVIDIA / "telegraf__dual_a5000-v13.xml").read_text())
    facts = nvidia_facts(parsed, str(tmp_path), str(tmp_path), "nvidia-smi -q -x")
    assert [(g["index"], g["devices"]) for g in facts["gpus"]] == [(0, ["/dev/nvidia1"]), (1, ["/dev/nvidia0"])]
    assert [g["numa_node"] for g in facts["gpus"]] == [None, None]
