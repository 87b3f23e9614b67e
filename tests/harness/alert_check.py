"""The real scenario's alert check (extensions/molecule/real/verify_alerts.yml): a real Prometheus over the
scrape-config fragment and the alert rules the monitoring stage wrote (narwhal-scrape.yml's job, narwhal-rules.yml
under rule_files, as an operator's prometheus.yml names them) scrapes the real fleet while the playbook stops an
engine's container, waits for its alert to fire, repairs the engine and waits for the alert to resolve. Prometheus
outlives each step (a session of its own); its URL and process ID are kept in WORKDIR/alert-check.json.

    python3 alert_check.py start SCRAPE_FILE RULES_FILE WORKDIR
        start Prometheus, wait until every target is up and every rule evaluated without error; show them
    python3 alert_check.py firing WORKDIR ALERT ENGINE STOPPED_AT [STOP_BEGAN_AT]
        wait until ALERT fires for ENGINE; show the seconds since STOPPED_AT (the epoch second the stop returned)
    python3 alert_check.py resolved WORKDIR ALERT ENGINE SINCE
        wait until ALERT for ENGINE is neither pending nor firing; show the seconds since SINCE
    python3 alert_check.py stop WORKDIR
        stop that Prometheus
"""
import json
import os
import pathlib
import signal
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit" / "plugins"))
from test_support import prometheus  # noqa: E402 - the test helpers' package, beside this checkout's tests

STATE = "alert-check.json"
SETTLE_S = 120  # beyond an alert's `for`: scrapes, evaluations, an engine's start


def _state(workdir):
    return json.loads((pathlib.Path(workdir) / STATE).read_text())


def _show(url):
    for alert in sorted(prometheus.alerts(url), key=lambda a: (a["labels"]["alertname"], json.dumps(a["labels"]))):
        labels = {k: v for k, v in alert["labels"].items() if k in ("engine", "router", "role", "severity", "worker")}
        print("  %-8s %-30s %s  %s" % (alert["state"], alert["labels"]["alertname"], json.dumps(labels, sort_keys=True),
                                       alert["annotations"].get("summary", "")))


def start(scrape_file, rules_file, workdir):
    where = pathlib.Path(workdir)
    where.mkdir(parents=True, exist_ok=True)
    (job,) = prometheus.scrape_configs(pathlib.Path(scrape_file))
    files = [name for sd in job["file_sd_configs"] for name in sd["files"]]
    expected = sum(len(group["targets"]) for name in files for group in json.loads(pathlib.Path(name).read_text()))
    url, proc = prometheus.start(where, pathlib.Path(scrape_file), pathlib.Path(rules_file), detach=True)
    (where / STATE).write_text(json.dumps({"url": url, "pid": proc.pid}))
    active = prometheus.until("every target up", lambda: prometheus.all_up(url, expected))
    for target in sorted(active, key=lambda t: t["scrapeUrl"]):
        print("up %s %s" % (target["scrapeUrl"], target["labels"].get("engine") or target["labels"].get("router")))
    loaded = prometheus.until("every rule evaluated without error", lambda: (
        all(r["health"] == "ok" for rules in prometheus.alert_rules(url).values() for r in rules),
        prometheus.alert_rules(url)))
    for name, rules in sorted(loaded.items()):
        print("rule %-30s x%d for %ss" % (name, len(rules), rules[0]["duration"]))
    print("Prometheus %s (pid %d), rules %s; active alerts:" % (url, proc.pid, rules_file))
    _show(url)
    return 0


def _matching(url, alert, engine):
    return [a for a in prometheus.alerts(url)
            if a["labels"]["alertname"] == alert and a["labels"].get("engine") == engine]


def _for_s(url, alert):
    return max(r["duration"] for r in prometheus.alert_rules(url)[alert])


def firing(workdir, alert, engine, stopped_at, stop_began_at=None):
    url = _state(workdir)["url"]
    held = _for_s(url, alert)
    prometheus.until("%s firing for %s" % (alert, engine), lambda: (
        any(a["state"] == "firing" for a in _matching(url, alert, engine)), prometheus.alerts(url)),
        deadline_s=held + SETTLE_S)
    now = time.time()
    how = "" if stop_began_at is None else " (%.1f s after the stop began)" % (now - float(stop_began_at))
    print("%s{engine=%r} firing %.1f s after the container stopped%s; its for: %ss, scrape and evaluation every 1 s"
          % (alert, engine, now - float(stopped_at), how, held))
    _show(url)
    return 0


def resolved(workdir, alert, engine, since):
    url = _state(workdir)["url"]
    prometheus.until("%s for %s resolved" % (alert, engine), lambda: (
        not _matching(url, alert, engine), prometheus.alerts(url)), deadline_s=SETTLE_S)
    print("%s{engine=%r} resolved %.1f s after the repair returned; active alerts:"
          % (alert, engine, time.time() - float(since)))
    _show(url)
    return 0


def stop(workdir):
    pid = _state(workdir)["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("Prometheus (pid %d) stopped" % pid)
            return 0
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    print("Prometheus (pid %d) killed after 15 s" % pid)
    return 0


if __name__ == "__main__":
    COMMANDS = {"start": start, "firing": firing, "resolved": resolved, "stop": stop}
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
