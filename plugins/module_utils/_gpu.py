# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU inventory: parsers for vendor tool output and sysfs lookups (pure; no subprocess).

Every parser takes the text a tool printed and returns plain dicts. File reading lives in small helpers
that take a ``sysfs_root`` / ``dev_root`` so tests can point them at fixture trees.

A GPU's identity on a host is its index (position in the tool's listing). GPUs are never merged or
de-duplicated by UUID: sanitised captures carry the same UUID twice and masked ones carry all-zero UUIDs.
"""

from __future__ import annotations

import glob
import json
import os
import re
import xml.etree.ElementTree as ET  # noqa: N817  (ET is the idiomatic name)

from ansible_collections.narwhal.deploy.plugins.module_utils._pci import read_pci_path

NVIDIA_CTL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
AMD_KFD_DEVICE = "/dev/kfd"

_BDF_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)
_MEM_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNKNOWN = ("", "n/a", "[n/a]", "none", "unknown", "not supported", "[not supported]")


class GpuParseError(ValueError):
    """Raised when tool output cannot be understood; the message says what was wrong."""


# --------------------------------------------------------------------------------------------------
# small value helpers


def _clean(value):
    if value is None:
        return None
    value = str(value).strip()
    if value.lower() in _UNKNOWN:
        return None
    return value


def normalize_pci_bus_id(value):
    """``00000000:00:0D.0`` / ``0000:83:00.0`` / ``83:00.0`` -> ``0000:83:00.0`` (lower case); None if not a BDF."""
    value = _clean(value)
    if value is None:
        return None
    match = _BDF_RE.match(value)
    if not match:
        return None
    domain = int(match.group("domain") or "0", 16)
    bus, dev, fn = int(match.group("bus"), 16), int(match.group("dev"), 16), match.group("fn")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def _to_int(value):
    value = _clean(value)
    if value is None:
        return None
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


def memory_to_mib(value, default_unit="MiB"):
    """``81920 MiB`` -> 81920; ``34342961152`` with default_unit ``B`` -> 32752; None when unknown."""
    value = _clean(value)
    if value is None:
        return None
    match = _MEM_RE.match(value)
    if not match:
        return None
    number = float(match.group("num"))
    unit = (match.group("unit") or default_unit).lower()
    factor = {
        "b": 1.0 / (1024 * 1024),
        "kib": 1.0 / 1024,
        "kb": 1.0 / 1024,
        "mib": 1.0,
        "mb": 1.0,
        "gib": 1024.0,
        "gb": 1024.0,
        "tib": 1024.0 * 1024,
        "tb": 1024.0 * 1024,
    }.get(unit)
    if factor is None:
        return None
    return int(number * factor)


def _natural_key(text):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# --------------------------------------------------------------------------------------------------
# NVIDIA: nvidia-smi -q -x


def parse_nvidia_smi_xml(text):
    """Parse ``nvidia-smi -q -x`` output.

    Returns ``{"driver_version", "cuda_version", "attached_gpus", "gpus": [...]}``; each GPU has ``index``
    (position in the listing = nvidia-smi index), ``uuid``, ``name``, ``pci_bus_id``, ``minor_number``,
    ``memory_mib``, ``mig_mode`` and, when MIG is enabled, ``mig_devices``.
    """
    if text is None or not text.strip():
        raise GpuParseError("empty output (expected an <nvidia_smi_log> XML document)")
    text = text.strip()
    if not text.startswith("<"):
        # a warning line printed before the document (e.g. an infoROM notice) must not hide the report
        starts = [pos for pos in (text.find("<?xml"), text.find("<nvidia_smi_log")) if pos >= 0]
        if starts:
            text = text[min(starts) :]
    try:
        root = ET.fromstring(text.encode("utf-8"))
    except ET.ParseError as exc:
        raise GpuParseError(f"not well-formed XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise GpuParseError(f"unexpected XML root element <{root.tag}> (expected <nvidia_smi_log>)")
    gpus = []
    for position, node in enumerate(root.findall("gpu")):
        bdf = normalize_pci_bus_id(node.findtext("pci/pci_bus_id")) or normalize_pci_bus_id(node.get("id"))
        mig_mode = _clean(node.findtext("mig_mode/current_mig"))
        gpu = {
            "index": position,
            "uuid": _clean(node.findtext("uuid")),
            "name": _clean(node.findtext("product_name")),
            "pci_bus_id": bdf,
            "minor_number": _to_int(node.findtext("minor_number")),
            "memory_mib": memory_to_mib(node.findtext("fb_memory_usage/total")),
            "mig_mode": mig_mode,
        }
        if mig_mode is not None and mig_mode.lower() == "enabled":
            migs = []
            for mig in node.findall("mig_devices/mig_device"):
                migs.append(
                    {
                        "index": _to_int(mig.findtext("index")),
                        "gpu_instance_id": _to_int(mig.findtext("gpu_instance_id")),
                        "compute_instance_id": _to_int(mig.findtext("compute_instance_id")),
                        "uuid": _clean(mig.findtext("uuid")),
                        "memory_mib": memory_to_mib(mig.findtext("fb_memory_usage/total")),
                    }
                )
            gpu["mig_devices"] = migs
        gpus.append(gpu)
    attached = _to_int(root.findtext("attached_gpus"))
    if not gpus:
        # nvidia-smi reports a host without GPUs by failing ("No devices were found"), never with an empty log
        raise GpuParseError(f"the <nvidia_smi_log> lists no <gpu> (attached_gpus: {attached}); a GPU-less host "
                            "makes nvidia-smi fail with 'No devices were found', so this is not a real inventory")
    for gpu in gpus:
        if gpu["pci_bus_id"] is None and gpu["minor_number"] is None:
            raise GpuParseError(f"GPU {gpu['index']} has neither a PCI bus id nor a minor number, so no device node "
                                "or sysfs entry can be found for it")
    return {
        "driver_version": _clean(root.findtext("driver_version")),
        "cuda_version": _clean(root.findtext("cuda_version")),
        "attached_gpus": attached,
        "gpus": gpus,
    }


# --------------------------------------------------------------------------------------------------
# NVIDIA: nvidia-smi -q (text) fallback parser

_TEXT_KV_RE = re.compile(r"^( *)([^:]*?\S)\s+:\s?(.*)$")


def _text_tree(lines):
    """Indentation tree of ``Key : value`` / ``Section`` lines -> nested list of (key, value, children)."""
    root = []
    stack = [(-1, root)]
    for raw in lines:
        line = raw.rstrip("\r\n").replace("\t", "    ")
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        match = _TEXT_KV_RE.match(line)
        if match:
            key, value = match.group(2).strip(), match.group(3).strip()
        else:
            key, value = line.strip(), None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        children = []
        stack[-1][1].append((key, value, children))
        stack.append((indent, children))
    return root


def _tree_get(nodes, *path):
    for position, part in enumerate(path):
        for key, value, children in nodes:
            if key == part:
                if position == len(path) - 1:
                    return value
                nodes = children
                break
        else:
            return None
    return None


def _tree_all(nodes, name):
    return [children for key, _value, children in nodes if key == name]


def parse_nvidia_smi_text(text):
    """Parse ``nvidia-smi -q`` / ``-a`` text (same result shape as :func:`parse_nvidia_smi_xml`).

    Only the first ``NVSMI LOG`` block is read; a line starting with ``####`` (capture-file banners) ends it.
    """
    if text is None or "NVSMI LOG" not in text:
        raise GpuParseError("no '==NVSMI LOG==' header found (expected 'nvidia-smi -q' text)")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "NVSMI LOG" in line)
    body = []
    for line in lines[start + 1 :]:
        if line.startswith("####") or "NVSMI LOG" in line:
            break
        body.append(line)
    tree = _text_tree(body)
    gpus = []
    position = 0
    for key, _value, children in tree:
        if not key.startswith("GPU "):
            continue
        header_bdf = key[4:].strip()
        mig_mode = _clean(_tree_get(children, "MIG Mode", "Current"))
        gpu = {
            "index": position,
            "uuid": _clean(_tree_get(children, "GPU UUID")),
            "name": _clean(_tree_get(children, "Product Name")),
            "pci_bus_id": normalize_pci_bus_id(_tree_get(children, "PCI", "Bus Id"))
            or normalize_pci_bus_id(header_bdf),
            "minor_number": _to_int(_tree_get(children, "Minor Number")),
            "memory_mib": memory_to_mib(_tree_get(children, "FB Memory Usage", "Total")),
            "mig_mode": mig_mode,
        }
        if mig_mode is not None and mig_mode.lower() == "enabled":
            gpu["mig_devices"] = [
                {
                    "index": _to_int(_tree_get(mig, "Index")),
                    "gpu_instance_id": _to_int(_tree_get(mig, "GPU Instance ID")),
                    "compute_instance_id": _to_int(_tree_get(mig, "Compute Instance ID")),
                    "uuid": _clean(_tree_get(mig, "MIG UUID")) or _clean(_tree_get(mig, "UUID")),
                    "memory_mib": memory_to_mib(
                        _tree_get(mig, "Shared FB Memory Usage", "Total") or _tree_get(mig, "FB Memory Usage", "Total")
                    ),
                }
                for mig in _tree_all(children, "MIG Device")
            ]
        gpus.append(gpu)
        position += 1
    return {
        "driver_version": _clean(_tree_get(tree, "Driver Version")),
        "cuda_version": _clean(_tree_get(tree, "CUDA Version")),
        "attached_gpus": _to_int(_tree_get(tree, "Attached GPUs")),
        "gpus": gpus,
    }


# --------------------------------------------------------------------------------------------------
# AMD: rocm-smi --json

_CARD_RE = re.compile(r"^card(\d+)$")


def _first(mapping, *keys):
    lowered = {str(k).strip().lower(): v for k, v in mapping.items()}
    for key in keys:
        value = _clean(lowered.get(key.lower()))
        if value is not None:
            return value
    return None


def _load_json(text, what):
    if isinstance(text, (dict, list)):
        return text
    if text is None or not str(text).strip():
        raise GpuParseError(f"empty output (expected {what})")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GpuParseError(f"not valid JSON (expected {what}): {exc}") from None
    except RecursionError:
        raise GpuParseError(f"JSON nested too deeply to read (expected {what})") from None


def parse_rocm_smi_json(text):
    """Parse ``rocm-smi ... --json`` (any ROCm 4.x-6.x key spelling).

    Returns ``{"driver_version", "gpus": [...]}``; each GPU has ``index`` (N of ``cardN``), ``uuid`` (the
    ``Unique ID`` as printed, None for ``N/A``), ``name`` (``Device Name``, else ``Card series``, else
    ``Card model``), ``pci_bus_id``, ``memory_mib``, ``numa_node`` (as rocm-smi reports it), ``kfd_node_id``,
    ``gfx_version``.
    """
    data = _load_json(text, "rocm-smi JSON")
    if not isinstance(data, dict):
        raise GpuParseError(f"rocm-smi JSON is a {type(data).__name__}, expected an object keyed by cardN")
    gpus = []
    for key, card in data.items():
        match = _CARD_RE.match(str(key))
        if not match or not isinstance(card, dict):
            continue
        memory = _first(card, "VRAM Total Memory (B)")
        memory_mib = memory_to_mib(memory, "B") if memory is not None else None
        if memory_mib is None:
            memory_mib = memory_to_mib(_first(card, "VRAM Total Memory (MiB)"), "MiB")
        gpus.append(
            {
                "index": int(match.group(1)),
                "uuid": _first(card, "Unique ID"),
                "name": _first(card, "Device Name", "Card Series", "Card model", "Card SKU"),
                "pci_bus_id": normalize_pci_bus_id(_first(card, "PCI Bus")),
                "memory_mib": memory_mib,
                "numa_node": _to_int(_first(card, "(Topology) Numa Node")),
                "kfd_node_id": _to_int(_first(card, "Node ID")),
                "gfx_version": _first(card, "GFX Version"),
            }
        )
    if not gpus:
        keys = ", ".join(sorted(map(str, data)))
        raise GpuParseError(f"no cardN entries in rocm-smi JSON (keys: {keys})")
    gpus.sort(key=lambda g: g["index"])
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    return {"driver_version": _first(system, "Driver version"), "gpus": gpus}


# --------------------------------------------------------------------------------------------------
# AMD: amd-smi static --json (no real capture exists; written from AMD's documented layout)


def _dig(mapping, *path):
    node = mapping
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def parse_amd_smi_static_json(text):
    """Parse ``amd-smi static --json``: a list of per-GPU objects, or ``{"gpu_data": [...]}`` (newer releases).

    Uses ``gpu``, ``asic.market_name``, ``asic.asic_serial``, ``bus.bdf``, ``board.product_name``,
    ``vram.size``, ``numa.node``, ``driver.version`` where present; every field is optional.
    """
    data = _load_json(text, "amd-smi JSON")
    if isinstance(data, dict):
        for key in ("gpu_data", "gpus", "data"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            data = [data]
    if not isinstance(data, list):
        raise GpuParseError(f"amd-smi JSON is a {type(data).__name__}, expected a list of GPUs")
    gpus = []
    driver_version = None
    for position, entry in enumerate(data):
        if not isinstance(entry, dict):
            continue
        index = entry.get("gpu")
        index = index if isinstance(index, int) else _to_int(index)
        size = _dig(entry, "vram", "size")
        if isinstance(size, dict):
            memory_mib = memory_to_mib(f"{size.get('value')} {size.get('unit') or 'MB'}")
        else:
            memory_mib = memory_to_mib(size, "MB") if size is not None else None
        numa = _dig(entry, "numa", "node")
        driver_version = driver_version or _clean(_dig(entry, "driver", "version"))
        gpus.append(
            {
                "index": position if index is None else index,
                "uuid": _clean(entry.get("uuid")) or _clean(_dig(entry, "asic", "asic_serial")),
                "name": _clean(_dig(entry, "asic", "market_name")) or _clean(_dig(entry, "board", "product_name")),
                "pci_bus_id": normalize_pci_bus_id(_dig(entry, "bus", "bdf"))
                or normalize_pci_bus_id(entry.get("bdf"))
                or normalize_pci_bus_id(_dig(entry, "asic", "pci_bdf")),
                "memory_mib": memory_mib,
                "numa_node": numa if isinstance(numa, int) else _to_int(numa),
                "kfd_node_id": _to_int(_dig(entry, "kfd", "node_id")),
                "gfx_version": _clean(_dig(entry, "asic", "target_graphics_version")),
            }
        )
    if not gpus:
        raise GpuParseError("no GPU objects in amd-smi JSON")
    gpus.sort(key=lambda g: g["index"])
    return {"driver_version": driver_version, "gpus": gpus}


# --------------------------------------------------------------------------------------------------
# sysfs / dev helpers (the only file access in this module; all take a root)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_pci_numa_node(sysfs_root, pci_bus_id):
    """``<sysfs_root>/bus/pci/devices/<bdf>/numa_node`` as int; None when absent or -1 (no NUMA info)."""
    if not pci_bus_id:
        return None
    value = _to_int(_read(os.path.join(sysfs_root, "bus", "pci", "devices", pci_bus_id, "numa_node")))
    if value is None or value < 0:
        return None
    return value


def _uevent_slot(device_dir):
    text = _read(os.path.join(device_dir, "uevent")) or ""
    for line in text.splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            return normalize_pci_bus_id(line.split("=", 1)[1])
    return None


def _device_bdf(device_link):
    """BDF of the PCI device a sysfs ``device`` entry stands for.

    The basename of the resolved link, else ``PCI_SLOT_NAME`` of its ``uevent`` (a copied tree whose links
    were dereferenced still works).
    """
    if not os.path.exists(device_link):
        return None
    return normalize_pci_bus_id(os.path.basename(os.path.realpath(device_link))) or _uevent_slot(device_link)


def read_kfd_topology(sysfs_root):
    """GPU nodes of ``<sysfs_root>/class/kfd/kfd/topology/nodes/*/properties``.

    Returns a list of ``{"node", "gpu_id", "drm_render_minor", "pci_bus_id", "unique_id"}``; CPU nodes
    (gpu_id 0 / no render minor) are skipped.
    """
    nodes = []
    base = os.path.join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    for path in sorted(glob.glob(os.path.join(base, "*")), key=_natural_key):
        text = _read(os.path.join(path, "properties"))
        if text is None:
            continue
        props = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                props[parts[0]] = _to_int(parts[1])
        gpu_id = _to_int(_read(os.path.join(path, "gpu_id")))
        minor = props.get("drm_render_minor")
        if not minor or minor < 128 or gpu_id == 0:
            continue
        bdf = None
        location = props.get("location_id")
        if location is not None and location > 0:
            domain = props.get("domain") or 0
            bus, dev, fn = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
            bdf = f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
        unique = props.get("unique_id")
        nodes.append(
            {
                "node": _to_int(os.path.basename(path)),
                "gpu_id": gpu_id,
                "drm_render_minor": minor,
                "pci_bus_id": bdf,
                "unique_id": unique,
            }
        )
    return nodes


def read_drm_nodes(sysfs_root):
    """``{bdf: {"render": [minor...], "card": [index...]}}`` from ``<sysfs_root>/class/drm/{renderD,card}*/device``."""
    result = {}
    base = os.path.join(sysfs_root, "class", "drm")
    for path in sorted(glob.glob(os.path.join(base, "*")), key=_natural_key):
        name = os.path.basename(path)
        match = re.match(r"^(renderD|card)(\d+)$", name)
        if not match:
            continue  # connectors such as card0-DP-1, version, ...
        bdf = _device_bdf(os.path.join(path, "device"))
        if bdf is None:
            continue
        entry = result.setdefault(bdf, {"render": [], "card": []})
        entry["render" if match.group(1) == "renderD" else "card"].append(int(match.group(2)))
    return result


def amd_gpu_devices(gpu, kfd_nodes, drm_nodes):
    """Device paths one AMD GPU needs: its ``/dev/dri/renderD<N>`` and ``/dev/dri/card<M>``.

    Render minor from the KFD topology first (matched by BDF, else by KFD node id, else unique id), then from
    the DRM class; the card node from the DRM class. Returns ``(paths, how, pci_bus_id)``: ``how`` lists the
    sources used, ``pci_bus_id`` is the GPU's bus id (from the topology when the tool printed none).
    """
    bdf = gpu.get("pci_bus_id")
    render = None
    how = []
    for node in kfd_nodes:
        if bdf and node["pci_bus_id"] == bdf:
            render = node["drm_render_minor"]
        elif not bdf and gpu.get("kfd_node_id") is not None and node["node"] == gpu["kfd_node_id"]:
            render = node["drm_render_minor"]
        elif not bdf and gpu.get("uuid") and node["unique_id"] and _to_int(gpu["uuid"]) == node["unique_id"]:
            render = node["drm_render_minor"]
        if render is not None:
            how.append("kfd-topology")
            if not bdf:
                bdf = node["pci_bus_id"]
            break
    drm = drm_nodes.get(bdf) if bdf else None
    if render is None and drm and drm["render"]:
        render = drm["render"][0]
        how.append("drm-class")
    paths = []
    if render is not None:
        paths.append(f"/dev/dri/renderD{render}")
    if drm:
        paths.extend(f"/dev/dri/card{card}" for card in sorted(drm["card"]))
        if "drm-class" not in how and drm["card"]:
            how.append("drm-class")
    return paths, how, bdf


def existing_devices(dev_root, paths):
    """The subset of ``/dev/...`` paths that exist under ``dev_root`` (reported with their ``/dev`` names)."""
    found = []
    for path in paths:
        relative = path[len("/dev/") :] if path.startswith("/dev/") else path.lstrip("/")
        if os.path.exists(os.path.join(dev_root, relative)):
            found.append(path)
    return found


# --------------------------------------------------------------------------------------------------
# fact assembly


def empty_facts(source=None):
    return {"vendor": "none", "gpus": [], "devices": [], "driver_version": None, "source": source}


def nvidia_facts(parsed, sysfs_root, dev_root, source):
    """Facts for NVIDIA from a parsed ``nvidia-smi`` result."""
    gpus = []
    for gpu in parsed["gpus"]:
        devices = []
        if gpu.get("minor_number") is not None:
            devices.append(f"/dev/nvidia{gpu['minor_number']}")
        entry = {
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu["name"],
            "pci_bus_id": gpu["pci_bus_id"],
            "pci_path": read_pci_path(sysfs_root, gpu["pci_bus_id"]),
            "devices": devices,
            "numa_node": read_pci_numa_node(sysfs_root, gpu["pci_bus_id"]),
            "memory_mib": gpu["memory_mib"],
            "minor_number": gpu.get("minor_number"),
        }
        if "mig_devices" in gpu:
            entry["mig_devices"] = gpu["mig_devices"]
        gpus.append(entry)
    return {
        "vendor": "nvidia",
        "gpus": gpus,
        "devices": existing_devices(dev_root, NVIDIA_CTL_DEVICES),
        "driver_version": parsed.get("driver_version"),
        "source": source,
    }


def amd_facts(parsed, sysfs_root, source):
    """Facts for AMD from a parsed ``amd-smi``/``rocm-smi`` result plus the KFD topology / DRM class.

    ``/dev/kfd`` is always listed: every ROCm container needs it.
    """
    kfd_nodes = read_kfd_topology(sysfs_root)
    drm_nodes = read_drm_nodes(sysfs_root)
    gpus = []
    for gpu in parsed["gpus"]:
        devices, how, bdf = amd_gpu_devices(gpu, kfd_nodes, drm_nodes)
        numa = read_pci_numa_node(sysfs_root, bdf)
        gpus.append(
            {
                "index": gpu["index"],
                "uuid": gpu["uuid"],
                "name": gpu["name"],
                "pci_bus_id": bdf,
                "pci_path": read_pci_path(sysfs_root, bdf),
                "devices": devices,
                "numa_node": numa if numa is not None else gpu.get("numa_node"),
                "memory_mib": gpu["memory_mib"],
                "device_source": "+".join(how) if how else None,
            }
        )
    return {
        "vendor": "amd",
        "gpus": gpus,
        "devices": [AMD_KFD_DEVICE],
        "driver_version": parsed.get("driver_version"),
        "source": source,
    }
