# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The deadline of the host tools a facts module runs (module_utils/_common/tools.py::run_bounded).
    DOCUMENTATION = r"""
options:
  command_timeout:
    description:
      - Seconds each host tool the module runs (C(ip), C(nvidia-smi), C(amd-smi), C(rocm-smi), C(ibstat),
        C(ibv_devinfo), as it needs them) may take.
      - A tool that does not answer in time is killed with its process group and fails the module with a message
        naming the tool, the host and why that tool hangs (for example a wedged GPU driver). Output a tool prints
        that is not what that tool writes fails the module the same way; it is never read as "nothing found".
    type: int
    default: 60
"""
