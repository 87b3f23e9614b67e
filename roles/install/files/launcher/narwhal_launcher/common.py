"""Inputs, files and the plan on the engine host: the role environment, the record, the API key, the run
directory, the launcher's own digest, and `prepare` (record + role env -> plan.json via the planner)."""
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import api_keys_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError as LaunchError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENGINE_NAME
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import register_secret
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import (
    DEFAULT_TIMEOUT,
    Client,
    DaemonUnreachable,
    EngineAPIError,
    NotFound,
    Timeout,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import check_record
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import container_spec, docker_run_argv
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import ENGINE_LABEL, plan_hash, redacted
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import parse_role_env

__all__ = ["LaunchError"]
MAX_INPUT_BYTES = 4 * 1024 * 1024  # role env, record, check output: a bigger file is not ours


def _open_regular(path):
    """A regular file opened for reading; never blocks on a FIFO (O_NONBLOCK, then fstat). OSError otherwise, with
    a strerror saying what the path is (a FIFO, a socket, a device, a symlink loop)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "a symlink loop (a link that leads back to itself)")
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "a directory" if stat.S_ISDIR(mode) else "a device")
            raise OSError(errno.EINVAL, "%s, not a regular file" % kind)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _read_text(path, what, fix):
    try:
        with _open_regular(path) as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise LaunchError("%s %s: %s; %s" % (what, path, exc.strerror or exc, fix))
    if len(data) > MAX_INPUT_BYTES:
        raise LaunchError("%s %s is larger than %d bytes; %s" % (what, path, MAX_INPUT_BYTES, fix))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise LaunchError("%s %s is not UTF-8 text; %s" % (what, path, fix))


def read_role_env(path):
    """KEY=VALUE lines written by prepare (the planner's format; unknown or repeated keys refused)."""
    text = _read_text(path, "role environment", "pass the engine's role env file with --role-env")
    return parse_role_env(text, path)


def load_record(path):
    text = _read_text(path, "NARWHAL_RECORD", "rerun install to copy the launch record")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LaunchError("NARWHAL_RECORD %s is not JSON (%s); rerun discovery and install" % (path, exc))
    if not isinstance(record, dict):
        raise LaunchError("NARWHAL_RECORD %s: expected one engine record object" % path)
    # every field the planner uses, checked as discovery and prepare check it (one validator) before planning
    return check_record(record, "%s (NARWHAL_RECORD)" % path)


def read_api_key(path):
    """The engine API key (the first line: api_keys_from's rule) from its 0600 (or 0400) file."""
    return read_api_keys(path)[0]


def read_api_keys(path):
    """The keys of the engine API key file: [key] or, during a rotation, [key, previous] (_common/api_key.py)."""
    if not path:
        raise LaunchError("role env NARWHAL_API_KEY_FILE is not set; install writes the engine key file")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LaunchError("NARWHAL_API_KEY_FILE %s: %s; rerun install to write the engine key"
                          % (path, "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or exc))
    if st.st_mode & 0o077:  # refused before the key is read
        api_keys_from(b"", st.st_mode, path)
    text = _read_text(path, "NARWHAL_API_KEY_FILE", "rerun install to write the engine key")
    keys = api_keys_from(text.encode("utf-8"), st.st_mode, path)  # prepare's rule for the same file
    for key in keys:
        register_secret(key)  # from now on redacted from every message of this process
    return keys


def launcher_path():
    """The launcher artefact this code runs from: the zipapp (or the directory in tests)."""
    archive = getattr(globals().get("__loader__"), "archive", None)
    return archive or os.path.abspath(sys.argv[0])


def launcher_sha256():
    path = launcher_path()
    if os.path.isdir(path):  # run from the source tree (tests): no artefact to hash
        return "source-tree"
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def write_private(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_json_file(path):
    try:
        with _open_regular(path) as fh:
            data = json.loads(fh.read(MAX_INPUT_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def role(role_env, key):
    value = role_env.get(key, "")
    if not value:
        raise LaunchError("role env %s is not set; rerun install to write the engine's role environment" % key)
    return value


def run_dir(role_env):
    path = role(role_env, "NARWHAL_RUN_DIR")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LaunchError("role env NARWHAL_RUN_DIR=%s: %s" % (path, exc.strerror or exc))
    return path


def host_group_ids(names):
    """{name: numeric ID} of the HOST's groups that own the GPU device nodes (ROCm: video, render).

    Docker resolves a group *name* inside the image's /etc/group, where `render` is often missing ("Unable to
    find group render"); the device nodes belong to the host's groups, so their numeric IDs are what counts.
    A group the host does not have owns no device and is left out."""
    import grp
    ids = {}
    for name in names:
        try:
            ids[name] = str(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return ids


class Prepared:
    """The inputs read and the plan built: role_env, record, plan, digest (plan hash), argv, group_ids."""

    def __init__(self, role_env, record, plan, digest, argv, group_ids):
        self.role_env, self.record, self.plan, self.digest = role_env, record, plan, digest
        self.argv, self.group_ids = argv, group_ids


def installed(role_env_path):
    """(role_env, record, plan, plan hash) of the installed run, read only: nothing written, no key read."""
    role_env = read_role_env(role_env_path)
    record = load_record(role(role_env, "NARWHAL_RECORD"))
    plan = container_spec(record, role_env)
    return role_env, record, plan, plan_hash(plan)


def prepare(role_env_path):
    """Read the inputs, build the plan with the planner and write plan.json."""
    role_env = read_role_env(role_env_path)
    record = load_record(role(role_env, "NARWHAL_RECORD"))
    read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))  # refuse early: the engine always runs with a key
    plan = container_spec(record, role_env)
    digest = plan_hash(plan)
    group_ids = host_group_ids(plan["group_add"])
    argv = docker_run_argv(plan, group_ids, role_env.get("NARWHAL_RUN_ID", ""))
    write_private(os.path.join(run_dir(role_env), "plan.json"), {
        "engine": plan["engine"], "run_id": role_env.get("NARWHAL_RUN_ID", ""), "plan": redacted(plan),
        "plan_hash": digest, "argv": argv, "group_ids": group_ids, "launcher_sha256": launcher_sha256()})
    return Prepared(role_env, record, plan, digest, argv, group_ids)


UNREACHABLE = "cannot reach the Docker daemon (%s); start docker or fix DOCKER_HOST"


class DockerUnreachableError(LaunchError):
    """No Docker daemon answers (or DOCKER_HOST/TLS cannot be used): one line, exit 2."""


class EngineAPI(Client):
    """The Engine API client of the launcher (plugins/module_utils/_docker/engine_api.py: stdlib only, so `start` never
    imports the Docker SDK): a daemon that does not answer is a DockerUnreachableError naming the fix."""

    def call(self, method, path, query=None, body=None, timeout=None):
        try:
            return super().call(method, path, query, body, timeout)
        except Timeout:
            raise
        except DaemonUnreachable as exc:
            raise DockerUnreachableError(UNREACHABLE % exc)


def engine_api(timeout=None):
    """The Docker daemon of DOCKER_HOST (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) as docker.from_env() finds it,
    `timeout` seconds per call. Nothing is asked yet: the first call finds out whether the daemon answers."""
    try:
        return EngineAPI.from_env(timeout=timeout or DEFAULT_TIMEOUT)
    except EngineAPIError as exc:
        raise DockerUnreachableError(UNREACHABLE % exc)


def check_host(plan):
    """What the container needs from this host exists: the recorded device nodes and the model directory."""
    for entry in plan["devices"]:
        path = entry.split(":", 1)[0]
        if not os.path.exists(path):
            raise LaunchError("device %s from the launch record (accelerator_devices/transfer.devices) is not on "
                              "this host; rerun discovery" % path)
    for path in plan["verify_devices"]:
        if not os.path.exists(path):
            raise LaunchError("device %s from the launch record accelerator_devices is not on this host; check "
                              "the NVIDIA driver or rerun discovery" % path)
    model, installed = plan["mounts"][0], plan["mounts"][1:]
    if not os.path.isdir(model["source"]):
        raise LaunchError("launch record runtime.model_path %s is not a directory on this host; stage the "
                          "model or rerun discovery" % model["source"])
    for mount in installed:  # the key guard's directory and the TLS directory install writes
        if not os.path.isdir(mount["source"]):
            raise LaunchError("%s (mounted at %s) is not a directory on this host: install writes it; rerun prepare "
                              "(it installs the run)" % (mount["source"], mount["target"]))


PREVIOUS_SUFFIX = "-previous"  # the replaced container while its successor proves itself (start)
FAILED_SUFFIX = "-failed"  # a new container that did not become ready, kept for `docker logs` (start)


def companion_names(name):
    """The engine's container name and its companions, in the order stop removes them."""
    return [name, name + PREVIOUS_SUFFIX, name + FAILED_SUFFIX]


def container_labels(attrs):
    """The labels of a container as inspected (Config.Labels) or as listed (Labels)."""
    if not attrs:
        return {}
    return (attrs.get("Config") or {}).get("Labels") or attrs.get("Labels") or {}


def container_state(attrs):
    """running, exited, restarting, paused, created or dead: State.Status as inspected, State as listed."""
    state = attrs.get("State")
    return state.get("Status") if isinstance(state, dict) else state


def refuse_foreign(attrs, name, engine):
    """LaunchError unless the container `name` is narwhal's container of `engine` (its ENGINE_LABEL says so)."""
    label = container_labels(attrs).get(ENGINE_LABEL)
    if label != engine:
        raise LaunchError("container %s (%s) is not narwhal's container of %s (label %s=%s); it was left alone: "
                          "rename or remove it (docker rm -f %s) and run again"
                          % (name, attrs["Id"][:12], engine, ENGINE_LABEL, label or "(none)", name))
    return attrs


def our_container(api, name, engine):
    """The inspected container called `name` if it is narwhal's container of `engine`; None when there is none. A
    container of that name that is not ours is refused, never touched."""
    try:
        attrs = api.container(name)
    except NotFound:
        return None
    return refuse_foreign(attrs, name, engine)


def companions(api, name):
    """{each of companion_names(name): its listed summary (Id, State, Labels) or None}, in one call: a list
    filtered by the name (the daemon matches part of it), then matched exactly here."""
    found = dict.fromkeys(companion_names(name))
    for summary in api.containers(filters={"name": [name]}):
        for each in summary.get("Names") or []:
            if each.lstrip("/") in found:
                found[each.lstrip("/")] = summary
    return found


def container_name(role_env_path):
    """The engine's container name from the installed plan; narwhal-<engine> when the record cannot be planned
    (stop must work on an engine whose record is broken)."""
    try:
        return installed(role_env_path)[2]["name"]
    except LaunchError:
        role_env = read_role_env(role_env_path)
        engine = role(role_env, "NARWHAL_ENGINE")
        if not ENGINE_NAME.match(engine):
            raise LaunchError("role env NARWHAL_ENGINE=%r must be engine-<n>; rerun install" % engine)
        return "narwhal-%s" % engine
