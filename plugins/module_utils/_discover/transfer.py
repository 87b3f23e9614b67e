# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's transfer plan of an engine (pure): the record's `transfer` object (transport, net devices, transfer
devices, UCX_TLS) and its KV buffer device. For ucx_rdma the rails: NARWHAL_RDMA_DEVICES (or the node's) as given,
or auto, each GPU's nearest active HCA port (nearest_rails); for ucx_tcp the fabric interface, which the planner
resolves from the role environment."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import node_settings
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.transfer import ucx_tls

__metaclass__ = type


def transfer_plan(engine, n, node, node_policy, site, host, gpus, platform, image_key, sources):
    """The record's transfer object: net devices, transfer devices, UCX_TLS (and the KV buffer device)."""
    if site["NARWHAL_TRANSPORT"] == "ucx_rdma":
        net_devices, transfer_devices, sources["transfer"] = choose_rdma(engine, n, node_policy, site,
                                                                         host.get("rdma"), gpus)
    else:
        # the literal the specification records (docs/vllm-requirements.md, "Allocation and transport fields"); the
        # planner resolves it from the role environment, in one place (_plan/container.py::_net_devices)
        net_devices, transfer_devices = ["${NARWHAL_FABRIC_INTERFACE}"], []
        sources["transfer"] = "ucx_tcp over the fabric interface (%s on this node)" % node["interface"]
    kv_buffer_device = "cpu" if platform == "cpu" else "cuda"  # vLLM: cuda on CUDA *and* ROCm
    try:
        ucx_list = ucx_tls(site["NARWHAL_TRANSPORT"], platform, kv_buffer_device)
    except PlanError as exc:
        raise InputError(image_key, "%s: %s" % (engine, exc))
    sources["ucx_tls"] = "UCX_TLS %s for %s KV memory on %s (GPU memory needs the GPU copy transport)" % (
        ",".join(ucx_list), "host" if kv_buffer_device == "cpu" else "GPU", platform)
    transfer = {"transport": site["NARWHAL_TRANSPORT"], "net_devices": net_devices, "devices": transfer_devices,
                "ucx_tls": ucx_list}
    return transfer, kv_buffer_device


def choose_rdma(engine, n, node_policy, site, rdma, gpus):
    """-> (net_devices, devices, reason) for ucx_rdma.

    auto: every rail the engine's GPUs are nearest to (see :func:`nearest_rails`); an explicit
    NARWHAL_RDMA_DEVICES / NARWHAL_NODE_<n>_RDMA_DEVICES list is taken as given, each port checked active."""
    settings = node_settings(site, node_policy, n)
    key = settings["inputs"]["rdma_devices"]
    wanted = settings["rdma_devices"] or "auto"
    hcas = dict((h["name"], h) for h in (rdma or {}).get("hcas", []))
    active = [(h, p) for h in hcas.values() for p in h.get("ports", []) if p.get("active")]
    if not active:
        raise InputError("NARWHAL_TRANSPORT", "ucx_rdma needs an active HCA port, but %s has none (%s); bring a "
                                              "port up or use NARWHAL_TRANSPORT=ucx_tcp"
                         % (engine, ", ".join(sorted(hcas)) or "no HCA found"))
    if wanted == "auto":
        picked, reason = nearest_rails(active, gpus)
        reason = "%s=auto, %s" % (key, reason)
    else:
        picked = []
        for item in [x.strip() for x in wanted.split(",") if x.strip()]:
            name, _sep, port_s = item.partition(":")
            hca = hcas.get(name)
            port = None
            if hca and port_s.isdigit():
                port = next((p for p in hca.get("ports", []) if p["port"] == int(port_s)), None)
            if port is None:
                raise InputError(key, "%s is not an HCA:port of %s (it has %s); correct %s" % (
                    item, engine, ", ".join("%s:%d" % (h["name"], p["port"]) for h, p in active) or "none", key))
            if not port.get("active"):
                raise InputError(key, "%s on %s is %s, not active; choose an active port"
                                 % (item, engine, port.get("state")))
            picked.append((hca, port))
        reason = "%s=%s" % (key, wanted)
    devices = []
    for hca, _port in picked:
        if not hca.get("uverbs"):
            raise InputError(key, "the uverbs device of %s on %s is unknown (no /sys/class/infiniband_verbs entry); "
                                  "check the RDMA drivers (ib_uverbs) on the host" % (hca["name"], engine))
        if hca["uverbs"] not in devices:
            devices.append(hca["uverbs"])
    if not (rdma or {}).get("rdma_cm"):
        raise InputError("NARWHAL_TRANSPORT", "%s has no /dev/infiniband/rdma_cm; load rdma_ucm on the host or use "
                                              "ucx_tcp" % engine)
    devices.append(rdma["rdma_cm"])
    return ["%s:%d" % (h["name"], p["port"]) for h, p in picked], devices, reason


def _natural(name):
    import re
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _pci_shared(a, b):
    """How many leading elements two PCI paths (root bus, root port, switch ports...) share; 0 if one is unknown."""
    a, b = a or [], b or []
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return shared


def _rail_rank(hca, port, path, numa, served):
    """Sort key of an active (HCA, port) for one GPU: nearest first (see nearest_rails)."""
    return (-_pci_shared(path, hca.get("pci_path")),
            0 if numa is not None and hca.get("numa_node") == numa else 1,
            0 if port.get("link_layer") == "InfiniBand" else 1,
            len(served.get("%s:%d" % (hca["name"], port["port"]), [])),
            _natural(hca["name"]), port["port"])


def _rail_why(gpu, hca, numa):
    """Why a port is the nearest one of a GPU, in words."""
    path = gpu.get("pci_path")
    shared = _pci_shared(path, hca.get("pci_path"))
    if shared >= 3:
        return "same PCIe switch %s" % path[shared - 1]
    if shared == 2:
        return "same PCIe root port %s" % path[1]
    if numa is not None and hca.get("numa_node") == numa:
        return "NUMA node %s (%s)" % (numa, "PCIe path unknown" if not path
                                      else "PCIe path of %s unknown" % hca["name"] if not hca.get("pci_path")
                                      else "no active port shares its PCIe switch")
    if shared == 1:
        return "same PCIe root complex %s" % path[0]
    return ("no active port on NUMA node %s or below its PCIe switch" % numa if numa is not None
            else "NUMA node and PCIe path unknown")


def nearest_rails(active, gpus):
    """NARWHAL_RDMA_DEVICES=auto -> ([(hca, port)] deduplicated in GPU order, reason).

    For each allocated GPU, in order, the nearest active port: the one behind the deepest PCIe switch it shares
    with the GPU (longest common prefix of their sysfs PCI paths: switch, then root port, then root complex),
    then on the GPU's NUMA node, then InfiniBand before Ethernet, then the one serving the fewest of the
    engine's GPUs so far (equally near GPUs spread over equally near rails), then natural name order. GPUs
    share a port when there are fewer rails than GPUs. Without PCI paths this is the NUMA rule, per GPU; a GPU
    of unknown NUMA node counts as on the node most of the engine's GPUs are on."""
    numas = [g.get("numa_node") for g in gpus if g.get("numa_node") is not None]
    engine_numa = sorted(set(numas), key=lambda x: (-numas.count(x), x))[0] if numas else None
    if not gpus:
        hca, port = min(active, key=lambda hp: _rail_rank(hp[0], hp[1], None, None, {}))
        return [(hca, port)], "the engine has no GPU: %s:%d, the first active port (InfiniBand first)" % (
            hca["name"], port["port"])
    served, picked, lines = {}, [], []
    for gpu in gpus:
        numa = gpu.get("numa_node") if gpu.get("numa_node") is not None else engine_numa
        path = gpu.get("pci_path")
        hca, port = min(active, key=lambda hp: _rail_rank(hp[0], hp[1], path, numa, served))
        name = "%s:%d" % (hca["name"], port["port"])
        why = _rail_why(gpu, hca, numa)
        if port.get("link_layer") != "InfiniBand":
            why += ", %s (no InfiniBand port as near)" % (port.get("link_layer") or "link layer unknown")
        if served.get(name):
            why += ", shared with GPU %s" % ", ".join(str(i) for i in served[name])
        else:
            picked.append((hca, port))
        served.setdefault(name, []).append(gpu.get("index"))
        label = "GPU %s (%s)" % (gpu.get("index"), gpu["pci_bus_id"]) if gpu.get("pci_bus_id") else \
            "GPU %s" % gpu.get("index")
        lines.append("%s -> %s: %s" % (label, name, why))
    return picked, "the nearest active port of each GPU: " + "; ".join(lines)
