# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RDMA inventory: sysfs reader and ``ibstat`` / ``ibv_devinfo`` / ``ibstatus`` text parsers (no subprocess).

Every HCA is returned as ``{"name", "hca_type", "fw_ver", "board_id", "numa_node", "pci_bus_id", "pci_path",
"uverbs", "ports": [{"port", "state", "phys_state", "link_layer", "rate", "netdev", "active"}]}``
(``pci_path``: see ``_pci.pci_path``; only sysfs knows it).
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._pci import pci_path

RDMA_CM = "/dev/infiniband/rdma_cm"

_BDF_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class RdmaParseError(ValueError):
    """Raised when tool output cannot be understood."""


def _natural_key(text):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _read(path):
    try:
        with open(path) as handle:
            value = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def _strip_code(value):
    """``4: ACTIVE`` -> ``ACTIVE``; ``PORT_ACTIVE (4)`` -> ``ACTIVE``; ``Active`` -> ``ACTIVE``."""
    if value is None:
        return None
    value = value.strip()
    match = re.match(r"^\d+:\s*(.*)$", value)
    if match:
        value = match.group(1)
    value = re.sub(r"\s*\(\d+\)$", "", value)
    if value.upper().startswith("PORT_"):
        value = value[5:]
    return value.upper() or None


def _phys_state(value):
    """``5: LinkUp`` -> ``LinkUp``; ``Polling`` stays."""
    if value is None:
        return None
    value = value.strip()
    match = re.match(r"^\d+:\s*(.*)$", value)
    return (match.group(1) if match else value) or None


def _link_layer(value):
    if value is None:
        return None
    low = value.strip().lower()
    if low == "infiniband":
        return "InfiniBand"
    if low == "ethernet":
        return "Ethernet"
    return value.strip() or None


def _port(number, state, phys_state, link_layer, rate, netdev=None):
    state = _strip_code(state)
    return {
        "port": number,
        "state": state,
        "phys_state": _phys_state(phys_state),
        "link_layer": _link_layer(link_layer),
        "rate": rate.strip() if rate else None,
        "netdev": netdev,
        "active": state == "ACTIVE",
    }


def _hca(name, hca_type=None, fw_ver=None, board_id=None):
    return {
        "name": name,
        "hca_type": hca_type,
        "fw_ver": fw_ver,
        "board_id": board_id,
        "numa_node": None,
        "pci_bus_id": None,
        "pci_path": None,
        "uverbs": None,
        "ports": [],
    }


# --------------------------------------------------------------------------------------------------
# sysfs


def read_uverbs_map(sysfs_root):
    """``{hca_name: "/dev/infiniband/uverbsN"}`` from ``<sysfs_root>/class/infiniband_verbs/uverbs*/ibdev``."""
    result = {}
    pattern = os.path.join(sysfs_root, "class", "infiniband_verbs", "uverbs*")
    for path in sorted(glob.glob(pattern), key=_natural_key):
        ibdev = _read(os.path.join(path, "ibdev"))
        if ibdev and ibdev not in result:
            result[ibdev] = "/dev/infiniband/" + os.path.basename(path)
    return result


def _device_numa_and_bdf(hca_dir):
    """(NUMA node, PCI bus id) of the PCI device below an HCA's sysfs directory."""
    device = os.path.join(hca_dir, "device")
    if not os.path.exists(device):
        return None, None
    numa = _read(os.path.join(device, "numa_node"))
    try:
        numa = int(numa) if numa is not None else None
    except ValueError:
        numa = None
    if numa is not None and numa < 0:
        numa = None
    bdf = _bdf(os.path.basename(os.path.realpath(device)))
    if bdf is None:
        # a copied tree whose links were dereferenced: the PCI device's uevent still names the slot
        for line in (_read(os.path.join(device, "uevent")) or "").splitlines():
            if line.startswith("PCI_SLOT_NAME="):
                bdf = _bdf(line.split("=", 1)[1])
    return numa, bdf


def _bdf(text):
    match = _BDF_RE.match(text.strip())
    if not match:
        return None
    return f"{int(match.group(1), 16):04x}:{match.group(2).lower()}:{match.group(3).lower()}.{match.group(4)}"


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
    for name in sorted(os.listdir(base), key=_natural_key):
        hca_dir = os.path.join(base, name)
        if not os.path.isdir(hca_dir):
            continue
        hca = _hca(
            name,
            _read(os.path.join(hca_dir, "hca_type")),
            _read(os.path.join(hca_dir, "fw_ver")),
            _read(os.path.join(hca_dir, "board_id")),
        )
        hca["numa_node"], hca["pci_bus_id"] = _device_numa_and_bdf(hca_dir)
        hca["pci_path"] = pci_path(sysfs_root, os.path.join(hca_dir, "device"))
        hca["uverbs"] = uverbs.get(name)
        if hca["uverbs"] is None:
            # real sysfs also links the verbs device below the PCI device
            found = sorted(glob.glob(os.path.join(hca_dir, "device", "infiniband_verbs", "uverbs*")), key=_natural_key)
            if found:
                hca["uverbs"] = "/dev/infiniband/" + os.path.basename(found[0])
        ports_dir = os.path.join(hca_dir, "ports")
        numbers = []
        if os.path.isdir(ports_dir):
            numbers = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
        for number in numbers:
            port_dir = os.path.join(ports_dir, str(number))
            hca["ports"].append(
                _port(
                    number,
                    _read(os.path.join(port_dir, "state")),
                    _read(os.path.join(port_dir, "phys_state")),
                    _read(os.path.join(port_dir, "link_layer")),
                    _read(os.path.join(port_dir, "rate")),
                    _read(os.path.join(port_dir, "gid_attrs", "ndevs", "0")),
                )
            )
        hcas.append(hca)
    return hcas


def existing_rdma_devices(dev_root):
    """(uverbs paths, rdma_cm path or None) that exist under ``dev_root``, reported with their /dev names."""
    base = os.path.join(dev_root, "infiniband")
    uverbs = sorted(
        ("/dev/infiniband/" + os.path.basename(p) for p in glob.glob(os.path.join(base, "uverbs*"))),
        key=_natural_key,
    )
    rdma_cm = RDMA_CM if os.path.exists(os.path.join(base, "rdma_cm")) else None
    return uverbs, rdma_cm


def rdma_facts(hcas, dev_root, source):
    uverbs, rdma_cm = existing_rdma_devices(dev_root)
    devices = list(uverbs)
    if rdma_cm:
        devices.append(rdma_cm)
    return {"hcas": hcas, "rdma_cm": rdma_cm, "devices": devices, "source": source}


# --------------------------------------------------------------------------------------------------
# ibstat


def parse_ibstat(text):
    """Parse ``ibstat`` output (``CA 'mlx5_0'`` blocks with ``Port N:`` sub-blocks)."""
    if text is None or not text.strip():
        return []
    hcas = []
    hca = None
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = re.match(r"^CA\s+'([^']+)'", line)
        if match:
            hca = _hca(match.group(1))
            hcas.append(hca)
            port = None
            continue
        if hca is None:
            continue
        match = re.match(r"^Port\s+(\d+):$", line)
        if match:
            port = {"port": int(match.group(1))}
            hca["ports"].append(port)
            continue
        if ":" not in line:
            continue
        key, value = [part.strip() for part in line.split(":", 1)]
        if port is None:
            if key == "CA type":
                hca["hca_type"] = value or None
            elif key == "Firmware version":
                hca["fw_ver"] = value or None
        else:
            port[key] = value
    if not hcas:
        raise RdmaParseError("no \"CA '<name>'\" lines (expected ibstat output)")
    for hca in hcas:
        hca["ports"] = [
            _port(p["port"], p.get("State"), p.get("Physical state"), p.get("Link layer"), _ibstat_rate(p.get("Rate")))
            for p in hca["ports"]
        ]
    return hcas


def _ibstat_rate(value):
    """ibstat prints the rate as a bare number of Gb/s."""
    if value is None or value == "":
        return None
    return f"{value} Gb/sec" if re.match(r"^\d+(\.\d+)?$", value) else value


# --------------------------------------------------------------------------------------------------
# ibv_devinfo


def parse_ibv_devinfo(text):
    """Parse ``ibv_devinfo`` output (``hca_id:`` blocks with ``port:`` sub-blocks, tab-indented).

    No output, or only ``No IB devices found``, is a host without HCAs; anything else without an ``hca_id:`` line
    is an error."""
    if text is None or not text.strip() or text.strip() == "No IB devices found":
        return []
    hcas = []
    hca = None
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or ":" not in line:
            continue
        key, value = [part.strip() for part in line.split(":", 1)]
        if key == "hca_id":
            hca = _hca(value)
            hcas.append(hca)
            port = None
            continue
        if hca is None:
            continue
        if key == "port":
            if not value.isdigit():
                raise RdmaParseError(f"hca {hca['name']}: 'port: {value}' is not a port number")
            port = {"port": int(value)}
            hca["ports"].append(port)
        elif port is None:
            if key == "fw_ver":
                hca["fw_ver"] = value or None
            elif key == "board_id":
                hca["board_id"] = value or None
            elif key == "vendor_part_id":
                hca["vendor_part_id"] = value or None
        else:
            port[key] = value
    if not hcas:
        raise RdmaParseError("no 'hca_id:' lines (expected ibv_devinfo output)")
    for hca in hcas:
        part = hca.pop("vendor_part_id", None)
        if hca["hca_type"] is None and part:
            hca["hca_type"] = f"MT{part}"
        hca["ports"] = [
            _port(p["port"], p.get("state"), p.get("phys_state"), p.get("link_layer"), p.get("active_speed"))
            for p in hca["ports"]
        ]
    return hcas


# --------------------------------------------------------------------------------------------------
# ibstatus


def parse_ibstatus(text):
    """Parse ``ibstatus`` output (``Infiniband device 'mlx5_0' port 1 status:`` blocks)."""
    if text is None or not text.strip():
        return []
    hcas = {}
    order = []
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        match = re.match(r"^Infiniband device '([^']+)' port (\d+) status:$", line)
        if match:
            name = match.group(1)
            if name not in hcas:
                hcas[name] = _hca(name)
                order.append(name)
            port = {"port": int(match.group(2))}
            hcas[name]["ports"].append(port)
            continue
        if port is not None and ":" in line:
            key, value = [part.strip() for part in line.split(":", 1)]
            port[key] = value
    if not order:
        raise RdmaParseError("no \"Infiniband device '<name>' port N status:\" lines (expected ibstatus output)")
    result = []
    for name in order:
        hca = hcas[name]
        hca["ports"] = [
            _port(p["port"], p.get("state"), p.get("phys state"), p.get("link_layer"), p.get("rate"))
            for p in hca["ports"]
        ]
        result.append(hca)
    return result
