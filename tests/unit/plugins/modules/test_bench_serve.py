"""bench_serve against this machine's Docker daemon: a step whose image has no vLLM fails naming the load
generator's exit and output, and leaves no container and no result directory; state=absent removes what an
interrupted benchmark left. (The real load generator runs in the real scenario, extensions/molecule/real.)"""
import glob
import tempfile
import uuid

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import Client, EngineAPIError
from ansible_collections.narwhal.deploy.plugins.modules import bench_serve

IMAGE = "narwhal-sim/vllm-router:latest"  # python3 and /bin/sh, no vLLM


def _daemon_with_image():
    try:
        return Client.from_env(timeout=10).image(IMAGE)["Id"]
    except (EngineAPIError, OSError):
        return None


pytestmark = pytest.mark.skipif(_daemon_with_image() is None, reason="no Docker daemon or router image")


def _bench_containers():
    return Client.from_env().containers(filters={"label": ["org.narwhal.role=bench"]})


def test_a_step_without_the_load_generator_fails_by_name_and_leaves_nothing(module_runner, tmp_path):
    key = tmp_path / "engine-api.key"
    key.write_text("narwhal-secret-%s\n" % uuid.uuid4().hex)
    key.chmod(0o600)
    before = set(glob.glob(tempfile.gettempdir() + "/narwhal-bench-*"))
    name = "narwhal-bench-test-%s" % uuid.uuid4().hex[:8]
    status, result = module_runner(bench_serve.main, {
        "image": IMAGE, "argv": ["--backend", "openai", "--num-prompts", "2"], "name": name,
        "key_file": str(key), "model_path": str(tmp_path), "result_file": "x.json", "timeout": 60})
    assert status == "fail" and result["exit_code"] == 127
    assert "vllm bench serve exited 127 without a result (%s)" % name in result["msg"]
    assert "not found" in result["log_tail"]
    assert result["command"] == "vllm bench serve --backend openai --num-prompts 2"
    assert key.read_text().strip() not in str(result)
    assert not [c for c in _bench_containers() if "/" + name in c.get("Names", [])]
    assert set(glob.glob(tempfile.gettempdir() + "/narwhal-bench-*")) == before


def test_missing_inputs_on_the_host_are_named(module_runner, tmp_path):
    status, result = module_runner(bench_serve.main, {
        "image": IMAGE, "argv": [], "name": "narwhal-bench-test-x", "key_file": str(tmp_path / "absent.key"),
        "model_path": str(tmp_path), "result_file": "x.json"})
    assert status == "fail" and "key_file %s is not on this host" % (tmp_path / "absent.key") in result["msg"]
    status, result = module_runner(bench_serve.main, {
        "image": "narwhal-sim/absent:none", "argv": [], "name": "narwhal-bench-test-x",
        "key_file": str(tmp_path), "model_path": str(tmp_path), "result_file": "x.json"})
    assert status == "fail" and "NARWHAL_BENCH_IMAGE" in result["msg"]


def test_absent_removes_what_an_interrupted_benchmark_left(module_runner):
    api = Client.from_env()
    body = {"Image": IMAGE, "Cmd": ["sleep", "600"], "Labels": {"org.narwhal.role": "bench"}}
    left = api.create("narwhal-bench-test-%s" % uuid.uuid4().hex[:8], body)["Id"]
    status, result = module_runner(bench_serve.main, {"state": "absent", "_ansible_check_mode": True})
    assert status == "exit" and left in result["removed"] and api.container(left)
    status, result = module_runner(bench_serve.main, {"state": "absent"})
    assert status == "exit" and result["changed"] and left in result["removed"]
    assert not _bench_containers()
