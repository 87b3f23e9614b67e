# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running a host tool for discovery's readers (_facts/gpu_reader.py, rdma_reader.py, interface_reader.py): LC_ALL=C,
a deadline (_common/tools.py::run_bounded), and a failure that names the command and the host when the tool hangs,
cannot start, fails or prints something its parser cannot read. Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import DEFAULT_TIMEOUT
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    excerpt,
    host_name,
    run_bounded,
)

__metaclass__ = type


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
