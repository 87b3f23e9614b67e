# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus file-based service discovery for the fleet (docs/monitoring.md): one target per engine's /metrics
and per router's metrics endpoint, from the same resolved fleet the router and the probes use (the `fleet` lookup:
complete-value substitution, _plan/subst.py) and the routers' records (runs/routers/<router>.json).

Pure: the role passes the resolved fleet, the router records and the fleet file's path; the result is the file_sd
document (a list of {"targets": ["host:port"], "labels": {...}}), in a fixed order so that an unchanged fleet
writes the same bytes.
"""

from __future__ import annotations

import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import (
    redact_userinfo,
    refuse_fleet_userinfo,
    refuse_userinfo,
    split_url,
    target,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key

__metaclass__ = type

ENGINE_JOB = "narwhal-engine"
ROUTER_JOB = "narwhal-router"
ENGINE_ROLES = ("prefill", "decode")
ROUTER_ROLE = "router"
# vLLM serves its Prometheus metrics at /metrics of the engine's HTTP port, without the API key (vllm-router at
# /metrics of its metrics port, the path of a record's metrics_url).
METRICS_PATH = "/metrics"


def fleet_name(path):
    """The fleet's label: the fleet file's name without .json (config/fleet.json -> fleet, fleet.lab.json ->
    fleet.lab)."""
    name = os.path.basename(str(path))
    return name[:-len(".json")] if name.endswith(".json") and len(name) > len(".json") else name


def _refuse_url(where, who, url, fix):
    raise PlanError("%s: %s has URL %r; a Prometheus target needs an http or https URL with a host and a port "
                    "(http://10.0.0.11:8000); %s" % (where, who, redact_userinfo(url), fix), where)


def engine_targets(fleet, name, where="NARWHAL_FLEET"):
    """One target group per fleet engine: its /metrics, job narwhal-engine, labels engine, role, host, fleet."""
    if not isinstance(fleet, list):
        raise PlanError("%s: the fleet is not a list of engines; rerun discovery" % where, where)
    refuse_fleet_userinfo(fleet, where)  # the one rule of every fleet reader: a credential would be in the targets
    groups = []
    for i, entry in enumerate(fleet):
        if not isinstance(entry, dict):
            raise PlanError("%s: entry %d is not an object; rerun discovery" % (where, i), where)
        engine, role, url = entry.get("engine"), entry.get("role"), entry.get("url")
        who = engine if isinstance(engine, str) and engine else "entry %d" % i
        if not (isinstance(engine, str) and engine):
            raise PlanError("%s: %s has no engine name; rerun discovery" % (where, who), where)
        if role not in ENGINE_ROLES:
            raise PlanError("%s: %s has role %r, not prefill or decode; set NARWHAL_NODE_<n>_ROLE and rerun "
                            "discovery" % (where, who, role), where)
        parsed = split_url(url)
        if parsed is None:
            _refuse_url(where, who, url, "correct NARWHAL_NODE_<n>_URL (or the engine port) and rerun discovery")
        scheme, host, port, path = parsed
        groups.append({"targets": [target(host, port)],
                       "labels": {"job": ENGINE_JOB, "engine": engine, "role": role, "host": host, "fleet": name,
                                  "__scheme__": scheme, "__metrics_path__": path + METRICS_PATH}})
    return sorted(groups, key=lambda g: natural_key(g["labels"]["engine"]))


def router_targets(routers, name, where="runs/routers"):
    """One target group per router record: its metrics_url, job narwhal-router, labels router, role router, host,
    fleet."""
    if not isinstance(routers, list):
        raise PlanError("%s: the router records are not a list" % where, where)
    groups = []
    for i, record in enumerate(routers):
        router = record.get("host") if isinstance(record, dict) else None
        if not (isinstance(router, str) and router):
            raise PlanError("%s: record %d names no router (its host); rerun the router stage" % (where, i), where)
        url = record.get("metrics_url")
        refuse_userinfo(url, "%s/%s.json: router %s, field metrics_url" % (where, router, router), where,
                        "rerun the router stage (narwhal.deploy.router) to record it again")
        parsed = split_url(url)
        if parsed is None:
            _refuse_url("%s/%s.json" % (where, router), "router %s" % router, url,
                        "rerun the router stage (narwhal.deploy.router) to record it")
        scheme, host, port, path = parsed
        groups.append({"targets": [target(host, port)],
                       "labels": {"job": ROUTER_JOB, "router": router, "role": ROUTER_ROLE, "host": host,
                                  "fleet": name, "__scheme__": scheme, "__metrics_path__": path or METRICS_PATH}})
    return sorted(groups, key=lambda g: natural_key(g["labels"]["router"]))


def file_sd(fleet, routers, name):
    """The file_sd document: the engines (in natural order of their names), then the routers. Refuses one
    endpoint named twice (Prometheus would scrape it twice, under two names)."""
    groups = engine_targets(fleet, name) + router_targets(routers or [], name)
    seen = {}
    for group in groups:
        labels = group["labels"]
        who = labels.get("engine") or "router %s" % labels.get("router")
        key = (labels["__scheme__"], group["targets"][0], labels["__metrics_path__"])
        if key in seen:
            raise PlanError("NARWHAL_FLEET: %s and %s have the same metrics endpoint %s://%s%s; each engine and "
                            "router needs one of its own (rerun discovery, or the router stage)"
                            % (seen[key], who, key[0], key[1], key[2]), "NARWHAL_FLEET")
        seen[key] = who
    return groups


# The scrape job of the fragment; each target's own `job` label (narwhal-engine, narwhal-router) replaces it.
SCRAPE_JOB = "narwhal"


def scrape_config(targets_file, ca_file=None):
    """The scrape-config fragment the stage writes beside the targets (config/prometheus/narwhal-scrape.yml): one job
    reading the targets file, and with TLS (NARWHAL_TLS site or operator: `ca_file`, the controller's
    <NARWHAL_TLS_DIR>/ca.crt) a tls_config that verifies the engines' and routers' certificates against the site CA,
    the target's host as the server name (Prometheus' default: the certificates name the address the fleet's URL
    holds). A Prometheus includes it with scrape_config_files (2.43 and later) or takes its scrape_configs entry into
    prometheus.yml. Both paths must be absolute: Prometheus reads a relative one against its own config's directory."""
    for name, path in (("the targets file", targets_file), ("the CA certificate", ca_file)):
        if (path is not None or name == "the targets file") and not (isinstance(path, str) and path.startswith("/")):
            raise PlanError("monitoring: %s %r is not an absolute path; Prometheus would read it against its own "
                            "configuration's directory: give an absolute path" % (name, path), "monitoring")
    job = {"job_name": SCRAPE_JOB, "file_sd_configs": [{"files": [targets_file]}]}
    if ca_file:
        job["tls_config"] = {"ca_file": ca_file}
    return {"scrape_configs": [job]}
