# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host-side readers of the discovery fact modules, shared by each `*_facts` module and by
`engine_host_facts`, which runs them all in one module execution (one round trip per host).

Each reader takes the running AnsibleModule (for get_bin_path, warn and fail_json) and returns the facts dict
of its module; on an error it calls module.fail_json with the same message as the single module. Every tool
runs through run_tool (_tools.run_bounded): a deadline, and a failure that names the tool and the host when it
hangs, fails or prints something its parser cannot read.
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
from ansible_collections.narwhal.deploy.plugins.module_utils._tools import (
    DEFAULT_TIMEOUT,
    CommandTimeoutError,
    excerpt,
    host_name,
    run_bounded,
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


def read_interface(module, name, family, timeout=DEFAULT_TIMEOUT):
    """narwhal_interface: the addresses of interface `name` from `ip -j addr show`."""
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
    return {
        "name": name,
        "operstate": link.get("operstate"),
        "mtu": link.get("mtu"),
        "host_id": host_id(),
        "global_addresses": global_addresses(addresses, family),
        "addresses": addresses,
    }


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
