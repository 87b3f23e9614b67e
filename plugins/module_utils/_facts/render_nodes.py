# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device nodes of AMD GPUs (pure): which /dev/dri/renderD<N> and card<M> one GPU needs, from the KFD topology
and the DRM class that _facts/gpu_reader.py read, and the refusal of an inventory in which a GPU has no render node
or two GPUs share one. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import os

from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu import to_int

__metaclass__ = type


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
