"""The monitoring stage against a real Prometheus (Debian's `prometheus` package; scripts/bootstrap.sh installs it):
the role, run by a real ansible-playbook (playbooks/monitoring.yml), writes the file_sd targets of two stand-in
engines and of the real vllm-router in front of them, from a fleet file of ${NAME} values, the scrape-config
fragment over them and the alert rules of the fleet (promtool checks them first: a promtool that refuses them leaves
no file); Prometheus takes the fragment's job and the rules, reads that file and scrapes every target (plain HTTP
here, NARWHAL_TLS=off: test_prometheus_tls.py scrapes over TLS); every panel query of the role's Grafana dashboard,
its template variables substituted as Grafana substitutes them, returns series after traffic through the router (a
failing request included); and with NARWHAL_ALERT_FOR=5s, a stopped engine fires the engine-down alert, and the real
router's worker-unhealthy alert for it (the router's worker label is the URL the rules name).

No fixed sleeps: every wait polls with a generous deadline. Prometheus listens on a free port with its own storage,
so a Prometheus the package may have started on 9090 plays no part."""
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from test_support.paths import REPO
from test_support.prometheus import (
    PROMETHEUS,
    alert_rules,
    alerts,
    all_up,
    get,
    grafana,
    panels,
    query,
    until,
    variables,
)
from test_support.prometheus import start as start_prometheus
from test_support.router import router_process
from test_support.standin import engine_process

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.rules import rules
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd, scrape_config
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import stream

DASHBOARD = REPO / "roles" / "monitoring" / "files" / "narwhal-pd-dashboard.json"
KEY = "sk-narwhal-monitoring-test-key-0123456789"
FLEET_NAME = "fleet.lab"  # config/fleet.lab.json: a name with a regex metacharacter, as Grafana must escape it
ALERT_FOR = "5s"  # NARWHAL_ALERT_FOR: short, for the engine-down alert to fire within the test


def _playbook(project, path=None, ok=True):
    """ansible-playbook narwhal.deploy.monitoring in `project` -> its output; `path`: the controller's PATH; `ok`:
    whether it must pass (else fail)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    if path is not None:
        env["PATH"] = path
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(project / "inventory"), "narwhal.deploy.monitoring"], capture_output=True, text=True,
                         env=env, cwd=project, timeout=300, check=False)
    assert (out.returncode == 0) == ok, out.stdout[-4000:] + out.stderr[-2000:]
    return out.stdout


def _project(where, engines, router):
    """An operator's project: .env, the fleet file of ${NAME} values, deployment.env with the engines' URLs, the
    router's record as the router stage writes it, an inventory with engines and routers."""
    (where / "config").mkdir(parents=True)
    (where / "runs" / "routers").mkdir(parents=True)
    (where / "inventory").mkdir()
    (where / ".env").write_text("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_TLS=off\n"
                                "NARWHAL_NODE_2_ROLE=decode\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
                                "NARWHAL_MODEL_PATH=/srv/models/tiny\nNARWHAL_FLEET=config/%s.json\n"
                                "NARWHAL_ALERT_FOR=%s\n" % (FLEET_NAME, ALERT_FOR))
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
        refused = _refused_by_promtool(tmp, project)
        targets_file = project / "config" / "prometheus" / "narwhal-targets.json"
        rules_file = project / "config" / "prometheus" / "narwhal-rules.yml"
        url, prom = start_prometheus(tmp, project / "config" / "prometheus" / "narwhal-scrape.yml", rules_file)
        procs.append(prom)
        state = {"engines": engines, "router": router, "record": record, "project": project, "first": first,
                 "second": second, "refused": refused, "targets_file": targets_file, "rules_file": rules_file,
                 "prometheus": url, "timings": {}, "engine_procs": {"engine-1": procs[0], "engine-2": procs[1]}}
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


def _refused_by_promtool(tmp, project):
    """The role in a copy of the project with no rules file yet, a promtool first on PATH that refuses every file:
    the run fails and writes no rules file. -> (the run's output, the paths promtool was asked to check)."""
    fake = tmp / "fake-bin"
    fake.mkdir()
    asked = tmp / "promtool-asked"
    (fake / "promtool").write_text("#!/bin/sh\necho \"$@\" >> %s\necho 'FAILED: refused by the test' >&2\nexit 1\n"
                                   % asked)
    (fake / "promtool").chmod(0o755)
    copy = tmp / "project-refused"
    shutil.copytree(project, copy)
    (copy / "config" / "prometheus" / "narwhal-rules.yml").unlink()
    out = _playbook(copy, path="%s:%s" % (fake, os.environ.get("PATH", "")), ok=False)
    assert not (copy / "config" / "prometheus" / "narwhal-rules.yml").exists()
    return out, asked.read_text().split("\n")


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
    # the fragment names the rules in a comment: a file of scrape_config_files may hold scrape_configs only
    assert "# name %s under rule_files in\n# prometheus.yml" % scraped["rules_file"] in scrape.read_text()
    rules_text = scraped["rules_file"].read_text()
    assert yaml.safe_load(rules_text) == rules(scraped["engines"], [scraped["record"]], FLEET_NAME,
                                               {"NARWHAL_ALERT_FOR": ALERT_FOR})
    assert rules_text.startswith("# The alert rules of the fleet, written by narwhal.deploy's monitoring stage")
    assert oct(scraped["rules_file"].stat().st_mode & 0o777) == "0o644"
    dashboard = scraped["project"] / "config" / "grafana" / "narwhal-pd-dashboard.json"
    assert dashboard.read_bytes() == DASHBOARD.read_bytes()
    assert re.search(r"engine-1 +: ok=\d+ +changed=[1-9]", scraped["first"]), scraped["first"][-2000:]
    for host in ("engine-1", "engine-2", "router-1"):
        assert re.search(r"%s +: ok=\d+ +changed=0 " % host, scraped["second"]), scraped["second"][-2000:]


def test_promtool_checks_the_rules_before_they_are_written(scraped):
    """The role runs promtool check rules on the new file before it takes its place: a promtool that refuses it
    fails the run, naming the refusal, and leaves no rules file (_refused_by_promtool)."""
    out, asked = scraped["refused"]
    task = re.search(r"TASK \[narwhal\.deploy\.monitoring : Write the alert rules.*?(?=\nTASK |\nPLAY RECAP)", out,
                     re.S)
    assert task, out[-3000:]
    assert "failed to validate" in task.group(0) and "FAILED: refused by the test" in task.group(0), task.group(0)
    (call,) = [line for line in asked if line]
    assert re.match(r"^check rules --lint-fatal \S+$", call), asked


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


def _active(url, alert, engine):
    return [a for a in alerts(url) if a["labels"]["alertname"] == alert and a["labels"].get("engine") == engine]


def test_prometheus_loads_every_alert_of_the_rules_and_none_fires_on_a_serving_fleet(scraped):
    url = scraped["prometheus"]
    loaded = alert_rules(url)
    expected = {r["alert"] for r in yaml.safe_load(scraped["rules_file"].read_text())["groups"][0]["rules"]}
    assert set(loaded) == expected and len(expected) == 12
    for name, found in loaded.items():
        for rule in found:
            assert rule["health"] in ("ok", "unknown") and rule["duration"] == 5, (name, rule)
    # after the rules' first evaluations: the fleet serves, so nothing fires
    until("every rule evaluated without error", lambda: (
        all(r["health"] == "ok" for f in alert_rules(url).values() for r in f), alert_rules(url)))
    firing = [a["labels"] for a in alerts(url) if a["state"] == "firing"]
    assert firing == []


def test_a_stopped_engine_fires_the_engine_down_alert_and_the_routers_worker_alert(scraped):
    """Runs last in this file: it stops engine-2 (the decode). Prometheus (1 s scrapes and evaluations) fires
    NarwhalEngineDown for it after NARWHAL_ALERT_FOR, and NarwhalRouterWorkerUnhealthy from the real router's
    vllm_router_worker_health of its URL. The time from the stop to each firing is printed, not asserted."""
    url = scraped["prometheus"]
    assert _active(url, "NarwhalEngineDown", "engine-2") == []
    proc = scraped["engine_procs"]["engine-2"]
    proc.terminate()
    proc.wait(15)
    stopped, fired = time.time(), {}

    def firing():
        for alert in ("NarwhalEngineDown", "NarwhalRouterWorkerUnhealthy"):
            found = [a for a in _active(url, alert, "engine-2") if a["state"] == "firing"]
            if found and alert not in fired:
                fired[alert] = (round(time.time() - stopped, 1), found[0])
        return len(fired) == 2, [(a["labels"]["alertname"], a["state"]) for a in alerts(url)]
    until("engine-2's alerts firing", firing, deadline_s=120)
    print("\nengine-2 stopped; NARWHAL_ALERT_FOR=%s, scrape and evaluation every 1 s:" % ALERT_FOR)
    for alert, (seconds, found) in sorted(fired.items()):
        print("  %-30s firing %5.1f s after the stop  %s\n      %s" % (
            alert, seconds, json.dumps(found["labels"], sort_keys=True), found["annotations"]["summary"]))
    down = fired["NarwhalEngineDown"][1]
    assert {k: down["labels"][k] for k in ("severity", "fleet", "engine", "role", "job")} == {
        "severity": "page", "fleet": FLEET_NAME, "engine": "engine-2", "role": "decode", "job": "narwhal-engine"}
    assert down["annotations"]["summary"] == "Engine engine-2 (decode, fleet %s) is down" % FLEET_NAME
    assert "narwhal_repair=true" in down["annotations"]["description"]
    worker = fired["NarwhalRouterWorkerUnhealthy"][1]
    assert worker["labels"]["router"] == "router-1"
    assert worker["labels"]["worker"] == scraped["engines"][1]["url"]
    # engine-1 serves on: nothing fires for it
    assert [a for a in alerts(url) if a["labels"].get("engine") == "engine-1"] == []
