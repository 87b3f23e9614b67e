# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RDMA tool output parsers (ibstat, ibv_devinfo, ibstatus) and the HCA/port entries the sysfs reader
(_facts/rdma_reader.py) fills in the same shape. Pure. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import re

RDMA_CM = "/dev/infiniband/rdma_cm"

_BDF_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class RdmaParseError(ValueError):
    """Raised when tool output cannot be understood."""


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


# A port's data rate as the kernel writes it (drivers/infiniband/core/sysfs.c, rate_show:
# "<Gb/s> Gb/sec (<width>X <speed>)", e.g. "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)"; the ABI,
# Documentation/ABI/stable/sysfs-class-infiniband: "Port data rate (active width * active speed)"), as ibstatus
# copies it, and ibstat's bare number (_ibstat_rate makes it "<n> Gb/sec").
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec(?: \(.*\))?$")


def ib_rate_bits(rate):
    """A port's rate text -> its nominal rate in bits per second (int), None when it is not the kernel's
    "<n> Gb/sec ..." form (ibv_devinfo's active_speed, "25.0 Gbps (32)", is one lane's speed, not the port's)."""
    match = _RATE_RE.match((rate or "").strip())
    if not match:
        return None
    return int(round(float(match.group(1)) * 1e9))


def port_entry(number, state, phys_state, link_layer, rate, netdev=None):
    state = _strip_code(state)
    return {
        "port": number,
        "state": state,
        "phys_state": _phys_state(phys_state),
        "link_layer": _link_layer(link_layer),
        "rate": rate.strip() if rate else None,
        "rate_bits_s": ib_rate_bits(rate),
        "netdev": netdev,
        "active": state == "ACTIVE",
    }


def hca_entry(name, hca_type=None, fw_ver=None, board_id=None):
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


def _bdf(text):
    match = _BDF_RE.match(text.strip())
    if not match:
        return None
    return f"{int(match.group(1), 16):04x}:{match.group(2).lower()}:{match.group(3).lower()}.{match.group(4)}"


def _check_hcas(hcas, tool, counts):
    """What one tool's listing of a host must hold (issue 24): each HCA named once, each with its ports, each port
    numbered from 1 (verbs count an HCA's ports from 1) and listed once, as many ports as the tool said the HCA has
    (`counts`: {name: stated count}). Otherwise the output is cut or garbled: an error, never fewer HCAs or ports."""
    seen = set()
    for hca in hcas:
        name = hca["name"]
        if name in seen:
            raise RdmaParseError(f"HCA {name} is listed twice; {tool} lists each HCA once")
        seen.add(name)
        numbers = [p["port"] for p in hca["ports"]]
        if not numbers:
            raise RdmaParseError(f"HCA {name} has no port entries; {tool} lists every port of an HCA")
        for number in numbers:
            if number < 1:
                raise RdmaParseError(f"HCA {name}: port {number} is not an HCA port (verbs number them from 1)")
            if numbers.count(number) > 1:
                raise RdmaParseError(f"HCA {name}: port {number} is listed twice")
        stated = counts.get(name)
        if stated is not None and stated != len(numbers):
            raise RdmaParseError(f"HCA {name} says it has {stated} port(s) but {len(numbers)} are listed; the output "
                                 "is cut short or garbled")


def _count(value, what, name):
    if value is None:
        return None
    if not value.isdigit():
        raise RdmaParseError(f"HCA {name}: '{what}: {value}' is not a number of ports")
    return int(value)


# --------------------------------------------------------------------------------------------------
# ibstat


def parse_ibstat(text):
    """Parse ``ibstat`` output (``CA 'mlx5_0'`` blocks with ``Port N:`` sub-blocks)."""
    if text is None or not text.strip():
        return []
    hcas = []
    counts = {}
    hca = None
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = re.match(r"^CA\s+'([^']+)'", line)
        if match:
            hca = hca_entry(match.group(1))
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
            elif key == "Number of ports":
                counts[hca["name"]] = _count(value, key, hca["name"])
        else:
            port[key] = value
    if not hcas:
        raise RdmaParseError("no \"CA '<name>'\" lines (expected ibstat output)")
    _check_hcas(hcas, "ibstat", counts)
    for hca in hcas:
        hca["ports"] = [
            port_entry(p["port"], p.get("State"), p.get("Physical state"), p.get("Link layer"),
                       _ibstat_rate(p.get("Rate")))
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
    counts = {}
    hca = None
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or ":" not in line:
            continue
        key, value = [part.strip() for part in line.split(":", 1)]
        if key == "hca_id":
            hca = hca_entry(value)
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
            elif key == "phys_port_cnt":
                counts[hca["name"]] = _count(value, key, hca["name"])
        else:
            port[key] = value
    if not hcas:
        raise RdmaParseError("no 'hca_id:' lines (expected ibv_devinfo output)")
    _check_hcas(hcas, "ibv_devinfo", counts)
    for hca in hcas:
        part = hca.pop("vendor_part_id", None)
        if hca["hca_type"] is None and part:
            hca["hca_type"] = f"MT{part}"
        hca["ports"] = [
            port_entry(p["port"], p.get("state"), p.get("phys_state"), p.get("link_layer"), p.get("active_speed"))
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
                hcas[name] = hca_entry(name)
                order.append(name)
            port = {"port": int(match.group(2))}
            hcas[name]["ports"].append(port)
            continue
        if port is not None and ":" in line:
            key, value = [part.strip() for part in line.split(":", 1)]
            port[key] = value
    if not order:
        raise RdmaParseError("no \"Infiniband device '<name>' port N status:\" lines (expected ibstatus output)")
    _check_hcas([hcas[name] for name in order], "ibstatus", {})
    result = []
    for name in order:
        hca = hcas[name]
        hca["ports"] = [
            port_entry(p["port"], p.get("state"), p.get("phys state"), p.get("link_layer"), p.get("rate"))
            for p in hca["ports"]
        ]
        result.append(hca)
    return result
