"""router_container against this machine's Docker daemon and the proving ground's router image
(tests/harness/images/vllm-router): the image's ID and vllm-router version read by a short-lived container, and the
container's life - created, kept, restarted, replaced when the plan hash changes, reported, removed."""
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
    try:
        Client.from_env().remove(name, force=True)
    except EngineAPIError:
        pass


def _plan(name, tmp_path, digest):
    return {"name": name, "image": _daemon_with_image(), "entrypoint": ["python3"],
            "command": ["-c", "import time; time.sleep(600)"], "dir": str(tmp_path), "hash": digest,
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
    status, restarted = run({"state": "started", "plan": _plan(name, tmp_path, "a" * 64), "restart": True})
    assert restarted["action"] == "restarted" and restarted["container"]["Id"] == first["container"]["Id"]
    status, replaced = run({"state": "started", "plan": dict(_plan(name, tmp_path, "b" * 64),
                                                             env=["SSL_CERT_FILE=/narwhal/tls/ca.crt"])})
    assert replaced["action"] == "replaced" and replaced["container"]["Id"] != first["container"]["Id"]
    assert "SSL_CERT_FILE=/narwhal/tls/ca.crt" in api.container(name)["Config"]["Env"]  # the plan's env (TLS)
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
