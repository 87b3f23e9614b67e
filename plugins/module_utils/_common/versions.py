# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Version numbers as the planner reads them: the strict parser of a record's runtime.vllm_version and the
lenient (major, minor, patch) used for version gates.
"""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError

__metaclass__ = type


def version_tuple(text, where="launch record runtime.vllm_version"):
    parts = []
    for piece in str(text).split("+", 1)[0].split("."):
        match = re.match(r"[0-9]+", piece)
        if not match:
            break
        parts.append(int(match.group(0)))
    if len(parts) < 2:
        raise PlanError("%s=%r is not a version; %s" % (where, text, RERUN), where)
    return tuple(parts)


def release_tuple(version):
    """(major, minor, patch) of a version string by the planner's one parser (0.19.0rc1 -> (0, 19, 0))."""
    try:
        parts = list(version_tuple(version or "0.0"))[:3]
    except PlanError:
        parts = [0, 0]
    return tuple(parts + [0] * (3 - len(parts)))
