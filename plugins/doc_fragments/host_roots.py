# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The host roots of the sysfs and /dev readers; the argument spec is HOST_ROOTS_SPEC in
    # plugins/module_utils/_common/specs.py. What a module reads below them is said in that module.
    DOCUMENTATION = r"""
options:
  sysfs_root:
    description:
      - Root of the sysfs tree to read; the sysfs paths the module's documentation names are relative to it.
      - Tests and simulated hosts point it at a prepared tree.
    type: path
    default: /sys
  dev_root:
    description:
      - Directory in which the device nodes are looked up.
      - Paths are always reported with their C(/dev/...) names.
    type: path
    default: /dev
"""
