"""Shared by the launcher tests: the launcher's parts (roles/install/files/launcher, imported from the source
tree) and the planner, gathered in one namespace `le`; the hand-shaped records (tests/fixtures/hand-shaped) and a
role environment (TLS off, the key guard in /opt/narwhal/guard, or beside the inputs write_inputs writes); `zipapp`
builds the real artefact the way prepare does."""
import copy
import hashlib
import json
import shutil
import socket
import sys
import types

from test_support.paths import GUARD, HAND_LAUNCH_CONFIG, REPO

LAUNCHER_DIR = REPO / "roles" / "install" / "files" / "launcher"
SECRET = "s3cr3t-Key-0123456789abcdef"
GUARD_SHA256 = hashlib.sha256(GUARD.read_bytes()).hexdigest()

sys.path.insert(0, str(LAUNCHER_DIR))

from narwhal_launcher import cli, common, health, image_check, in_image, start, status, stop  # noqa: E402

from ansible_collections.narwhal.deploy.plugins.module_utils._common import secrets as _secrets  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import args as _args  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import container as _container  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import fields as _fields  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import labels as _labels  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import lifecycle as _lifecycle  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import parallel as _parallel  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import role_env as _role_env  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan import transfer as _transfer  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare import launcher as _launcher  # noqa: E402

MODULES = {"plan": _container, "fields": _fields, "labels": _labels, "lifecycle": _lifecycle, "parallel": _parallel,
           "transfer": _transfer, "common": common, "image_check": image_check, "health": health, "start": start,
           "cli": cli,
           "in_image": in_image, "status": status, "stop": stop}


def _namespace():
    names = {}
    for module in (_secrets, _args, _role_env, _fields, _labels, _lifecycle, _parallel, _transfer, _container, common,
                   image_check, health, start, stop, status, cli):
        names.update((k, v) for k, v in vars(module).items() if not k.startswith("__"))
    names["build_plan"] = lambda role_env, record: _container.container_spec(record, role_env)
    return types.SimpleNamespace(**names)


le = _namespace()


def zipapp(tmp_path):
    """The launcher artefact built from the checkout, as prepare builds it."""
    path = tmp_path / "launch_engine.pyz"
    path.write_bytes(_launcher.build_zipapp(_launcher.launcher_sources(str(REPO))))
    return path


def record(name="engine-1"):
    return copy.deepcopy(json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"][name])


def role_env(engine="engine-1", **overrides):
    env = {
        "NARWHAL_ENGINE": engine,
        "NARWHAL_RECORD": "/opt/narwhal/config/engine-launch.%s.json" % engine,
        "NARWHAL_MODEL_MOUNT": "/models/tiny-llama",
        "NARWHAL_SERVED_MODEL_NAME": "tiny-llama",
        "NARWHAL_BIND_FAMILY": "ipv4",
        "NARWHAL_HTTP_PORT": "8000",
        "NARWHAL_ADVERTISED_ADDRESS": "172.31.241.11" if engine == "engine-1" else "172.31.241.12",
        "NARWHAL_SIDE_CHANNEL_PORT": "5600",
        "NARWHAL_FABRIC_INTERFACE": "eth1",
        "NARWHAL_API_KEY_FILE": "/opt/narwhal/secrets/api-key",
        "NARWHAL_RUN_DIR": "/opt/narwhal/runs/r1",
        "NARWHAL_RUN_ID": "r1",
        "NARWHAL_GUARD_DIR": "/opt/narwhal/guard",
        "NARWHAL_GUARD_SHA256": GUARD_SHA256,
        "NARWHAL_TLS_DIR": "",
        "NARWHAL_TLS_CERT_SHA256": "",
    }
    env.update(overrides)
    # vllm serve --host: the advertised address unless the test names another (NARWHAL_ENGINE_BIND)
    env.setdefault("NARWHAL_BIND_ADDRESS", env["NARWHAL_ADVERTISED_ADDRESS"])
    return env


def write_inputs(tmp_path, rec, tag="", **overrides):
    """The record, a 0600 API key file (in tmp_path/secrets) and a role environment pointing at both, under tmp_path
    (`tag` names a second set of record and role environment, as another run installs them)."""
    rec_path = tmp_path / ("record%s.json" % tag)
    rec_path.write_text(json.dumps(rec))
    key = tmp_path / "secrets" / "engine-api.key"  # in a directory of its own, mounted by the engine (install's)
    key.parent.mkdir(exist_ok=True)
    key.write_text(SECRET + "\n")
    key.chmod(0o600)
    guard = tmp_path / "guard"  # the key guard, as install puts it
    guard.mkdir(exist_ok=True)
    shutil.copy(GUARD, guard / GUARD.name)
    given = {"NARWHAL_RECORD": str(rec_path), "NARWHAL_API_KEY_FILE": str(key),
             "NARWHAL_RUN_DIR": str(tmp_path / "runs" / "r1"), "NARWHAL_GUARD_DIR": str(guard)}
    given.update(overrides)
    env = role_env(rec["engine"], **given)
    env_path = tmp_path / ("engine%s.env" % tag)
    env_path.write_text("".join("%s=%s\n" % kv for kv in env.items()))
    return env_path, env


def host_address():
    """This machine's outward IPv4 address (what a host-network engine binds), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
            address = sock.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def free_port(port):
    """Whether TCP `port` can be bound on every address now."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def patch_planner(monkeypatch, name, value):
    """Replace the planner's `name` for a test, in the planner module and in every launcher part that imported it
    (the launcher imports the planner's functions by name)."""
    for module in MODULES.values():
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def standin_docker():
    """(docker SDK, client) when the SDK, a daemon and the stand-in image are here, else (None, None)."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get("narwhal-sim/engine-standin:latest")
        return docker, client
    except Exception:  # no SDK, no daemon or no image
        return None, None
