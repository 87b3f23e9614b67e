# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The attributes of the collection's modules, shared instead of copied (community.docker's attributes.py).
    # A module extends the standard fragment, one behaviour fragment (facts, read_only or writer) and one place
    # fragment (engine_host or controller):
    #   extends_documentation_fragment:
    #     - narwhal.deploy.attributes
    #     - narwhal.deploy.attributes.facts
    #     - narwhal.deploy.attributes.engine_host
    # A module's own attributes: block wins key by key (ansible's fragment merge), so a module that behaves
    # differently states only the difference, for example a check_mode description of its own.

    # Standard fragment: idempotence holds for every module; the platform comes from a place fragment.
    # check_mode and diff_mode are described by the behaviour fragments alone, so that the order of the
    # fragments in a module never decides which description wins.
    DOCUMENTATION = r"""
options: {}
attributes:
  idempotent:
    description: A second run with the same inputs changes nothing.
    support: full
  platform:
    description: Where the module runs.
    support: N/A
"""

    # Fact modules: read only, results as ansible_facts, never changed.
    FACTS = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return the same result.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
  facts:
    description: Returns its results as facts.
    support: full
"""

    # Read-only modules that return results (not facts) and never report a change.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    description: Only reads; runs the same in check mode.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
"""

    # Controller-side writers of an output set: check mode writes nothing, diff mode shows the change.
    WRITER = r"""
options: {}
attributes:
  check_mode:
    description: Reports what would change and writes nothing.
    support: full
  diff_mode:
    description: Returns the before and after of what changes.
    support: full
"""

    # Modules that run on an engine host (sysfs, /dev, iproute2, the host's Docker daemon).
    ENGINE_HOST = r"""
options: {}
attributes:
  platform:
    platforms: linux
    details:
      - Runs on the engine host, a Linux host with the GPUs (see docs/host-prerequisites.md).
"""

    # Modules that run on a router host (inventory group routers): HTTP to its router and to the engines.
    ROUTER_HOST = r"""
options: {}
attributes:
  platform:
    platforms: posix
    details:
      - Runs on a router host (inventory group C(routers)), which reaches its router and the engines' URLs.
"""

    # Modules that run on the Ansible controller (delegate_to localhost, run_once): an action plugin of the same name
    # does the work in the controller's process (plugins/action, plugins/plugin_utils/_action.py).
    CONTROLLER = r"""
options: {}
attributes:
  action:
    description:
      - An action plugin of the same name runs the step inside the controller's Ansible process (no module process),
        as ansible-core's M(ansible.builtin.set_fact) does.
    support: full
  platform:
    platforms: posix
    details:
      - Runs on the Ansible controller; the playbooks delegate it to C(localhost) with C(run_once).
"""
