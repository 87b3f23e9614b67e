# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real Prometheus (Debian's `prometheus` package; scripts/bootstrap.sh installs it) for the monitoring tests and
the real scenario's checks (tests/harness/prometheus_check.py, tests/harness/alert_check.py): started on a free port
with its own storage over the scrape-config fragment the monitoring stage wrote (its job over the file_sd targets
file, and with TLS its tls_config ca_file) and the alert rules it wrote beside (rule_files), polled until ready and
until every target is up; its alerts; and the Grafana dashboard's panel queries with their template variables
substituted as Grafana's Prometheus datasource substitutes them."""
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import yaml

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RATE_INTERVAL = "1m"  # $__rate_interval: at a 1 s scrape interval, 60 samples (Grafana's floor is 4 intervals)
DEADLINE_S = 90


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def until(what, probe, deadline_s=DEADLINE_S):
    """Poll probe() -> (done, value) until done; fail naming `what` and the last answer after the deadline."""
    deadline, last = time.time() + deadline_s, None
    while time.time() < deadline:
        last = probe()
        if last and last[0]:
            return last[1]
        time.sleep(0.25)
    raise AssertionError("%s within %d s; last: %s" % (what, deadline_s, last and last[1]))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_configs(scrape_file):
    """The scrape_configs of the monitoring stage's fragment (config/prometheus/narwhal-scrape.yml), as an operator
    includes it (Debian bookworm's Prometheus 2.42 has no scrape_config_files: its entries are copied)."""
    fragment = yaml.safe_load(scrape_file.read_text())
    assert isinstance(fragment, dict) and list(fragment) == ["scrape_configs"], fragment
    return fragment["scrape_configs"]


def start(where, scrape_file, rules_file=None, detach=False):
    """-> (url, Popen) of a Prometheus scraping every second with the fragment's scrape jobs and, with `rules_file`
    (the stage's narwhal-rules.yml), evaluating its alert rules every second: an operator names the file under
    rule_files in prometheus.yml (the fragment cannot hold it: Prometheus reads a scrape_config_files file strictly as
    scrape_configs). `detach`: in a session of its own, so that it outlives the script that started it."""
    port = _free_port()
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": scrape_configs(scrape_file)}
    if rules_file is not None:
        config["rule_files"] = [str(rules_file)]
    (where / "prometheus.yml").write_text(yaml.safe_dump(config))
    with open(where / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([PROMETHEUS, "--config.file=%s" % (where / "prometheus.yml"),
                                 "--storage.tsdb.path=%s" % (where / "tsdb"),
                                 "--web.listen-address=127.0.0.1:%d" % port], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=detach)
    url = "http://127.0.0.1:%d" % port

    def ready():
        assert proc.poll() is None, (where / "prometheus.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                return resp.status == 200, resp.status
        except OSError as exc:
            return False, exc
    until("Prometheus ready at %s" % url, ready)
    return url, proc


def all_up(url, count):
    """(every one of `count` active targets is up, the targets or their health)."""
    active = get(url + "/api/v1/targets?state=active")["data"]["activeTargets"]
    done = len(active) == count and all(t["health"] == "up" for t in active)
    health = [(t["labels"].get("engine") or t["labels"].get("router"), t["health"], t["lastError"]) for t in active]
    return done, (active if done else health)


def alerts(url):
    """The alerts Prometheus holds now (GET /api/v1/alerts): pending and firing, each with labels, annotations,
    state and activeAt."""
    answer = get(url + "/api/v1/alerts")
    assert answer["status"] == "success", answer
    return answer["data"]["alerts"]


def alert_rules(url):
    """{alert name: [rule, ...]} of the alerting rules Prometheus has loaded (GET /api/v1/rules?type=alert); each rule
    with query, duration (its `for` in seconds), labels, health and lastError."""
    answer = get(url + "/api/v1/rules?type=alert")
    assert answer["status"] == "success", answer
    found = {}
    for group in answer["data"]["groups"]:
        for rule in group["rules"]:
            found.setdefault(rule["name"], []).append(rule)
    return found


def query(url, expr):
    answer = get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def variables(dashboard):
    return {v["name"]: v for v in json.loads(dashboard.read_text())["templating"]["list"]}


def regex_escape(value):
    """Grafana's prometheusSpecialRegexEscape (public/app/plugins/datasource/prometheus): a backslash becomes four,
    each other regex metacharacter gets two (one for the PromQL string, one for the regex)."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def grafana(dashboard, expr, selected):
    """expr with its template variables substituted as Grafana's Prometheus datasource does for regex matchers:
    a multi-value or include-all variable becomes its regex-escaped value, (a|b) for several, its allValue for All;
    $__rate_interval becomes RATE_INTERVAL."""
    known = variables(dashboard)
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("${__rate_interval}", RATE_INTERVAL)
    for name in sorted(selected, key=len, reverse=True):
        var, value = known[name], selected[name]
        if value == "$__all":
            text = var["allValue"]
        else:
            escaped = [regex_escape(v) for v in value]
            text = escaped[0] if len(escaped) == 1 else "(%s)" % "|".join(escaped)
        expr = expr.replace("${%s}" % name, text).replace("$%s" % name, text)
    assert "$" not in expr.replace("$__", ""), "an unsubstituted variable in %s" % expr
    return expr


def panels(dashboard):
    """(panel title, refId, expr) of every query of every panel (rows' nested panels included)."""
    out = []
    for panel in json.loads(dashboard.read_text())["panels"]:
        for inner in [panel] + panel.get("panels", []):
            for target in inner.get("targets", []):
                out.append((inner["title"], target["refId"], target["expr"]))
    return out
