"""router_container against this machine's Docker daemon and the proving ground's router image
(tests/harness/images/vllm-router): the image's ID and vllm-router version read by a short-lived container, and the
container's life - created, kept, restarted and replaced by a hand-over (a new container next to the old one until
its log says it serves), reported, removed; a new container that never serves removed, the old one kept."""
import uuid

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import Client, EngineAPIError
from ansible_collections.narwhal.deploy.plugins.modules import router_container

IMAGE = "narwhal-sim/vllm-router:latest"


def _daemon_with_image():
    try:
        return Client.from_env(timeout=10).image(IMAGE)["Id"]
    except (EngineAPIError, OSError):
        return None


pytestmark = pytest.mark.skipif(_daemon_with_image() is None, reason="no Docker daemon or router image")


def test_the_image_reports_its_router_version(module_runner):
    status, result = module_runner(router_container.main, {"state": "image", "image": IMAGE})
    assert status == "exit" and not result["changed"]
    assert result["image_id"] == _daemon_with_image() and result["version"] == "0.1.17"
    status, result = module_runner(router_container.main, {"state": "image", "image": "narwhal-sim/absent:none"})
    assert status == "exit" and result["image_id"] is None and result["error"] == "no such image"


@pytest.fixture
def name():
    name = "narwhal-router-test-%s" % uuid.uuid4().hex[:8]
    yield name
    for leftover in (name, name + "-next"):
        try:
            Client.from_env().remove(leftover, force=True)
        except EngineAPIError:
            pass


# the start script's line once its fronts listen (narwhal_router.py), which a hand-over waits for
SERVES = "import sys, time; print('narwhal_router: serving: test', file=sys.stderr, flush=True); time.sleep(600)"


def _plan(name, tmp_path, digest, code=SERVES):
    return {"name": name, "image": _daemon_with_image(), "entrypoint": ["python3"],
            "command": ["-c", code], "dir": str(tmp_path), "hash": digest,
            "labels": {"org.narwhal.role": "router", "org.narwhal.router.plan-hash": digest}, "stop_timeout": 1,
            "log": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}}}


def test_the_container_follows_its_plan(module_runner, name, tmp_path):
    def run(args):
        return module_runner(router_container.main, args)

    status, first = run({"state": "started", "plan": _plan(name, tmp_path, "a" * 64)})
    assert status == "exit" and first["changed"] and first["action"] == "created"
    assert first["container"]["State"]["Running"]
    assert first["container"]["Config"]["Labels"]["org.narwhal.router.plan-hash"] == "a" * 64
    api = Client.from_env()
    seen = api.container(name)
    assert seen["HostConfig"]["NetworkMode"] == "host"
    assert seen["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert [(m["Source"], m["Destination"], m["RW"]) for m in seen["Mounts"]] == [(str(tmp_path), "/narwhal", False)]
    assert not [e for e in seen["Config"]["Env"] or [] if "proxy" in e.lower()]
    assert seen["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}}
    assert seen["Config"]["StopTimeout"] == 1  # the plan's drain and margin (python3 as PID 1 ignores SIGTERM)
    status, again = run({"state": "started", "plan": _plan(name, tmp_path, "a" * 64)})
    assert (again["changed"], again["action"], again["container"]["Id"]) == (False, "kept", first["container"]["Id"])
    assert seen["Config"]["Labels"]["org.narwhal.router.handover"] == "reuseport"
    status, restarted = run({"state": "started", "plan": _plan(name, tmp_path, "a" * 64), "restart": True})
    assert restarted["action"] == "restarted" and restarted["handover"]["used"] is True
    assert restarted["container"]["Id"] != first["container"]["Id"]  # a hand-over: a new container
    status, replaced = run({"state": "started", "plan": dict(_plan(name, tmp_path, "b" * 64),
                                                             env=["SSL_CERT_FILE=/narwhal/tls/ca.crt"])})
    assert replaced["action"] == "replaced" and replaced["handover"]["used"] is True
    assert replaced["container"]["Id"] != restarted["container"]["Id"]
    assert "SSL_CERT_FILE=/narwhal/tls/ca.crt" in api.container(name)["Config"]["Env"]  # the plan's env (TLS)
    with pytest.raises(EngineAPIError):
        api.container(name + "-next")  # renamed, none left
    status, failed = run({"state": "started", "ready_timeout": 3,
                          "plan": _plan(name, tmp_path, "c" * 64, code="import time; time.sleep(600)")})
    assert status == "fail" and "%s-next did not serve within 3 s" % name in failed["msg"]
    assert api.container(name)["Id"] == replaced["container"]["Id"] and api.container(name)["State"]["Running"]
    with pytest.raises(EngineAPIError):
        api.container(name + "-next")  # removed
    api.stop(name, timeout=1)
    status, info = run({"state": "inspected", "name": name})
    assert not info["changed"] and info["container"]["State"]["Running"] is False
    status, started = run({"state": "started", "plan": _plan(name, tmp_path, "b" * 64)})
    assert started["action"] == "started" and started["container"]["Id"] == replaced["container"]["Id"]
    status, removed = run({"state": "absent", "name": name, "stop_timeout": 1})
    assert removed["changed"] and removed["action"] == "removed"
    status, absent = run({"state": "absent", "name": name})
    assert not absent["changed"] and absent["action"] == "absent"
    status, info = run({"state": "inspected", "name": name})
    assert info["container"] is None
