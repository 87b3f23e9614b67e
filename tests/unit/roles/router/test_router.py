"""The router stage's parts against the real vllm-router (requirements/router.txt) in front of two stand-in engines
served in-process: the start script (roles/router/files/narwhal_router.py) keeps the key out of the process list,
the process environment and its logs and refuses keyless clients; router_workers reports the fleet (and names an
engine the router lost); router_traffic proves every request of its matrix."""
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest
from test_support.paths import REPO, load_file
from test_support.router import router_process
from test_support.standin import engine_key_file, engine_process, write_key_file

from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.modules import router_traffic, router_workers

GUARD = load_file("narwhal_guard", REPO / "roles" / "install" / "files" / "guard" / "narwhal_guard.py")
KEY = "sk-narwhal-router-test-key-0123456789abcdef"


@pytest.fixture
def fleet(tmp_path):
    procs = {}
    engines = []
    for n, role in ((1, "prefill"), (2, "decode")):
        url, procs["engine-%d" % n] = engine_process(tmp_path, str(n), KEY, "--enable-prompt-tokens-details")
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    yield engines, procs
    for proc in procs.values():
        proc.kill()
        proc.wait(10)


@pytest.fixture
def router(fleet, tmp_path):
    engines, procs = fleet
    started = router_process(tmp_path, engines, KEY)
    yield dict(started, engines=engines, procs=procs, metrics=started["metrics_url"].rsplit("/", 1)[0])
    started["proc"].terminate()
    started["proc"].wait(10)


def test_the_key_is_in_no_process_list_environment_or_log(router, module_runner):
    status, result = module_runner(router_workers.main, {"url": router["url"], "engines": router["engines"],
                                                         "api_key_file": router["key_file"]})
    assert status == "exit", result
    pid = router["proc"].pid
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True).stdout
    line = [row for row in ps.splitlines() if row.strip().startswith(str(pid))]
    assert line and "vllm::router" in line[0]  # setproctitle: no command line of the start script at all
    assert KEY not in ps
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        children = [int(p) for p in handle.read().split()]
    assert len(children) == 1  # the front in the parent, vllm-router in its one child
    for each in [pid] + children:
        with open("/proc/%d/environ" % each, "rb") as handle:
            assert KEY.encode() not in handle.read()
        with open("/proc/%d/cmdline" % each, "rb") as handle:
            assert KEY.encode() not in handle.read()
    assert KEY not in router["log"].read_text(errors="replace")
    assert KEY not in json.dumps(result)


def test_clients_without_the_key_are_refused(router):
    assert call(router["url"] + "/v1/models", None)[0] == 401
    assert call(router["url"] + "/v1/models", "sk-wrong")[0] == 401
    assert call(router["url"] + "/v1/completions", None, {"model": "tiny", "prompt": "x"})[0] == 401
    assert call(router["url"] + "/v1/models", KEY)[0] == 200
    status, text = call(router["metrics"] + "/metrics")  # Prometheus needs no key
    assert status == 200 and "vllm_router" in text


def test_the_workers_are_the_fleet(router, module_runner):
    status, result = module_runner(router_workers.main, {"url": router["url"], "engines": router["engines"],
                                                         "api_key_file": router["key_file"]})
    assert status == "exit", result
    assert result["report"]["seen"] == ["engine-1", "engine-2"] and result["report"]["ok"]
    assert sorted(w["worker_type"] for w in result["workers"]) == ["decode", "prefill"]
    # a fleet with an engine the router does not know: named
    more = router["engines"] + [{"engine": "engine-3", "role": "decode", "url": "http://127.0.0.1:9"}]
    status, result = module_runner(router_workers.main, {"url": router["url"], "engines": more,
                                                         "api_key_file": router["key_file"]})
    assert status == "fail" and "the router lacks engine-3 (decode http://127.0.0.1:9)" in result["msg"]


def test_a_stopped_engine_is_named(router, module_runner):
    router["procs"]["engine-2"].kill()
    router["procs"]["engine-2"].wait(10)
    args = {"url": router["url"], "engines": router["engines"], "api_key_file": router["key_file"]}
    label = "engine-2 (decode %s)" % router["engines"][1]["url"]
    # at once: the engine's own /health does not answer
    status, result = module_runner(router_workers.main, args)
    assert status == "fail" and "not answering /health: %s" % label in result["msg"], result
    # and once the router's health checks noticed: the router says so too
    deadline = time.time() + 30
    while time.time() < deadline and "the router holds as unhealthy" not in result["msg"]:
        time.sleep(0.5)
        status, result = module_runner(router_workers.main, args)
    assert status == "fail" and "the router holds as unhealthy %s" % label in result["msg"], result


def test_traffic_through_the_router(router, module_runner):
    status, result = module_runner(router_traffic.main, {"url": router["url"], "engines": router["engines"],
                                                         "model": "tiny", "api_key_file": router["key_file"],
                                                         "timeout": 20})
    assert status == "exit", result["msg"] if status == "fail" else result
    assert len(result["requests"]) == 8 and all(r["ok"] and r["equal"] and r["kv"] for r in result["requests"])
    # the router passes return_token_ids through in both stages: the answers are compared as tokens
    assert {r["compared_as"] for r in result["requests"]} == {"token ids"}
    assert all(r["token_ids"] and r["token_ids"] == r["direct_token_ids"]["engine-2"] for r in result["requests"])
    assert result["served"] == {"engine-1": 8, "engine-2": 8}
    assert result["auth"] == {"none": 401, "wrong": 401, "key": 200}
    short = [r for r in result["requests"] if r["prompt"] == "short"]
    long = [r for r in result["requests"] if r["prompt"] == "long"]
    assert all(r["prompt_tokens"] < 16 for r in short if r["prompt_tokens"] is not None)
    assert all(r["prompt_tokens"] > 16 for r in long if r["prompt_tokens"] is not None)
    assert KEY not in json.dumps(result)


def test_the_role_pins_the_version_requirements_pin():
    pins = dict(line.split("==") for line in (REPO / "requirements" / "router.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    defaults = (REPO / "roles" / "router" / "defaults" / "main.yml").read_text()
    assert 'router_version: "%s"' % pins["vllm-router"] in defaults


def test_an_engine_replaced_leaves_the_router_answering_through_the_others(tmp_path):
    """A rolling replace stops one engine at a time. vllm-router 0.1.17 does not retry a P/D request on another
    decode worker: until its health checks (HEALTH_INTERVAL_S x HEALTH_FAILURES) take the stopped engine out of its
    healthy set, the requests it routes there fail (HTTP 500, connection refused). Once they have, with two decode
    engines, every request is answered through the other, and the replaced engine serves again once it is back."""
    procs, engines = {}, []
    for n, role in ((1, "prefill"), (2, "decode"), (3, "decode")):
        url, procs["engine-%d" % n] = engine_process(tmp_path, str(n), KEY)
        engines.append({"engine": "engine-%d" % n, "role": role, "url": url})
    started = router_process(tmp_path, engines, KEY)
    url, router_proc = started["url"], started["proc"]
    body = {"model": "tiny", "prompt": "rolling replace", "max_tokens": 4}

    def healthy():
        status, answer = call(url + "/workers", KEY, timeout=2)
        return {w["url"]: w["is_healthy"] for w in answer["workers"]} if status == 200 else {}

    def wait_for(predicate):
        deadline = time.time() + 30
        while time.time() < deadline and not predicate():
            time.sleep(0.2)
        assert predicate(), healthy()
    try:
        wait_for(lambda: len(healthy()) == 3)
        assert [call(url + "/v1/completions", KEY, body, timeout=20)[0] for _i in range(4)] == [200] * 4
        procs["engine-3"].kill()
        procs["engine-3"].wait(10)
        wait_for(lambda: healthy().get(engines[2]["url"]) is False)
        answers = [call(url + "/v1/completions", KEY, dict(body, prompt="while down %d" % i), timeout=30)[0]
                   for i in range(8)]
        assert answers == [200] * 8, (answers, started["log"].read_text(errors="replace")[-2000:])
        # the replaced engine comes back at its URL: the router serves it again
        port3 = int(engines[2]["url"].rsplit(":", 1)[1])
        procs["engine-3"] = engine_process(tmp_path, "3", KEY, port=port3)[1]
        wait_for(lambda: healthy().get(engines[2]["url"]) is True)
        answers = [call(url + "/v1/completions", KEY, dict(body, prompt="back %d" % i), timeout=30)[0]
                   for i in range(4)]
        assert answers == [200] * 4
    finally:
        router_proc.terminate()
        router_proc.wait(10)
        for proc in procs.values():
            proc.kill()
            proc.wait(10)


# ------------------------------------------------------------------------------------------ key rotation

NEW = "sk-narwhal-router-new-key-fedcba9876543210"


class Clients:
    """Steady completions through the router, one after the other, with the key the test gives them now."""

    def __init__(self, url, key):
        self.url, self.key, self.running, self.answers = url, key, True, []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            key = self.key
            status, answer = call(self.url + "/v1/completions", key, {"model": "tiny", "prompt": "rotate %d"
                                                                      % len(self.answers), "max_tokens": 2},
                                  timeout=30)
            self.answers.append((key, status, status == 200 or str(answer)[:200]))
            time.sleep(0.05)

    def stop(self):
        self.running = False
        self.thread.join(40)
        return self.answers


def _site(tmp_path, router, text, reload_number):
    """What `site` does with a changed NARWHAL_API_KEY_FILE: install rewrites each engine host's key file (the guard
    reads it within a second), the router stage its copy in the router directory and reloads the router."""
    for name in ("1", "2"):
        write_key_file(engine_key_file(tmp_path, name), text)
    # the router stage comes after install (prepare, launch and probe in between: tens of seconds); the guards read
    # their files again within RECHECK_S, so the router never sends a key an engine does not accept yet
    time.sleep(GUARD.RECHECK_S + 0.5)
    write_key_file(pathlib.Path(router["key_file"]), text)
    os.kill(router["proc"].pid, signal.SIGHUP)
    deadline = time.time() + 60
    while "reload %d done" % reload_number not in router["log"].read_text(errors="replace"):
        assert time.time() < deadline and "reload %d failed" % reload_number not in \
            router["log"].read_text(errors="replace"), router["log"].read_text(errors="replace")[-2000:]
        time.sleep(0.2)


def _refused_soon(url, key):
    deadline = time.time() + 10
    while call(url + "/v1/models", key)[0] != 401 and time.time() < deadline:
        time.sleep(0.2)
    return call(url + "/v1/models", key)[0] == 401


def test_a_key_rotation_serves_clients_with_either_key_and_restarts_no_engine(router, tmp_path):
    """docs/security.md "Rotating the key", through the real router in front of stand-ins behind their key guards,
    under steady traffic: the new key first and the old one second (`site`: the engines accept both, the router
    reloads with the new key) - clients with either key are served; the clients move to the new key; the second line
    removed (`site` again) - the old key is refused. No request fails, no engine process is restarted."""
    url, engines = router["url"], router["procs"]
    pids = {name: proc.pid for name, proc in engines.items()}
    assert call(url + "/v1/models", NEW)[0] == 401
    clients = Clients(url, KEY)
    time.sleep(1)
    _site(tmp_path, router, "%s\n%s\n" % (NEW, KEY), 2)
    time.sleep(1.5)  # the engines' guards have read their files again (at most a second)
    for key in (KEY, NEW):  # a client with the previous key and one with the new key, through the router
        status, answer = call(url + "/v1/completions", key, {"model": "tiny", "prompt": "both", "max_tokens": 2},
                              timeout=30)
        assert status == 200 and answer["choices"][0]["text"], (key == KEY, status, answer)
    clients.key = NEW  # the operator moves the clients to the new key
    time.sleep(1)
    _site(tmp_path, router, NEW + "\n", 3)
    time.sleep(1)
    answers = clients.stop()
    assert answers and all(ok is True for _key, _status, ok in answers), [a for a in answers if a[2] is not True][:3]
    assert {key for key, _status, _ok in answers} == {KEY, NEW}
    assert _refused_soon(url, KEY) and call(url + "/v1/models", NEW)[0] == 200
    status, _answer = call(url + "/v1/completions", KEY, {"model": "tiny", "prompt": "old", "max_tokens": 2})
    assert status == 401
    assert {name: proc.pid for name, proc in engines.items()} == pids
    assert all(proc.poll() is None for proc in engines.values())
    log = router["log"].read_text(errors="replace")
    assert KEY not in log and NEW not in log
