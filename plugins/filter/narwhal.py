# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of narwhal.deploy: resolve_values (complete-value substitution), an engine's node settings and
launcher command line, the router's plan, the benchmark's plan, the Prometheus targets of the fleet, and the rows of
the playbooks' tables, the pairs to probe and what follows a launch (decodes to restart)."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_plan as plan_bench
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_router_plan as plan_bench_router
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import bench_routers as plan_bench_routers
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import from_record
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.report import progress
from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import url_host, url_port
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import NODE_VAR, RANK_VAR
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import engine_hosts as hosts_of_engines
from ansible_collections.narwhal.deploy.plugins.module_utils._common.reach import describe as describe_lost
from ansible_collections.narwhal.deploy.plugins.module_utils._common.reach import lost_hosts as plan_lost_hosts
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text, secret_values
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.images import plan_images, resolved_pulls
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import (
    check_engine_hosts,
    check_role_groups,
    engine_settings,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import (
    after_launch,
    describe,
    restart_refusal,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import peer_facts as record_peer_facts
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.roll import describe as describe_roll
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.roll import phase_pairs, roll_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._launch.roll import router_moves as plan_router_moves
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd, fleet_name, scrape_config
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import install_paths, install_plan
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import SubstitutionError, resolve_values
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.fabric import (
    bits_text,
    figures_line,
    rate_text,
    share_text,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.pairs import probe_pairs as fleet_pairs
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.schedule import changed_pairs, cover_pairs
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import (
    KEY,
    MOUNT,
    TLS_CA,
    config_text,
    fleet_workers,
    local_url,
    router_bind,
    tls_names,
    tls_on,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import router_plan as plan_router
from ansible_collections.narwhal.deploy.plugins.module_utils._tls.certs import engine_host_names
from ansible_collections.narwhal.deploy.plugins.plugin_utils._hostvars import host_inspection


def resolve_values_filter(data, env):
    """Replace every JSON string that is exactly ${NAME} with env[NAME]; see docs/substitution.md. An error shows
    secret-looking values (and the values of env's secret-looking names) as <redacted>."""
    env = dict(env or {})
    try:
        return resolve_values(data, env)
    except SubstitutionError as exc:
        raise AnsibleFilterError(redact_text(str(exc), secret_values(env))) from None


def _inventory(name, groups, hostvars, site):
    """({inventory host: engine-<n>}, {engine-<n>: [its hosts, the head first]}) of group engines, checked."""
    if not isinstance(groups, dict):
        raise AnsibleFilterError("%s takes the inventory's groups (a dict), not %s" % (name, type(groups).__name__))
    hosts = []
    for host in groups.get("engines") or []:
        found = hostvars[host] if host in hostvars else {}
        hosts.append((host, found.get(NODE_VAR), found.get(RANK_VAR)))
    try:
        members = hosts_of_engines(hosts)
        engines = dict((host, engine) for engine, names in members.items() for host in names)
        if site:
            roles = dict((host, engine_settings(site, engine).get("role")) for host, engine in engines.items())
            check_role_groups(engines, roles, groups)
            check_engine_hosts(members, site)
    except InputError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return dict((host, engines[host]) for host, _node, _rank in hosts), members


def inventory_engines(groups, hostvars, site=None):
    """{inventory host: engine-<n>} for the hosts of group engines: the host variable narwhal_node, or the host's
    name engine-<n> (_common/names.py::engine_hosts; every host of an engine across hosts, narwhal_rank, maps to it);
    with `site` (narwhal_site), an inventory group prefill or decode that contradicts .env's roles and an engine with
    another number of hosts than NARWHAL_NODE_<n>_HOSTS are refused (_inputs/nodes.py)."""
    return _inventory("inventory_engines", groups, hostvars, site)[0]


def engine_hosts(groups, hostvars, site=None):
    """{engine-<n>: [its inventory hosts in narwhal_rank order]}: the head (the host that serves the engine's HTTP
    API) first; checked as inventory_engines checks them."""
    return _inventory("engine_hosts", groups, hostvars, site)[1]


def member_record(record, member=0):
    """The launch record as one host of its engine runs it: for an engine across hosts the view of its host of
    narwhal_rank `member` (its own GPUs, devices, rails, address and side-channel ports: _plan/parallel.py::
    member_view); any other record as it is."""
    if not isinstance(record, dict):
        raise AnsibleFilterError("member_record takes a launch record (a dict), not %s" % type(record).__name__)
    try:
        rank = int(member or 0)
    except (TypeError, ValueError):
        raise AnsibleFilterError("member_record: %r is not a host rank (narwhal_member)" % (member,)) from None
    if not record.get("members") and not rank:
        return record
    try:
        return member_view(record, rank)
    except KeyError:
        raise AnsibleFilterError("the launch record of %s has no host of narwhal_rank %d; rerun discovery"
                                 % (record.get("engine"), rank)) from None


def engine_of(hostvars):
    """The engine an inventory host runs: narwhal_engine as the opening play sets it, else the host's name."""
    return hostvars.get("narwhal_engine") or hostvars.get("inventory_hostname")


def table_row(row, hosts=None):
    """One engine of discovery's table; `hosts` ({engine: inventory host}) adds the inventory host. A row's `note`
    (an engine whose host is unreachable: discovery kept its last record) ends it."""
    text = "%-10s %-20s %-8s %-26s %-34s %-48s %s" % (
        row["engine"], (hosts or {}).get(row["engine"]) or row["engine"], row["interface"], row["address"], row["url"],
        row["attestation_url"], row["role"])
    return "%s   %s" % (text, row["note"]) if row.get("note") else text


def inspection(hostvars):
    """The inspection discovery gathered on one engine host, as discovery_outputs takes it (its action plugin reads
    the same from hostvars itself: plugins/plugin_utils/_hostvars.py::host_inspection)."""
    return host_inspection(hostvars)


def _count(value):
    """A counter as it reads: 3584.0 -> 3584."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def probe_row(result):
    verdict = "PASS" if result.get("ok") else "FAIL (%s)" % "; ".join(result.get("reasons") or [])
    same = {True: ", output = local recomputation", False: ", output differs from local recomputation"}.get(
        result.get("matches_recompute"), "")
    evidence = {"request": ", proven by the request (%s prompt tokens loaded)" % result.get("cached_tokens"),
                "counters": ", proven by the NIXL counters"}.get(result.get("evidence"), "")
    notes = "".join("; %s" % n for n in result.get("notes") or [])
    host = str(result.get("remote_host"))
    return "%s -> %s: %s, %s bytes of KV via %s:%s in %ss (decode %ss)%s%s%s%s" % (
        result.get("producer"), result.get("consumer"), verdict, _count(result.get("bytes")),
        url_host(host), result.get("remote_port"), result.get("latency_s"),
        result.get("decode_s"), _figures(result), evidence, same, notes)


def _figures(result):
    """`, moved at <rate> (<share> of <nominal>)` of a probe result with a transfer rate, else nothing."""
    if not result.get("rate_bytes_s"):
        return ""
    link = result.get("link") or {}
    return ", moved at %s (%s of %s%s)" % (
        rate_text(result["rate_bytes_s"]), share_text(result.get("utilisation")), bits_text(link.get("nominal_bits_s")),
        " nominal" if link.get("nominal_bits_s") else "")


def probe_figures(results):
    """The transfer probe's one line of figures over its results: the slowest pair and the slowest rail against their
    nominal rates (_probe/fabric.py::figures_line; the module returns the same as `slowest` and `slowest_rail`)."""
    if not isinstance(results, list):
        raise AnsibleFilterError("probe_figures takes the transfer probe's results (a list), not %s"
                                 % type(results).__name__)
    return figures_line(results)


def _short(value, n=12):
    value = str(value or "-")
    return value.split(":", 1)[-1][:n]


def _cert_days(tls):
    """The status table's cert column (the launcher's status `tls`: {days_left, not_after, error}): the served
    certificate's days left as `<n>d`, `expired` when none are left, FAIL when it fails verification, `-` without
    TLS (NARWHAL_TLS=off, a headless host)."""
    tls = tls or {}
    days = tls.get("days_left")
    if isinstance(days, bool) or not isinstance(days, int):
        return "FAIL" if tls.get("error") else "-"
    return "%dd" % days if days > 0 else "expired"


def status_row(status):
    """One engine of the status table (the launcher's `status` document)."""
    container = status.get("container") or {}
    state = "lost" if status.get("lost") else container.get("state") or "absent"
    if container.get("restart_count"):
        state = "%s/%sr" % (state, container["restart_count"])
    nixl = status.get("nixl") or {}
    return "%-10s %-20s %-8s %-9s %-12s %-14s %-7s %-9s %-6s %-13s %s" % (
        status.get("engine"), status.get("inventory_host") or status.get("engine"), status.get("role") or "-",
        state, _short(container.get("id")),
        _short(status.get("plan_hash_running")),
        "-" if status.get("headless") else "ok" if (status.get("health") or {}).get("ok") else "FAIL",
        (status.get("version") or {}).get("served") or "-", _cert_days(status.get("tls")),
        _count(nixl.get("bytes_transferred", "-")),
        "; ".join(status.get("problems") or []) or "; ".join(["serving as recorded"] + (status.get("notes") or [])))


def status_key(status):
    """The key of one host's status in the status report: the engine, `<engine>#<k>` for its host of narwhal_rank k
    after the head of an engine across hosts (member)."""
    member = status.get("member") or 0
    return "%s#%d" % (status.get("engine"), member) if member else status.get("engine")


def status_problems(status):
    """`<engine>: <problem>; <problem>` for an engine that does not serve as recorded (`<engine> (<inventory host>)`
    when the host has a name of its own)."""
    engine, host = status.get("engine"), status.get("inventory_host")
    name = "%s (%s)" % (engine, host) if host and host != engine else engine
    return "%s: %s" % (name, "; ".join(status.get("problems") or ["not serving as recorded"]))


SUMMARY_FACTS = ("prepare_summary", "launch_summary", "probe_summary", "stop_summary")


def summary_entry(hostvars, urls=None, lost=None):
    """One engine's row of a playbook's closing table, from the facts its stage roles set (<role>_summary, the
    later stage's value winning); a host this run lost (`lost`: narwhal_lost) is named so, its action `unreachable`
    (it did not answer) or `left out` (another host of its engine did not)."""
    done = {}
    for stage in SUMMARY_FACTS:
        done.update(hostvars.get(stage) or {})
    engine = engine_of(hostvars)
    role = node_settings(hostvars.get("narwhal_site") or {}, engine)["role"]
    member = int(hostvars.get("narwhal_member") or 0)  # a host after the head of an engine across hosts: no URL
    action = done.get("action")
    name = hostvars.get("inventory_hostname")
    if name in ((lost or {}).get("hosts") or ()):
        action = "unreachable"
    elif name in ((lost or {}).get("left_out") or ()):
        action = "left out"
    return {"engine": engine, "inventory_host": name or engine,
            "host": hostvars.get("ansible_host") or name or engine, "role": role,
            "url": (urls or {}).get(engine) if not member else "(narwhal_rank %d, headless)" % member,
            "run_id": done.get("run_id"), "container_id": done.get("container_id"),
            "action": action, "vllm_version": done.get("vllm_version"), "probe": done.get("probe")}


def lost_status(hosts, lost=None):
    """The status documents of the engine hosts of a play (`hosts`: their hostvars): each host's status_engine, and
    for a host this run lost (narwhal_lost) one that names it (state `lost`, not serving); router hosts and hosts
    without a status are left out."""
    lost = lost or {}
    docs = []
    for hostvars in hosts:
        name, doc = hostvars.get("inventory_hostname"), hostvars.get("status_engine")
        if doc:
            docs.append(doc)
            continue
        engine = hostvars.get("narwhal_engine")
        if not engine or name not in list(lost.get("hosts") or ()) + list(lost.get("left_out") or ()):
            continue
        why = ("the host did not answer (unreachable): the routers' health checks keep its engine out, and the next "
               "run that reaches it takes it back"
               if name in (lost.get("hosts") or ()) else
               "left out: another host of %s did not answer" % engine)
        doc = {"engine": engine, "inventory_host": name, "serving": False, "as_recorded": False, "lost": True,
               "role": node_settings(hostvars.get("narwhal_site") or {}, engine)["role"] or "-", "problems": [why]}
        if int(hostvars.get("narwhal_member") or 0):
            doc["member"] = int(hostvars["narwhal_member"])
        docs.append(doc)
    return docs


def without_lost(fleet, lost=None):
    """The resolved fleet without the engines this run lost (narwhal_lost.engines): what the routers serve and the
    probes pair while a host does not answer."""
    if not isinstance(fleet, list):
        raise AnsibleFilterError("without_lost takes the resolved fleet (a list), not %s" % type(fleet).__name__)
    gone = set((lost or {}).get("engines") or ())
    return [entry for entry in fleet if entry.get("engine") not in gone]


def summary_row(entry):
    return "%-10s %-20s %-8s %-34s %-12s %-10s %-8s %s" % (
        entry.get("engine"), entry.get("inventory_host") or entry.get("host"), entry.get("role") or "-",
        entry.get("url") or "-",
        _short(entry.get("container_id")), entry.get("action") or "-", entry.get("vllm_version") or "-",
        entry.get("probe") or "-")


def install_plan_filter(paths, record, role_env_text, launcher_sha256, api_key_file, owner="root", sources=None):
    """What install writes on an engine host and held_files' list of what the host should then hold
    (_plan/role_env.py::install_plan, the one owner; roles/install and roles/prepare)."""
    if not isinstance(paths, dict) or not isinstance(record, dict) or not isinstance(role_env_text, str):
        raise AnsibleFilterError("install_plan takes the install paths (a dict), the launch record (a dict) and the "
                                 "role environment's text")
    if sources is not None and not isinstance(sources, dict):
        raise AnsibleFilterError("install_plan's sources must be prepare_run's install_sources of the host (a dict)")
    return install_plan(paths, record, role_env_text, launcher_sha256, api_key_file, owner, sources)


def install_paths_filter(checkout, engine):
    """Where install put an engine's files in the engine checkout (_plan/role_env.py::install_paths, the one owner)."""
    paths = install_paths(checkout, engine, "")
    paths.pop("run_dir")
    return paths


def node_settings(site, engine):
    """An engine's node settings (narwhal_site.engines, its NARWHAL_NODE_<n>_* overrides applied over the site
    values by _inputs/nodes.py); an engine no per-node input names gets the site's values."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("node_settings takes narwhal_site (a dict), not %s" % type(site).__name__)
    return engine_settings(site, str(engine))


DEFAULT_PYTHON = "/usr/bin/python3"


def launcher_command(site, engine, python=None):
    """The installed launcher's command line on an engine host: {paths, role_env, argv, command} (paths from
    _plan/role_env.install_paths, as prepare installed them; command = argv joined by spaces, unquoted)."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("launcher_command takes narwhal_site (a dict), not %s" % type(site).__name__)
    paths = install_paths_filter((site.get("site") or {}).get("NARWHAL_ENGINE_CHECKOUT"), engine)
    argv = [python or DEFAULT_PYTHON, paths["launcher"], "--role-env", paths["role_env"]]
    return {"paths": paths, "role_env": paths["role_env"], "argv": argv, "command": " ".join(argv)}


def router_plan(site, fleet, image_id, version, entry_checksum, address=None, tls=None):
    """The router's complete plan (_router/plan.py::router_plan) from narwhal_site and the resolved fleet, with
    `config_text` and `workers_text`, the exact bytes of router.json and workers.json on the router host; `tls`:
    tls_material's entry of the router host (its hosts.<host>), needed when NARWHAL_TLS is not off."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("router_plan takes narwhal_site (a dict), not %s" % type(site).__name__)
    try:
        plan = plan_router(site.get("site") or {}, fleet, image_id, version, entry_checksum, address,
                           engines=site.get("engines"), tls=tls)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))
    plan["config_text"] = config_text(plan["config"])
    plan["workers_text"] = config_text(plan["workers_doc"])
    return plan


def router_local_url(site, address=None):
    """Where a router host reaches its own router (_router/plan.py::local_url of the bound address, NARWHAL_ROUTER_PORT
    and NARWHAL_TLS): `address` is the host's router_address, the bound address when NARWHAL_ROUTER_BIND is empty."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("router_local_url takes narwhal_site (a dict), not %s" % type(site).__name__)
    inputs = site.get("site") or {}
    try:
        return local_url(router_bind(inputs, address), inputs["NARWHAL_ROUTER_PORT"], tls_on(inputs))
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def router_tls_names(site, address):
    """The names a router host's certificate carries (_router/plan.py::tls_names): tls_material's `names` for it."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("router_tls_names takes narwhal_site (a dict), not %s" % type(site).__name__)
    try:
        return tls_names(site.get("site") or {}, address)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def bench_plan(site, fleet, router_url, routers, stamp, record=None, lengths=None):
    """Every step of one fleet benchmark run (_bench/plan.py::bench_plan) from narwhal_site and the resolved fleet:
    the targets, the loads and each step's `vllm bench serve` arguments. `routers`: the bench_routers filter's plans
    (or the second router's URL); `record`, the benchmark host's engine record, gives the tokenizer's
    --trust-remote-code; `lengths`, the probe_engines lookup, every engine's max_model_len."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("bench_plan takes narwhal_site (a dict), not %s" % type(site).__name__)
    inputs = site.get("site") or {}
    model = inputs.get("NARWHAL_SERVED_MODEL_NAME") or str(inputs.get("NARWHAL_MODEL_PATH", "")).rstrip("/").rsplit(
        "/", 1)[-1]
    planned = [] if isinstance(routers, str) else list(routers or [])
    second = routers if isinstance(routers, str) else next(
        (r.get("url") or "" for r in planned if isinstance(r, dict) and r.get("target") == "router"), "")
    trust_remote_code = from_record(record)[0]
    try:
        return plan_bench(inputs, fleet_workers(fleet), router_url, second, model, inputs.get("NARWHAL_MODEL_PATH"),
                          stamp, trust_remote_code, lengths, planned)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def bench_routers(record, site, fleet, records=None):
    """The routers the benchmark runs beside the fleet's router (_bench/plan.py::bench_routers): the second router, or
    one P/D router per policy of NARWHAL_BENCH_POLICIES, each with the `files` it needs in NARWHAL_ROUTER_DIR;
    `records`: the launch config's engines (their KV block sizes, for kv_aware)."""
    if not isinstance(site, dict) or not isinstance(record, dict):
        raise AnsibleFilterError("bench_routers takes the router's record (runs/routers/<router>.json), "
                                 "narwhal_site and the fleet")
    try:
        return plan_bench_routers(record, site.get("site") or {}, fleet, site.get("engines"), records)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def bench_router_plan(record, site, fleet):
    """The benchmark's second router (vllm-router's regular mode over the fleet's first decode engine) from the
    fleet router's record (_bench/plan.py::bench_router_plan), with `config_text`, the bytes of its
    bench-router.json."""
    if not isinstance(site, dict) or not isinstance(record, dict):
        raise AnsibleFilterError("bench_router_plan takes the router's record (runs/routers/<router>.json), "
                                 "narwhal_site and the fleet")
    try:
        plan = plan_bench_router(record, site.get("site") or {}, fleet_workers(fleet))
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))
    plan["config_text"] = config_text(plan["config"])
    return plan


def bench_progress(step, result):
    """The progress line of one finished benchmark step (_bench/report.py::progress)."""
    return progress(step, result or {})


def prometheus_targets(fleet, routers, fleet_file):
    """The Prometheus file_sd document of the resolved fleet and the routers' records (_monitor/targets.py::file_sd),
    every target labelled with the fleet's name (the fleet file's name without .json)."""
    if not isinstance(fleet_file, str) or not fleet_file:
        raise AnsibleFilterError("prometheus_targets takes the fleet file's path (narwhal_site.paths.fleet) third")
    try:
        return file_sd(fleet, routers or [], fleet_name(fleet_file))
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def prometheus_scrape(targets_file, ca_file=None):
    """The scrape-config fragment of the monitoring stage (_monitor/targets.py::scrape_config): one job over the
    targets file, with tls_config ca_file when `ca_file` (NARWHAL_TLS on) is given."""
    try:
        return scrape_config(targets_file, ca_file or None)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc))


def router_status_row(status, problems_only=False):
    """One line of the routers' status table, or with problems_only its refusal (router: problems)."""
    if problems_only:
        return "%s: %s" % (status.get("router"), "; ".join(status.get("problems") or []))
    return "%-10s %-9s %-8s %-12s %-8s %-5s %s" % (
        status.get("router"), status.get("state"), status.get("version"), status.get("plan"),
        status.get("workers"), status.get("cert", "-"), "; ".join(status.get("problems") or []) or "-")


def traffic_row(entry):
    """One line per request through the router: endpoint, stream, prompt, tokens, KV evidence, equality, verdict."""
    return "%-11s %-6s %-5s tokens %-4s kv %-34s equal %-5s (%s) %s" % (
        entry.get("endpoint"), "stream" if entry.get("stream") else "-", entry.get("prompt"),
        entry.get("prompt_tokens") if entry.get("prompt_tokens") is not None else "-",
        entry.get("kv") or "-", entry.get("equal"), entry.get("compared_as") or "text",
        "PASS" if entry.get("ok") else "FAIL: %s" % "; ".join(entry.get("problems") or []))


def peer_facts(record):
    """What the decode-restart rule reads from a launch record: vLLM, NIXL (its distribution's pinned version), the
    connector (_launch/peers.py::peer_facts)."""
    return record_peer_facts(record)


PROBE_PAIR_CHOICES = ("auto", "all", "cover")


def probe_pairs(fleet, engines=None, pairs="all", launched=None, done=None):
    """The fleet's [producer, consumer] pairs, or only those one of `engines` is in (_probe/pairs.py::probe_pairs);
    with pairs=cover, only enough of them for every engine to produce and consume once; with pairs=auto, the pairs
    this run's launch (`launched`: {engine: action}, `done`: the pairs it probed again) did not prove, and a cover,
    or every pair when nothing was launched (_probe/schedule.py)."""
    if pairs not in PROBE_PAIR_CHOICES:
        raise AnsibleFilterError("narwhal_probe_pairs=%r: use auto (site.yml: the pairs of what its launch changed, "
                                 "and a cover; on its own: every pair), all (every prefill/decode pair, both ways) or "
                                 "cover (every engine at least once as producer and once as consumer)" % (pairs,))
    chosen = fleet_pairs(fleet, engines)
    if pairs == "auto":
        return changed_pairs(chosen, launched or {}, done or ())
    return cover_pairs(chosen) if pairs == "cover" else chosen


DECODE_RESTART_MODES = ("auto", "tell")


def launch_peers(hosts, fleet, records=None, mode="auto", check=False):
    """What follows a launch (_launch/peers.py::after_launch) from the play's hosts' variables (launch_action,
    launch_started_at, launch_peer as the launch role sets them), the fleet, and the launch config's records for
    the engines the play did not preview. Adds `refusal`: the message that ends the launch (restart_refusal) or
    None, and `lines`: what launch shows (with check, what it would do)."""
    if mode not in DECODE_RESTART_MODES:
        raise AnsibleFilterError("narwhal_decode_restart=%r: use one of %s (auto restarts the decode engines the rule "
                                 "names, tell names them and fails)" % (mode, ", ".join(DECODE_RESTART_MODES)))
    launched, peers, play = {}, {}, []
    for hostvars in hosts:
        engine = engine_of(hostvars)
        play.append(engine)
        if hostvars.get("launch_action"):
            launched[engine] = {"action": hostvars["launch_action"], "started_at": hostvars.get("launch_started_at")}
        if hostvars.get("launch_peer"):
            peers[engine] = hostvars["launch_peer"]
    for engine, record in (records or {}).items():
        peers.setdefault(engine, record_peer_facts(record))
    plan = after_launch(fleet, launched, peers)
    plan["refusal"] = restart_refusal(plan, mode, play)
    plan["lines"] = describe(plan, check)
    return plan


ROLL_OUTAGE = ("", "accept")


def _roll_record(runs_dir, run, engine):
    """An engine's launch record of one run on the controller (the run directory prepare wrote)."""
    return "%s/%s/%s/engine-launch.%s.json" % (runs_dir, run, engine, engine)


def _roll_reads(hostvars, runs_dir):
    """{"new": path, "running": path or None} of one engine the launch previewed (launch_runs, set by the launch role):
    its installed run's record and, when it is replaced, the record of the run its container runs."""
    engine, runs = engine_of(hostvars), hostvars.get("launch_runs") or {}
    running = runs.get("running") if hostvars.get("launch_action") == "replace" else None
    return {"new": _roll_record(runs_dir, runs.get("installed"), engine) if runs.get("installed") else None,
            "running": _roll_record(runs_dir, running, engine) if running else None}


def launch_roll_records(hosts, runs_dir):
    """The record files launch_roll reads (on the controller, lookup('file')): for each previewed engine its installed
    record and, when it is replaced, the record of the run its container runs."""
    paths = []
    for hostvars in hosts:
        paths += [p for p in _roll_reads(hostvars, runs_dir).values() if p and p not in paths]
    return paths


def _roll_entries(hosts, fleet, runs_dir, texts, records):
    by_engine = dict((engine_of(h), h) for h in hosts if h.get("launch_action"))
    entries, host_of = [], {}
    for entry in fleet:
        engine, hostvars = entry.get("engine"), by_engine.get(entry.get("engine"))
        reads = _roll_reads(hostvars, runs_dir) if hostvars else {"new": None, "running": None}
        try:
            new = json.loads(texts[reads["new"]]) if reads["new"] in texts else (records or {}).get(engine)
            running = json.loads(texts[reads["running"]]) if reads["running"] in texts else None
        except ValueError as exc:
            raise AnsibleFilterError("the launch record of %s does not parse (%s); rerun prepare" % (engine, exc))
        if new is None:
            continue  # an engine without a record on the controller: not judged (it is not launched either)
        if hostvars:
            host_of[engine] = hostvars.get("inventory_hostname")
        entries.append({"engine": engine, "role": entry.get("role"), "url": str(entry.get("url")).rstrip("/"),
                        "action": hostvars.get("launch_action") if hostvars else "unchanged",
                        "running": running, "new": new})
    return entries, host_of


def launch_roll(hosts, fleet, runs_dir, texts=None, records=None, outage=""):
    """How launch rolls the engines it starts or replaces (_launch/roll.py::roll_plan) from the previewed hosts'
    variables (launch_action, launch_runs), the resolved fleet, the record files' texts ({path: text}, the paths of
    launch_roll_records) and the launch config's records (engines outside the play). Adds `lines` (what launch shows),
    `phase_hosts` and `phase_pairs` (per phase: the inventory hosts it launches, the pairs that prove it),
    `engine_pairs` (the pairs of each engine's phase) and `proven` (every pair the roll proves)."""
    if outage not in ROLL_OUTAGE:
        raise AnsibleFilterError("narwhal_roll_outage=%r: leave it unset, or set accept to take a stated outage where "
                                 "the engines cannot be rolled without one" % (outage,))
    if not isinstance(fleet, list):
        raise AnsibleFilterError("launch_roll takes the resolved fleet (a list), not %s" % type(fleet).__name__)
    entries, host_of = _roll_entries(list(hosts), fleet, runs_dir, texts or {}, records)
    plan = roll_plan(entries, accept_outage=outage == "accept")
    plan["lines"] = describe_roll(plan)
    plan["phase_hosts"] = [[host_of[e] for e in p["engines"] if e in host_of] for p in plan["phases"]]
    plan["phase_pairs"] = [phase_pairs(entries, p) for p in plan["phases"]]
    plan["engine_pairs"] = dict((e, phase_pairs(entries, p)) for p in plan["phases"] for e in p["engines"])
    plan["proven"] = [pair for i, pairs in enumerate(plan["phase_pairs"]) for pair in pairs
                      if pair not in [q for earlier in plan["phase_pairs"][:i] for q in earlier]]
    return plan


def router_access(records, site):
    """How a router host reaches its router, from the routers' records (runs/routers/<host>.json, as the router stage
    wrote them): [{host, url (the local URL, _router/plan.py::local_url of the recorded bind and port), dir,
    api_key_file, ca_file (the router directory's copies of what the container mounts at _router/plan.py MOUNT), workers
    ({prefill: [url], decode: [url]})}]."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("router_access takes narwhal_site (a dict), not %s" % type(site).__name__)
    folder = str((site.get("site") or {}).get("NARWHAL_ROUTER_DIR", "")).rstrip("/")
    out = []
    for record in records:
        secure = str(record.get("url", "")).startswith("https://")
        workers = record.get("workers") or {}
        held = dict((role, [w["url"] for w in workers.get(role) or []]) for role in ("prefill", "decode"))
        out.append({"host": record["host"], "url": local_url(record["bind"], url_port(record["url"]), secure),
                    "dir": folder, "api_key_file": folder + KEY[len(MOUNT):],
                    "ca_file": folder + TLS_CA[len(MOUNT):] if secure else "",
                    "workers": held})
    return out


def router_moves(routers, direction, engines=None, serving=None):
    """What narwhal.deploy.router_members does on each router (_launch/roll.py::router_moves)."""
    if direction not in ("out", "in", "set"):
        raise AnsibleFilterError("router_moves: direction %r is not out, in or set" % (direction,))
    return plan_router_moves(routers, direction, engines, serving)


def lost_hosts(play_hosts, reached, engines, members, routers, site):
    """The hosts this run lost when it opened, the engines they take with them, and whether the run goes on
    (_common/reach.py::lost_hosts, NARWHAL_MAX_LOST_HOSTS); adds `lines`, what the opening shows."""
    if not isinstance(site, dict):
        raise AnsibleFilterError("lost_hosts takes narwhal_site (a dict), not %s" % type(site).__name__)
    engines, members = engines or {}, members or {}
    roles = dict((e, node_settings(site, e)["role"]) for e in sorted(set(engines.values())))
    report = plan_lost_hosts(list(play_hosts), list(reached), engines, members, list(routers or ()), roles,
                             site.get("site", {}).get("NARWHAL_MAX_LOST_HOSTS", "10%"))
    report["lines"] = describe_lost(report)
    return report


def tls_hosts(play_hosts, engines, members, fleet, launch=None):
    """tls_material's `hosts` for the engine hosts of a play: each with its engine's fleet URL host (the head's for
    an engine across hosts) and its own address from the launch records (_tls/certs.py::engine_host_names)."""
    if not isinstance(fleet, list):
        raise AnsibleFilterError("tls_hosts takes the resolved fleet (a list, lookup('narwhal.deploy.fleet')), not %s"
                                 % type(fleet).__name__)
    return engine_host_names(list(play_hosts), engines or {}, members or {}, fleet, launch or {})


def image_plan(reads, sources, repin=False, pulled=None, pin_file=None):
    """The deliver stage's image plan (_deliver/images.py::plan_images): `reads` {inventory host: its registered
    image_delivery state=read}, `sources` the image_sources result (pins, archives), `repin` deliver_image_repin,
    `pulled` the resolvers' registered pulls (the second call, once they pulled)."""
    if not isinstance(reads, dict) or not isinstance(sources, dict):
        raise AnsibleFilterError("image_plan takes the hosts' reads (a dict) and the image_sources result (a dict)")
    plain = json.loads(json.dumps({"reads": reads, "sources": sources, "pulled": list(pulled or [])}))
    hosts = dict((h, r) for h, r in plain["reads"].items() if isinstance(r, dict) and "images" in r)
    try:
        return plan_images(hosts, plain["sources"].get("pins"), plain["sources"].get("archives"), bool(repin),
                           resolved_pulls(plain["pulled"]), pin_file or "the pin file")
    except (InputError, PlanError) as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"resolve_values": resolve_values_filter, "table_row": table_row, "inspection": inspection,
                "probe_row": probe_row, "probe_figures": probe_figures,
                "status_row": status_row, "status_problems": status_problems,
                "summary_entry": summary_entry, "summary_row": summary_row,
                "install_paths": install_paths_filter, "install_plan": install_plan_filter,
                "node_settings": node_settings,
                "inventory_engines": inventory_engines, "engine_hosts": engine_hosts,
                "member_record": member_record, "status_key": status_key,
                "launcher_command": launcher_command, "router_plan": router_plan,
                "router_local_url": router_local_url, "router_tls_names": router_tls_names,
                "router_status_row": router_status_row,
                "traffic_row": traffic_row, "prometheus_targets": prometheus_targets,
                "prometheus_scrape": prometheus_scrape,
                "bench_plan": bench_plan, "bench_router_plan": bench_router_plan, "bench_progress": bench_progress,
                "bench_routers": bench_routers,
                "peer_facts": peer_facts, "probe_pairs": probe_pairs, "launch_peers": launch_peers,
                "tls_hosts": tls_hosts, "launch_roll": launch_roll, "launch_roll_records": launch_roll_records,
                "router_access": router_access, "router_moves": router_moves, "lost_hosts": lost_hosts,
                "lost_status": lost_status, "without_lost": without_lost, "image_plan": image_plan}
