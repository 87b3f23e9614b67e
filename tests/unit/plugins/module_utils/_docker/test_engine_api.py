"""plugins/module_utils/_docker/engine_api.py, the stdlib Docker Engine API client of the launcher and the image
facts, against the Docker daemon here (and its stand-in image): inspect, create/start/wait/logs/remove, list by
label, errors; the create body is field for field what the Docker SDK sends for the same keyword arguments, and makes
the same container; `start` and `stop` of the built launcher never import the Docker SDK."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import pytest
from test_support.launcher import (
    MODULES,
    free_port,
    host_address,
    record,
    role_env,
    standin_docker,
    write_inputs,
    zipapp,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._docker import engine_api as _engine_api

STANDIN = "narwhal-sim/engine-standin:latest"
LABEL = "org.narwhal.test-engineapi"
needs_docker = pytest.mark.skipif(standin_docker()[1] is None, reason="no Docker daemon or stand-in image")


@pytest.fixture
def api():
    client = _engine_api.Client.from_env(timeout=30)
    yield client
    for summary in client.containers(filters={"label": ["%s=%s" % (LABEL, os.getpid())]}):
        client.remove(summary["Id"], force=True)
    client.close()


def _create(api, name, command, **kwargs):
    body = api.config(STANDIN, entrypoint=["python3", "-c"], command=[command], network_mode="none",
                      labels={LABEL: str(os.getpid())}, detach=True, **kwargs)
    return api.create(name, body)["Id"]


# ------------------------------------------------------------------------------------------ the daemon here

@needs_docker
def test_image_by_reference_and_by_id(api):
    image = api.image(STANDIN)
    assert image["Id"].startswith("sha256:") and STANDIN in image["RepoTags"]
    assert api.image(image["Id"])["Id"] == image["Id"]
    with pytest.raises(_engine_api.NotFound) as info:
        api.image("narwhal-sim/no-such-image:0")
    assert info.value.status == 404 and "No such image: narwhal-sim/no-such-image:0" in str(info.value)
    assert api.ping() is True and api.version()["ApiVersion"]


@needs_docker
def test_create_start_wait_logs_remove(api):
    name = "narwhal-test-engineapi-%s" % uuid.uuid4().hex[:8]
    script = "import sys, time; print('to stdout', flush=True); time.sleep(0.05); " \
             "print('to stderr', file=sys.stderr, flush=True); time.sleep(0.05); print('two', flush=True); sys.exit(3)"
    ident = _create(api, name, script)
    assert len(ident) == 64
    with pytest.raises(_engine_api.Conflict) as info:
        _create(api, name, "pass")
    assert info.value.status == 409 and name in str(info.value)
    listed = api.containers(filters={"label": ["%s=%s" % (LABEL, os.getpid())]})
    assert [(c["Id"], c["Names"], c["State"]) for c in listed] == [(ident, ["/" + name], "created")]
    api.start(ident)
    assert api.wait(ident, timeout=30)["StatusCode"] == 3
    assert api.logs(ident, stdout=True, stderr=False) == b"to stdout\ntwo\n"
    assert api.logs(ident, stdout=False, stderr=True) == b"to stderr\n"
    assert sorted(api.logs(ident, tail=2).splitlines()) == [b"to stderr", b"two"]
    attrs = api.container(name)
    assert attrs["Id"] == ident and attrs["State"]["Status"] == "exited" and attrs["State"]["ExitCode"] == 3
    api.rename(ident, name + "-renamed")
    assert api.container(ident)["Name"] == "/%s-renamed" % name
    api.remove(ident, force=True)
    with pytest.raises(_engine_api.NotFound):
        api.container(ident)


@needs_docker
def test_stop_kill_and_a_wait_that_times_out(api):
    ident = _create(api, None, "import time; time.sleep(60)")
    api.start(ident)
    with pytest.raises(_engine_api.Timeout, match="did not answer within 0.5 s"):
        api.wait(ident, timeout=0.5)
    assert api.container(ident)["State"]["Running"]  # the client reconnects after the timeout
    api.kill(ident)
    assert api.wait(ident, timeout=30)["StatusCode"] == 137
    api.stop(ident, timeout=1)  # already stopped: a no-op
    api.remove(ident)


def test_a_socket_that_does_not_answer_is_named(tmp_path):
    missing = tmp_path / "no-docker.sock"
    with pytest.raises(_engine_api.DaemonUnreachable) as info:
        _engine_api.Client("unix://%s" % missing, timeout=5).image(STANDIN)
    assert str(info.value).startswith("the Docker daemon does not answer at unix://%s (" % missing)
    assert "No such file or directory" in str(info.value) and info.value.status is None


def test_docker_host_and_tls_from_the_environment(tmp_path):
    assert _engine_api.Client.from_env(environ={}).target == ("unix", "/var/run/docker.sock")
    assert _engine_api.Client.from_env(environ={"DOCKER_HOST": "tcp://10.0.0.1:2375"}).target == \
        ("tcp", "10.0.0.1", 2375)
    assert _engine_api.Client.from_env(environ={"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}).target == \
        ("unix", "/run/user/1000/docker.sock")
    with pytest.raises(_engine_api.EngineAPIError, match="only unix:// and tcp://"):
        _engine_api.Client.from_env(environ={"DOCKER_HOST": "ssh://me@host"})
    with pytest.raises(_engine_api.EngineAPIError, match="%s is missing" % (tmp_path / "cert.pem")):
        _engine_api.Client.from_env(environ={"DOCKER_HOST": "tcp://h:2376", "DOCKER_TLS_VERIFY": "1",
                                             "DOCKER_CERT_PATH": str(tmp_path)})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a certificate")
def test_tls_from_docker_tls_verify_and_docker_cert_path(tmp_path):
    """A TLS daemon address as docker.from_env reads it: the CA, the client certificate, the server verified."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)
    shutil.copy(tmp_path / "cert.pem", tmp_path / "ca.pem")

    class Ping(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/_ping" else 404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ping)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"DOCKER_HOST": "tcp://localhost:%d" % server.server_address[1], "DOCKER_TLS_VERIFY": "1",
               "DOCKER_CERT_PATH": str(tmp_path)}
        assert _engine_api.Client.from_env(environ=env).ping() is True
        with pytest.raises(_engine_api.DaemonUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            other = tmp_path / "other"
            other.mkdir()
            for name in ("cert.pem", "key.pem"):
                shutil.copy(tmp_path / name, other / name)
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                            "/CN=other", "-keyout", str(other / "ca-key.pem"), "-out", str(other / "ca.pem")],
                           check=True, capture_output=True)
            _engine_api.Client.from_env(environ=dict(env, DOCKER_CERT_PATH=str(other))).ping()
        with pytest.raises(_engine_api.EngineAPIError, match="TLS needs DOCKER_TLS_VERIFY"):
            _engine_api.Client.from_env(environ={"DOCKER_HOST": "https://localhost:1"})
    finally:
        server.shutdown()
        server.server_close()


def test_demultiplex():
    frames = b"\x01\x00\x00\x00\x00\x00\x00\x03out" + b"\x02\x00\x00\x00\x00\x00\x00\x04err\n"
    assert _engine_api.demultiplex(frames) == b"outerr\n" and _engine_api.demultiplex(b"") == b""


# ------------------------------------------------------------------------------------------ the SDK's body

GROUP_IDS = {"video": "44", "render": "105"}


def _plan_labels(plan):
    return MODULES["labels"].create_labels(plan, "r1", "f" * 64)


def _sdk_create_kwargs(plan, group_ids):
    """The reference: docker-py's client.containers.create(...) keyword arguments of a plan, as the launcher called
    the SDK before it spoke the Engine API (the same container, the SDK's own translation)."""
    environment = dict(plan["environment"])
    groups = [group_ids.get(g) for g in plan["group_add"]]
    logs = {"log_config": dict(plan["log_config"])} if "log_config" in plan else {}
    return dict(logs, **{
        "image": plan["image"], "command": plan["command"], "entrypoint": plan["entrypoint"], "name": plan["name"],
        "detach": True, "environment": ["%s=%s" % (k, environment[k]) for k in sorted(environment)],
        "network_mode": plan["network_mode"], "ipc_mode": plan["ipc_mode"], "devices": plan["devices"] or None,
        "device_requests": [dict(r) for r in plan["device_requests"]] or None,
        "group_add": [g for g in groups if g] or None, "cap_add": plan["cap_add"] or None,
        "ulimits": [dict(u) for u in plan["ulimits"]] or None, "security_opt": plan["security_opt"] or None,
        "mounts": [{"target": m["target"], "source": m["source"], "type": m["type"], "read_only": m["read_only"]}
                   for m in plan["mounts"]],
        "labels": _plan_labels(plan), "restart_policy": {"Name": plan["restart_policy"]["name"]},
    })


def _example_plans():
    """The hand-shaped records' plans; engine-2's with bounded logs (runtime.log: HostConfig.LogConfig)."""
    records = {"engine-1": record("engine-1"), "engine-2": record("engine-2")}
    records["engine-2"]["runtime"]["log"] = {"driver": "local", "max_size": "20m", "max_file": 3}
    return [MODULES["plan"].container_spec(records[engine], role_env(engine)) for engine in ("engine-1", "engine-2")]


def _launcher_kwargs():
    """SDK keyword arguments of the NVIDIA and the ROCm/RDMA example plans, the check container's, image facts'."""
    cases = [_sdk_create_kwargs(plan, GROUP_IDS) for plan in _example_plans()]
    cases.append({"image": "sha256:" + "a" * 64, "entrypoint": ["python3", "-c", "print(1)"], "command": ["vllm"],
                  "network_mode": "none", "labels": {"org.narwhal.deploy.image-facts": "version-probe"},
                  "environment": {"PYTHONDONTWRITEBYTECODE": "1"}})
    cases.append({"image": "x", "command": "serve --port 1", "entrypoint": "vllm", "name": "n", "detach": True,
                  "privileged": True, "shm_size": "1g", "ulimits": [{"name": "nofile", "soft": 1024}],
                  "mounts": [{"target": "/m", "source": "v", "type": "volume"}], "security_opt": [],
                  "device_requests": [{"count": -1, "capabilities": [["gpu"]]}], "restart_policy": {"Name": "no"},
                  "log_config": {"type": "json-file", "config": {"max-size": "1m", "max-file": "2"}}})
    return cases


def _sdk_kwargs(docker, kwargs):
    """The same keyword arguments as the launcher gave the SDK before: Mount objects (the SDK does not convert
    dicts there; device requests and ulimits it converts itself)."""
    return dict(kwargs, mounts=[docker.types.Mount(**m) for m in kwargs["mounts"]]) if "mounts" in kwargs else kwargs


def _sdk_body(docker, monkeypatch, kwargs):
    """(the create body, the name) the SDK sends for containers.create(**kwargs), captured before it is sent."""
    from docker.models.containers import _create_container_args

    sent = {}
    sdk = docker.APIClient(version="1.41")
    monkeypatch.setattr(sdk, "create_container_from_config",
                        lambda config, name=None, platform=None: sent.update(config=config, name=name))
    sdk.create_container(**_create_container_args(dict(_sdk_kwargs(docker, kwargs), version="1.41")))
    return json.loads(json.dumps({k: v for k, v in sent["config"].items() if v is not None})), sent["name"]


@pytest.mark.parametrize("case", range(4), ids=["nvidia", "rocm-rdma", "image-facts", "odd-kwargs"])
def test_the_body_is_the_one_the_sdk_sends(case, tmp_path, monkeypatch):
    docker = pytest.importorskip("docker")
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"default": {
        "httpProxy": "http://proxy:3128", "noProxy": "localhost,.internal"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    kwargs = _launcher_kwargs()[case]
    expected, sent_name = _sdk_body(docker, monkeypatch, kwargs)
    ours = dict(kwargs)
    name = ours.pop("name", None)
    assert name == sent_name
    assert json.loads(json.dumps(_engine_api.Client.from_env().config(**ours))) == expected
    assert expected["Env"][:2] == ["http_proxy=http://proxy:3128", "HTTP_PROXY=http://proxy:3128"]


@pytest.mark.parametrize("case", range(2), ids=["nvidia", "rocm-rdma"])
def test_the_plan_body_is_the_one_the_sdk_sends_for_the_plan(case, tmp_path, monkeypatch):
    """The launcher's one translation, plan -> create body (plan_config), is the body the SDK sends for the same
    container."""
    docker = pytest.importorskip("docker")
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"default": {"httpProxy": "http://proxy:3128"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    plan = _example_plans()[case]
    expected = _sdk_body(docker, monkeypatch, _sdk_create_kwargs(plan, GROUP_IDS))[0]
    client = _engine_api.Client.from_env()
    body = client.plan_config(plan, _plan_labels(plan), GROUP_IDS)
    assert json.loads(json.dumps(body)) == expected


@pytest.mark.parametrize("case", range(2), ids=["nvidia", "rocm-rdma"])
def test_the_engines_container_carries_no_key(case):
    """What `docker inspect` shows of an engine (Config.Env, Cmd, Labels: the create body) holds no key: VLLM_API_KEY
    is empty (vLLM's own check off), the guard finds the key file through NARWHAL_GUARD_KEY_FILE, in the key file's
    own directory mounted read-only; no --api-key."""
    plan = _example_plans()[case]
    body = _engine_api.plan_body(plan, _plan_labels(plan), GROUP_IDS)
    env = [e for e in body["Env"] if e.split("=", 1)[0] in ("VLLM_API_KEY", "NARWHAL_GUARD_KEY_FILE")]
    assert env == ["NARWHAL_GUARD_KEY_FILE=/narwhal/secrets/api-key", "VLLM_API_KEY="]
    assert {"Target": "/narwhal/secrets", "Source": "/opt/narwhal/secrets", "Type": "bind",
            "ReadOnly": True} in body["HostConfig"]["Mounts"]
    assert not [a for a in body["Cmd"] if a.startswith("--api-key")]


@needs_docker
def test_the_launcher_makes_the_container_the_sdk_made(api):
    """The NVIDIA and ROCm example plans (devices, device requests, groups, capabilities, ulimits, security
    options, mounts), created (not started) through the SDK and through the launcher's plan body: the same
    container."""
    docker, client = standin_docker()[:2]
    image = api.image(STANDIN)["Id"]
    for engine in ("engine-1", "engine-2"):
        rec = record(engine)
        rec["runtime"]["image_id"] = image
        # the model, the key guard and (engine-2) the TLS directory mounted: each from a directory of this host
        tls = {"NARWHAL_TLS_DIR": "/tmp", "NARWHAL_TLS_CERT_SHA256": "c" * 64} if engine == "engine-2" else {}
        plan = MODULES["plan"].container_spec(rec, role_env(engine, **tls))
        assert len(plan["mounts"]) == (4 if tls else 3)
        for mount in plan["mounts"]:
            mount["source"] = "/tmp"
        kwargs = _sdk_create_kwargs(plan, GROUP_IDS)
        kwargs["labels"][LABEL] = str(os.getpid())
        suffix = uuid.uuid4().hex[:8]
        sdk_kwargs = dict(_sdk_kwargs(docker, kwargs), name="narwhal-test-sdk-%s" % suffix)
        theirs = client.containers.create(**sdk_kwargs).attrs
        labels = dict(_plan_labels(plan), **{LABEL: str(os.getpid())})
        body = api.plan_config(plan, labels, GROUP_IDS)
        ours = api.container(api.create("narwhal-test-engineapi-%s" % suffix, body)["Id"])
        for key in ("Config", "HostConfig"):
            assert ours[key] == theirs[key], key
        assert ours["Image"] == theirs["Image"] == image


# ------------------------------------------------------------------------------------------ no SDK in start

NO_SDK = """import json, runpy, sys
for name in ("docker", "requests", "urllib3"):
    sys.modules[name] = None  # importing one of them fails
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "sdk": sorted(m for m in sys.modules if m.split(".")[0] in
                                              ("docker", "requests", "urllib3") and sys.modules[m] is not None)}))
"""


@needs_docker
def test_start_and_stop_never_import_the_docker_sdk(tmp_path):
    """The built zipapp starts (image check included) and stops a stand-in engine with the Docker SDK, requests
    and urllib3 made unimportable."""
    address = host_address()
    ports = [p for p in range(18601, 18699) if free_port(p)][:2]
    if address is None or len(ports) < 2:
        pytest.skip("no routable host address or free 186xx ports")
    api = _engine_api.Client.from_env()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text("{}")
    engine = "engine-%d" % (80000 + uuid.uuid4().int % 9999)
    rec = record("engine-1")
    rec.update(engine=engine, accelerator={"vendor": "cpu", "product": "cpu", "count": 0}, gpu_ids=[],
               gpu_host_indices=[], tensor_parallel_size=1, accelerator_devices=[])
    rec["runtime"].update(image_id=api.image(STANDIN)["Id"], platform="cpu", kv_buffer_device="cpu",
                          model_path=str(model))
    rec["transfer"]["ucx_tls"] = ["tcp"]
    env_path, env = write_inputs(tmp_path, rec, NARWHAL_HTTP_PORT=str(ports[0]),
                                 NARWHAL_SIDE_CHANNEL_PORT=str(ports[1]), NARWHAL_ADVERTISED_ADDRESS=address,
                                 NARWHAL_FABRIC_INTERFACE="lo")
    launcher = zipapp(tmp_path)
    name = "narwhal-" + engine

    def run(action):
        proc = subprocess.run([sys.executable, "-c", NO_SDK, str(launcher), "--role-env", str(env_path), action],
                              capture_output=True, text=True, timeout=300, check=False)
        return json.loads(proc.stdout.splitlines()[-1]), proc

    try:
        result, proc = run("start")
        assert result == {"code": 0, "sdk": []}, proc.stderr
        assert proc.stdout.startswith("started %s " % name)
        assert api.container(name)["State"]["Running"]
        deployment = json.loads((pathlib.Path(env["NARWHAL_RUN_DIR"]) / "deployment.json").read_text())
        assert deployment["started_at"] == api.container(name)["State"]["StartedAt"]
        api.kill(name)  # the stand-in (PID 1) ignores SIGTERM: stop would wait its 30 s grace period
        result, proc = run("stop")
        assert result == {"code": 0, "sdk": []}, proc.stderr
        assert proc.stdout.startswith("stopped %s " % name)
    finally:
        try:
            api.remove(name, force=True)
        except _engine_api.NotFound:
            pass
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)


# ------------------------------------------------------------------------------------------ pull, tag, load (no daemon)

class _Daemon:
    """A one-connection HTTP server on a unix socket that records each request and answers from `answers`
    [(status, body bytes)], in order."""

    def __init__(self, path, answers):
        import socketserver
        import threading
        from http.server import BaseHTTPRequestHandler

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                if self.headers.get("Transfer-Encoding") == "chunked":
                    body = b""
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        chunk = self.rfile.read(size + 2)[:size]
                        if not size:
                            break
                        body += chunk
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.command, self.path, dict(self.headers), body))
                status, data = answers.pop(0)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

            def address_string(self):
                return "unix"

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True  # a kept-alive connection's handler does not hold up shutdown()

        self.server = Server(str(path), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _stream(*messages):
    return b"".join(json.dumps(m).encode() + b"\r\n" for m in messages)


def test_a_pull_sends_the_auth_header_and_reads_the_stream_to_its_end(tmp_path):
    daemon = _Daemon(tmp_path / "d.sock", [(200, _stream({"status": "Pulling from vllm/vllm-openai"},
                                                         {"status": "Digest: sha256:" + "1" * 64}))])
    try:
        api = _engine_api.Client("unix://%s" % (tmp_path / "d.sock"))
        found = api.pull("registry.example:5000/vllm/vllm-openai", "v1", "YXV0aA==", timeout=5)
    finally:
        daemon.close()
    assert [m["status"] for m in found] == ["Pulling from vllm/vllm-openai", "Digest: sha256:" + "1" * 64]
    ((method, path, headers, _body),) = daemon.seen
    assert (method, path) == ("POST", "/images/create?fromImage=registry.example%3A5000%2Fvllm%2Fvllm-openai&tag=v1")
    assert headers["X-Registry-Auth"] == "YXV0aA=="


@pytest.mark.parametrize("answer, kind, words", [
    ((200, _stream({"status": "Pulling"}, {"errorDetail": {"message": "unauthorized: authentication required"},
                                           "error": "unauthorized: authentication required"})),
     _engine_api.StreamError, "unauthorized: authentication required"),
    ((200, _stream({"errorDetail": {"message": "manifest unknown"}})), _engine_api.StreamError, "manifest unknown"),
    ((500, b'{"message": "Get https://r/v2/: x509: certificate signed by unknown authority"}'),
     _engine_api.EngineAPIError, "Get https://r/v2/: x509: certificate signed by unknown authority"),
    ((404, b'{"message": "manifest for r/x:1 not found"}'), _engine_api.NotFound, "manifest for r/x:1 not found"),
])
def test_a_refused_pull_carries_the_registrys_words(tmp_path, answer, kind, words):
    daemon = _Daemon(tmp_path / "d.sock", [answer])
    try:
        with pytest.raises(kind) as info:
            _engine_api.Client("unix://%s" % (tmp_path / "d.sock")).pull("r/x", "1", timeout=5)
    finally:
        daemon.close()
    assert info.value.explanation == words and "X-Registry-Auth" not in daemon.seen[0][2]


def test_tag_and_a_load_streamed_from_a_file(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"x" * (3 << 20))  # three 1 MiB blocks
    daemon = _Daemon(tmp_path / "d.sock", [(201, b""), (200, _stream({"stream": "Loaded image: a:1\n"}))])
    try:
        api = _engine_api.Client("unix://%s" % (tmp_path / "d.sock"))
        api.tag("sha256:" + "a" * 64, "registry.example:5000/ns/img", "v1")
        with open(archive, "rb") as handle:
            found = api.load(handle, 3 << 20, timeout=5)
    finally:
        daemon.close()
    assert found == [{"stream": "Loaded image: a:1\n"}]
    (tag, load) = daemon.seen
    assert tag[:2] == ("POST", "/images/sha256:%s/tag?repo=registry.example%%3A5000%%2Fns%%2Fimg&tag=v1" % ("a" * 64))
    assert load[:2] == ("POST", "/images/load?quiet=1") and load[3] == b"x" * (3 << 20)
    assert load[2]["Content-Type"] == "application/x-tar"
