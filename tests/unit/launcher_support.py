"""Shared by the launcher tests: roles/install/files/launch_engine.py loaded as a module (it is a role file,
not a package), the example records and a role environment."""
import copy
import importlib.util
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "install" / "files" / "launch_engine.py"
EXAMPLE = REPO / "docs" / "examples" / "engine-launch.example.json"
SECRET = "s3cr3t-Key-0123456789abcdef"


def _load():
    spec = importlib.util.spec_from_file_location("launch_engine", str(LAUNCHER))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


le = _load()


def record(name="engine-1"):
    return copy.deepcopy(json.loads(EXAMPLE.read_text())["engines"][name])


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
    }
    env.update(overrides)
    return env


def write_inputs(tmp_path, rec, **overrides):
    """The record, a 0600 API key file and a role environment pointing at both, under tmp_path."""
    rec_path = tmp_path / "record.json"
    rec_path.write_text(json.dumps(rec))
    key = tmp_path / "api-key"
    key.write_text(SECRET + "\n")
    key.chmod(0o600)
    env = role_env(rec["engine"], NARWHAL_RECORD=str(rec_path), NARWHAL_API_KEY_FILE=str(key),
                   NARWHAL_RUN_DIR=str(tmp_path / "runs" / "r1"), **overrides)
    env_path = tmp_path / "engine.env"
    env_path.write_text("".join("%s=%s\n" % kv for kv in env.items()))
    return env_path, env
