"""One benchmark step's container (plugins/module_utils/_bench/serve.py::run_step) against a fake Engine API client:
with a CA file the load generator's container gets it read-only and SSL_CERT_FILE naming it (vllm bench serve's
aiohttp verifies https targets with ssl.create_default_context()); without, neither; a CA file the host lacks is
named. (The real daemon and load generator: tests/unit/plugins/modules/test_bench_serve.py, molecule's real
scenario.)"""
import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import CA
from ansible_collections.narwhal.deploy.plugins.module_utils._bench.serve import run_step
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import NotFound


class StopError(Exception):
    pass


class FakeModule:
    def __init__(self, params):
        self.params = params

    def fail_json(self, **kwargs):
        raise StopError(kwargs)

    exit_json = fail_json


class FakeAPI:
    def __init__(self):
        self.bodies = []

    def image(self, ref):
        return {"Id": "sha256:abc"}

    def create(self, name, body):
        self.bodies.append(body)
        return {"Id": "c1"}

    def start(self, ref):
        pass

    def wait(self, ref, timeout=None):
        return {"StatusCode": 0}

    def logs(self, ref, tail=None):
        return b""

    def remove(self, ref, force=False):
        raise NotFound("gone")


def _params(tmp_path, **more):
    key = tmp_path / "engine-api.key"
    key.write_text("k\n")
    return dict({"image": "vllm/vllm:1", "argv": ["--base-url", "https://10.0.0.21:30000"], "name": "narwhal-bench-x",
                 "key_file": str(key), "model_path": str(tmp_path), "result_file": "x.json", "timeout": 60,
                 "ca_file": None}, **more)


def test_with_a_ca_file_the_load_generator_verifies_with_it(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    api = FakeAPI()
    with pytest.raises(StopError):  # no result file: the step fails, after its container ran
        run_step(FakeModule(_params(tmp_path, ca_file=str(ca))), api)
    (body,) = api.bodies
    assert body["Env"] == ["SSL_CERT_FILE=%s" % CA]
    mounts = dict((m["Target"], (m["Source"], m["ReadOnly"])) for m in body["HostConfig"]["Mounts"])
    assert mounts[CA] == (str(ca), True)


def test_without_a_ca_file_the_container_is_as_before(tmp_path):
    api = FakeAPI()
    with pytest.raises(StopError):
        run_step(FakeModule(_params(tmp_path)), api)
    (body,) = api.bodies
    assert "Env" not in body and CA not in [m["Target"] for m in body["HostConfig"]["Mounts"]]


def test_a_ca_file_the_host_lacks_is_named(tmp_path):
    api = FakeAPI()
    with pytest.raises(StopError) as stop:
        run_step(FakeModule(_params(tmp_path, ca_file=str(tmp_path / "tls" / "ca.crt"))), api)
    assert "ca_file %s is not on this host" % (tmp_path / "tls" / "ca.crt") in stop.value.args[0]["msg"]
    assert not api.bodies


@pytest.mark.parametrize("text", ["new-key\n", "new-key", "new-key\nold-key\n"])
def test_the_load_generator_gets_the_first_line_of_the_key_file(tmp_path, text):
    """The container's /bin/sh -c WRAPPER hands `vllm bench serve` the key file's first line as OPENAI_API_KEY: the
    key, also while a rotation has the previous key on a second line (a newline in a Bearer token breaks every
    request)."""
    import os
    import subprocess

    from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import KEY
    from ansible_collections.narwhal.deploy.plugins.module_utils._bench.serve import WRAPPER

    (tmp_path / "api.key").write_text(text)
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "vllm"  # what the wrapper execs: prints the key it was given and its arguments
    fake.write_text('#!/bin/sh\nprintf "%s|%s" "$OPENAI_API_KEY" "$*"\n')
    fake.chmod(0o755)
    proc = subprocess.run(["/bin/sh", "-c", WRAPPER.replace(KEY, str(tmp_path / "api.key")), "vllm-bench", "--x"],
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"])))
    assert proc.stdout == "new-key|bench serve --x"
