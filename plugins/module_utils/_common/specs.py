# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs that several modules share, each documented by the doc fragment of the same name.

A module takes a group whole: its argument_spec composes the constant, its DOCUMENTATION extends the fragment
(community.docker's DOCKER_COMMON_ARGS with doc_fragments/docker.py), so an option's name, type and default are
written once here and its text once in plugins/doc_fragments/, and validate-modules compares the two:

    HOST_ROOTS_SPEC       host_roots       sysfs_root, dev_root  gpu_facts, rdma_facts, engine_host_facts
    COMMAND_TIMEOUT_SPEC  command_timeout  command_timeout       gpu_facts, rdma_facts, interface_facts,
                                                                 engine_host_facts, engine_prereqs
    DOCKER_ACCESS_SPEC    docker_access    docker_host           image_facts, engine_host_facts, engine_prereqs
    IMAGE_READ_SPEC       image_read       cache_dir, timeout    image_facts, engine_host_facts
    ROUTER_ACCESS_SPEC    router_access    url, engines,         router_workers, router_traffic (router_members:
                                           api_key_file, ca_file all but engines, documented on its own)

Compose with dict(a=..., **SPEC, b=...) in the order the module lists its options. Python 3.8 compatible (runs
on engine hosts).
"""

from __future__ import annotations

__metaclass__ = type

# Seconds a host tool may run (run_bounded's default in _common/tools.py, the command_timeout option's default).
DEFAULT_TIMEOUT = 60

# The host roots of the sysfs and /dev readers (module_utils/_facts/gpu_reader.py read_gpus, rdma_reader.py
# read_rdma): tests and simulated hosts point them at prepared trees.
HOST_ROOTS_SPEC = dict(
    sysfs_root=dict(type="path", default="/sys"),
    dev_root=dict(type="path", default="/dev"),
)

# The deadline of each host tool (module_utils/_common/tools.py run_bounded).
COMMAND_TIMEOUT_SPEC = dict(
    command_timeout=dict(type="int", default=DEFAULT_TIMEOUT),
)

# The Docker daemon the module asks (module_utils/_docker/engine_api.py Client).
DOCKER_ACCESS_SPEC = dict(
    docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
)

# The image reader's cache and deadline (module_utils/_facts/daemon.py read_image).
IMAGE_READ_SPEC = dict(
    cache_dir=dict(type="path", default="/var/cache/narwhal/image-facts"),
    timeout=dict(type="int", default=120),
)

# The router and its fleet as a router host's module reaches them (module_utils/_router/client.py): the router's
# base URL, the resolved fleet, the engines' key file and the CA certificate on the host.
ROUTER_ACCESS_SPEC = dict(
    url=dict(type="str", required=True),
    engines=dict(type="list", elements="dict", required=True),
    api_key_file=dict(type="path", required=True, no_log=False),
    ca_file=dict(type="path"),
)
