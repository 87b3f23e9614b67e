# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine's node settings, resolved once: its NARWHAL_NODE_<n>_* overrides applied over the site values.

Pure code. site_inputs returns them as `narwhal_site.engines` (engine-<n> -> settings); the roles read them
through the filter narwhal.deploy.node_settings, discovery (_discover/fleet.py, _discover/records.py) through
engine_settings / node_settings, so an override is applied in this file only.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME

__metaclass__ = type


# (setting, node input NARWHAL_NODE_<n>_<name>, the site input it overrides)
OVERRIDES = (
    ("fabric_interface", "FABRIC_INTERFACE", "NARWHAL_FABRIC_INTERFACE"),
    ("engine_port", "ENGINE_PORT", "NARWHAL_ENGINE_PORT"),
    ("attest_port", "ATTEST_PORT", "NARWHAL_ATTEST_PORT"),
    ("image", "IMAGE", "NARWHAL_IMAGE"),
    ("rdma_devices", "RDMA_DEVICES", "NARWHAL_RDMA_DEVICES"),
    ("data_parallel_size", "DATA_PARALLEL_SIZE", "NARWHAL_DATA_PARALLEL_SIZE"),
    ("enable_expert_parallel", "ENABLE_EXPERT_PARALLEL", "NARWHAL_ENABLE_EXPERT_PARALLEL"),
)

# (setting, node input) of the inputs that exist per node only (None when unset); the URLs' defaults need the
# discovered address (_discover/fleet.py)
NODE_ONLY = (
    ("role", "ROLE"),
    ("ip", "IP"),
    ("url", "URL"),
    ("attestation_url", "ATTESTATION_URL"),
    ("hosts", "HOSTS"),
)


def node_settings(site, node, n):
    """The settings of node `n` (None for a host not named engine-<n>): every OVERRIDES setting from `node`
    (its NARWHAL_NODE_<n>_* inputs, as load_inputs returns them) when set, else from `site`; the NODE_ONLY ones
    from `node` or None; `inputs` names the .env input each OVERRIDES setting came from."""
    node = node or {}
    site = site or {}
    settings = {"engine": "engine-%d" % n if n is not None else None, "node": n}
    sources = {}
    for name, node_key, site_key in OVERRIDES:
        if node.get(node_key) not in (None, ""):  # a node's false (ENABLE_EXPERT_PARALLEL) overrides too
            settings[name], sources[name] = node[node_key], "NARWHAL_NODE_%d_%s" % (n, node_key)
        else:
            settings[name], sources[name] = site.get(site_key), site_key
    for name, node_key in NODE_ONLY:
        settings[name] = node.get(node_key)
    settings["inputs"] = sources
    return settings


def _node_number(engine):
    m = ENGINE_NAME.match(str(engine or ""))
    return int(m.group(1)) if m else None


def resolve_engines(inputs):
    """-> {engine-<n>: node_settings(...)} for every node the inputs set something of (`inputs` as load_inputs
    returns it; node numbers int or, through Ansible, str), in node order."""
    nodes = dict((int(n), v) for n, v in (inputs.get("nodes") or {}).items())
    return dict(("engine-%d" % n, node_settings(inputs.get("site"), nodes[n], n)) for n in sorted(nodes))


def engine_settings(inputs, engine):
    """The settings of one engine: those site_inputs resolved (`inputs["engines"]`, narwhal_site.engines) when
    the inputs carry them, else resolved here; an engine no NARWHAL_NODE_<n>_* input names gets the site's."""
    resolved = (inputs.get("engines") or {}).get(engine)
    if resolved is not None:
        return resolved
    n = _node_number(engine)
    nodes = inputs.get("nodes") or {}
    node = (nodes.get(n) or nodes.get(str(n))) if n is not None else None
    return node_settings(inputs.get("site"), node, n)


ROLE_GROUPS = ("prefill", "decode")


def check_role_groups(engines, roles, groups):
    """Refuses an inventory whose own group prefill or decode holds an engine host that .env gives another role (or
    none): `.env` is the one source of the roles (NARWHAL_NODE_<n>_ROLE). `engines` is {inventory host: engine-<n>},
    `roles` {inventory host: its role in .env, or None}, `groups` the inventory's {group: [hosts]}."""
    for group in ROLE_GROUPS:
        for host in (groups or {}).get(group) or []:
            if host not in engines or roles.get(host) == group:
                continue
            key = "NARWHAL_NODE_%s_ROLE" % engines[host].split("-")[1]
            has = "%s=%s" % (key, roles[host]) if roles.get(host) else "no role for it (%s is not set)" % key
            raise InputError(key, "inventory host %s (%s) is in the inventory's group %s, but .env has %s; .env is the "
                                  "one source of the roles: remove the host from group %s in the inventory (the "
                                  "narwhal.deploy.fleet_groups inventory plugin and every playbook's opening add the "
                                  "engines to prefill and decode from .env), or correct %s"
                             % (host, engines[host], group, has, group, key))


def check_engine_hosts(members, inputs):
    """Refuses an engine whose inventory hosts are not as many as .env says it spans (NARWHAL_NODE_<n>_HOSTS,
    default 1). `members` is {engine-<n>: [its inventory hosts, the head first]} (_common/names.py::engine_hosts),
    `inputs` narwhal_site."""
    for engine, hosts in sorted(members.items()):
        want = engine_settings(inputs, engine).get("hosts") or 1
        if len(hosts) == want:
            continue
        n = engine.split("-")[1]
        raise InputError("NARWHAL_NODE_%s_HOSTS" % n,
                         "%s spans %d host(s) by .env (NARWHAL_NODE_%s_HOSTS%s) but the inventory has %d host(s) of "
                         "it in group engines (%s); give the engine's hosts narwhal_node: %s and narwhal_rank: 0 .. %d "
                         "in the inventory, or set NARWHAL_NODE_%s_HOSTS=%d"
                         % (engine, want, n, "=%d" % want if want > 1 else " unset: 1", len(hosts), ", ".join(hosts),
                            n, want - 1, n, len(hosts)))
