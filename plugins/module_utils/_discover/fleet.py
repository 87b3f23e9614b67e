# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery part 1, pure planning: node addresses, engine/attestation URLs, deployment.env, fleet.

Input: validated inputs (_inputs/validate.py::load_inputs), the engine names of the play and each engine host's
narwhal_interface facts. Output: the deployment.env entries, the fleet records and a summary table.
Every refusal raises InputError naming the .env key or the host, and the fix.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import (
    attestation_url,
    engine_scheme,
    engine_url,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import engine_number
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import (
    ATTESTATION,
    DP_RPC,
    ENGINE,
    KV_EVENTS,
    SIDE_CHANNEL,
    bound_ports,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import USABLE_OPERSTATES
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import engine_settings
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import parse_url

__metaclass__ = type


# deployment.env values, as python-dotenv and a shell both read them unquoted: nothing that ends a line, quotes,
# comments (#), expands ($, `), escapes (\) or splits words
ENV_VALUE = re.compile(r"^[A-Za-z0-9._:/\[\]@%+,=~-]*$")


def select_address(n, host, interface, facts, family, explicit=None):
    """The node's fabric address: an explicit NARWHAL_NODE_<n>_IP wins (it must be on the interface),
    otherwise exactly one usable global address of the bind family."""
    usable = [a for a in facts.get("addresses", []) if a.get("usable")]
    key = "NARWHAL_NODE_%d_IP" % n
    if explicit:
        present = [a["address"] for a in facts.get("addresses", [])]
        if explicit not in [str(ipaddress.ip_address(a)) for a in present if _is_ip(a)]:
            raise InputError(key, "%s is not an address of %s on %s (it has: %s); set %s to one of its "
                                  "global addresses, or use NARWHAL_NODE_%d_URL for another reachable address"
                             % (explicit, interface, host, ", ".join(present) or "none", key, n))
        match = [a for a in facts["addresses"] if _is_ip(a["address"]) and
                 str(ipaddress.ip_address(a["address"])) == explicit][0]
        if not match["usable"]:
            raise InputError(key, "%s on %s of %s is not usable (%s); choose a global, preferred address"
                             % (explicit, interface, host, match["reason"]))
        return explicit
    candidates = [a["address"] for a in usable if a["family"] == family]
    if not candidates:
        others = ", ".join("%s (%s)" % (a["address"], a["reason"] or a["family"]) for a in facts.get("addresses", []))
        raise InputError("NARWHAL_FABRIC_INTERFACE" if not facts.get("per_node") else
                         "NARWHAL_NODE_%d_FABRIC_INTERFACE" % n,
                         "interface %s on host %s has no usable global %s address (addresses: %s); assign one, "
                         "choose another interface, or change NARWHAL_BIND_FAMILY"
                         % (interface, host, family, others or "none"))
    if len(candidates) > 1:
        raise InputError(key, "interface %s on host %s has %d global %s addresses (%s); set %s to the one "
                              "engines must use" % (interface, host, len(candidates), family,
                                                    ", ".join(candidates), key))
    return candidates[0]


def _is_ip(value):
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


def _override(n, node, kind, port_key, default_url, port, tls=None):
    """NARWHAL_NODE_<n>_<kind> when set, else `default_url`; its port must be the node's. With `tls` (NARWHAL_TLS, for
    the engine URL) its scheme must be the engines' (engine_scheme): https with TLS, http without."""
    key = "NARWHAL_NODE_%d_%s" % (n, kind)
    url = node.get(kind)
    if not url:
        return default_url
    scheme, _host, url_port, _path = parse_url(key, url)
    if tls is not None and scheme != engine_scheme(tls):
        raise InputError(key, "%s is %s but NARWHAL_TLS is %s, so the engines serve %s; write the URL with %s:// (or "
                              "set NARWHAL_TLS%s), then rerun discovery"
                         % (url, scheme, tls, engine_scheme(tls), engine_scheme(tls),
                            "=off for plain HTTP" if scheme == "http" else " to site or operator"))
    if url_port != port:
        raise InputError(key, "%s uses port %d but node %d's %s port is %d; set NARWHAL_NODE_%d_%s=%d "
                              "(or correct the URL)" % (url, url_port, n, port_key.split("_")[0].lower(),
                                                        port, n, port_key, url_port))
    return url


def _discovered_address(n, host, settings, facts, family):
    """(fabric address, host ID) of an engine from its host's narwhal_interface facts."""
    interface = settings["fabric_interface"]
    facts = dict(facts or {})
    facts["per_node"] = settings["inputs"]["fabric_interface"] != "NARWHAL_FABRIC_INTERFACE"
    # the facts modules refuse such a link on the host (_facts/netaddr.py::link_problem); this holds the same
    # rule for the facts that reach the controller (operstate only: UP and UNKNOWN carry traffic)
    state = str(facts.get("operstate") or "").upper()
    if state and state not in USABLE_OPERSTATES:
        key = settings["inputs"]["fabric_interface"]
        raise InputError(key, "interface %s on host %s is down (ip reports operstate %s), so its addresses carry "
                              "no traffic and must not go into the records; bring the link up (cable, switch "
                              "port, 'ip link set %s up') or choose another interface, then rerun discovery"
                         % (interface, host, facts["operstate"], interface))
    return select_address(n, host, interface, facts, family, settings["ip"]), facts.get("host_id") or host


def _check_kept(node, kept, ip):
    """A kept engine's deployment.env lines (_discover/kept.py) must be what today's .env gives it: its role, ports,
    interface, URLs and an explicit address (`ip`, NARWHAL_NODE_<n>_IP); its address is the kept one."""
    now = {"ROLE": node["role"], "ENGINE_PORT": str(node["engine_port"]), "ATTEST_PORT": str(node["attest_port"]),
           "FABRIC_INTERFACE": node["interface"], "IP": ip or kept["env"].get("IP"), "URL": node["url"],
           "ATTESTATION_URL": node["attestation_url"]}
    for suffix, value in now.items():
        if kept["env"].get(suffix) != value:
            key = "NARWHAL_NODE_%d_%s" % (node["n"], suffix)
            raise InputError(key, "%s, so discovery would keep its last record, whose deployment.env has %s=%s, but "
                                  ".env gives %s now; undo the change until %s is back, or %s"
                             % (kept["unreachable"], key, kept["env"].get(suffix), value, node["engine"], kept["fix"]))


def build_fleet(inputs, engines, interfaces, kept=None):
    """-> {"nodes": [...], "deployment_env": [(key, value)...], "fleet": [...], "table": [...]}. `kept`: {engine:
    what discovery keeps of an engine whose host is unreachable (_discover/kept.py::kept_outputs)}: its address and
    host ID instead of its facts."""
    kept = kept or {}
    site = inputs["site"]
    family = site["NARWHAL_BIND_FAMILY"]
    numbers = {}
    for name in engines:
        numbers[engine_number(name)] = name
    for n in sorted(inputs["nodes"]):
        if n not in numbers and inputs["nodes"][n]:
            names = ["NARWHAL_NODE_%d_%s" % (n, k) for k in sorted(inputs["nodes"][n])]
            key = "NARWHAL_NODE_%d_ROLE" % n if "ROLE" in inputs["nodes"][n] else names[0]
            raise InputError(key, "is set but no host of the inventory's group engines is engine-%d (a host with "
                                  "narwhal_node: %d, or named engine-%d; the group has %s), so %s would configure "
                                  "nothing; add the host to group engines or remove %s from .env"
                             % (n, n, n, ", ".join(numbers[m] for m in sorted(numbers)) or "none", ", ".join(names),
                                "it" if len(names) == 1 else "them"))
    nodes = []
    for n in sorted(numbers):
        host = numbers[n]
        node = inputs["nodes"].get(n, {})
        if not node.get("ROLE"):
            raise InputError("NARWHAL_NODE_%d_ROLE" % n,
                             "%s (an engine host of the inventory) has no fleet role; set NARWHAL_NODE_%d_ROLE=prefill "
                             "or decode" % (host, n))
        settings = engine_settings(inputs, host)  # the node's overrides, resolved once (_inputs/nodes.py)
        interface = settings["fabric_interface"]
        if host in kept:
            address, host_id = kept[host]["address"], kept[host]["host_id"]
        else:
            address, host_id = _discovered_address(n, host, settings, interfaces.get(host), family)
        engine_port, attest_port = settings["engine_port"], settings["attest_port"]
        tls = site["NARWHAL_TLS"]
        url = _override(n, node, "URL", "ENGINE_PORT", engine_url(address, engine_port, engine_scheme(tls)),
                        engine_port, tls)
        att = _override(n, node, "ATTESTATION_URL", "ATTEST_PORT", attestation_url(address, attest_port),
                        attest_port)
        nodes.append({"n": n, "engine": host, "role": node["ROLE"], "interface": interface,
                      "address": address, "engine_port": engine_port, "attest_port": attest_port,
                      "url": url, "attestation_url": att, "host_id": host_id})
        if host in kept:
            _check_kept(nodes[-1], kept[host], settings["ip"])
    if len(nodes) < 2:
        raise InputError("engines", "the fleet has %d engine(s); prefill/decode needs at least two "
                                    "(engine-1 prefill, engine-2 decode): add hosts to group engines" % len(nodes))
    for role in ("prefill", "decode"):
        if not any(x["role"] == role for x in nodes):
            raise InputError("NARWHAL_NODE_<n>_ROLE", "no engine has role %s; set NARWHAL_NODE_<n>_ROLE=%s for "
                                                      "at least one engine" % (role, role))
    _check_shared_hosts(nodes)
    env = []
    for x in nodes:
        p = "NARWHAL_NODE_%d_" % x["n"]
        env += [(p + "IP", x["address"]), (p + "URL", x["url"]), (p + "ATTESTATION_URL", x["attestation_url"]),
                (p + "ENGINE_PORT", str(x["engine_port"])), (p + "ATTEST_PORT", str(x["attest_port"])),
                (p + "ROLE", x["role"]), (p + "FABRIC_INTERFACE", x["interface"])]
    fleet = [{"iid": "n%d" % x["n"], "engine": x["engine"], "url": "${NARWHAL_NODE_%d_URL}" % x["n"],
              "attestation_url": "${NARWHAL_NODE_%d_ATTESTATION_URL}" % x["n"], "role": x["role"]}
             for x in nodes]
    table = [{"engine": x["engine"], "interface": x["interface"], "address": x["address"], "url": x["url"],
              "attestation_url": x["attestation_url"], "role": x["role"]} for x in nodes]
    return {"nodes": nodes, "deployment_env": env, "fleet": fleet, "table": table}


def _check_shared_hosts(nodes):
    seen = {}
    for x in nodes:
        if x["engine_port"] == x["attest_port"]:
            raise InputError("NARWHAL_NODE_%d_ATTEST_PORT" % x["n"],
                             "%s would serve the engine and the attestation sidecar on the same port %d; "
                             "give them different ports" % (x["engine"], x["engine_port"]))
        for kind, port in (("engine", x["engine_port"]), ("attestation", x["attest_port"])):
            for key in ((x["host_id"], port), ("addr", x["address"], port)):
                other = seen.get(key)
                if other and other[0] != x["engine"]:
                    raise InputError(
                        "NARWHAL_NODE_%d_%s" % (x["n"], "ENGINE_PORT" if kind == "engine" else "ATTEST_PORT"),
                        "%s and %s share a host and both use port %d (%s %s); give each engine on one host "
                        "its own ports with NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT"
                        % (other[0], x["engine"], port, other[1], kind))
                seen[key] = (x["engine"], kind)


def check_own_ports(record, keys):
    """One engine's own ports on its head host must not overlap, checked where they are first all known (its record,
    _discover/records.py::build_record): vLLM binds the NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT, a ZMQ socket)
    and, on the head of an engine across hosts, its data-parallel RPC socket (--data-parallel-rpc-port:
    vllm/v1/engine/utils.py::launch_core_engines) next to its HTTP server in one network namespace (network_mode
    host), so one of them would fail with "Address already in use" at start (vLLM issue 20965). `keys`: the .env
    input of the engine's HTTP and attestation ports (node_settings' `inputs`: engine_port, attest_port). Engines
    sharing a host are prepare's check (_prepare/checks.py::shared_hosts)."""
    ports = bound_ports(record)
    key = {ENGINE: keys["engine_port"], ATTESTATION: keys["attest_port"], SIDE_CHANNEL: "NARWHAL_SIDE_CHANNEL_PORT"}
    what = {ENGINE: "HTTP", ATTESTATION: "attestation", SIDE_CHANNEL: "side-channel"}
    engine = record["engine"]
    rpc = ports.get(DP_RPC)
    for name in (ENGINE, ATTESTATION, SIDE_CHANNEL):
        lo, hi = ports[name]
        if rpc and lo <= rpc[0] <= hi:
            raise InputError("NARWHAL_DATA_PARALLEL_RPC_PORT",
                             "%s (an engine across hosts) would bind vLLM's data-parallel RPC port %d on its head, "
                             "which holds its own %s %s (%s); one engine cannot bind both: set "
                             "NARWHAL_DATA_PARALLEL_RPC_PORT to a free port outside the engines' HTTP, attestation "
                             "and side-channel ports, or move the engine's %s port with %s, then rerun discovery"
                             % (engine, rpc[0], what[name], _span(lo, hi), key[name], what[name], key[name]))
    lo, hi = ports[SIDE_CHANNEL]
    for name in (ENGINE, ATTESTATION):
        port = ports[name][0]
        if lo <= port <= hi:
            raise InputError("NARWHAL_SIDE_CHANNEL_PORT",
                             "%s would listen for NIXL's side channel on %s (from NARWHAL_SIDE_CHANNEL_PORT, the first "
                             "side-channel port of each host), which holds its own %s port %d (%s); one engine cannot "
                             "bind both: set NARWHAL_SIDE_CHANNEL_PORT outside the engines' HTTP and attestation "
                             "ports, or move the engine's %s port with %s, then rerun discovery"
                             % (engine, _span(lo, hi), what[name], port, key[name], what[name], key[name]))
    _check_kv_ports(engine, ports, key, what)


def _check_kv_ports(engine, ports, key, what):
    """The KV events ports of one engine (its ranks' publishers, _common/kv_events.py) against its other ports."""
    if KV_EVENTS not in ports:
        return
    lo, hi = ports[KV_EVENTS]
    key, what = dict(key, **{DP_RPC: "NARWHAL_DATA_PARALLEL_RPC_PORT"}), dict(what, **{DP_RPC: "data-parallel RPC"})
    for name in (ENGINE, ATTESTATION, SIDE_CHANNEL, DP_RPC):
        if name in ports and ports[name][0] <= hi and lo <= ports[name][1]:
            raise InputError("NARWHAL_KV_EVENTS_PORT",
                             "%s would publish its KV events on %s (from NARWHAL_KV_EVENTS_PORT, one port per "
                             "data-parallel rank), which overlaps its own %s %s (%s); one engine cannot bind both: set "
                             "NARWHAL_KV_EVENTS_PORT outside the engines' other ports, then rerun discovery"
                             % (engine, _span(lo, hi), what[name], _span(*ports[name]), key[name]))


def _span(lo, hi):
    return "port %d" % lo if lo == hi else "ports %d-%d" % (lo, hi)


def render_env(entries, header):
    """deployment.env: KEY=VALUE lines read by python-dotenv (scripts/narwhal-fleet, the fleet lookup) and
    shells. A value that could add a line, be expanded or be read differently unquoted is refused by key."""
    lines = ["# %s" % line for line in header]
    for key, value in entries:
        value = str(value)
        if not re.match(r"^[A-Z][A-Z0-9_]*$", key) or not ENV_VALUE.match(value):
            raise InputError(key, "%r cannot be written into deployment.env as one plain KEY=VALUE line (only letters, "
                                  "digits and . _ : / [ ] @ %% + , = ~ -); correct the input it comes from in .env, "
                                  "then rerun discovery" % value)
        lines.append("%s=%s" % (key, value))
    return "\n".join(lines) + "\n"
