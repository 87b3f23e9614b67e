# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KV events from the engines to the router (issue 38; docs/router.md, "Routing policies and KV events"): the router
policy of each role, whether the engines publish KV events, a record's `kv_events` field and the endpoints a
subscriber connects to. The one owner of these rules: the inputs stage (_inputs/validate.py), discovery
(_discover/records.py, _discover/outputs.py, _discover/policy.py), prepare (_prepare/checks.py) and the router plan
(_router/plan.py, which the router host modules ship) read them here. Pure, standard library only, Python 3.8.

What vLLM and vllm-router do (vLLM 0.32.0, vllm-router 0.1.17):
- `vllm serve --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:<port>"}'`
  (vllm/config/kv_events.py) makes each engine core publish its KV cache events on a ZMQ PUB socket. The publisher
  binds a wildcard, `::` or ipc endpoint and connects to any other (distributed/kv_events.py, _is_bind_endpoint), so
  an engine the router subscribes to publishes on `tcp://*:<port>`: every IPv4 interface of its host. It sets no
  ZMQ_IPV6 on that socket (only for tcp://*:0), so an IPv6 address never carries the events (seen with pyzmq 27.3 /
  libzmq 4.3.5: `tcp://*:P` binds 0.0.0.0 only and `tcp://[::]:P` fails with "No such device").
- Data-parallel rank r publishes on <port> + r (offset_endpoint_port of the global rank, data_parallel_index: v1/core/
  sched/scheduler.py), on the host that runs the rank.
- vllm-router in P/D mode subscribes a kv_aware PREFILL policy to `--pd-kv-events <prefill URL>=<ep>[,<ep>...]`, the
  endpoints ordered by DP rank and the key the worker's base URL (with --intra-node-data-parallel-size too: a
  `<url>@<rank>` key is refused, "use the base URL without the '@rank' suffix"); its help: "Block size is 16". It logs
  "kv_index subscriber for <url> rank<r> on <endpoint>" for each (tests/unit/roles/router/test_kv_events.py).
- Block hashes agree across engines only with one --prefix-caching-hash-algo (default sha256, config/cache.py) and one
  NONE_HASH seed: PYTHONHASHSEED when set, else a fixed seed for the cryptographic algorithms and a random one per
  process for xxhash (v1/core/kv_cache_utils.py, resolve_none_hash_seed). So every engine of a fleet with events gets
  PYTHONHASHSEED=NARWHAL_KV_HASH_SEED (Python itself takes 0 .. 4294967295).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import zmq_endpoint

__metaclass__ = type

KV_AWARE = "kv_aware"
# vllm-router 0.1.17's --pd-kv-events reads 16-token blocks (its help: "Block size is 16")
ROUTER_BLOCK_SIZE = 16
# what Python takes for PYTHONHASHSEED besides "random" (Python/initconfig.c: "PYTHONHASHSEED must be "random" or an
# integer in range [0; 4294967295]")
HASH_SEED_MAX = 4294967295
HASH_SEED_ENV = "PYTHONHASHSEED"
HASH_ALGO_FLAG = "--prefix-caching-hash-algo"
DEFAULT_HASH_ALGO = "sha256"  # vLLM 0.32.0 config/cache.py CacheConfig.prefix_caching_hash_algo
ROLES = ("prefill", "decode")


def events_port(site):
    """NARWHAL_KV_EVENTS_PORT, its catalogue default (5557) when a site lacks it: the first engine's first port."""
    return int(site.get("NARWHAL_KV_EVENTS_PORT") or 5557)


def hash_seed(site):
    """NARWHAL_KV_HASH_SEED as PYTHONHASHSEED's text, its catalogue default (0) when a site lacks it."""
    return str(site.get("NARWHAL_KV_HASH_SEED") or 0)


def role_policy(site, role):
    """(policy, the input it came from) of `role` (prefill or decode): NARWHAL_ROUTER_<ROLE>_POLICY when set, else
    NARWHAL_ROUTER_POLICY."""
    key = "NARWHAL_ROUTER_%s_POLICY" % role.upper()
    if site.get(key):
        return site[key], key
    return site.get("NARWHAL_ROUTER_POLICY") or "round_robin", "NARWHAL_ROUTER_POLICY"


def events_on(site):
    """Whether the engines publish KV events: NARWHAL_KV_EVENTS on, or auto (its default) with a kv_aware prefill
    policy."""
    mode = site.get("NARWHAL_KV_EVENTS") or "auto"
    if mode == "auto":
        return role_policy(site, "prefill")[0] == KV_AWARE
    return mode == "on"


def bind_endpoint(port):
    """The endpoint an engine publishes on: every interface of its host (the publisher binds only a wildcard)."""
    return "tcp://*:%d" % int(port)


def record_field(site, port):
    """A record's `kv_events` with its first port (the plan of _discover/outputs.py), or None when events are off (the
    record then has no such field)."""
    if not events_on(site):
        return None
    return {"endpoint": bind_endpoint(port), "port": int(port), "hash_seed": hash_seed(site)}


def _host_addresses(record):
    """[fabric address of the host of engine part k] for k = 0 (the head) .. the members, in narwhal_rank order."""
    members = sorted(record.get("members") or [], key=lambda m: m["member"])
    return [record["node"]["address"]] + [m["node"]["address"] for m in members]


def subscriber_endpoints(record):
    """[tcp://<address>:<port + r>] of a record with `kv_events`, by global DP rank r (the address of the host that
    runs rank r: rank r of an engine across hosts runs on its host r // data_parallel_size_local), or None."""
    kv = record.get("kv_events")
    if not kv:
        return None
    dp = record.get("data_parallel_size") or 1
    local = record.get("data_parallel_size_local") or dp
    addresses = _host_addresses(record)
    return [zmq_endpoint(addresses[rank // local], kv["port"] + rank) for rank in range(dp)]


def hash_algo(args):
    """The --prefix-caching-hash-algo an argument list gives vLLM (its parser keeps the last; `--x=v`, `--x v` and
    `--x_y` forms), or None when it gives none (vLLM's default applies)."""
    found = None
    for index, word in enumerate(args or []):
        head, sep, value = str(word).partition("=")
        if head.replace("_", "-") != HASH_ALGO_FLAG:
            continue
        if sep:
            found = value
        elif index + 1 < len(args):
            found = str(args[index + 1])
    return found
