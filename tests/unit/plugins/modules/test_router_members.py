"""router_members against the real vllm-router (requirements/router.txt) behind the start script
(roles/router/files/narwhal_router.py) in front of stand-in engines: a worker added is a reload (SIGHUP, here sent to
the start script's process in place of the Docker daemon's kill), a worker removed goes at once by /remove_worker,
nothing changes when the router holds the set, check mode and diff mode change nothing, a set without a decode
worker is refused."""
import json
import os
import signal

import pytest
from test_support.router import router_process
from test_support.standin import engine_process

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._router import members
from ansible_collections.narwhal.deploy.plugins.modules import router_members

KEY = "sk-narwhal-members-test-key-0123456789abcdef"


@pytest.fixture
def site(tmp_path, monkeypatch):
    procs, engines = [], []
    for n, role in ((1, "prefill"), (2, "decode"), (3, "decode")):
        url, proc = engine_process(tmp_path, str(n), KEY)
        procs.append(proc)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    router = router_process(tmp_path, engines[:2], KEY, drain_timeout=10)
    hups = []

    def send_hup(container, timeout):
        hups.append(container)
        os.kill(router["proc"].pid, signal.SIGHUP)

    monkeypatch.setattr(members, "send_hup", send_hup)
    yield dict(router, engines=[e["url"] for e in engines], hups=hups, dir=str(tmp_path),
               args={"url": router["url"], "api_key_file": router["key_file"], "dir": str(tmp_path), "timeout": 60})
    for proc in procs + [router["proc"]]:
        proc.kill()
        proc.wait(10)


def _reported(url):
    answer = call(url + "/workers", KEY, timeout=5)[1]
    return sorted((w["worker_type"], w["url"]) for w in answer["workers"])


def test_add_reloads_remove_is_at_once_and_a_second_run_changes_nothing(site, module_runner):
    p1, d2, d3 = site["engines"]
    args = site["args"]
    status, result = module_runner(router_members.main, dict(args, add=[{"role": "decode", "url": d3}]))
    assert status == "exit" and result["changed"] and result["method"] == "reload", result
    assert result["before"] == {"prefill": [p1], "decode": [d2]}
    assert sorted(result["after"]["decode"]) == sorted([d2, d3]) and result["seconds"] > 0
    assert site["hups"] == ["narwhal-router"]
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d2), ("decode", d3)])
    assert json.loads(site["workers"].read_text()) == {"prefill": [p1], "decode": [d2, d3]}
    assert oct(os.stat(site["workers"]).st_mode & 0o777) == "0o600"
    status, again = module_runner(router_members.main, dict(args, add=[{"role": "decode", "url": d3}]))
    assert (status, again["changed"], again["method"]) == ("exit", False, "none")
    status, result = module_runner(router_members.main, dict(args, remove=[d2]))
    assert status == "exit" and result["changed"] and result["method"] == "remove", result
    assert result["after"] == {"prefill": [p1], "decode": [d3]} and len(site["hups"]) == 1  # no reload
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d3)])
    assert json.loads(site["workers"].read_text()) == {"prefill": [p1], "decode": [d3]}
    assert call(site["url"] + "/v1/completions", KEY, {"model": "tiny", "prompt": "x", "max_tokens": 2},
                timeout=20)[0] == 200
    status, result = module_runner(router_members.main, dict(args, remove=[d3]))
    assert status == "fail" and "no decode worker" in result["msg"] and result["input"] == "remove"
    # the complete set: d2 back in, by a reload
    status, result = module_runner(router_members.main, dict(args, workers={"prefill": [p1], "decode": [d2, d3]}))
    assert status == "exit" and result["method"] == "reload" and len(site["hups"]) == 2
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d2), ("decode", d3)])


def test_check_and_diff_mode_change_nothing(site, module_runner):
    p1, d2, d3 = site["engines"]
    before = site["workers"].read_text()
    status, result = module_runner(router_members.main, dict(site["args"], add=[{"role": "decode", "url": d3}],
                                                             _ansible_check_mode=True, _ansible_diff=True))
    assert status == "exit" and result["changed"] and result["method"] == "reload"
    assert json.loads(result["diff"]["after"]) == {"prefill": [p1], "decode": [d2, d3]}
    assert result["diff"]["before"] == before == site["workers"].read_text() and not site["hups"]
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d2)])


def test_a_worker_that_does_not_answer_is_refused_before_anything_changes(site, module_runner):
    p1, d2, _d3 = site["engines"]
    before = site["workers"].read_text()
    status, result = module_runner(router_members.main, dict(site["args"],
                                                             add=[{"role": "decode", "url": "http://127.0.0.1:9"}]))
    assert status == "fail" and "not answering /health: decode http://127.0.0.1:9" in result["msg"], result
    assert site["workers"].read_text() == before and not site["hups"]
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d2)])


def test_a_reload_that_does_not_serve_in_time_fails_and_the_router_keeps_serving(site, module_runner, monkeypatch):
    p1, d2, d3 = site["engines"]
    monkeypatch.setattr(members, "router_log", lambda container, lines=40: "narwhal_router: reload 2 failed: ...")
    monkeypatch.setattr(members, "send_hup", lambda container, timeout: None)  # a signal that never arrives
    status, result = module_runner(router_members.main, dict(site["args"], timeout=2,
                                                             add=[{"role": "decode", "url": d3}]))
    assert status == "fail" and "did not report the new worker set within 2 s" in result["msg"], result
    assert "reload 2 failed" in result["msg"] and result["input"] == "timeout"
    assert _reported(site["url"]) == sorted([("prefill", p1), ("decode", d2)])
