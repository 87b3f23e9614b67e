"""The launcher's day-two commands: start's rolling replace and rollback, stop, status (roles/install/files/launcher).
Pure parts over real formatted inputs; the container lifecycle against the Docker daemon and the stand-in image."""
import hashlib
import json
import pathlib
import shutil
import socket
import uuid

import pytest
from test_support import engine_tls
from test_support.launcher import MODULES, SECRET, free_port, host_address, le, patch_planner, record, write_inputs
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS

# ------------------------------------------------------------------------------------------ /proc/net/tcp

# Lines as the kernel writes them (x86-64, little-endian words), from a host with: sshd on 0.0.0.0:2024, a
# listener on 127.0.0.1:18557, an established loopback connection (state 06, not a listener), and an engine on
# 172.31.241.12:5600 (0CF11FAC = AC.1F.F1.0C read little-endian).
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:487D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1165007 1 000000005f08a057 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1076 1 00000000982396f1 100 0 0 10 0
   2: 0100007F:47FF 0100007F:93B4 06 00000000:00000000 03:00000DEF 00000000     0        0 0 3 000000009eb07391
   3: 0CF11FAC:15E0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2231 1 0000000011111111 100 0 0 10 0
"""  # noqa: E501
# ::1:18556 and [::]:18555 as the kernel printed them; fd00::11:8000 written the same way (word-wise little-endian).
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:487C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1165006 1 000000006938c8b7 100 0 0 10 0
   1: 00000000000000000000000000000000:487B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1165005 1 00000000e8c69b18 100 0 0 10 0
   2: 000000FD000000000000000011000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1165009 1 00000000e8c69b19 100 0 0 10 0
   3: 000000FD000000000000000011000000:1F40 000000FD000000000000000012000000:C350 01 00000000:00000000 00:00000000 00000000     0        0 1165010 1 00000000e8c69b1a 100 0 0 10 0
"""  # noqa: E501


def test_listening_sockets_from_proc_net_tcp():
    assert le.listening_sockets(PROC_TCP, "little") == [
        ("127.0.0.1", 18557), ("0.0.0.0", 2024), ("172.31.241.12", 5600)]
    assert le.listening_sockets(PROC_TCP6, "little") == [("::1", 18556), ("::", 18555), ("fd00::11", 8000)]
    assert le.listening_sockets("garbage\n  9: zz:1 00:0 0A\n", "little") == []
    sockets = le.listening_sockets(PROC_TCP, "little") + le.listening_sockets(PROC_TCP6, "little")
    assert le.port_facts(sockets, 8000) == {"port": 8000, "listening": True, "addresses": ["fd00::11"]}
    assert le.port_facts(sockets, 5600)["addresses"] == ["172.31.241.12"]
    assert le.port_facts(sockets, 37812) == {"port": 37812, "listening": False, "addresses": []}  # 0x93B4: not LISTEN


def test_listening_sockets_of_this_host():
    """A real listener shows up in the real /proc/net/tcp, read in this host's byte order."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        table = le.port_table({"NARWHAL_HTTP_PORT": str(port), "NARWHAL_SIDE_CHANNEL_PORT": "9"})
    assert table["http"] == {"port": port, "listening": True, "addresses": ["127.0.0.1"]}
    assert table["side_channel"]["listening"] is False and table["error"] is None
    assert le.port_table({}, paths=("/nonexistent/tcp",))["error"].startswith("/nonexistent/tcp: ")


# ------------------------------------------------------------------------------------------ status verdict

HASH_A, HASH_B = "a" * 64, "b" * 64
IMAGE = "sha256:" + "c" * 64


def facts(**changes):
    """The facts of a healthy engine-2, as status collects them, with `changes` applied."""
    doc = {
        "engine": "engine-2", "container_name": "narwhal-engine-2",
        "container": {"name": "narwhal-engine-2", "id": "d" * 64, "state": "running", "running": True,
                      "restart_count": 0, "started_at": "2026-12-01T10:00:00Z", "exit_code": 0, "ours": True,
                      "engine_label": "engine-2", "image_id": IMAGE},
        "companions": [], "docker_error": None,
        "plan_hash_running": HASH_A, "plan_hash_installed": HASH_A, "run_id_running": "r1", "run_id_installed": "r2",
        "image_id_running": IMAGE, "image_id_planned": IMAGE,
        "deployment": {"container_id": "d" * 64, "action": "unchanged", "run_id": "r2"},
        "health": {"url": "http://10.0.0.2:8000/health", "ok": True, "status": 200, "error": None},
        "version": {"url": "http://10.0.0.2:8000/version", "served": "0.33.0", "expected": "0.33.0", "ok": True,
                    "error": None},
        "ports": {"http": {"port": 8000, "listening": True, "addresses": ["0.0.0.0"]},
                  "side_channel": {"port": 5600, "listening": True, "addresses": ["10.0.0.2"]}, "error": None},
        "version_probe": {"age_s": 12.0, "ok": True, "version": "0.33.0", "expected": "0.33.0"},
        "rollback": None,
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = dict(doc[key], **value)
        else:
            doc[key] = value
    return doc


def test_status_of_a_healthy_engine_has_no_problems():
    # a kept (unchanged) container created by run r1 serves the installed run r2: the same plan, no problem
    doc = le.verdict(facts())
    assert doc["problems"] == [] and doc["serving"] is True and doc["as_recorded"] is True


@pytest.mark.parametrize("changes, problem", [
    ({"container": {"state": "exited", "running": False, "exit_code": 137}},
     "container narwhal-engine-2 is exited (code 137)"),
    ({"container": {"state": "restarting", "running": False, "exit_code": 1, "restart_count": 4}},
     "container narwhal-engine-2 is restarting after exiting (code 1, restarted 4 times)"),
    ({"container": None}, "container narwhal-engine-2 does not exist: engine-2 is not started (run launch)"),
    ({"container": {"ours": False, "engine_label": None}},
     "container narwhal-engine-2 is not narwhal's container of engine-2 (label org.narwhal.engine=(none))"),
    ({"docker_error": "cannot reach the Docker daemon (refused)", "container": None},
     "cannot ask Docker about container narwhal-engine-2: cannot reach the Docker daemon (refused)"),
    ({"plan_hash_running": HASH_B},
     "running plan bbbbbbbbbbbb (run r1) differs from the installed run's aaaaaaaaaaaa (run r2); run launch to "
     "apply the installed run"),
    ({"plan_hash_running": None},
     "container narwhal-engine-2 carries no org.narwhal.plan-hash label: it was not started by this launcher"),
    ({"image_id_running": "sha256:" + "e" * 64},
     "container narwhal-engine-2 runs image sha256:%s, the plan's is %s" % ("e" * 64, IMAGE)),
    ({"deployment": None}, "the installed run r2 has no deployment.json (its launch did not complete)"),
    ({"deployment": {"container_id": "f" * 64}},
     "container narwhal-engine-2 is dddddddddddd, not ffffffffffff that the installed run's deployment.json records"),
    ({"health": {"ok": False, "status": 503}}, "GET http://10.0.0.2:8000/health answered HTTP 503"),
    ({"health": {"ok": False, "status": None, "error": "[Errno 111] Connection refused"},
      "version": {"served": None, "ok": False, "error": "[Errno 111] Connection refused"}},
     "GET http://10.0.0.2:8000/health failed: [Errno 111] Connection refused"),
    ({"version": {"served": "0.32.0", "ok": False}},
     "GET http://10.0.0.2:8000/version answered version 0.32.0 but checked.json vllm_api_version is 0.33.0"),
    ({"version": {"expected": None, "ok": False}},
     "checked.json is missing from the installed run directory: the image was never checked for run r2 (run launch)"),
    ({"ports": {"side_channel": {"port": 5600, "listening": False, "addresses": []}}},
     "nothing listens on TCP port 5600 (the NIXL side channel, VLLM_NIXL_SIDE_CHANNEL_PORT)"),
    ({"ports": {"http": {"port": 8000, "listening": False, "addresses": []}}},
     "nothing listens on TCP port 8000 (the engine's HTTP port, NARWHAL_HTTP_PORT)"),
    ({"ports": {"error": "/proc/net/tcp: Permission denied"}},
     "cannot read the listening sockets: /proc/net/tcp: Permission denied"),
    ({"version_probe": {"age_s": 30.5, "ok": False, "version": "0.32.0", "expected": "0.33.0"}},
     "the last version probe (30.5 s ago) found version 0.32.0, not the checked 0.33.0"),
    ({"rollback": {"cause": "the container exited (code 1)", "restored_serving": True}},
     "the installed run's start failed and rolled back (the previous container serves again): the container "
     "exited (code 1); see rollback.json"),
], ids=lambda v: None if isinstance(v, dict) else v[:40])
def test_status_problem_names_what_differs(changes, problem):
    doc = le.verdict(facts(**changes))
    assert problem in doc["problems"], doc["problems"]
    assert doc["as_recorded"] is False


def test_status_serving_needs_running_health_and_version():
    assert le.verdict(facts(container={"state": "exited", "running": False}))["serving"] is False
    assert le.verdict(facts(health={"ok": False, "status": 503}))["serving"] is False
    assert le.verdict(facts(version={"served": "0.32.0", "ok": False}))["serving"] is False
    # serving, but not as recorded: another plan answers
    doc = le.verdict(facts(plan_hash_running=HASH_B))
    assert doc["serving"] is True and doc["as_recorded"] is False and len(doc["problems"]) == 1


def test_status_restarts_by_the_policy_are_noted_not_a_problem():
    doc = le.verdict(facts(container={"restart_count": 2}))
    assert doc["as_recorded"] is True and doc["problems"] == []
    assert doc["notes"] == ["container narwhal-engine-2 was restarted 2 times by its restart policy (it exited; see "
                            "docker logs)"]
    assert le.verdict(facts())["notes"] == []


def test_status_shows_the_containers_log_driver_and_rotation():
    inspected = {"Name": "/narwhal-engine-2", "Id": "d" * 64, "State": {"Status": "running"}, "Image": IMAGE,
                 "Config": {"Labels": {"org.narwhal.engine": "engine-2"}},
                 "HostConfig": {"LogConfig": {"Type": "local", "Config": {"max-size": "20m", "max-file": "3"}}}}
    expected = {"Type": "local", "Config": {"max-size": "20m", "max-file": "3"}}
    assert le.container_facts(inspected, "engine-2")["log"] == expected
    del inspected["HostConfig"]
    assert le.container_facts(inspected, "engine-2")["log"] is None


TLS = {"url": "https://10.0.0.2:8000", "not_after": "2027-12-01T00:00:00Z", "days_left": 300, "sha256": HASH_A,
       "installed_sha256": HASH_A, "error": None}


@pytest.mark.parametrize("tls, problem", [
    ({"url": "https://10.0.0.2:8000", "error": "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                               "certificate has expired (_ssl.c:1006)"},
     "the certificate served at https://10.0.0.2:8000 fails: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
     "failed: certificate has expired (_ssl.c:1006); an expired certificate or one the installed CA did not sign is "
     "refused: prepare again (it issues or checks the certificates), then launch"),
    (dict(TLS, days_left=-2, not_after="2026-11-29T00:00:00Z"),
     "the certificate served at https://10.0.0.2:8000 expired on 2026-11-29T00:00:00Z; prepare again, then launch"),
    (dict(TLS, sha256=HASH_B), "the certificate served at https://10.0.0.2:8000 (sha256 bbbbbbbbbbbb) is not the "
                               "installed one (aaaaaaaaaaaa); run launch to serve it"),
])
def test_status_names_an_engine_whose_certificate_fails(tls, problem):
    doc = le.verdict(facts(tls=tls))
    assert doc["problems"] == [problem] and doc["as_recorded"] is False


def test_status_reports_the_days_left_and_notes_a_certificate_near_its_end():
    doc = le.verdict(facts(tls=TLS))
    assert doc["problems"] == [] and doc["notes"] == [] and doc["tls"]["days_left"] == 300
    doc = le.verdict(facts(tls=dict(TLS, days_left=12)))
    assert doc["problems"] == [] and doc["notes"] == [
        "the certificate served at https://10.0.0.2:8000 expires in 12 days (2027-12-01T00:00:00Z); the next prepare "
        "issues a new one (site mode) or refuses it (operator mode)"]
    assert le.verdict(facts(tls=None))["problems"] == []  # TLS off
    # a host after the head of an engine across hosts serves no HTTP: no certificate to ask
    assert le.verdict(facts(headless=True, tls={"url": "x", "error": "refused"}))["problems"] == []


def test_certificate_facts_from_what_getpeercert_gives():
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    found = le.certificate_facts("https://h:1", "Jan 25 08:00:00 2027 GMT", b"der", HASH_A, now)
    assert found == {"url": "https://h:1", "not_after": "2027-01-25T08:00:00Z", "days_left": 10,
                     "sha256": hashlib.sha256(b"der").hexdigest(), "installed_sha256": HASH_A, "error": None}
    assert le.certificate_facts("u", "Jan 15 07:00:00 2027 GMT", b"", "", now)["days_left"] == -1


def test_status_reads_the_served_certificate(tmp_path):
    ca, other = engine_tls.make_ca(), engine_tls.make_ca("another CA")
    leaf = engine_tls.make_leaf(ca, days=90)
    served = engine_tls.write_tls_dir(tmp_path / "served", ca[1], leaf)
    server = engine_tls.https_server(engine_tls.VersionEngine, served)
    env = {"NARWHAL_TLS_DIR": str(served), "NARWHAL_HTTP_PORT": str(server.server_address[1]),
           "NARWHAL_BIND_ADDRESS": "127.0.0.1", "NARWHAL_ADVERTISED_ADDRESS": "10.0.0.2",
           "NARWHAL_TLS_CERT_SHA256": hashlib.sha256(engine_tls.der(leaf[1])).hexdigest()}
    try:
        found = le.tls_facts(env)
        assert found["error"] is None and found["sha256"] == env["NARWHAL_TLS_CERT_SHA256"]
        assert found["days_left"] in (88, 89) and found["url"] == "https://127.0.0.1:%d" % server.server_address[1]
        health, version, _nixl = le.http_facts(env, "0.33.0")
        assert health["ok"] and version["ok"]
        (served / "ca.crt").write_bytes(engine_tls.pem(other[1]))  # the installed CA did not sign it
        found = le.tls_facts(env)
        assert "certificate verify failed" in found["error"] and "days_left" not in found
        assert le.http_facts(env, "0.33.0")[0]["ok"] is False
        assert le.tls_facts(dict(env, NARWHAL_TLS_DIR="")) is None
    finally:
        server.shutdown()
        server.server_close()


def test_status_document_strings_are_redacted():
    doc = le.redact_strings({"rollback": {"failed_log_tail": ["VLLM_API_KEY=%s" % SECRET]}, "n": [1, None]})
    assert SECRET not in json.dumps(doc) and doc["n"] == [1, None]


# ------------------------------------------------------------------------------------------ start: pure parts

FAILED = {"name": "narwhal-engine-2-failed", "plan_hash": HASH_B, "run_id": "r2", "kept": True}
RESTORED = {"id": "0123456789abcdef" * 4, "plan_hash": HASH_A, "run_id": "r1", "serving": True, "started": True,
            "error": None}
TAIL = "INFO starting\n\nTraceback (most recent call last):\n  ...\n    ^^^^^^\n" \
       "OSError: [Errno 98] Address already in use\n"


def test_rollback_message_when_the_previous_serves_again():
    text = le.rollback_message("engine-2", FAILED, "the container exited (code 1) before http://x/health answered",
                               RESTORED, TAIL)
    assert text == (
        "engine-2: the new container (plan bbbbbbbbbbbb, run r2) failed: the container exited (code 1) before "
        "http://x/health answered; rolled back to the previous container 0123456789ab (plan aaaaaaaaaaaa, run r1) "
        "which is serving again; the failed container is kept as narwhal-engine-2-failed (docker logs "
        "narwhal-engine-2-failed); its last log lines: INFO starting | Traceback (most recent call last): | ... | "
        "OSError: [Errno 98] Address already in use")
    assert "\n" not in text


def test_rollback_message_when_the_engine_is_down():
    text = le.rollback_message("engine-2", FAILED, "x", None, "")
    assert "there was no previous container to roll back to, so engine-2 is down" in text
    assert text.endswith("; it left no log lines")
    down = dict(RESTORED, serving=False, error="http://x/health did not answer 200 within 5 s (last: refused)")
    assert "rolled back to the previous container 0123456789ab (plan aaaaaaaaaaaa, run r1) but it is not serving " \
           "(http://x/health did not answer 200 within 5 s (last: refused)), so engine-2 is down" in \
           le.rollback_message("engine-2", FAILED, "x", down, TAIL)
    stopped = dict(RESTORED, serving=False, started=False)
    assert "it was not running before this start and is left stopped, so engine-2 is down" in \
           le.rollback_message("engine-2", dict(FAILED, kept=False), "x", stopped, TAIL)
    assert "kept as" not in le.rollback_message("engine-2", dict(FAILED, kept=False), "x", stopped, TAIL)


def test_log_excerpt_keeps_the_last_lines_bounded():
    tail = "\n".join("line %d" % i for i in range(50))
    assert le.log_excerpt(tail) == " | ".join("line %d" % i for i in range(30, 50))
    assert len(le.log_excerpt("x" * 5000)) == 2003 and le.log_excerpt(None) == ""


def test_served_port_and_ready_timeout():
    attrs = {"Config": {"Cmd": ["serve", "/models/m", "--port", "8123", "--host", "0.0.0.0"]}}
    assert le.served_port(attrs, 8000) == 8123
    assert le.served_port({"Config": {"Cmd": ["serve", "--port=9001"]}}, 8000) == 9001
    assert le.served_port({"Config": {"Cmd": None}}, 8000) == 8000
    assert le.ready_timeout_from({}) == 300.0
    assert le.ready_timeout_from({}, 20) == 20.0
    with pytest.raises(le.LaunchError, match=r"--ready-timeout=0 must be a number of seconds"):
        le.ready_timeout_from({}, 0)


def test_a_previous_container_is_probed_where_and_as_it_serves():
    """A rollback waits for the previous container's /health on its own port and bind address, over https with the
    TLS directory it mounts when it serves TLS, whatever the installed run says."""
    role_env = {"NARWHAL_HTTP_PORT": "8000", "NARWHAL_ADVERTISED_ADDRESS": "10.0.0.2",
                "NARWHAL_BIND_ADDRESS": "10.0.0.2", "NARWHAL_TLS_DIR": "/opt/narwhal/tls/engine-2"}
    plain = {"Config": {"Cmd": ["serve", "/models/m", "--host", "0.0.0.0", "--port", "8123"]}}
    served = le.served_role_env(plain, role_env)
    assert (served["NARWHAL_HTTP_PORT"], served["NARWHAL_BIND_ADDRESS"], served["NARWHAL_TLS_DIR"]) == \
        ("8123", "0.0.0.0", "")
    assert le.probe_url(served, "/health") == "http://10.0.0.2:8123/health"
    tls = {"Config": {"Cmd": ["serve", "/m", "--host=10.0.0.7", "--port", "8000", "--ssl-certfile",
                              "/narwhal/tls/server.crt"]},
           "Mounts": [{"Source": "/srv/m", "Destination": "/models/m"},
                      {"Source": "/opt/narwhal/tls/old", "Destination": "/narwhal/tls"}]}
    served = le.served_role_env(tls, dict(role_env, NARWHAL_TLS_DIR=""))
    assert served["NARWHAL_TLS_DIR"] == "/opt/narwhal/tls/old"
    assert le.probe_url(served, "/health") == "https://10.0.0.7:8000/health"
    older = {"Config": {"Cmd": ["serve", "/m", "--port", "8000"]}}  # from before --host was the bind address
    assert le.probe_url(le.served_role_env(older, role_env), "/health") == "http://10.0.0.2:8000/health"


def test_the_ready_timeout_help_is_true():
    """--help: 300 s by hand, the site's NARWHAL_ENGINE_READY_TIMEOUT (default 900) from the launch stage; a role
    environment cannot carry a timeout (the launcher refuses the key)."""
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        le.main(["--help"])
    text = " ".join(out.getvalue().split())
    assert "(default 300; the launch stage passes the site's NARWHAL_ENGINE_READY_TIMEOUT, default 900)" in text
    assert le.DEFAULT_READY_TIMEOUT == 300.0
    for tasks in ("start.yml", "restart.yml"):  # a start, and a restart of a decode (start --force)
        launch = " ".join((REPO / "roles" / "launch" / "tasks" / tasks).read_text().split())
        assert "--ready-timeout {{ narwhal_site.site.NARWHAL_ENGINE_READY_TIMEOUT }}" in launch, tasks
        assert "{{ __launch_launcher }} start" in launch, tasks
    # and the start of an unchanged engine in the preview's command (preview --keep-unchanged)
    keep = " ".join((REPO / "roles" / "launch" / "vars" / "main.yml").read_text().split())
    assert "['--keep-unchanged', '--ready-timeout', narwhal_site.site.NARWHAL_ENGINE_READY_TIMEOUT | string]" in keep
    catalogue = {spec["name"]: spec for spec in INPUTS}
    assert catalogue["NARWHAL_ENGINE_READY_TIMEOUT"]["default"] == 900
    with pytest.raises(le.LaunchError, match="NARWHAL_ENGINE_READY_TIMEOUT is not a key the launcher reads"):
        le.parse_role_env("NARWHAL_ENGINE_READY_TIMEOUT=900\n", "engine.env")


def test_status_refuses_an_unreadable_role_env_with_exit_2(tmp_path, capsys):
    assert le.main(["--role-env", str(tmp_path / "missing.env"), "status"]) == 2
    assert "role environment %s" % (tmp_path / "missing.env") in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ docker

def _docker():
    try:
        import docker

        client = docker.from_env()
        client.ping()
        return docker, client, client.images.get("narwhal-sim/engine-standin:latest")
    except Exception:  # no SDK, no daemon or no image
        return None, None, None


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A CPU stand-in engine's inputs on free ports; containers are named narwhal-launcher-test-<engine>[-...] and
    removed afterwards."""
    docker, client, image = _docker()
    if client is None:
        pytest.skip("no Docker daemon or stand-in image")
    address = host_address()
    ports = [p for p in range(18531, 18599) if free_port(p)][:3]
    if address is None or len(ports) < 3:
        pytest.skip("no routable host address or free 185xx ports")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text("{}")
    engine = "engine-%d" % (90000 + uuid.uuid4().int % 9999)
    rec = record("engine-1")
    rec.update(engine=engine, accelerator={"vendor": "cpu", "product": "cpu", "count": 0}, gpu_ids=[],
               gpu_host_indices=[], tensor_parallel_size=1, accelerator_devices=[])
    rec["runtime"].update(image_id=image.id, platform="cpu", kv_buffer_device="cpu", model_path=str(model))
    rec["transfer"]["ucx_tls"] = ["tcp"]
    name = "narwhal-launcher-test-%s" % engine
    original = MODULES["plan"].container_spec

    def container_spec(record_, role_env_):
        plan = original(record_, role_env_)
        plan["name"] = name
        return plan

    patch_planner(monkeypatch, "container_spec", container_spec)
    monkeypatch.setattr(MODULES["start"], "STOP_TIMEOUT", 2)
    state = {"docker": docker, "client": client, "rec": rec, "name": name, "engine": engine, "ports": ports,
             "address": address, "tmp": tmp_path}

    def inputs(run_id="r1", side_port=None, **overrides):
        env_path, env = write_inputs(tmp_path, rec, tag="-" + run_id, NARWHAL_HTTP_PORT=str(ports[0]),
                                     NARWHAL_SIDE_CHANNEL_PORT=str(side_port or ports[1]),
                                     NARWHAL_ADVERTISED_ADDRESS=address, NARWHAL_FABRIC_INTERFACE="lo",
                                     NARWHAL_RUN_ID=run_id, NARWHAL_RUN_DIR=str(tmp_path / "runs" / run_id),
                                     **overrides)
        return str(env_path), pathlib.Path(env["NARWHAL_RUN_DIR"])

    state["inputs"] = inputs
    try:
        yield state
    finally:
        for each in le.companion_names(name):
            try:
                client.containers.get(each).remove(force=True)
            except docker.errors.NotFound:
                pass
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)


def _get(client, name):
    try:
        return client.containers.get(name)
    except Exception:  # docker.errors.NotFound
        return None


def _status(env_path, capsys):
    capsys.readouterr()
    assert le.main(["--role-env", env_path, "status"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    return json.loads(out)


def test_replace_status_and_stop(standin, capsys):
    client, name = standin["client"], standin["name"]
    env1, run1 = standin["inputs"]("r1")
    assert le.main(["--role-env", env1, "start", "--ready-timeout", "60"]) == 0
    first = client.containers.get(name)
    assert capsys.readouterr().out.strip() == "started %s %s" % (name, first.id)
    assert first.labels["org.narwhal.run-id"] == "r1"
    assert json.loads((run1 / "version-probe.json").read_text())["ok"] is True  # start waited for /version

    doc = _status(env1, capsys)
    assert doc["problems"] == [] and doc["serving"] is True and doc["as_recorded"] is True, doc["problems"]
    assert doc["container"]["id"] == first.id and doc["container"]["state"] == "running"
    assert doc["run_id_running"] == doc["run_id_installed"] == "r1"
    assert doc["plan_hash_running"] == doc["plan_hash_installed"] == json.loads(
        (run1 / "plan.json").read_text())["plan_hash"]
    assert doc["ports"]["http"]["listening"] and doc["ports"]["side_channel"]["listening"]
    assert doc["ports"]["side_channel"]["addresses"] == [standin["address"]]
    assert doc["nixl"]["bytes_transferred"] == 0.0 and doc["nixl"]["failed_transfers"] == 0.0
    assert doc["version"]["served"] == doc["version"]["expected"] and doc["version_probe"]["ok"] is True

    # a new run with another plan: rolling replace, the previous container gone once the new one is ready
    standin["rec"]["runtime"]["extra_args"] = ["--max-model-len", "2048"]
    env2, run2 = standin["inputs"]("r2")
    assert le.main(["--role-env", env2, "start", "--ready-timeout", "60"]) == 0
    second = client.containers.get(name)
    assert capsys.readouterr().out.strip() == "replaced %s %s" % (name, second.id)
    assert second.id != first.id and second.labels["org.narwhal.run-id"] == "r2"
    assert _get(client, first.id) is None and _get(client, name + "-previous") is None
    deployment = json.loads((run2 / "deployment.json").read_text())
    assert deployment["previous_container_id"] == deployment["replaced_container_id"] == first.id
    assert deployment["previous_plan_hash"] == first.labels["org.narwhal.plan-hash"] != deployment["plan_hash"]
    assert deployment["previous_run_id"] == "r1" and deployment["action"] == "replaced"

    # the installed run r1 is no longer what runs
    doc = _status(env1, capsys)
    assert doc["serving"] is True and doc["as_recorded"] is False
    assert any(p.startswith("running plan %s (run r2) differs from the installed run's %s (run r1)"
                            % (second.labels["org.narwhal.plan-hash"][:12], first.labels["org.narwhal.plan-hash"][:12]))
               for p in doc["problems"]), doc["problems"]

    # stopped by hand: status names it
    second.stop(timeout=2)
    doc = _status(env2, capsys)
    assert doc["container"]["state"] == "exited" and doc["serving"] is False
    assert any(p.startswith("container %s is exited (code " % name) for p in doc["problems"]), doc["problems"]
    assert "nothing listens on TCP port %d (the engine's HTTP port, NARWHAL_HTTP_PORT)" % standin["ports"][0] \
        in doc["problems"]

    # stop, twice
    assert le.main(["--role-env", env2, "stop"]) == 0
    assert capsys.readouterr().out.splitlines() == ["stopped %s %s" % (name, second.id)]
    assert _get(client, name) is None
    assert le.main(["--role-env", env2, "stop"]) == 0
    assert capsys.readouterr().out.strip() == "absent"
    doc = _status(env2, capsys)
    assert doc["container"] is None and doc["serving"] is False
    assert "container %s does not exist: %s is not started (run launch)" % (name, standin["engine"]) in doc["problems"]


def test_failed_start_rolls_back_to_the_previous_container(standin, capsys):
    client, name = standin["client"], standin["name"]
    env1, run1 = standin["inputs"]("r1")
    assert le.main(["--role-env", env1, "start", "--ready-timeout", "60"]) == 0
    first = client.containers.get(name)
    # the next run moves the NIXL side channel to a port something else holds: the new engine exits at once
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", standin["ports"][2]))
        holder.listen()
        env2, run2 = standin["inputs"]("r2", side_port=standin["ports"][2])
        capsys.readouterr()
        assert le.main(["--role-env", env2, "start", "--ready-timeout", "120"]) == 2
        out, err = capsys.readouterr()
    assert out == "" and SECRET not in err
    lines = err.splitlines()
    assert lines[0].startswith("image check ok (ran): ") and len(lines) == 2  # the check's verdict, then ONE error
    err = lines[1]
    failed = client.containers.get(name + "-failed")
    restored = client.containers.get(name)
    plan2 = json.loads((run2 / "plan.json").read_text())["plan_hash"]
    assert err.startswith("launch_engine: error: %s: the new container (plan %s, run r2) failed: the container "
                          "exited" % (standin["engine"], plan2[:12])), err
    assert "rolled back to the previous container %s (plan %s, run r1) which is serving again" % (
        first.id[:12], first.labels["org.narwhal.plan-hash"][:12]) in err
    assert "kept as %s-failed" % name in err and "Address already in use" in err
    # the previous container serves again under its name; the failed one is kept, stopped, for docker logs
    assert restored.id == first.id and restored.status == "running"
    assert failed.status == "exited" and failed.labels["org.narwhal.run-id"] == "r2"
    assert b"Address already in use" in failed.logs()
    assert _get(client, name + "-previous") is None
    rollback = json.loads((run2 / "rollback.json").read_text())
    assert rollback["failed_container_id"] == failed.id and rollback["restored_container_id"] == first.id
    assert rollback["restored_plan_hash"] == first.labels["org.narwhal.plan-hash"]
    assert rollback["restored_run_id"] == "r1" and rollback["restored_serving"] is True
    assert rollback["cause"].startswith("the container exited") and rollback["failed_log_tail"]
    assert (run2 / "rollback.json").stat().st_mode & 0o777 == 0o600
    assert not (run2 / "deployment.json").exists()

    doc = _status(env2, capsys)
    assert doc["serving"] is True and doc["as_recorded"] is False and doc["rollback"]["restored_serving"] is True
    assert {c["name"] for c in doc["companions"]} == {name + "-failed"}
    assert any(p.startswith("the installed run's start failed and rolled back (the previous container serves "
                            "again)") for p in doc["problems"]), doc["problems"]

    # stop removes the engine's container and its companions
    assert le.main(["--role-env", env2, "stop"]) == 0
    assert capsys.readouterr().out.splitlines() == ["stopped %s %s" % (name, first.id),
                                                    "stopped %s-failed %s" % (name, failed.id)]

    # no previous container: the engine is down, the failed container kept
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", standin["ports"][2]))
        holder.listen()
        assert le.main(["--role-env", env2, "start", "--ready-timeout", "120"]) == 2
    err = capsys.readouterr().err
    assert "there was no previous container to roll back to, so %s is down" % standin["engine"] in err
    assert _get(client, name) is None and client.containers.get(name + "-failed").status == "exited"
    assert json.loads((run2 / "rollback.json").read_text())["restored_container_id"] is None


def test_stop_refuses_a_container_that_is_not_ours(standin, capsys):
    docker, client, name = standin["docker"], standin["client"], standin["name"]
    env1, _run1 = standin["inputs"]("r1")
    image = standin["rec"]["runtime"]["image_id"]
    foreign = client.containers.create(image, entrypoint=["sleep"], command=["60"], name=name + "-previous",
                                       labels={"org.narwhal.engine": "engine-1"})
    try:
        assert le.main(["--role-env", env1, "stop"]) == 2
        err = capsys.readouterr().err
        assert "container %s-previous (%s) is not narwhal's container of %s (label org.narwhal.engine=engine-1)" % (
            name, foreign.short_id, standin["engine"]) in err
        assert client.containers.get(foreign.id)  # left alone
    finally:
        try:
            foreign.remove(force=True)
        except docker.errors.NotFound:
            pass


class _Restarted:
    """The Engine API client's view of a container its restart policy brought back: running, RestartCount > 0."""

    def __init__(self, status, restarts, code):
        self.attrs = {"RestartCount": restarts, "State": {"Status": status, "ExitCode": code}}

    def container(self, name):
        return self.attrs

    def logs(self, name, tail):
        return b"OSError: [Errno 98] Address already in use\nVLLM_API_KEY=" + SECRET.encode() + b"\n"


def test_a_container_its_restart_policy_restarts_counts_as_exited():
    """unless-stopped brings a crashing engine back at once: `restarting`, or even `running` again with a restart
    count; either is the end of this container's start, not a reason to wait for the timeout."""
    how, tail = le.container_exit(_Restarted("running", 2, 0), "x", SECRET)
    assert how == "exited (code 0; its restart policy restarted it 2 times)" and SECRET not in tail
    assert le.container_exit(_Restarted("restarting", 0, 1), "x")[0] == \
        "exited (code 1; its restart policy restarted it 1 times)"
    assert le.container_exit(_Restarted("running", 0, 0), "x") is None


def test_an_unchanged_engine_is_probed_and_a_wrong_version_is_refused_in_place(standin, capsys):
    client, name = standin["client"], standin["name"]
    env1, run1 = standin["inputs"]("r1")
    assert le.main(["--role-env", env1, "start", "--ready-timeout", "60"]) == 0
    first = client.containers.get(name)
    capsys.readouterr()
    (run1 / "version-probe.json").unlink()
    assert le.main(["--role-env", env1, "start", "--ready-timeout", "60"]) == 0
    assert capsys.readouterr().out.strip() == "unchanged"
    assert json.loads((run1 / "version-probe.json").read_text())["ok"] is True  # probed again, as probe-version does
    # checked.json says another version than the one served: start reports it, exit 2, and changes nothing
    checked = json.loads((run1 / "checked.json").read_text())
    checked["vllm_api_version"] = "0.0.1"
    (run1 / "checked.json").write_text(json.dumps(checked))
    assert le.main(["--role-env", env1, "start", "--ready-timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert "the running container of this plan (%s) does not serve" % name in err
    assert "checked.json vllm_api_version is 0.0.1" in err and SECRET not in err
    again = client.containers.get(name)
    assert again.id == first.id and again.status == "running" and _get(client, name + "-failed") is None


def _preview(env_path, capsys, *args):
    capsys.readouterr()
    code = le.main(["--role-env", env_path, "preview", *args])
    out, err = capsys.readouterr()
    assert SECRET not in out and SECRET not in err
    return code, out, err


def test_preview_keeps_an_unchanged_engine_in_the_same_command(standin, capsys):
    """preview --keep-unchanged: an unchanged engine is started (kept, probed) in the preview's command, which reports
    start's line and the digests of the run's files; any other action is only previewed, nothing started."""
    import hashlib

    client, name = standin["client"], standin["name"]
    env1, run1 = standin["inputs"]("r1")
    # nothing runs yet: a start, previewed only (no container, no plan.json written)
    code, out, _err = _preview(env1, capsys, "--keep-unchanged", "--ready-timeout", "60")
    doc = json.loads(out)
    assert code == 0 and doc["action"] == "start" and "kept" not in doc and "records" not in doc
    assert _get(client, name) is None and not (run1 / "plan.json").exists()

    assert le.main(["--role-env", env1, "start", "--ready-timeout", "60"]) == 0
    first = client.containers.get(name)
    (run1 / "version-probe.json").unlink()
    (run1 / "stray").mkdir()
    code, out, err = _preview(env1, capsys, "--keep-unchanged", "--ready-timeout", "60")
    assert code == 0, err
    doc = json.loads(out)
    assert code == 0 and doc["action"] == "unchanged" and doc["kept"] == "unchanged"
    assert json.loads((run1 / "version-probe.json").read_text())["ok"] is True  # start probed /version again
    files = sorted(p.name for p in run1.iterdir() if p.is_file())
    assert {"plan.json", "checked.json", "deployment.json", "version-probe.json"} <= set(files)
    assert doc["records"] == dict((n, hashlib.sha256((run1 / n).read_bytes()).hexdigest()) for n in files)
    assert doc["deployment"] == json.loads((run1 / "deployment.json").read_text())
    assert doc["deployment"]["container_id"] == first.id and doc["deployment"]["run_id"] == "r1"
    assert client.containers.get(name).id == first.id

    # without the option, the same preview starts nothing and reports no records
    code, out, _err = _preview(env1, capsys)
    assert code == 0 and json.loads(out)["action"] == "unchanged" and "kept" not in json.loads(out)

    # unchanged but not serving the checked version: exit 2 with start's message, the container left as it is
    checked = json.loads((run1 / "checked.json").read_text())
    checked["vllm_api_version"] = "0.0.1"
    (run1 / "checked.json").write_text(json.dumps(checked))
    code, out, err = _preview(env1, capsys, "--keep-unchanged", "--ready-timeout", "5")
    assert code == 2 and out == ""
    assert "the running container of this plan (%s) does not serve" % name in err
    assert client.containers.get(name).id == first.id

    # a new plan: replace, previewed only; the running container untouched
    standin["rec"]["runtime"]["extra_args"] = ["--max-model-len", "2048"]
    env2, _run2 = standin["inputs"]("r2")
    code, out, _err = _preview(env2, capsys, "--keep-unchanged", "--ready-timeout", "60")
    doc = json.loads(out)
    assert code == 0 and doc["action"] == "replace" and "kept" not in doc and doc["diff"]
    assert client.containers.get(name).id == first.id


def test_status_of_a_headless_host_asks_no_http_and_reads_its_own_side_channel():
    """A host after the head of an engine across hosts has no HTTP API: its status is its container, plan and the side
    channel of its first global DP rank; nothing about /health or /version is a problem there."""
    doc = {"engine": "engine-1", "container_name": "narwhal-engine-1", "headless": True,
           "container": {"running": True, "ours": True, "id": "c" * 64, "state": "running"},
           "plan_hash_running": "a" * 64, "plan_hash_installed": "a" * 64, "run_id_installed": "run-1",
           "image_id_running": "sha256:" + "b" * 64, "image_id_planned": "sha256:" + "b" * 64,
           "deployment": {"container_id": "c" * 64}, "health": {"skipped": "headless"},
           "version": {"skipped": "headless", "expected": "0.33.0"}, "nixl": {},
           "ports": {"http": {"port": 8000, "listening": False}, "side_channel": {"port": 5601, "listening": True},
                     "error": None}}
    verdict = le.verdict(doc)
    assert verdict["problems"] == [] and verdict["serving"] and verdict["as_recorded"]
    doc["ports"]["side_channel"]["listening"] = False
    assert le.verdict(doc)["problems"] == ["nothing listens on TCP port 5601 (the NIXL side channel, "
                                           "VLLM_NIXL_SIDE_CHANNEL_PORT)"]
    doc["version"] = {"skipped": "headless", "expected": None}
    doc["ports"]["side_channel"]["listening"] = True
    assert "checked.json is missing" in le.verdict(doc)["problems"][0]
