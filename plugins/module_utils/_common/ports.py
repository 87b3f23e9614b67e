# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ports one host's part of an engine binds, read from its launch record (or a host's view of it): prepare's
shared-host check (_prepare/checks.py) and the free-port check on the host (modules/engine_prereqs.py) read them here.
Standard library only: the engine host imports it too.
"""

from __future__ import annotations

__metaclass__ = type


def side_channel_range(node):
    """(first, last) NIXL side-channel port of a record's `node`: its range, else its one port."""
    side = node.get("side_channel_ports") or [node["side_channel_port"], node["side_channel_port"]]
    return side[0], side[1]


def rpc_port(r):
    """The data-parallel RPC port this host binds, or None: only the head of an engine across hosts has one (discovery
    records data_parallel_rpc_port for those alone); it binds vLLM's DP handshake socket there
    (vllm/v1/engine/utils.py::launch_core_engines), its other hosts connect to it. `r` is the head's record or a
    host's view (_plan/container.py::member_view: `member.rank`; the views of _prepare/checks.py::shared_hosts:
    `headless`)."""
    if r.get("headless") or (r.get("member") or {}).get("rank"):
        return None
    return r.get("data_parallel_rpc_port") or None
