# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host readers of discovery: the fabric interface (`ip`), GPUs (vendor tools + sysfs), RDMA HCAs (sysfs,
else ibstat/ibv_devinfo/ibstatus) and the checkpoint, shared by each `*_facts` module and by
`engine_host_facts`, which runs them all in one module execution (one round trip per host).

Each reader takes the running AnsibleModule (for get_bin_path, warn and fail_json) and returns the facts
dict of its module; on an error it calls module.fail_json with the same message as the single module.
Every tool runs through run_tool (_common/tools.run_bounded): a deadline, and a failure that names the
tool and the host when it hangs, fails or prints something its parser cannot read. The parsing is in
_facts/netaddr.py, gpu.py, rdma.py and model.py. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    excerpt,
    host_id,
    host_name,
    run_bounded,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_checkpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu import (
    AMD_KFD_DEVICE,
    NVIDIA_CTL_DEVICES,
    GpuParseError,
    empty_facts,
    normalize_pci_bus_id,
    parse_amd_smi_static_json,
    parse_nvidia_smi_xml,
    parse_rocm_smi_json,
    to_int,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import ModelConfigError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    interface_addresses,
    interface_facts,
    link_refusal,
    link_speed,
    parse_ip_json,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.rdma import (
    RDMA_CM,
    RdmaParseError,
    _bdf,
    hca_entry,
    parse_ibstat,
    parse_ibv_devinfo,
    port_entry,
)

__metaclass__ = type


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
    value = to_int(_read(os.path.join(sysfs_root, "bus", "pci", "devices", pci_bus_id, "numa_node")))
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
    for path in sorted(glob.glob(os.path.join(base, "*")), key=natural_key):
        text = _read(os.path.join(path, "properties"))
        if text is None:
            continue
        props = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                props[parts[0]] = to_int(parts[1])
        gpu_id = to_int(_read(os.path.join(path, "gpu_id")))
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
                "node": to_int(os.path.basename(path)),
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
    for path in sorted(glob.glob(os.path.join(base, "*")), key=natural_key):
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
        elif not bdf and gpu.get("uuid") and node["unique_id"] and to_int(gpu["uuid"]) == node["unique_id"]:
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


# ------------------------------------------------------------------------------------------- interface


def read_link_speed(sysfs_root, name):
    """The nominal speed of interface `name` (_facts/netaddr.py::link_speed) from
    ``<sysfs_root>/class/net/<name>/speed``; virtual when the entry resolves below ``devices/virtual``."""
    entry = os.path.join(sysfs_root, "class", "net", name)
    where = os.path.join(entry, "speed")
    try:
        with open(where) as handle:
            text, error = handle.read(), None
    except (OSError, UnicodeDecodeError) as exc:
        text, error = None, getattr(exc, "strerror", None) or str(exc)
    virtual = os.sep + os.path.join("devices", "virtual") + os.sep in os.path.realpath(entry) + os.sep
    return link_speed(text, where, virtual, error)


def read_interface(module, name, family, timeout=DEFAULT_TIMEOUT, sysfs_root="/sys"):
    """narwhal_interface: the addresses of interface `name` from `ip -j addr show`, and its nominal speed from
    sysfs (read_link_speed; the kernel's own /sys unless a test gives a copy)."""
    ip = module.get_bin_path("ip", required=True)
    links = run_tool(module, "ip -j addr show", [ip, "-j", "addr", "show"], parse_ip_json, ValueError,
                     "install a current iproute2 (JSON output needs iproute2 >= 4.13), then rerun discovery",
                     "run 'ip -j addr show' by hand on the host", timeout, tool="ip")
    link, addresses = interface_addresses(links, name)
    if link is None:
        present = ", ".join(x.get("ifname", "?") for x in links)
        module.fail_json(msg="interface %s does not exist on this host (present: %s); set "
                             "NARWHAL_FABRIC_INTERFACE (or NARWHAL_NODE_<n>_FABRIC_INTERFACE) to the fabric "
                             "interface of this host and rerun discovery" % (name, present))
    refusal = link_refusal(name, link, "host %s" % host_name())
    if refusal:
        module.fail_json(msg=refusal)
    return interface_facts(name, link, addresses, family, host_id(), read_link_speed(sysfs_root, name))


# ------------------------------------------------------------------------------------------------ tools

# Why each tool hangs, for the timeout message (the fix of the tool's failures follows it).
TIMEOUT_CAUSE = {
    "ip": "ip hangs when the kernel's netlink socket does not answer (a stuck network driver: check 'dmesg')",
    "nvidia-smi": "nvidia-smi hangs when the NVIDIA driver is wedged (a GPU fallen off the bus, Xid errors in "
    "'dmesg | grep -i -e xid -e nvrm') or initialises every GPU on each call without persistence mode (start "
    "nvidia-persistenced)",
    "amd-smi": "amd-smi hangs when the amdgpu driver is stuck (a GPU reset or a hung GPU: 'dmesg | grep -i amdgpu')",
    "rocm-smi": "rocm-smi hangs when the amdgpu driver is stuck (a GPU reset or a hung GPU: 'dmesg | grep -i amdgpu')",
    "ibstat": "ibstat hangs when an HCA's driver or firmware is stuck ('dmesg | grep -i -e mlx -e ib_')",
    "ibv_devinfo": "ibv_devinfo hangs when an HCA's driver or firmware is stuck ('dmesg | grep -i -e mlx -e ib_')",
}


# What each tool's output should be, for the unparseable-output message.
OUTPUT_FORM = {
    "ip": "the JSON 'ip -j' writes (a list of interface objects)",
    "nvidia-smi": "the XML nvidia-smi writes",
    "amd-smi": "the JSON amd-smi writes",
    "rocm-smi": "the JSON rocm-smi writes",
    "ibstat": "the text ibstat writes",
    "ibv_devinfo": "the text ibv_devinfo writes",
}


def run_tool(module, label, argv, parser, parse_error, fix, hint, timeout=DEFAULT_TIMEOUT, tool=None):
    """Run a host tool with LC_ALL=C and a deadline, and parse its output. Fails naming the command and the host:
    a timeout (the tool is killed), a failure (rc != 0, with its first line), or output `parser` cannot read
    (never an empty result)."""
    tool = tool or os.path.basename(argv[0])
    host = "host %s" % host_name()
    try:
        rc, out, err = run_bounded(argv, timeout, {"LC_ALL": "C"})
    except CommandTimeoutError:
        cause = TIMEOUT_CAUSE.get(tool, "%s hangs on this host" % tool)
        module.fail_json(msg=f"'{label}' on {host} did not answer within {timeout} s (timed out, killed); {cause}; "
                             "fix that, then rerun (a tool that is only slow: raise command_timeout)", timed_out=True)
    except OSError as exc:
        module.fail_json(msg=f"'{label}' could not be started on {host}: {exc.strerror or exc}; {fix}")
    if rc != 0:
        cause = (err or out or "").strip().splitlines()
        module.fail_json(
            msg=f"'{label}' failed on {host} (rc={rc}): {cause[0] if cause else 'no output'}; {fix}",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    try:
        return parser(out)
    except (parse_error, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = "nested too deeply to read"
        form = OUTPUT_FORM.get(tool, "what %s writes" % tool)
        module.fail_json(
            msg=f"'{label}' output on {host} is not {form} ({excerpt(out)}): {exc}; {hint}; {fix}",
            stdout=out,
            stderr=err,
        )
    return None  # not reached


# ------------------------------------------------------------------------------------------------ GPUs

ROCM_DIRS = ["/opt/rocm/bin"]

ROCM_SMI_ARGS = ["--showproductname", "--showbus", "--showuniqueid", "--json"]

GPU_FIX = {
    "nvidia-smi": "check that the NVIDIA kernel driver is loaded and matches the user-space tools "
    "('lsmod | grep nvidia', 'dmesg | grep -i nvrm'); reinstall or reload the driver, then rerun discovery",
    "amd-smi": "check that the amdgpu driver is loaded ('lsmod | grep amdgpu') and that the connecting user may open "
    "/dev/kfd and /dev/dri/renderD* (groups video and render); then rerun discovery",
    "rocm-smi": "check that the amdgpu driver is loaded ('lsmod | grep amdgpu') and that the connecting user may open "
    "/dev/kfd and /dev/dri/renderD* (groups video and render); then rerun discovery",
}


def run_gpu_tool(module, tool, argv, parser, timeout=DEFAULT_TIMEOUT):
    command = " ".join([tool] + argv[1:])
    hint = (f"run '{command}' by hand on the host: a wrapper, a mismatched tool version or a broken driver "
            "prints something else")
    return command, run_tool(module, command, argv, parser, GpuParseError, GPU_FIX[tool], hint, timeout, tool)


def read_gpus(module, sysfs_root, dev_root, timeout=DEFAULT_TIMEOUT):
    """narwhal_gpus: nvidia-smi, else amd-smi, else rocm-smi, else no GPUs."""
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if nvidia_smi:
        source, parsed = run_gpu_tool(module, "nvidia-smi", [nvidia_smi, "-q", "-x"], parse_nvidia_smi_xml,
                                      timeout)
        return nvidia_facts(parsed, sysfs_root, dev_root, source)
    amd_smi = module.get_bin_path("amd-smi", opt_dirs=ROCM_DIRS)
    rocm_smi = None if amd_smi else module.get_bin_path("rocm-smi", opt_dirs=ROCM_DIRS)
    if amd_smi:
        source, parsed = run_gpu_tool(module, "amd-smi", [amd_smi, "static", "--json"], parse_amd_smi_static_json,
                                      timeout)
    elif rocm_smi:
        source, parsed = run_gpu_tool(module, "rocm-smi", [rocm_smi] + ROCM_SMI_ARGS, parse_rocm_smi_json,
                                      timeout)
    else:
        source, parsed = None, None
    if parsed is None:
        return empty_facts()
    facts = amd_facts(parsed, sysfs_root, source)
    refusal = render_node_refusal(facts, sysfs_root, "host %s" % host_name())
    if refusal:
        module.fail_json(msg=refusal)
    return facts


def render_node_refusal(facts, sysfs_root, where):
    """The refusal of AMD facts in which a GPU has no render node (None when every GPU has one).

    ROCr enumerates only the GPUs whose /dev/dri/renderD<N> the container has, so such a GPU, allocated, would be
    counted in TP while the container sees one GPU fewer. A GPU the vendor tool lists but sysfs does not map is a
    host to fix (a device the driver did not bind, a wrong sysfs_root), not a GPU to leave out of the inventory.
    """
    owners = {}
    for gpu in facts["gpus"]:
        for path in gpu["devices"]:
            if path in owners:
                return (f"'{facts['source']}' on {where} lists AMD GPUs {owners[path]} and {gpu['index']}, and sysfs "
                        f"below {sysfs_root} maps both to {path}; one device node cannot be two GPUs, so the tool "
                        "and sysfs disagree: compare 'ls -l /sys/class/drm/*/device' with the tool's PCI bus ids, "
                        "then rerun discovery")
            owners[path] = gpu["index"]
    missing = [gpu for gpu in facts["gpus"] if not any(p.startswith("/dev/dri/renderD") for p in gpu["devices"])]
    if not missing:
        return None
    listed = ", ".join(
        "%d (%s%s)" % (gpu["index"], gpu["pci_bus_id"] or "no PCI bus id", ", " + gpu["name"] if gpu["name"] else "")
        for gpu in missing
    )
    return (
        f"'{facts['source']}' on {where} lists AMD GPU{'s' if len(missing) > 1 else ''} {listed} without a render "
        f"node: neither the KFD topology ({os.path.join(sysfs_root, 'class/kfd/kfd/topology/nodes')}) nor the DRM "
        f"class ({os.path.join(sysfs_root, 'class/drm')}) maps {'their' if len(missing) > 1 else 'its'} PCI bus id to "
        "a /dev/dri/renderD<N>, so a container given it would see fewer GPUs than the engine's tensor parallel size; "
        "check that amdgpu bound the GPU ('ls -l /sys/class/drm/renderD*/device', 'dmesg | grep -i amdgpu') and that "
        "sysfs_root is the host's /sys, then rerun discovery"
    )


# ------------------------------------------------------------------------------------------------ RDMA

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


# ----------------------------------------------------------------------------------------------- model

def read_model(module, path):
    """narwhal_model: the checkpoint's config (config.json, tokenizer_config.json); no container, no cache
    (the read is two small files, as cheap as hashing them for a cache key)."""
    try:
        return read_checkpoint(path)
    except ModelConfigError as exc:
        module.fail_json(msg=str(exc))
    return None  # not reached


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


def _read_value(path):
    try:
        with open(path) as handle:
            value = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


# --------------------------------------------------------------------------------------------------
# sysfs


def read_uverbs_map(sysfs_root):
    """``{hca_name: "/dev/infiniband/uverbsN"}`` from ``<sysfs_root>/class/infiniband_verbs/uverbs*/ibdev``."""
    result = {}
    pattern = os.path.join(sysfs_root, "class", "infiniband_verbs", "uverbs*")
    for path in sorted(glob.glob(pattern), key=natural_key):
        ibdev = _read_value(os.path.join(path, "ibdev"))
        if ibdev and ibdev not in result:
            result[ibdev] = "/dev/infiniband/" + os.path.basename(path)
    return result


def _device_numa_and_bdf(hca_dir):
    """(NUMA node, PCI bus id) of the PCI device below an HCA's sysfs directory."""
    device = os.path.join(hca_dir, "device")
    if not os.path.exists(device):
        return None, None
    numa = _read_value(os.path.join(device, "numa_node"))
    try:
        numa = int(numa) if numa is not None else None
    except ValueError:
        numa = None
    if numa is not None and numa < 0:
        numa = None
    bdf = _bdf(os.path.basename(os.path.realpath(device)))
    if bdf is None:
        # a copied tree whose links were dereferenced: the PCI device's uevent still names the slot
        for line in (_read_value(os.path.join(device, "uevent")) or "").splitlines():
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
            _read_value(os.path.join(hca_dir, "hca_type")),
            _read_value(os.path.join(hca_dir, "fw_ver")),
            _read_value(os.path.join(hca_dir, "board_id")),
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
                    _read_value(os.path.join(port_dir, "state")),
                    _read_value(os.path.join(port_dir, "phys_state")),
                    _read_value(os.path.join(port_dir, "link_layer")),
                    _read_value(os.path.join(port_dir, "rate")),
                    _read_value(os.path.join(port_dir, "gid_attrs", "ndevs", "0")),
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
