# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sysfs reads shared by discovery's GPU and RDMA readers (the only file access they have; every function takes
the sysfs root, so tests give a copied or simulated tree): one attribute, a PCI device's NUMA node and bus id, and
the PCI hierarchy above a device (pci_path). Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import os
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu import normalize_pci_bus_id, to_int

__metaclass__ = type


def read_text(path):
    """The stripped text of a sysfs attribute; None when it cannot be read."""
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_value(path):
    """The stripped text of a sysfs attribute; None when it cannot be read or is empty."""
    try:
        with open(path) as handle:
            value = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def read_pci_numa_node(sysfs_root, pci_bus_id):
    """``<sysfs_root>/bus/pci/devices/<bdf>/numa_node`` as int; None when absent or -1 (no NUMA info)."""
    if not pci_bus_id:
        return None
    value = to_int(read_text(os.path.join(sysfs_root, "bus", "pci", "devices", pci_bus_id, "numa_node")))
    if value is None or value < 0:
        return None
    return value


def _uevent_slot(device_dir):
    text = read_text(os.path.join(device_dir, "uevent")) or ""
    for line in text.splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            return normalize_pci_bus_id(line.split("=", 1)[1])
    return None


def device_bdf(device_link):
    """BDF of the PCI device a sysfs ``device`` entry stands for.

    The basename of the resolved link, else ``PCI_SLOT_NAME`` of its ``uevent`` (a copied tree whose links
    were dereferenced still works).
    """
    if not os.path.exists(device_link):
        return None
    return normalize_pci_bus_id(os.path.basename(os.path.realpath(device_link))) or _uevent_slot(device_link)


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
