# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's GPU read on a host (narwhal_gpus): nvidia-smi, else amd-smi, else rocm-smi (run through
_facts/tool_runner.py, parsed by _facts/gpu.py), then sysfs and /dev for what the tools do not say: each GPU's NUMA
node and PCI path, its device nodes (NVIDIA: /dev/nvidia<minor>; AMD: from the KFD topology and the DRM class,
_facts/render_nodes.py). Each reader takes the running AnsibleModule (for get_bin_path and fail_json). Python 3.8
compatible (runs on engine hosts).
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_name
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu import (
    AMD_KFD_DEVICE,
    NVIDIA_CTL_DEVICES,
    GpuParseError,
    empty_facts,
    parse_amd_smi_static_json,
    parse_nvidia_smi_xml,
    parse_rocm_smi_json,
    to_int,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.render_nodes import (
    amd_gpu_devices,
    render_node_refusal,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.sysfs import (
    device_bdf,
    read_pci_numa_node,
    read_pci_path,
    read_text,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.tool_runner import run_tool

__metaclass__ = type


def read_kfd_topology(sysfs_root):
    """GPU nodes of ``<sysfs_root>/class/kfd/kfd/topology/nodes/*/properties``.

    Returns a list of ``{"node", "gpu_id", "drm_render_minor", "pci_bus_id", "unique_id"}``; CPU nodes
    (gpu_id 0 / no render minor) are skipped.
    """
    nodes = []
    base = os.path.join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    for path in sorted(glob.glob(os.path.join(base, "*")), key=natural_key):
        text = read_text(os.path.join(path, "properties"))
        if text is None:
            continue
        props = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                props[parts[0]] = to_int(parts[1])
        gpu_id = to_int(read_text(os.path.join(path, "gpu_id")))
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
        bdf = device_bdf(os.path.join(path, "device"))
        if bdf is None:
            continue
        entry = result.setdefault(bdf, {"render": [], "card": []})
        entry["render" if match.group(1) == "renderD" else "card"].append(int(match.group(2)))
    return result


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
