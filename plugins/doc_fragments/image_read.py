# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The image reader's cache and deadline (plugins/module_utils/_facts/daemon.py read_image); the argument spec
    # is IMAGE_READ_SPEC in plugins/module_utils/_common/specs.py. The daemon is narwhal.deploy.docker_access.
    DOCUMENTATION = r"""
options:
  cache_dir:
    description:
      - Image facts cache directory, holding one C(<image id hex>.json) file (mode C(0600)) per inspected image.
      - Created outside check mode when missing. In check mode the cache is read but never written.
    type: path
    default: /var/cache/narwhal/image-facts
  timeout:
    description:
      - Seconds to wait for the Docker API and for the version container to finish.
      - A container still running then is killed and removed.
    type: int
    default: 120
"""
