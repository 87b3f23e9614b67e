# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of the ports one host's part of an engine binds (bound_ports), read from its launch record or a
host's view of it: discovery's check of one engine's own ports (_discover/fleet.py::check_own_ports), prepare's
shared-host check (_prepare/checks.py::shared_hosts) and the free-port check on the host (modules/engine_prereqs.py)
read them here. Standard library only: the engine host imports it too.
"""

from __future__ import annotations

__metaclass__ = type

# The names of bound_ports' entries, in its order.
ENGINE, ATTESTATION, SIDE_CHANNEL, DP_RPC = "engine", "attestation", "side-channel", "data-parallel RPC"
KV_EVENTS = "kv-events"


def side_channel_range(node):
    """(first, last) NIXL side-channel port of a record's `node`: its range, else its one port."""
    side = node.get("side_channel_ports") or [node["side_channel_port"], node["side_channel_port"]]
    return side[0], side[1]


def headless(r):
    """Whether `r` is a host after the head of an engine across hosts: engine cores only (vllm serve --headless, 0.32.0
    entrypoints/cli/serve.py run_headless), no HTTP API and no attestation sidecar there. `r` is a host's view of a
    record (_plan/parallel.py::member_view: `member.rank` > 0; the views of _prepare/checks.py::shared_hosts:
    `headless`); a record itself is its head's."""
    return bool(r.get("headless") or (r.get("member") or {}).get("rank"))


def rpc_port(r):
    """The data-parallel RPC port this host binds, or None: only the head of an engine across hosts has one (discovery
    records data_parallel_rpc_port for those alone); it binds vLLM's DP handshake socket there
    (vllm/v1/engine/utils.py::launch_core_engines), its other hosts connect to it."""
    if headless(r):
        return None
    return r.get("data_parallel_rpc_port") or None


def kv_events_range(r):
    """(first, last) KV events port this host binds, or None for a record without `kv_events` (events off): one per
    data-parallel rank it runs, at the record's port + the rank's global index (vLLM's offset_endpoint_port,
    _common/kv_events.py). `r`: a record (the head's ranks from 0) or a host's view of it (`member.start_rank`)."""
    kv = r.get("kv_events")
    if not kv:
        return None
    member = r.get("member") or {}
    local = r.get("data_parallel_size_local") or r.get("data_parallel_size") or 1
    first = kv["port"] + (member.get("start_rank") or 0)
    return first, first + local - 1


def bound_ports(r):
    """{name: (first, last)} of every port one host's part of an engine binds, in this order: ENGINE (its HTTP port)
    and ATTESTATION (its sidecar's) unless the host is headless, SIDE_CHANNEL (its range on this host), on the head
    of an engine across hosts DP_RPC, and with KV events KV_EVENTS (its ranks' publishers). `r`: a record or a host's
    view of it (headless)."""
    node = r["node"]
    ports = {}
    if not headless(r):
        ports[ENGINE] = (node["engine_port"], node["engine_port"])
        ports[ATTESTATION] = (node["attest_port"], node["attest_port"])
    ports[SIDE_CHANNEL] = side_channel_range(node)
    if rpc_port(r):
        ports[DP_RPC] = (rpc_port(r), rpc_port(r))
    if kv_events_range(r):
        ports[KV_EVENTS] = kv_events_range(r)
    return ports


def port_set(r):
    """The set of every port of bound_ports(r)."""
    return set(p for lo, hi in bound_ports(r).values() for p in range(lo, hi + 1))
