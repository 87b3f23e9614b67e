"""The real scenario's alert check (tests/harness/alert_check.py, run by extensions/molecule/real/verify_alerts.yml)
against stand-in engines: its steps as the playbook runs them, each a process of its own - start (a Prometheus that
outlives it, over the fragment and the rules of the pure code), firing (after an engine stops), resolved (after the
engine serves again at its URL) and stop (that Prometheus gone)."""
import json
import os
import subprocess
import sys
import time

import yaml
from test_support.paths import REPO
from test_support.prometheus import PROMETHEUS
from test_support.standin import engine_process

from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.rules import rules
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd, scrape_config

SCRIPT = REPO / "tests" / "harness" / "alert_check.py"
KEY = "sk-narwhal-alert-check-test-key-0123456789"


def _step(*args):
    out = subprocess.run([sys.executable, str(SCRIPT)] + [str(a) for a in args], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_firing_resolved_stop(tmp_path):
    assert os.access(PROMETHEUS, os.X_OK), "no prometheus binary (%s): install Debian's prometheus package" % PROMETHEUS
    procs, engines = {}, []
    work = tmp_path / "alerts"
    try:
        for n, role in ((1, "prefill"), (2, "decode")):
            url, procs[n] = engine_process(tmp_path, str(n), KEY)
            engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
        targets, scrape, rules_file = (tmp_path / "narwhal-targets.json", tmp_path / "narwhal-scrape.yml",
                                       tmp_path / "narwhal-rules.yml")
        targets.write_text(json.dumps(file_sd(engines, [], "fleet")))
        scrape.write_text(yaml.safe_dump(scrape_config(str(targets))))
        rules_file.write_text(yaml.safe_dump(rules(engines, [], "fleet", {"NARWHAL_ALERT_FOR": "3s"})))
        started = _step("start", scrape, rules_file, work)
        pid = json.loads((work / "alert-check.json").read_text())["pid"]
        assert _alive(pid)  # the step ended, its Prometheus serves on
        assert "rule NarwhalEngineDown              x1 for 3s" in started, started
        began = time.time()
        procs[2].terminate()
        procs[2].wait(15)
        fired = _step("firing", work, "NarwhalEngineDown", "engine-2", time.time(), began)
        print(fired)
        assert "NarwhalEngineDown{engine='engine-2'} firing" in fired and "; its for: 3s" in fired
        assert "firing   NarwhalEngineDown" in fired
        port = int(engines[1]["url"].rsplit(":", 1)[1])
        _url, procs[2] = engine_process(tmp_path, "2", KEY, port=port)  # serves again at its URL
        back = time.time()
        gone = _step("resolved", work, "NarwhalEngineDown", "engine-2", back)
        print(gone)
        assert "NarwhalEngineDown{engine='engine-2'} resolved" in gone
        assert "Prometheus (pid %d) stopped" % pid in _step("stop", work)
        assert not _alive(pid)
    finally:
        if (work / "alert-check.json").exists():
            _step("stop", work)
        for proc in procs.values():
            proc.terminate()
            proc.wait(15)
