# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU tool output parsers (nvidia-smi -q -x and its text form, rocm-smi --json, amd-smi static --json):
each takes the text a tool printed and returns plain dicts or raises GpuParseError. Pure; the sysfs side
(NUMA nodes, KFD topology, DRM nodes, device paths) is in _facts/gpu_reader.py and render_nodes.py.

A GPU's identity on a host is its PCI bus id; the tool index is what the container sees.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET  # noqa: N817  (ET is the idiomatic name)

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


def to_int(value):
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


# --------------------------------------------------------------------------------------------------
# strict field readers (issue 24): a field the tool left out or marked unknown (N/A, [Not Supported]) is None; a
# field it printed that is not what the tool prints there is an error naming the GPU and the field, never a None
# that would silently shrink what the host offers


def _whole(value, what, where):
    """An integer field -> int or None (unknown); GpuParseError for anything else (text, a fraction, true/false)."""
    if isinstance(value, bool) or isinstance(value, (float, dict, list)):
        raise GpuParseError(f"{where}: {what} {json.dumps(value)} is not a whole number")
    if isinstance(value, int):
        return value
    if _clean(value) is None:
        return None
    number = to_int(value)
    if number is None:
        raise GpuParseError(f"{where}: {what} {str(value).strip()!r} is not a whole number")
    return number


def _index(value, where):
    """A GPU index: a whole number of at least 0 (the container and the visibility variable count from 0)."""
    index = _whole(value, "index", where)
    if index is None:
        raise GpuParseError(f"{where}: the GPU index is missing or unknown ({value!r})")
    if index < 0:
        raise GpuParseError(f"{where}: GPU index {index} is negative; GPU indices count from 0")
    return index


def _mib(value, default_unit, what, where):
    """A memory size -> MiB or None (unknown); GpuParseError when it is neither a size nor an unknown marker."""
    if isinstance(value, bool) or isinstance(value, (dict, list)):
        raise GpuParseError(f"{where}: {what} {json.dumps(value)} is not a memory size")
    if isinstance(value, (int, float)) and value < 0:
        raise GpuParseError(f"{where}: {what} {value} is negative")
    if _clean(value) is None:
        return None
    mib = memory_to_mib(value, default_unit)
    if mib is None:
        raise GpuParseError(f"{where}: {what} {str(value).strip()!r} is not a memory size (a number, optionally "
                            f"with a unit such as MiB)")
    return mib


def _bus_id(value, what, where):
    """A PCI bus id -> normalized or None (unknown); GpuParseError when it is printed but is not one."""
    if isinstance(value, (bool, int, float, dict, list)):
        raise GpuParseError(f"{where}: {what} {json.dumps(value)} is not a PCI bus id")
    if _clean(value) is None:
        return None
    bdf = normalize_pci_bus_id(value)
    if bdf is None:
        raise GpuParseError(f"{where}: {what} {str(value).strip()!r} is not a PCI bus id (domain:bus:device.function)")
    return bdf


def _unique(gpus, field, what, names):
    """No two GPUs share `field` (index, PCI bus id, device minor): one host has no such pair, and two records would
    hand one device to two engines. `names` labels each GPU as the tool named it."""
    seen = {}
    for position, gpu in enumerate(gpus):
        name = names[position]  # (no zip(strict=) on Python 3.8)
        value = gpu.get(field)
        if value is None:
            continue
        if value in seen:
            raise GpuParseError(f"{seen[value]} and {name} have the same {what} {value}; one host cannot have two "
                                f"GPUs with one {what}, so this is not a real inventory")
        seen[value] = name


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
        where = f"GPU {position}"
        bdf = _bus_id(node.findtext("pci/pci_bus_id"), "pci_bus_id", where) or normalize_pci_bus_id(node.get("id"))
        mig_mode = _clean(node.findtext("mig_mode/current_mig"))
        gpu = {
            "index": position,
            "uuid": _clean(node.findtext("uuid")),
            "name": _clean(node.findtext("product_name")),
            "pci_bus_id": bdf,
            "minor_number": _minor(node.findtext("minor_number"), where),
            "memory_mib": _mib(node.findtext("fb_memory_usage/total"), "MiB", "fb_memory_usage total", where),
            "mig_mode": mig_mode,
        }
        if mig_mode is not None and mig_mode.lower() == "enabled":
            migs = []
            for mig in node.findall("mig_devices/mig_device"):
                migs.append(
                    {
                        "index": to_int(mig.findtext("index")),
                        "gpu_instance_id": to_int(mig.findtext("gpu_instance_id")),
                        "compute_instance_id": to_int(mig.findtext("compute_instance_id")),
                        "uuid": _clean(mig.findtext("uuid")),
                        "memory_mib": _mib(mig.findtext("fb_memory_usage/total"), "MiB",
                                           "MIG device fb_memory_usage total", where),
                    }
                )
            gpu["mig_devices"] = migs
        gpus.append(gpu)
    attached = _whole(root.findtext("attached_gpus"), "attached_gpus", "<nvidia_smi_log>")
    if not gpus:
        # nvidia-smi reports a host without GPUs by failing ("No devices were found"), never with an empty log
        raise GpuParseError(f"the <nvidia_smi_log> lists no <gpu> (attached_gpus: {attached}); a GPU-less host "
                            "makes nvidia-smi fail with 'No devices were found', so this is not a real inventory")
    _check_nvidia(gpus, attached, "<gpu>")
    return {
        "driver_version": _clean(root.findtext("driver_version")),
        "cuda_version": _clean(root.findtext("cuda_version")),
        "attached_gpus": attached,
        "gpus": gpus,
    }


def _minor(value, where):
    """The minor number of /dev/nvidia<N>: a whole number of at least 0, or unknown."""
    minor = _whole(value, "minor number", where)
    if minor is not None and minor < 0:
        raise GpuParseError(f"{where}: minor number {minor} is negative (/dev/nvidia<N> counts from 0)")
    return minor


def _check_nvidia(gpus, attached, entry):
    """What one nvidia-smi report of a host must hold: no more GPUs than it says are attached (fewer happen in
    captures cut short, never more), each with a PCI bus id or a minor number, none sharing either."""
    if attached is not None and len(gpus) > attached:
        raise GpuParseError(f"{len(gpus)} {entry} entries but attached_gpus is {attached}; nvidia-smi never lists "
                            "more GPUs than are attached, so this is not a real inventory")
    for gpu in gpus:
        if gpu["pci_bus_id"] is None and gpu["minor_number"] is None:
            raise GpuParseError(f"GPU {gpu['index']} has neither a PCI bus id nor a minor number, so no device node "
                                "or sysfs entry can be found for it")
    names = [f"GPU {gpu['index']}" for gpu in gpus]
    _unique(gpus, "pci_bus_id", "PCI bus id", names)
    _unique(gpus, "minor_number", "minor number (/dev/nvidia<N>)", names)


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
        where = f"GPU {position} ({key})"
        mig_mode = _clean(_tree_get(children, "MIG Mode", "Current"))
        gpu = {
            "index": position,
            "uuid": _clean(_tree_get(children, "GPU UUID")),
            "name": _clean(_tree_get(children, "Product Name")),
            "pci_bus_id": _bus_id(_tree_get(children, "PCI", "Bus Id"), "PCI Bus Id", where)
            or normalize_pci_bus_id(header_bdf),
            "minor_number": _minor(_tree_get(children, "Minor Number"), where),
            "memory_mib": _mib(_tree_get(children, "FB Memory Usage", "Total"), "MiB", "FB Memory Usage Total", where),
            "mig_mode": mig_mode,
        }
        if mig_mode is not None and mig_mode.lower() == "enabled":
            gpu["mig_devices"] = [
                {
                    "index": to_int(_tree_get(mig, "Index")),
                    "gpu_instance_id": to_int(_tree_get(mig, "GPU Instance ID")),
                    "compute_instance_id": to_int(_tree_get(mig, "Compute Instance ID")),
                    "uuid": _clean(_tree_get(mig, "MIG UUID")) or _clean(_tree_get(mig, "UUID")),
                    "memory_mib": _mib(
                        _tree_get(mig, "Shared FB Memory Usage", "Total") or _tree_get(mig, "FB Memory Usage", "Total"),
                        "MiB", "MIG Device FB Memory Usage Total", where,
                    ),
                }
                for mig in _tree_all(children, "MIG Device")
            ]
        gpus.append(gpu)
        position += 1
    attached = _whole(_tree_get(tree, "Attached GPUs"), "Attached GPUs", "the NVSMI LOG")
    if not gpus:
        # a header over anything else (a garbled or cut report) is not a host without GPUs: nvidia-smi reports
        # that by failing with 'No devices were found'
        raise GpuParseError(f"the NVSMI LOG lists no 'GPU <bus id>' section (Attached GPUs: {attached}); a GPU-less "
                            "host makes nvidia-smi fail with 'No devices were found', so this is not a real inventory")
    _check_nvidia(gpus, attached, "'GPU <bus id>'")
    return {
        "driver_version": _clean(_tree_get(tree, "Driver Version")),
        "cuda_version": _clean(_tree_get(tree, "CUDA Version")),
        "attached_gpus": attached,
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


def _no_duplicate_keys(pairs):
    """rocm-smi and amd-smi write JSON from Python dicts, so a key appears once per object; json.loads would keep
    only the last of two (a GPU silently dropped)."""
    result = {}
    for key, value in pairs:
        if key in result:
            raise GpuParseError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _load_json(text, what):
    if isinstance(text, (dict, list)):
        return text
    if text is None or not str(text).strip():
        raise GpuParseError(f"empty output (expected {what})")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
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
    names = []
    for key, card in data.items():
        match = _CARD_RE.match(str(key))
        if not match:
            if str(key).lower().startswith("card"):
                raise GpuParseError(f"key {key!r} is not a card entry rocm-smi writes (card<N>, N from 0)")
            continue
        if not isinstance(card, dict):
            raise GpuParseError(f"{key} is a JSON {type(card).__name__}, not the object of one GPU")
        memory_mib = _mib(_first(card, "VRAM Total Memory (B)"), "B", "'VRAM Total Memory (B)'", key)
        if memory_mib is None:
            memory_mib = _mib(_first(card, "VRAM Total Memory (MiB)"), "MiB", "'VRAM Total Memory (MiB)'", key)
        gpus.append(
            {
                "index": int(match.group(1)),
                "uuid": _first(card, "Unique ID"),
                "name": _first(card, "Device Name", "Card Series", "Card model", "Card SKU"),
                "pci_bus_id": _bus_id(_first(card, "PCI Bus"), "'PCI Bus'", key),
                "memory_mib": memory_mib,
                "numa_node": _whole(_first(card, "(Topology) Numa Node"), "'(Topology) Numa Node'", key),
                "kfd_node_id": _whole(_first(card, "Node ID"), "'Node ID'", key),
                "gfx_version": _first(card, "GFX Version"),
            }
        )
        names.append(str(key))
    if not gpus:
        keys = ", ".join(sorted(map(str, data)))
        raise GpuParseError(f"no cardN entries in rocm-smi JSON (keys: {keys})")
    _unique(gpus, "index", "GPU index", names)
    _unique(gpus, "pci_bus_id", "PCI bus id", names)
    _unique(gpus, "kfd_node_id", "KFD node id", names)
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
            if "gpu" not in data:
                # one GPU's object carries its index; anything else (rocm-smi's cardN document, an error object)
                # is not amd-smi's report of this host
                keys = ", ".join(sorted(map(str, data))) or "none"
                raise GpuParseError(f"the object has neither gpu_data nor a 'gpu' index (keys: {keys}); amd-smi "
                                    "writes a list of GPU objects, each with its 'gpu' index")
            data = [data]
    if not isinstance(data, list):
        raise GpuParseError(f"amd-smi JSON is a {type(data).__name__}, expected a list of GPUs")
    gpus = []
    names = []
    driver_version = None
    for position, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise GpuParseError(f"entry {position} is a JSON {type(entry).__name__}, not the object of one GPU")
        where = f"entry {position}" if "gpu" not in entry else f"gpu {json.dumps(entry['gpu'])}"
        index = position if entry.get("gpu") is None else _index(entry["gpu"], where)
        size = _dig(entry, "vram", "size")
        if isinstance(size, dict):
            unit = size.get("unit") or "MB"
            if not isinstance(unit, str):
                raise GpuParseError(f"{where}: vram.size.unit {json.dumps(unit)} is not a unit")
            value = size.get("value")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = f"{value} {unit}" if value >= 0 else value
            elif isinstance(value, str) and _clean(value) is not None:
                value = f"{value} {unit}"
            memory_mib = _mib(value, "MB", "vram.size", where)
        else:
            memory_mib = _mib(size, "MB", "vram.size", where)
        numa = _dig(entry, "numa", "node")
        driver_version = driver_version or _clean(_dig(entry, "driver", "version"))
        gpus.append(
            {
                "index": index,
                "uuid": _clean(entry.get("uuid")) or _clean(_dig(entry, "asic", "asic_serial")),
                "name": _clean(_dig(entry, "asic", "market_name")) or _clean(_dig(entry, "board", "product_name")),
                "pci_bus_id": _bus_id(_dig(entry, "bus", "bdf"), "bus.bdf", where)
                or _bus_id(entry.get("bdf"), "bdf", where)
                or _bus_id(_dig(entry, "asic", "pci_bdf"), "asic.pci_bdf", where),
                "memory_mib": memory_mib,
                "numa_node": _whole(numa, "numa.node", where),
                "kfd_node_id": _whole(_dig(entry, "kfd", "node_id"), "kfd.node_id", where),
                "gfx_version": _clean(_dig(entry, "asic", "target_graphics_version")),
            }
        )
        names.append(where)
    if not gpus:
        raise GpuParseError("no GPU objects in amd-smi JSON")
    _unique(gpus, "index", "GPU index", names)
    _unique(gpus, "pci_bus_id", "PCI bus id", names)
    _unique(gpus, "kfd_node_id", "KFD node id", names)
    gpus.sort(key=lambda g: g["index"])
    return {"driver_version": driver_version, "gpus": gpus}


# --------------------------------------------------------------------------------------------------
# fact assembly


def empty_facts(source=None):
    return {"vendor": "none", "gpus": [], "devices": [], "driver_version": None, "source": source}
