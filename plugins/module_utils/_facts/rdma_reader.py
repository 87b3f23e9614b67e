# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's RDMA read on a host (narwhal_rdma): the HCAs and their ports from sysfs (class/infiniband, with each
HCA's NUMA node, PCI bus id and path, and uverbs device), else from ibstat / ibv_devinfo (run through
_facts/tool_runner.py, parsed by _facts/rdma.py), and the RDMA device nodes under /dev. Works on a plain dump of
/sys/class/infiniband. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import glob
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.rdma import (
    RDMA_CM,
    RdmaParseError,
    _bdf,
    hca_entry,
    parse_ibstat,
    parse_ibv_devinfo,
    port_entry,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.sysfs import pci_path, read_value
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.tool_runner import run_tool

__metaclass__ = type


RDMA_FIX = (
    "check that the RDMA drivers are loaded ('lsmod | grep -E \"mlx5_ib|ib_uverbs\"') and rdma-core / "
    "infiniband-diags are installed ('ibv_devinfo' should list the HCAs); then rerun discovery"
)


def run_rdma_tool(module, tool, path, parser, timeout=DEFAULT_TIMEOUT):
    return run_tool(module, tool, [path], parser, RdmaParseError, RDMA_FIX, "run it by hand on the host", timeout,
                    tool)


def read_rdma(module, sysfs_root, dev_root, timeout=DEFAULT_TIMEOUT):
    """narwhal_rdma: HCAs from sysfs, else from ibstat / ibv_devinfo."""
    hcas = read_sysfs_hcas(sysfs_root)
    source = os.path.join(sysfs_root, "class", "infiniband")
    if hcas is None:
        hcas, source = [], None
        for tool, parser in (("ibstat", parse_ibstat), ("ibv_devinfo", parse_ibv_devinfo)):
            path = module.get_bin_path(tool)
            if path:
                hcas, source = run_rdma_tool(module, tool, path, parser, timeout), tool
                break
        uverbs = read_uverbs_map(sysfs_root)
        for hca in hcas:
            hca["uverbs"] = uverbs.get(hca["name"])
    return rdma_facts(hcas, dev_root, source)


def read_uverbs_map(sysfs_root):
    """``{hca_name: "/dev/infiniband/uverbsN"}`` from ``<sysfs_root>/class/infiniband_verbs/uverbs*/ibdev``."""
    result = {}
    pattern = os.path.join(sysfs_root, "class", "infiniband_verbs", "uverbs*")
    for path in sorted(glob.glob(pattern), key=natural_key):
        ibdev = read_value(os.path.join(path, "ibdev"))
        if ibdev and ibdev not in result:
            result[ibdev] = "/dev/infiniband/" + os.path.basename(path)
    return result


def _device_numa_and_bdf(hca_dir):
    """(NUMA node, PCI bus id) of the PCI device below an HCA's sysfs directory."""
    device = os.path.join(hca_dir, "device")
    if not os.path.exists(device):
        return None, None
    numa = read_value(os.path.join(device, "numa_node"))
    try:
        numa = int(numa) if numa is not None else None
    except ValueError:
        numa = None
    if numa is not None and numa < 0:
        numa = None
    bdf = _bdf(os.path.basename(os.path.realpath(device)))
    if bdf is None:
        # a copied tree whose links were dereferenced: the PCI device's uevent still names the slot
        for line in (read_value(os.path.join(device, "uevent")) or "").splitlines():
            if line.startswith("PCI_SLOT_NAME="):
                bdf = _bdf(line.split("=", 1)[1])
    return numa, bdf


def read_sysfs_hcas(sysfs_root):
    """HCAs from ``<sysfs_root>/class/infiniband``; None when that directory does not exist.

    Works on a plain dump of /sys/class/infiniband (no ``device`` links, no ``infiniband_verbs``): the
    fields that need those are then null.
    """
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(base):
        return None
    uverbs = read_uverbs_map(sysfs_root)
    hcas = []
    for name in sorted(os.listdir(base), key=natural_key):
        hca_dir = os.path.join(base, name)
        if not os.path.isdir(hca_dir):
            continue
        hca = hca_entry(
            name,
            read_value(os.path.join(hca_dir, "hca_type")),
            read_value(os.path.join(hca_dir, "fw_ver")),
            read_value(os.path.join(hca_dir, "board_id")),
        )
        hca["numa_node"], hca["pci_bus_id"] = _device_numa_and_bdf(hca_dir)
        hca["pci_path"] = pci_path(sysfs_root, os.path.join(hca_dir, "device"))
        hca["uverbs"] = uverbs.get(name)
        if hca["uverbs"] is None:
            # real sysfs also links the verbs device below the PCI device
            found = sorted(glob.glob(os.path.join(hca_dir, "device", "infiniband_verbs", "uverbs*")), key=natural_key)
            if found:
                hca["uverbs"] = "/dev/infiniband/" + os.path.basename(found[0])
        ports_dir = os.path.join(hca_dir, "ports")
        numbers = []
        if os.path.isdir(ports_dir):
            numbers = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
        for number in numbers:
            port_dir = os.path.join(ports_dir, str(number))
            hca["ports"].append(
                port_entry(
                    number,
                    read_value(os.path.join(port_dir, "state")),
                    read_value(os.path.join(port_dir, "phys_state")),
                    read_value(os.path.join(port_dir, "link_layer")),
                    read_value(os.path.join(port_dir, "rate")),
                    read_value(os.path.join(port_dir, "gid_attrs", "ndevs", "0")),
                )
            )
        hcas.append(hca)
    return hcas


def existing_rdma_devices(dev_root):
    """(uverbs paths, rdma_cm path or None) that exist under ``dev_root``, reported with their /dev names."""
    base = os.path.join(dev_root, "infiniband")
    uverbs = sorted(
        ("/dev/infiniband/" + os.path.basename(p) for p in glob.glob(os.path.join(base, "uverbs*"))),
        key=natural_key,
    )
    rdma_cm = RDMA_CM if os.path.exists(os.path.join(base, "rdma_cm")) else None
    return uverbs, rdma_cm


def rdma_facts(hcas, dev_root, source):
    uverbs, rdma_cm = existing_rdma_devices(dev_root)
    devices = list(uverbs)
    if rdma_cm:
        devices.append(rdma_cm)
    return {"hcas": hcas, "rdma_cm": rdma_cm, "devices": devices, "source": source}
