# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sysfs reads shared by the GPU and RDMA readers (plugins/module_utils/_facts/sysfs.py): the PCI path of a
device from where sysfs nests it (the profiles' trees are read in test_gpu_reader.py and test_rdma_reader.py)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.sysfs import read_pci_path


@pytest.mark.parametrize(
    "location, expected",
    [
        ("pci0000:00/0000:00:1e.0", ["pci0000:00"]),  # on the root bus
        ("pci0000:80/0000:80:01.1/0000:81:00.0/0000:82:00.0/0000:83:00.0",
         ["pci0000:80", "0000:80:01.1", "0000:81:00.0", "0000:82:00.0"]),
        # Hyper-V: the root bus sits below platform nodes
        ("LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01/47505500-0001-0000-3130-444531444234/pci0001:00/"
         "0001:00:00.0", ["pci0001:00"]),
        ("platform/soc/0000:00:00.0", None),  # no root bus directory
        ("pci0000:00/0000:00:01.0/usb1/0000:01:00.0", None),  # something else than PCI functions in between
    ],
)
def test_pci_path_of_a_sysfs_location(tmp_path, location, expected):
    (tmp_path / "devices" / location).mkdir(parents=True)
    link = tmp_path / "bus" / "pci" / "devices" / location.rsplit("/", 1)[1]
    link.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(tmp_path / "devices" / location, link.parent), link)
    assert read_pci_path(str(tmp_path), link.name) == expected
