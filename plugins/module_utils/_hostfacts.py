# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host-side readers of the discovery fact modules, shared by each `*_facts` module and by
`engine_host_facts`, which runs them all in one module execution (one round trip per host).

Each reader takes the running AnsibleModule (for run_command, get_bin_path, warn and fail_json) and returns
the facts dict of its module; on an error it calls module.fail_json with the same message as before.
These do I/O (tools, sysfs, files); the pure parsing and planning stays in _netaddr, _gpu, _rdma, _model.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import hashlib
import os
import socket

from ansible_collections.narwhal.deploy.plugins.module_utils._gpu import (
    GpuParseError,
    amd_facts,
    empty_facts,
    nvidia_facts,
    parse_amd_smi_static_json,
    parse_nvidia_smi_xml,
    parse_rocm_smi_json,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._model import ModelConfigError, read_checkpoint
from ansible_collections.narwhal.deploy.plugins.module_utils._netaddr import (
    global_addresses,
    interface_addresses,
    parse_ip_json,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._rdma import (
    RdmaParseError,
    parse_ibstat,
    parse_ibv_devinfo,
    rdma_facts,
    read_sysfs_hcas,
    read_uverbs_map,
)

__metaclass__ = type

# ------------------------------------------------------------------------------------------- interface


def host_id():
    try:
        with open("/etc/machine-id") as fh:
            machine = fh.read().strip()
    except OSError:
        machine = ""
    return hashlib.sha256(("%s/%s" % (machine, socket.gethostname())).encode()).hexdigest()[:16]


def read_interface(module, name, family):
    """narwhal_interface: the addresses of interface `name` from `ip -j addr show`."""
    ip = module.get_bin_path("ip", required=True)
    rc, out, err = module.run_command([ip, "-j", "addr", "show"], check_rc=False)
    if rc != 0:
        module.fail_json(msg="'ip -j addr show' failed on this host (rc=%d): %s; install a current iproute2"
                             % (rc, err.strip()))
    try:
        links = parse_ip_json(out)
    except ValueError as exc:
        module.fail_json(msg="cannot parse 'ip -j addr show' output: %s" % exc)
    link, addresses = interface_addresses(links, name)
    if link is None:
        present = ", ".join(x.get("ifname", "?") for x in links)
        module.fail_json(msg="interface %s does not exist on this host (present: %s); set "
                             "NARWHAL_FABRIC_INTERFACE (or NARWHAL_NODE_<n>_FABRIC_INTERFACE) to the fabric "
                             "interface of this host and rerun discovery" % (name, present))
    return {
        "name": name,
        "operstate": link.get("operstate"),
        "mtu": link.get("mtu"),
        "host_id": host_id(),
        "global_addresses": global_addresses(addresses, family),
        "addresses": addresses,
    }


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


def run_tool(module, label, argv, parser, parse_error, fix, hint):
    """Run a host tool with LC_ALL=C and parse its output; fail naming the command, its cause and `fix`."""
    rc, out, err = module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C"})
    if rc != 0:
        cause = (err or out or "").strip().splitlines()
        module.fail_json(
            msg=f"'{label}' failed on this host (rc={rc}): {cause[0] if cause else 'no output'}; {fix}",
            rc=rc,
            stdout=out,
            stderr=err,
        )
    try:
        return parser(out)
    except parse_error as exc:
        module.fail_json(
            msg=f"'{label}' ran on this host but its output cannot be read: {exc}; {hint}; {fix}",
            stdout=out,
            stderr=err,
        )
    return None  # not reached


def run_gpu_tool(module, tool, argv, parser):
    command = " ".join([tool] + argv[1:])
    hint = (f"run '{command}' by hand on the host: a wrapper, a mismatched tool version or a broken driver "
            "prints something else")
    return command, run_tool(module, command, argv, parser, GpuParseError, GPU_FIX[tool], hint)


def read_gpus(module, sysfs_root, dev_root):
    """narwhal_gpus: nvidia-smi, else amd-smi, else rocm-smi, else no GPUs."""
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if nvidia_smi:
        source, parsed = run_gpu_tool(module, "nvidia-smi", [nvidia_smi, "-q", "-x"], parse_nvidia_smi_xml)
        return nvidia_facts(parsed, sysfs_root, dev_root, source)
    amd_smi = module.get_bin_path("amd-smi", opt_dirs=ROCM_DIRS)
    rocm_smi = None if amd_smi else module.get_bin_path("rocm-smi", opt_dirs=ROCM_DIRS)
    if amd_smi:
        source, parsed = run_gpu_tool(module, "amd-smi", [amd_smi, "static", "--json"], parse_amd_smi_static_json)
    elif rocm_smi:
        source, parsed = run_gpu_tool(module, "rocm-smi", [rocm_smi] + ROCM_SMI_ARGS, parse_rocm_smi_json)
    else:
        source, parsed = None, None
    if parsed is None:
        return empty_facts()
    facts = amd_facts(parsed, sysfs_root, source)
    for gpu in facts["gpus"]:
        if not any(path.startswith("/dev/dri/renderD") for path in gpu["devices"]):
            module.warn(
                f"AMD GPU {gpu['index']} ({gpu['pci_bus_id']}) has no render node: neither the KFD "
                f"topology nor the DRM class below {sysfs_root} maps its PCI bus id; a container for it "
                "would get no GPU"
            )
    return facts


# ------------------------------------------------------------------------------------------------ RDMA

RDMA_FIX = (
    "check that the RDMA drivers are loaded ('lsmod | grep -E \"mlx5_ib|ib_uverbs\"') and rdma-core / "
    "infiniband-diags are installed ('ibv_devinfo' should list the HCAs); then rerun discovery"
)


def run_rdma_tool(module, tool, path, parser):
    return run_tool(module, tool, [path], parser, RdmaParseError, RDMA_FIX, "run it by hand on the host")


def read_rdma(module, sysfs_root, dev_root):
    """narwhal_rdma: HCAs from sysfs, else from ibstat / ibv_devinfo."""
    hcas = read_sysfs_hcas(sysfs_root)
    source = os.path.join(sysfs_root, "class", "infiniband")
    if hcas is None:
        hcas, source = [], None
        for tool, parser in (("ibstat", parse_ibstat), ("ibv_devinfo", parse_ibv_devinfo)):
            path = module.get_bin_path(tool)
            if path:
                hcas, source = run_rdma_tool(module, tool, path, parser), tool
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
