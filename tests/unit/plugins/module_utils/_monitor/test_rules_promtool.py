"""The alert rules of a small fleet (plugins/module_utils/_monitor/rules.py) under `promtool test rules` (Debian's
prometheus package; scripts/bootstrap.sh installs it): for EVERY alert, input series that cause it, the alert not
firing one evaluation before its `for` has passed and firing with its labels and annotations after; and series a
normal fleet shows (a burst that drains, a fast role, an engine whose counters stay still) firing nothing. The promtool
test file is generated here from the same fleet, so it follows the rules. promtool's own verdict is checked to be a
verdict: one wrong expectation fails it.

Time runs in minutes: input samples and evaluations every minute, NARWHAL_ALERT_FOR 2m, the rules' window 5m."""
import re
import shutil
import subprocess

import yaml

from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.rules import rules

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
FLEET_NAME = "fleet.lab"
FOR_MIN = 2
FLEET = [{"engine": "engine-1", "role": "prefill", "url": "http://10.0.0.11:8000"},
         {"engine": "engine-2", "role": "decode", "url": "http://10.0.0.12:8000"}]
ROUTERS = [{"host": "router-1", "metrics_url": "http://10.0.0.21:29000/metrics"}]


def _target(engine=None, router=None):
    """The labels Prometheus gives the scraped series of a target (the file_sd labels, instance)."""
    if router:
        return {"job": "narwhal-router", "instance": "10.0.0.21:29000", "router": router, "role": "router",
                "host": "10.0.0.21", "fleet": FLEET_NAME}
    entry = [e for e in FLEET if e["engine"] == engine][0]
    host = entry["url"].split("//")[1].split(":")[0]
    return {"job": "narwhal-engine", "instance": "%s:8000" % host, "engine": engine, "role": entry["role"],
            "host": host, "fleet": FLEET_NAME}


def _vllm(engine):
    """An engine's own series: the target's labels and vLLM's (model_name, its engine index as exported_engine)."""
    return dict(_target(engine), model_name="tiny", exported_engine="0")


def _series(name, labels, values):
    return {"series": "%s{%s}" % (name, ", ".join('%s="%s"' % (k, v) for k, v in sorted(labels.items()))),
            "values": values}


def _up_all():
    return [_series("up", _target("engine-1"), "1x20"), _series("up", _target("engine-2"), "1x20"),
            _series("up", _target(router="router-1"), "1x20")]


def _health(engine, values):
    url = [e["url"] for e in FLEET if e["engine"] == engine][0]
    return _series("vllm_router_worker_health", dict(_target(router="router-1"), worker=url), values)


def _ttft(engine, slow):
    """Cumulative buckets of vllm:time_to_first_token_seconds: 60 requests a minute, all within 0.5 s, or all
    between 2.5 and 5 s (p99 4.975 s, over a 2000 ms objective)."""
    out = []
    for le in ("0.5", "1", "2.5", "5", "+Inf"):
        within = le in ("5", "+Inf") if slow else True
        out.append(_series("vllm:time_to_first_token_seconds_bucket", dict(_vllm(engine), le=le),
                           "0+60x20" if within else "0x20"))
    return out


# alert -> (input series, the minute the cause starts holding in every evaluation, {the alert's own labels that
# name who fires: the checker adds the rest}, the series whose labels the alert carries). The cause holds from
# `start`; the alert fires at start + FOR_MIN: checked not firing at start + FOR_MIN - 1 and firing at
# start + FOR_MIN + 1.
def _cases():
    e1, e2 = _vllm("engine-1"), _vllm("engine-2")
    per_engine = {"fleet": FLEET_NAME}
    return {
        "NarwhalEngineDown": (
            [_series("up", _target("engine-1"), "1 1 0x18"), _series("up", _target("engine-2"), "1x20")], 2,
            [dict(_target("engine-1"), severity="page")]),
        "NarwhalEngineMissing": (  # the targets lack engine-2
            [_series("up", _target("engine-1"), "1x20")], 0,
            [{"job": "narwhal-engine", "fleet": FLEET_NAME, "engine": "engine-2", "role": "decode",
              "severity": "ticket"}]),
        "NarwhalRouterDown": (
            [_series("up", _target(router="router-1"), "1 1 0x18")], 2,
            [dict(_target(router="router-1"), severity="page")]),
        "NarwhalRouterMissing": (
            _up_all()[:2], 0,
            [{"job": "narwhal-router", "fleet": FLEET_NAME, "router": "router-1", "severity": "ticket"}]),
        "NarwhalRouterWorkerUnhealthy": (
            _up_all() + [_health("engine-1", "1x20"), _health("engine-2", "1 1 0x18")], 2,
            [dict(_target(router="router-1"), worker="http://10.0.0.12:8000", engine="engine-2", role="decode",
                  severity="page")]),
        "NarwhalRouterWorkerMissing": (  # the router serves without engine-2
            _up_all() + [_health("engine-1", "1x20")], 0,
            [{"job": "narwhal-router", "fleet": FLEET_NAME, "router": "router-1", "worker": "http://10.0.0.12:8000",
              "engine": "engine-2", "role": "decode", "severity": "page"}]),
        "NarwhalNixlTransfersFailed": (  # engine-2's transfers fail; engine-1 only its notifications
            [_series("vllm:nixl_num_failed_transfers_total", e2, "0 0 0 1+1x17"),
             _series("vllm:nixl_num_failed_notifications_total", e2, "0x20"),
             _series("vllm:nixl_num_failed_transfers_total", e1, "0x20"),
             _series("vllm:nixl_num_failed_notifications_total", e1, "0 0 0 1x17")], 3,
            [dict(per_engine, engine=e, role=r, severity="page")
             for e, r in (("engine-1", "prefill"), ("engine-2", "decode"))]),
        "NarwhalKvLeasesExpired": (
            [_series("vllm:nixl_num_kv_expired_reqs_total", e1, "0 0 0 1x17"),
             _series("vllm:nixl_num_kv_expired_reqs_total", e2, "0x20")], 3,
            [dict(per_engine, engine="engine-1", role="prefill", severity="page")]),
        "NarwhalKvReadAfterExpiry": (
            [_series("vllm:nixl_num_notifications_after_expiry_total", e1, "0 0 0 2x17"),
             _series("vllm:nixl_num_notifications_after_expiry_total", e2, "0x20")], 3,
            [dict(per_engine, engine="engine-1", role="prefill", severity="page")]),
        "NarwhalKvCacheNearlyFull": (  # engine-1 at 0.9 stays quiet
            [_series("vllm:kv_cache_usage_perc", e2, "0.5 0.5 0.97x18"),
             _series("vllm:kv_cache_usage_perc", e1, "0.9x20")], 2,
            [dict(per_engine, engine="engine-2", role="decode", severity="ticket")]),
        "NarwhalTtftP99OverObjective": (  # the decodes are slow, the prefills fast; a rate needs two samples
            _ttft("engine-2", True) + _ttft("engine-1", False), 1,
            [dict(per_engine, role="decode", severity="page")]),
        "NarwhalWaitingRequestsGrowing": (  # engine-2's queue grows; engine-1's bursts drain; none at a steady 5
            [_series("vllm:num_requests_waiting", e2, "0+1x20"),
             _series("vllm:num_requests_waiting", e1, "0 5 10 5 0 0 5 10 5 0 0 5 10 5 0 0 5 10 5 0 0"),
             _series("vllm:num_requests_waiting", dict(e1, exported_engine="1"), "5x20")], 6,
            [dict(per_engine, engine="engine-2", role="decode", severity="ticket")]),
    }


def _render(template, labels):
    """Prometheus' expansion of the annotations' only template form, {{ $labels.<name> }}."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
    assert "{{" not in out, out
    return out


def _annotations(doc, alert, labels):
    """The annotations promtool must see for the alert of `labels` (the rule whose own labels match them)."""
    (rule,) = [r for r in doc["groups"][0]["rules"] if r["alert"] == alert
               and all(labels.get(k) == v for k, v in r["labels"].items())]
    return {k: _render(v, labels) for k, v in rule["annotations"].items()}


def _test_file(doc, rules_file, wrong=None):
    tests = []
    for alert, (series, start, fired) in _cases().items():
        checks = [{"eval_time": "%dm" % (start + FOR_MIN - 1), "alertname": alert, "exp_alerts": []},
                  {"eval_time": "%dm" % (start + FOR_MIN + 1), "alertname": alert,
                   "exp_alerts": [{"exp_labels": labels, "exp_annotations": _annotations(doc, alert, labels)}
                                  for labels in fired]}]
        if wrong:  # expect it one evaluation before its `for` has passed: promtool must say no
            checks[0]["exp_alerts"] = checks[1]["exp_alerts"]
        tests.append({"name": alert, "interval": "1m", "input_series": series, "alert_rule_test": checks})
    return {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests}


def _promtool(tmp_path, wrong=None):
    assert shutil.which(PROMTOOL), (
        "no promtool (%s): install Debian's prometheus package (scripts/bootstrap.sh does: apt-get install "
        "--no-install-recommends prometheus)" % PROMTOOL)
    doc = rules(FLEET, ROUTERS, FLEET_NAME, {"NARWHAL_ALERT_FOR": "%dm" % FOR_MIN})
    rules_file = tmp_path / "narwhal-rules.yml"
    rules_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    test_file = tmp_path / "narwhal-rules.test.yml"
    test_file.write_text(yaml.safe_dump(_test_file(doc, rules_file, wrong), sort_keys=False))
    check = subprocess.run([PROMTOOL, "check", "rules", "--lint-fatal", str(rules_file)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    out = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120,
                         check=False)
    return doc, check, out


def test_every_alert_fires_after_its_for_and_not_before(tmp_path):
    doc, check, out = _promtool(tmp_path)
    print("\n$ promtool check rules --lint-fatal narwhal-rules.yml\n%s" % (check.stdout + check.stderr))
    print("$ promtool test rules narwhal-rules.test.yml\n%s%s" % (out.stdout, out.stderr))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    # every alert of the rules has a test in which it fires
    assert {r["alert"] for r in doc["groups"][0]["rules"]} == set(_cases())
    assert all(fired for _series_, _start, fired in _cases().values())


def test_promtool_fails_every_alert_expected_before_its_for(tmp_path):
    """The evaluation before `for` has passed is tight: each alert expected there (pending, not firing) fails."""
    _doc, _check, out = _promtool(tmp_path, wrong=True)
    print(out.stdout + out.stderr)
    assert out.returncode != 0
    failed = re.findall(r"alertname: (\w+), time: (\d+m)", out.stdout + out.stderr)
    assert sorted(failed) == sorted((alert, "%dm" % (start + FOR_MIN - 1))
                                    for alert, (_series, start, _fired) in _cases().items())
