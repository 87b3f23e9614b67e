# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe topology from sysfs: where a PCI device sits in the tree of root buses, root ports and switches.

Shared by the GPU and RDMA readers (``_gpu``, ``_rdma``); the only file access is resolving links below a
``sysfs_root``, so tests point it at recorded or prepared trees. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import os
import re

# sysfs names: a root bus directory ``pci<domain>:<bus>`` and PCI functions ``<domain>:<bus>:<dev>.<fn>``
_ROOT_RE = re.compile(r"^pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}$")
_BDF_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def pci_path(sysfs_root, device):
    """The PCI hierarchy above a device, as sysfs nests it; None when it cannot be known.

    ``device`` is any sysfs entry that stands for a PCI function: ``<sysfs_root>/bus/pci/devices/<bdf>`` or a
    class device's ``device`` link (``class/infiniband/mlx5_0/device``). Its resolved location below
    ``<sysfs_root>/devices`` (``devices/pci0000:00/0000:00:01.0/0000:01:00.0/.../0000:07:00.0``) gives the
    list from the root bus down to the device's parent bridge: ``["pci0000:00", "0000:00:01.0",
    "0000:01:00.0", ...]`` (lower case). A device directly on a root bus has ``["pci0000:00"]``.
    None when the entry does not exist or does not resolve into ``devices/`` (a copied tree whose links were
    dereferenced, a dump of a class directory alone).
    """
    if not device or not os.path.exists(device):
        return None
    devices = os.path.realpath(os.path.join(sysfs_root, "devices"))
    real = os.path.realpath(device)
    if not real.startswith(devices + os.sep):
        return None
    parts = os.path.relpath(real, devices).split(os.sep)
    roots = [i for i, part in enumerate(parts) if _ROOT_RE.match(part)]
    if not roots:
        return None
    chain = parts[roots[-1]:]  # a root bus can sit below platform nodes (ACPI, VMBus): start at the last one
    if len(chain) < 2 or not all(_BDF_RE.match(part) for part in chain[1:]):
        return None
    return [part.lower() for part in chain[:-1]]


def read_pci_path(sysfs_root, pci_bus_id):
    """:func:`pci_path` of ``<sysfs_root>/bus/pci/devices/<pci_bus_id>``; None when the bus id is unknown."""
    if not pci_bus_id:
        return None
    return pci_path(sysfs_root, os.path.join(sysfs_root, "bus", "pci", "devices", pci_bus_id))
