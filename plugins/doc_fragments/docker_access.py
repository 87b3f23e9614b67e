# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The Docker daemon a module asks over its Engine API (plugins/module_utils/_docker/engine_api.py); the
    # argument spec is DOCKER_ACCESS_SPEC in plugins/module_utils/_common/specs.py.
    DOCUMENTATION = r"""
options:
  docker_host:
    description:
      - Docker daemon URL, C(unix:///path/to/docker.sock) or C(tcp://host:port) (plain TCP).
    type: str
    default: unix:///var/run/docker.sock
"""
