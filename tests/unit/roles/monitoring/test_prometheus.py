"""The monitoring stage against a real Prometheus (Debian's `prometheus` package; scripts/bootstrap.sh installs it):
the role, run by a real ansible-playbook (playbooks/monitoring.yml), writes the file_sd targets of two stand-in
engines and of the real vllm-router in front of them, from a fleet file of ${NAME} values, and the scrape-config
fragment over them; Prometheus takes the fragment's job, reads that file and scrapes every target (plain HTTP here,
NARWHAL_TLS=off: test_prometheus_tls.py scrapes over TLS); and every panel query of the role's Grafana dashboard, its
template variables substituted as Grafana substitutes them, returns series after traffic through the router (a failing
request included).

No fixed sleeps: every wait polls with a generous deadline. Prometheus listens on a free port with its own storage,
so a Prometheus the package may have started on 9090 plays no part."""
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from test_support.paths import REPO
from test_support.prometheus import PROMETHEUS, all_up, get, grafana, panels, query, until, variables
from test_support.prometheus import start as start_prometheus
from test_support.router import router_process
from test_support.standin import engine_process

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd, scrape_config
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import stream

DASHBOARD = REPO / "roles" / "monitoring" / "files" / "narwhal-pd-dashboard.json"
KEY = "sk-narwhal-monitoring-test-key-0123456789"
FLEET_NAME = "fleet.lab"  # config/fleet.lab.json: a name with a regex metacharacter, as Grafana must escape it


def _playbook(project):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(project / "inventory"), "narwhal.deploy.monitoring"], capture_output=True, text=True,
                         env=env, cwd=project, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return out.stdout


def _project(where, engines, router):
    """An operator's project: .env, the fleet file of ${NAME} values, deployment.env with the engines' URLs, the
    router's record as the router stage writes it, an inventory with engines and routers."""
    (where / "config").mkdir(parents=True)
    (where / "runs" / "routers").mkdir(parents=True)
    (where / "inventory").mkdir()
    (where / ".env").write_text("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_TLS=off\n"
                                "NARWHAL_NODE_2_ROLE=decode\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
                                "NARWHAL_MODEL_PATH=/srv/models/tiny\nNARWHAL_FLEET=config/%s.json\n" % FLEET_NAME)
    fleet = [{"engine": e["engine"], "iid": "iid-%s" % e["engine"], "role": e["role"],
              "url": "${NARWHAL_NODE_%s_URL}" % e["engine"].split("-")[1],
              "attestation_url": "${NARWHAL_NODE_%s_ATTESTATION_URL}" % e["engine"].split("-")[1]} for e in engines]
    (where / "config" / ("%s.json" % FLEET_NAME)).write_text(json.dumps(fleet, indent=2))
    (where / "config" / "deployment.env").write_text("".join(
        "NARWHAL_NODE_{n}_URL={url}\nNARWHAL_NODE_{n}_ATTESTATION_URL={url}/v1/attestation\n".format(
            n=e["engine"].split("-")[1], url=e["url"]) for e in engines))
    record = {"host": "router-1", "url": router["url"], "metrics_url": router["metrics_url"]}
    (where / "runs" / "routers" / "router-1.json").write_text(json.dumps(record, indent=2))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}  # the opening's ping
    (where / "inventory" / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "engines": {"hosts": {e["engine"]: dict(local) for e in engines}},
        "routers": {"hosts": {"router-1": dict(local)}}}}}))
    return record


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """Two stand-in engines, the real router in front of them, the role's targets, Prometheus scraping them, and
    traffic through the router once every target is up."""
    assert os.access(PROMETHEUS, os.X_OK), (
        "no prometheus binary (%s): install Debian's prometheus package (scripts/bootstrap.sh does: apt-get install "
        "--no-install-recommends prometheus)" % PROMETHEUS)
    tmp = tmp_path_factory.mktemp("monitoring")
    started = time.time()
    procs, engines = [], []
    try:
        for n, role in ((1, "prefill"), (2, "decode")):
            url, proc = engine_process(tmp, str(n), KEY, "--enable-prompt-tokens-details")
            procs.append(proc)
            engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
        router = router_process(tmp, engines, KEY)
        procs.append(router["proc"])
        project = tmp / "project"
        record = _project(project, engines, router)
        first = _playbook(project)
        second = _playbook(project)
        targets_file = project / "config" / "prometheus" / "narwhal-targets.json"
        url, prom = start_prometheus(tmp, project / "config" / "prometheus" / "narwhal-scrape.yml")
        procs.append(prom)
        state = {"engines": engines, "router": router, "record": record, "project": project, "first": first,
                 "second": second, "targets_file": targets_file, "prometheus": url, "timings": {}}
        state["timings"]["setup_s"] = round(time.time() - started, 1)
        up_at = time.time()
        state["active"] = until("every target up", lambda: all_up(url, 3))
        state["timings"]["targets_up_s"] = round(time.time() - up_at, 1)
        state["traffic"] = _traffic(router["url"], url)
        yield state
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _round(router_url, n):
    """Completions and chat completions through the router, streamed and not, and one request for a model no
    engine serves, which the prefill engine refuses (the router's prefill error counter)."""
    statuses = []
    for i in range(3):
        body = {"model": "tiny", "prompt": "monitoring round %d request %d says hello" % (n, i), "max_tokens": 6}
        statuses.append(call(router_url + "/v1/completions", KEY, body, timeout=30)[0])
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "round %d chat %d" % (n, i)}],
                "max_tokens": 6}
        statuses.append(call(router_url + "/v1/chat/completions", KEY, chat, timeout=30)[0])
        statuses.append(stream(router_url + "/v1/completions", KEY, dict(body, stream=True), timeout=30)[0])
    assert statuses == [200] * 9, statuses
    failed = call(router_url + "/v1/completions", KEY, {"model": "no-such-model", "prompt": "x", "max_tokens": 2})[0]
    assert failed >= 400, failed
    return failed


def _traffic(router_url, prometheus):
    """Two rounds of traffic. vllm-router creates a counter at its first increment (a route's requests, a worker's
    errors), and rate() counts no increase before a series' first sample: the second round, sent once Prometheus
    holds the first round's counters, is what the rates see."""
    first = _round(router_url, 1)
    counters = '{job="narwhal-router", __name__=~"vllm_router_pd_requests_total|vllm_router_pd_prefill_errors_total"}'
    until("the first round's router counters in Prometheus", lambda: (len(query(prometheus, counters)) >= 3, None))
    second = _round(router_url, 2)
    return {"ok": 18, "refused": [first, second]}


def test_the_role_writes_the_targets_of_the_pure_code_and_a_second_run_changes_nothing(scraped):
    written = json.loads(scraped["targets_file"].read_text())
    assert written == file_sd(scraped["engines"], [scraped["record"]], FLEET_NAME)
    assert oct(scraped["targets_file"].stat().st_mode & 0o777) == "0o644"
    scrape = scraped["project"] / "config" / "prometheus" / "narwhal-scrape.yml"
    assert yaml.safe_load(scrape.read_text()) == scrape_config(str(scraped["targets_file"]))  # no TLS: no tls_config
    assert scrape.read_text().startswith("# The Prometheus scrape job of the fleet, written by narwhal.deploy")
    assert oct(scrape.stat().st_mode & 0o777) == "0o644"
    dashboard = scraped["project"] / "config" / "grafana" / "narwhal-pd-dashboard.json"
    assert dashboard.read_bytes() == DASHBOARD.read_bytes()
    assert re.search(r"engine-1 +: ok=\d+ +changed=[1-9]", scraped["first"]), scraped["first"][-2000:]
    for host in ("engine-1", "engine-2", "router-1"):
        assert re.search(r"%s +: ok=\d+ +changed=0 " % host, scraped["second"]), scraped["second"][-2000:]


def test_prometheus_scrapes_every_engine_and_the_router_with_the_fleet_labels(scraped):
    by_name = {t["labels"].get("engine") or t["labels"]["router"]: t for t in scraped["active"]}
    assert sorted(by_name) == ["engine-1", "engine-2", "router-1"]
    for engine in scraped["engines"]:
        target = by_name[engine["engine"]]
        assert target["health"] == "up" and target["scrapeUrl"] == engine["url"] + "/metrics"
        assert {k: target["labels"][k] for k in ("job", "role", "fleet", "host")} == {
            "job": "narwhal-engine", "role": engine["role"], "fleet": FLEET_NAME, "host": "127.0.0.1"}
    router = by_name["router-1"]
    assert router["health"] == "up" and router["scrapeUrl"] == scraped["router"]["metrics_url"]
    assert {k: router["labels"][k] for k in ("job", "role", "fleet", "host")} == {
        "job": "narwhal-router", "role": "router", "fleet": FLEET_NAME, "host": "127.0.0.1"}
    print("\ntargets up after %(targets_up_s)s s (setup %(setup_s)s s):" % scraped["timings"])
    for name, target in sorted(by_name.items()):
        print("  %-9s %-6s %s %s" % (name, target["health"], target["scrapeUrl"],
                                     json.dumps({k: v for k, v in target["labels"].items() if k != "instance"})))
    # vLLM's own `engine` label (the engine core's index) does not hide the fleet's: Prometheus keeps it as
    # exported_engine
    running = query(scraped["prometheus"], 'vllm:num_requests_running{job="narwhal-engine"}')
    assert sorted((s["metric"]["engine"], s["metric"]["exported_engine"]) for s in running) == [
        ("engine-1", "0"), ("engine-2", "0")]


def test_every_panel_query_returns_series(scraped):
    url = scraped["prometheus"]
    selected = {"fleet": [FLEET_NAME], "role": "$__all"}
    started, rows = time.time(), []
    for title, ref, expr in panels(DASHBOARD):
        promql = grafana(DASHBOARD, expr, selected)

        def answered(promql=promql):
            result = query(url, promql)
            values = [float(s["value"][1]) for s in result]
            return bool(result) and any(math.isfinite(v) for v in values), result
        result = until("%s (%s): a series with a value for %s" % (title, ref, promql), answered)
        rows.append((title, ref, len(result), promql, [s["value"][1] for s in result][:4]))
    print("\nevery panel answered within %.1f s of the traffic (%s):" % (time.time() - started, scraped["traffic"]))
    for title, ref, count, promql, values in rows:
        print("  %-28s %s %d series %s\n      %s" % (title, ref, count, values, promql))
    assert len(rows) == len(panels(DASHBOARD)) >= 20


def test_the_template_variables_list_the_fleet_and_its_roles_and_narrow_the_panels(scraped):
    url = scraped["prometheus"]
    known = variables(DASHBOARD)
    assert known["DS_PROMETHEUS"]["type"] == "datasource" and known["DS_PROMETHEUS"]["query"] == "prometheus"
    found = {}
    for name in ("fleet", "role"):
        m = re.match(r"^label_values\((.+), (\w+)\)$", known[name]["query"])
        assert m and m.group(2) == name, known[name]["query"]
        selector = grafana(DASHBOARD, m.group(1), {"fleet": [FLEET_NAME]})
        selector_query = urllib.parse.urlencode({"match[]": selector})
        found[name] = get(url + "/api/v1/label/%s/values?%s" % (name, selector_query))["data"]
    assert found == {"fleet": [FLEET_NAME], "role": ["decode", "prefill"]}
    (running,) = [expr for title, _ref, expr in panels(DASHBOARD) if title == "Running requests"]

    def engines(selected):
        return sorted(s["metric"]["engine"] for s in query(url, grafana(DASHBOARD, running, selected)))
    assert engines({"fleet": [FLEET_NAME], "role": ["decode"]}) == ["engine-2"]
    assert engines({"fleet": [FLEET_NAME], "role": ["prefill", "decode"]}) == ["engine-1", "engine-2"]
    assert engines({"fleet": ["fleet"], "role": "$__all"}) == []  # the regex is escaped and anchored: fleet.lab only
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
