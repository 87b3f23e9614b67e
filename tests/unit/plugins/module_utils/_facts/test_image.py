# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Image facts: the pure helpers (plugins/module_utils/_facts/image.py), the module (plugins/modules/image_facts.py,
with plugins/module_utils/_facts/daemon.py) against a fake Docker client, and (optionally) a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from test_support.image import IMAGE_ID, STANDIN_ATTRS, STANDIN_ENV, STANDIN_VERSIONS, FakeClient
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.daemon import CONTAINER_LABEL
from ansible_collections.narwhal.deploy.plugins.modules import image_facts

ROCM_ENV = {"ROCM_PATH": "/opt/rocm", "HIP_PLATFORM": "amd", "PATH": "/opt/rocm/bin:/usr/bin"}
CUDA_ENV = {"CUDA_VERSION": "12.9.1", "NVIDIA_VISIBLE_DEVICES": "all"}

# ------------------------------------------------------------------------------------------------
# pure helpers


def test_filter_env_keeps_runtime_keys_and_drops_secrets():
    env = _image.filter_env(STANDIN_ENV)
    assert env["CUDA_VERSION"] == "12.9.1"
    assert env["PATH"].startswith("/usr/local/sbin")
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/usr/local/cuda/lib64"
    assert env["NIXL_PLUGIN_DIR"].endswith("/nixl")
    assert env["UCX_HOME"] == "/usr/local/ucx"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    for key in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "VLLM_API_KEY", "GITHUB_TOKEN", "HOME"):
        assert key not in env


def test_env_list_to_dict_edge_cases():
    assert _image.env_list_to_dict(["A=1=2", "B", "A=3", "=x"]) == {"A": "3", "B": ""}
    assert _image.filter_env(None) == {}


@pytest.mark.parametrize(
    "dists, env, platform, nixl",
    [
        ({"vllm": "0.32.0+cpu", "torch": "2.9.0+cpu"}, {}, "cpu", None),
        ({"vllm": "0.32.0+cpu", "nixl": "1.5.1"}, CUDA_ENV, "cpu", "nixl"),
        ({"vllm": "0.11.0.cpu"}, {}, "cpu", None),
        ({"vllm": "0.33.0", "nixl": "1.5.1", "nixl-cu12": "1.5.1"}, CUDA_ENV, "cuda", "nixl"),
        ({"vllm": "0.33.0", "nixl-cu13": "1.5.1"}, {}, "cuda", "nixl-cu13"),
        ({"vllm": "0.33.0", "nixl-cu12": "0.6.0"}, {}, "cuda", "nixl-cu12"),
        ({"vllm": "0.33.0+cu129"}, {}, "cuda", None),
        ({"vllm": "0.33.0", "nixl-rocm": "1.5.0", "nixl": "1.5.1"}, ROCM_ENV, "rocm", "nixl-rocm"),
        ({"vllm": "0.19.1+rocm700", "rixl": "0.1.0"}, {}, "rocm", "rixl"),
        ({"vllm": "0.33.0", "nixl": "1.5.1"}, ROCM_ENV, "rocm", "nixl"),
        ({"vllm": "0.33.0"}, {"HIP_VISIBLE_DEVICES": "0"}, "rocm", None),
        ({"vllm": "0.33.0", "torch": "2.9.0+rocm6.4"}, {}, "rocm", None),
        # PyPI's unrelated `rixl` in a CUDA image is not ROCm evidence and never the NIXL choice there
        ({"vllm": "0.33.0", "rixl": "0.2.0", "nixl-cu12": "1.5.1"}, CUDA_ENV, "cuda", "nixl-cu12"),
        ({"torch": "2.9.0+cpu"}, {}, "cpu", None),
        ({"vllm": "0.33.0"}, {"PATH": "/usr/bin"}, "unknown", None),
        ({}, {}, "unknown", None),
    ],
)
def test_platform_and_nixl(dists, env, platform, nixl):
    got = _image.derive_platform(dists, env)
    assert got == platform
    assert _image.choose_nixl(dists, got) == nixl


def test_parse_script_output():
    out = b"warning: something\nNARWHAL_IMAGE_FACTS:" + json.dumps({"vllm": "0.33.0", "other": "1"}).encode() + b"\n"
    assert _image.parse_script_output(out, ["vllm", "nixl"]) == {"vllm": "0.33.0"}
    assert _image.parse_script_output("NARWHAL_IMAGE_FACTS:{}\n", ["vllm"]) == {}
    with pytest.raises(_image.ImageFactsError):
        _image.parse_script_output("Traceback ...\n", ["vllm"])
    with pytest.raises(_image.ImageFactsError):
        _image.parse_script_output("NARWHAL_IMAGE_FACTS:{not json\n", ["vllm"])
    with pytest.raises(_image.ImageFactsError):
        _image.parse_script_output("NARWHAL_IMAGE_FACTS:[1]\n", ["vllm"])


def test_version_script_runs_locally():
    """The script itself, run by this interpreter: pytest is installed, the made-up name is not."""
    proc = subprocess.run(
        ["python3", "-c", _image.VERSION_SCRIPT, "pytest", "narwhal-no-such-dist"],
        capture_output=True,
        text=True,
        check=True,
    )
    got = _image.parse_script_output(proc.stdout, ["pytest", "narwhal-no-such-dist"])
    assert list(got) == ["pytest"]


def test_cache_naming_and_validation():
    assert _image.cache_file_name(IMAGE_ID) == IMAGE_ID[7:] + ".json"
    assert _image.cache_file_name(IMAGE_ID[7:]) == IMAGE_ID[7:] + ".json"
    for bad in ("sha256:../../etc/passwd", "latest", None, "sha256:" + "A" * 64):
        with pytest.raises(_image.ImageFactsError):
            _image.cache_file_name(bad)
    doc = _image.cache_document(IMAGE_ID, ["vllm", "nixl", "vllm"], {"vllm": "0.33.0"})
    assert _image.cached_distributions(doc, IMAGE_ID, ["nixl", "vllm"]) == {"vllm": "0.33.0"}
    assert _image.cached_distributions(doc, IMAGE_ID, ["vllm"]) is None
    assert _image.cached_distributions(doc, "sha256:" + "1" * 64, ["vllm", "nixl"]) is None
    assert _image.cached_distributions(dict(doc, format=0), IMAGE_ID, ["vllm", "nixl"]) is None
    assert _image.cached_distributions(dict(doc, distributions={"x": "1"}), IMAGE_ID, ["vllm", "nixl"]) is None
    assert _image.cached_distributions(None, IMAGE_ID, ["vllm"]) is None


def test_build_facts_layout():
    attrs = {
        "Id": IMAGE_ID,
        "RepoTags": ["narwhal-sim/engine-standin:latest"],
        "RepoDigests": [],
        "Architecture": "amd64",
        "Os": "linux",
        "Config": {"Env": STANDIN_ENV, "Entrypoint": ["vllm", "serve"], "Cmd": None, "Labels": {"a": "b"}},
    }
    facts = _image.build_facts("img", attrs, {"vllm": "0.33.0", "nixl": "1.5.1", "nixl-cu12": "1.5.1"}, False)
    assert set(facts) == {
        "image", "id", "repo_tags", "repo_digests", "architecture", "os", "entrypoint", "cmd", "env",
        "withheld_env", "labels", "distributions", "platform", "nixl_distribution", "cached",
    }
    assert facts["platform"] == "cuda"
    assert facts["nixl_distribution"] == "nixl"
    assert "HF_TOKEN" not in facts["env"]


def test_default_distributions_match_docs():
    import yaml

    doc = yaml.safe_load(image_facts.DOCUMENTATION)
    assert doc["options"]["distributions"]["default"] == _image.DEFAULT_DISTRIBUTIONS
    for name in ("vllm", "nixl", "nixl-cu12", "nixl-cu13", "nixl-rocm", "rixl", "torch", "ucx-py"):
        assert name in _image.DEFAULT_DISTRIBUTIONS


def test_one_distribution_list_discovery_reads_and_image_facts_extends():
    """engine_host_facts (discovery) reads DISCOVERY_DISTRIBUTIONS by default, its docs say so, image_facts' default
    extends the same list, and the discover role names no list of its own (only NARWHAL_EXPECTED_PACKAGES)."""
    import yaml

    from ansible_collections.narwhal.deploy.plugins.modules import engine_host_facts

    doc = yaml.safe_load(engine_host_facts.DOCUMENTATION)
    assert doc["options"]["distributions"]["default"] == _image.DISCOVERY_DISTRIBUTIONS
    assert doc["options"]["extra_distributions"]["default"] == []
    assert _image.DEFAULT_DISTRIBUTIONS[:len(_image.DISCOVERY_DISTRIBUTIONS)] == _image.DISCOVERY_DISTRIBUTIONS
    tasks = (REPO / "roles" / "discover" / "tasks" / "main.yml").read_text()
    assert "extra_distributions:" in tasks and "\n    distributions:" not in tasks


# ------------------------------------------------------------------------------------------------
# the module against a fake Docker client (the calls of the plugins/module_utils/_docker/engine_api.py client)


@pytest.fixture
def run_module(module_runner, monkeypatch):
    """conftest's runner for image_facts.main, with the Docker client replaced by `client`."""

    def run(args, client):
        monkeypatch.setattr(image_facts, "make_client", lambda host, timeout: client)
        return module_runner(image_facts.main, args)

    return run


def test_module_runs_once_then_uses_cache(run_module, tmp_path):
    cache = tmp_path / "cache"
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS)
    args = {"image": "narwhal-sim/engine-standin:latest", "cache_dir": str(cache)}

    kind, res = run_module(args, client)
    assert kind == "exit", res
    assert res["changed"] is False
    facts = res["ansible_facts"]["narwhal_image"]
    assert facts["distributions"] == STANDIN_VERSIONS
    assert facts["cached"] is False
    assert facts["platform"] == "cuda"
    assert facts["nixl_distribution"] == "nixl"
    assert facts["id"] == IMAGE_ID
    assert "HF_TOKEN" not in facts["env"] and "env_all" not in facts
    assert len(client.created) == 1 and client.created[0].removed
    path = cache / (IMAGE_ID[7:] + ".json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp file left

    kind, res2 = run_module(args, client)
    assert kind == "exit", res2
    facts2 = res2["ansible_facts"]["narwhal_image"]
    assert len(client.created) == 1  # no second container
    assert facts2["cached"] is True
    assert dict(facts2, cached=False) == facts

    # a different request list is a cache miss
    kind, res3 = run_module(dict(args, distributions=["vllm"]), client)
    assert kind == "exit" and res3["ansible_facts"]["narwhal_image"]["cached"] is False
    assert res3["ansible_facts"]["narwhal_image"]["distributions"] == {"vllm": "0.33.0"}
    assert len(client.created) == 2


def test_module_check_mode_writes_nothing(run_module, tmp_path):
    cache = tmp_path / "cache"
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS)
    args = {"image": IMAGE_ID, "cache_dir": str(cache), "_ansible_check_mode": True}
    kind, res = run_module(args, client)
    assert kind == "exit", res
    assert res["ansible_facts"]["narwhal_image"]["distributions"] == STANDIN_VERSIONS
    assert not cache.exists()

    # check mode reads an existing cache
    cache.mkdir()
    (cache / (IMAGE_ID[7:] + ".json")).write_text(
        json.dumps(_image.cache_document(IMAGE_ID, _image.DEFAULT_DISTRIBUTIONS, {"vllm": "0.1.0"}))
    )
    kind, res = run_module(args, client)
    assert res["ansible_facts"]["narwhal_image"]["distributions"] == {"vllm": "0.1.0"}
    assert res["ansible_facts"]["narwhal_image"]["cached"] is True
    assert len(client.created) == 1


def test_module_missing_image(run_module, tmp_path):
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS)
    kind, res = run_module({"image": "vllm/vllm-openai:v9", "cache_dir": str(tmp_path)}, client)
    assert kind == "fail"
    assert "image vllm/vllm-openai:v9 is not present on this host's Docker daemon" in res["msg"]
    assert "load or pull it there, then rerun discovery" in res["msg"]
    assert client.created == []


def test_module_daemon_not_answering(run_module, tmp_path):
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS, answering=False)
    kind, res = run_module({"image": "x", "cache_dir": str(tmp_path), "docker_host": "tcp://h:2375"}, client)
    assert kind == "fail"
    assert "tcp://h:2375 is not answering" in res["msg"] and "image x" in res["msg"]


def test_module_python_fallback_and_no_python(run_module, tmp_path):
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS, pythons=("python",))
    kind, res = run_module({"image": IMAGE_ID, "cache_dir": str(tmp_path)}, client)
    assert kind == "exit", res
    assert [c.entrypoint[0] for c in client.created] == ["python3", "python"]
    assert all(c.removed for c in client.created)

    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS, pythons=())
    kind, res = run_module({"image": IMAGE_ID, "cache_dir": str(tmp_path / "other")}, client)
    assert kind == "fail"
    assert "no usable python3 or python" in res["msg"] and IMAGE_ID in res["msg"]
    assert all(c.removed for c in client.created)
    assert not (tmp_path / "other").exists()


def test_module_container_timeout_kills_and_removes(run_module, tmp_path):
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS, hang=True)
    kind, res = run_module({"image": IMAGE_ID, "cache_dir": str(tmp_path), "timeout": 5}, client)
    assert kind == "fail"
    assert "did not finish within 5s" in res["msg"]
    assert client.killed == 1 and client.created[0].removed


def test_module_daemon_socket_missing(module_runner, tmp_path):
    """The real client against a socket path where no daemon listens: the same message, naming the address."""
    host = "unix://%s" % (tmp_path / "docker.sock")
    kind, res = module_runner(image_facts.main, {"image": "x", "cache_dir": str(tmp_path), "docker_host": host})
    assert kind == "fail"
    assert res["msg"].startswith("cannot inspect image x: the Docker daemon at %s is not answering (" % host)
    assert "No such file or directory" in res["msg"] and "(group docker), then rerun discovery" in res["msg"]


# ------------------------------------------------------------------------------------------------
# a real daemon, when one answers here

STANDIN = "narwhal-sim/engine-standin:latest"


def _standin_available():
    if not shutil.which("docker"):
        return False
    try:
        proc = subprocess.run(["docker", "image", "inspect", STANDIN], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@pytest.mark.skipif(not _standin_available(), reason="no Docker daemon with %s here" % STANDIN)
def test_real_daemon_standin(run_module, tmp_path):
    real = image_facts.make_client("unix:///var/run/docker.sock", 120)

    def probes():
        """The version-probe containers on the daemon (other tests run containers of their own beside this one)."""
        return {c["Id"] for c in real.containers(filters={"label": ["%s=version-probe" % CONTAINER_LABEL]})}
    before = probes()

    def run(args):
        kind, res = run_module(args, real)
        assert kind == "exit", res
        return res

    args = {"image": STANDIN, "cache_dir": str(tmp_path / "cache")}
    res = run(args)
    facts = res["ansible_facts"]["narwhal_image"]
    assert facts["distributions"]["vllm"] == "0.33.0"
    assert facts["distributions"]["nixl"] == "1.5.1"
    assert facts["distributions"]["nixl-cu12"] == "1.5.1"
    assert facts["platform"] == "cuda" and facts["nixl_distribution"] == "nixl"
    assert facts["id"].startswith("sha256:") and facts["cached"] is False
    assert run(args)["ansible_facts"]["narwhal_image"]["cached"] is True
    assert probes() == before  # the probe container is gone


# ------------------------------------------------------------------------------------------------
# secrets (issue 13, class 5): names of secret-looking image env reported, values never returned or cached


@pytest.mark.parametrize("config, secret", [
    ({"Env": ["HF_TOKEN=hf_imageToken0123456789abcdefgh"]}, "hf_imageToken0123456789abcdefgh"),
    ({"Cmd": ["--hf-token", "plainvalue-123"]}, "plainvalue-123"),
    ({"Cmd": ["--api-key=sk-cmd-0123456789abcdefghij"]}, "sk-cmd-0123456789abcdefghij"),
    ({"Entrypoint": ["sh", "-c", "HF_TOKEN=inline-0123 vllm serve"]}, "inline-0123"),
    ({"Labels": {"com.example.api_key": "label-secret-01"}}, "label-secret-01"),
    ({"Labels": {"com.example.note": "pull with https://bot:p4ssw0rd@registry.example"}}, "p4ssw0rd"),
], ids=["env", "cmd-flag", "cmd-flag-equals", "entrypoint-pair", "label-name", "label-url-password"])
def test_module_never_returns_image_secrets(run_module, tmp_path, config, secret):
    attrs = json.loads(json.dumps(STANDIN_ATTRS))
    attrs["Config"].update(config)
    kind, res = run_module({"image": "narwhal-sim/engine-standin:latest", "cache_dir": str(tmp_path)},
                           FakeClient(attrs, STANDIN_VERSIONS))
    assert kind == "exit", res
    assert secret not in json.dumps(res)
    assert "<redacted>" in json.dumps(res) or res["ansible_facts"]["narwhal_image"]["withheld_env"]
    for cached in tmp_path.iterdir():
        assert secret not in cached.read_text()


def test_withheld_env_names_every_secret_looking_image_variable():
    assert _image.withheld_env(STANDIN_ENV) == ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HF_TOKEN", "VLLM_API_KEY"]


@pytest.mark.skipif(not _standin_available(), reason="no Docker daemon with %s here" % STANDIN)
def test_the_image_read_never_imports_the_docker_sdk(tmp_path):
    """image_facts and engine_host_facts read the image (and run the version container) with the Docker SDK,
    requests and urllib3 unimportable."""
    code = """import json, sys
for name in ("docker", "requests", "urllib3"):
    sys.modules[name] = None
sys.path.insert(0, sys.argv[1])
from ansible_collections.narwhal.deploy.plugins.modules import engine_host_facts, image_facts  # noqa: F401
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import daemon as _daemon
api = _daemon.make_client("unix:///var/run/docker.sock", 120)
out = _daemon.run_version_container(api, api.image(sys.argv[2])["Id"], "python3", ["vllm"], 120)
print(json.dumps({"out": out.decode(), "sdk": [m for m in ("docker", "requests", "urllib3") if sys.modules[m]]}))
"""
    collections = str(REPO / "collections")
    proc = subprocess.run([sys.executable, "-c", code, collections, STANDIN], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["sdk"] == [] and '"vllm": "0.33.0"' in result["out"]
