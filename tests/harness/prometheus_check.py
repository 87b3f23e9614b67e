"""The real scenario's monitoring check (extensions/molecule/real/verify_monitoring.yml): a real Prometheus with the
scrape-config fragment the monitoring stage wrote (its job over the targets file, and with TLS its tls_config ca_file:
the site CA) scrapes the real engines and the router; every target must be `up`, and every panel query of the
dashboard is run (its variables substituted as Grafana does) and shown with its series count; the dashboard's TTFT and
KV-transfer panels must return series from the real engines.

    python3 prometheus_check.py SCRAPE_FILE DASHBOARD_FILE FLEET_NAME WORKDIR [ROUTER_URL KEY_FILE MODEL]

With ROUTER_URL, KEY_FILE and MODEL, a client sends completions through the router (two a second) while
Prometheus scrapes, so that the rate panels show the fleet serving rather than NaN; an https router is verified
against the fragment's CA.
"""
import json
import pathlib
import ssl
import sys
import threading
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit" / "plugins"))
from test_support import prometheus  # noqa: E402 - the test helpers' package, beside this checkout's tests

# panels that must answer from the real engines (polled: a rate needs two scrapes)
REQUIRED = ("Scrape targets up", "Time to first token", "NIXL bytes transferred", "Running requests")


def traffic(router_url, key_file, model, stop, answered, ca_file=None):
    """Completions through the router until `stop` is set; answered[status] counts the answers. An https router's
    certificate is verified against `ca_file` (the site CA)."""
    key = pathlib.Path(key_file).read_text().strip()
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    n = 0
    while not stop.is_set():
        n += 1
        body = json.dumps({"model": model, "prompt": "monitoring %d %s" % (n, "word " * (n % 40)), "max_tokens": 8,
                           "temperature": 0}).encode()
        req = urllib.request.Request(router_url.rstrip("/") + "/v1/completions", data=body, method="POST",
                                     headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30, context=context) as resp:
                status = resp.status
        except Exception as exc:  # noqa: BLE001 - counted, not raised: the check reports it
            status = getattr(exc, "code", type(exc).__name__)
        answered[status] = answered.get(status, 0) + 1
        stop.wait(0.5)


def main(scrape_file, dashboard_file, fleet, workdir, router_url=None, key_file=None, model=None):
    scrape, dashboard, where = pathlib.Path(scrape_file), pathlib.Path(dashboard_file), pathlib.Path(workdir)
    where.mkdir(parents=True, exist_ok=True)
    (job,) = prometheus.scrape_configs(scrape)
    ca_file = (job.get("tls_config") or {}).get("ca_file")
    files = [name for sd in job["file_sd_configs"] for name in sd["files"]]
    expected = sum(len(group["targets"]) for name in files for group in json.loads(pathlib.Path(name).read_text()))
    how = "TLS verified against %s" % ca_file if ca_file else "no TLS"
    print("scrape job %s over %s, %s" % (job["job_name"], ", ".join(files), how))
    stop, answered = threading.Event(), {}
    client = None
    if router_url:
        client = threading.Thread(target=traffic, args=(router_url, key_file, model, stop, answered, ca_file),
                                  daemon=True)
        client.start()
    url, proc = prometheus.start(where, scrape)
    failed = []
    try:
        if client:
            time.sleep(8)  # a rate over [1m] needs two scrapes (1 s apart) of the traffic
        active = prometheus.until("every target up", lambda: prometheus.all_up(url, expected))
        for target in sorted(active, key=lambda t: t["scrapeUrl"]):
            labels = {k: v for k, v in target["labels"].items() if k in ("job", "engine", "router", "role", "fleet")}
            print("up %-4s %s %s" % (target["health"] == "up", target["scrapeUrl"], json.dumps(labels, sort_keys=True)))
        selected = {"fleet": [fleet], "role": "$__all"}
        for title, ref, expr in prometheus.panels(dashboard):
            promql = prometheus.grafana(dashboard, expr, selected)
            result = prometheus.query(url, promql)
            if title in REQUIRED and not result:
                def answered(q=promql):
                    found = prometheus.query(url, q)
                    return bool(found), found
                try:
                    result = prometheus.until("series for %s" % title, answered, deadline_s=30)
                except AssertionError:
                    result = []
            values = [s["value"][1] for s in result][:3]
            print("panel %-30s %s %2d series %s  %s" % (title, ref, len(result), values, promql))
            if title in REQUIRED and not result:
                failed.append("%s (%s)" % (title, ref))
    finally:
        stop.set()
        proc.terminate()
        proc.wait(15)
    if client:
        client.join(35)
        print("client traffic through %s while scraping: %s" % (router_url, json.dumps(answered, sort_keys=True)))
        if set(answered) - {200}:
            failed.append("the router did not answer every request while scraped")
    if failed:
        print("no series for: %s" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
