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
                 "ca_file": None, "metrics_urls": []}, **more)


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


# ------------------------------------------------------------------ the engines' counters around a step (issue 38)

class MetricsServer:
    """A local engine /metrics (Prometheus text as vLLM 0.32 writes it) whose counters the step moves: `grow` adds to
    them, as the engine's work during the step does. Any other path is 404."""

    def __init__(self, queries=100.0, hits=10.0, kv_bytes=None):
        import http.server
        import threading

        self.values = {"queries": queries, "hits": hits, "kv_bytes": kv_bytes}
        self.paths = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.paths.append((self.path, self.headers.get("Authorization")))
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = outer.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self):
        v, labels = self.values, '{engine="0",model_name="tiny"}'
        lines = ["# TYPE vllm:prefix_cache_queries counter",
                 "vllm:prefix_cache_queries_total%s %s" % (labels, v["queries"]),
                 "vllm:prefix_cache_hits_total%s %s" % (labels, v["hits"])]
        if v["kv_bytes"] is not None:
            lines += ["vllm:nixl_bytes_transferred_sum%s %s" % (labels, v["kv_bytes"]),
                      "vllm:nixl_bytes_transferred_count%s 2.0" % labels]
        return "\n".join(lines) + "\n"

    def grow(self, queries, hits, kv_bytes=0.0):
        self.values["queries"] += queries
        self.values["hits"] += hits
        if self.values["kv_bytes"] is not None:
            self.values["kv_bytes"] += kv_bytes

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class ServingAPI(FakeAPI):
    """The load generator's container as the daemon runs it: it writes its result file into the mounted result
    directory, and while it runs the engines count (`during`)."""

    def __init__(self, during):
        super().__init__()
        self.during = during

    def wait(self, ref, timeout=None):
        import json
        import os

        from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import OUT

        (out,) = [m["Source"] for m in self.bodies[-1]["HostConfig"]["Mounts"] if m["Target"] == OUT]
        with open(os.path.join(out, "x.json"), "w") as fh:
            json.dump({"completed": 8, "failed": 0, "num_prompts": 8, "p50_ttft_ms": 12.5, "errors": []}, fh)
        self.during()
        return {"StatusCode": 0}


def test_the_step_keeps_what_each_engines_counters_grew_by_while_it_ran(tmp_path):
    prefill, decode = MetricsServer(100.0, 10.0), MetricsServer(50.0, 0.0, kv_bytes=1000.0)
    try:
        api = ServingAPI(lambda: (prefill.grow(800.0, 600.0), decode.grow(64.0, 16.0, 2048.0)))
        with pytest.raises(StopError) as stop:
            run_step(FakeModule(_params(tmp_path, metrics_urls=[prefill.url, decode.url + "/"])), api)
    finally:
        prefill.close()
        decode.close()
    out = stop.value.args[0]
    assert "msg" not in out and out["result"]["p50_ttft_ms"] == 12.5
    assert out["result"]["counters"] == {
        prefill.url: {"prefix_cache_queries": 800.0, "prefix_cache_hits": 600.0, "kv_bytes": None,
                      "kv_transfers": None, "kv_failed_transfers": None},
        decode.url + "/": {"prefix_cache_queries": 64.0, "prefix_cache_hits": 16.0, "kv_bytes": 2048.0,
                           "kv_transfers": 0.0, "kv_failed_transfers": None}}
    # read once before and once after, without the key (the key guard lets /metrics through)
    assert prefill.paths == [("/metrics", None), ("/metrics", None)] and decode.paths == prefill.paths


def test_an_engine_that_does_not_answer_is_named_and_the_step_still_counts(tmp_path):
    engine = MetricsServer()
    gone = MetricsServer()
    gone.close()  # its port answers nothing
    try:
        with pytest.raises(StopError) as stop:
            run_step(FakeModule(_params(tmp_path, metrics_urls=[engine.url, gone.url])),
                     ServingAPI(lambda: engine.grow(10.0, 5.0)))
    finally:
        engine.close()
    out = stop.value.args[0]
    assert "msg" not in out and out["result"]["counters"][engine.url]["prefix_cache_hits"] == 5.0
    assert out["result"]["counters"][gone.url]["error"].startswith("GET %s/metrics: " % gone.url)
    assert "; " in out["result"]["counters"][gone.url]["error"]  # before and after


def test_without_metrics_urls_nothing_is_read(tmp_path):
    with pytest.raises(StopError) as stop:
        run_step(FakeModule(_params(tmp_path)), ServingAPI(lambda: None))
    assert "counters" not in stop.value.args[0]["result"] and "msg" not in stop.value.args[0]
