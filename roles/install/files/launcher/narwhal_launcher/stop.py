"""`stop`: stop and remove the engine's container and its -previous/-failed companions. Only containers whose
engine label names this engine are touched; a container of one of those names that is not ours is refused
before anything is stopped. Idempotent: nothing there prints `absent`."""
import sys

from narwhal_launcher import start as _start
from narwhal_launcher.common import (
    companion_names,
    container_name,
    docker_client,
    our_container,
    read_role_env,
    role,
)


def stop(role_env_path, out=None):
    """-> [(name, id)] of the containers stopped and removed; prints one line each, or `absent`."""
    engine = role(read_role_env(role_env_path), "NARWHAL_ENGINE")
    name = container_name(role_env_path)
    docker, client = docker_client()
    found = [(n, our_container(docker, client, n, engine)) for n in companion_names(name)]  # refuse first
    done = []
    for each, container in found:
        if container is None:
            continue
        try:
            container.reload()
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=_start.STOP_TIMEOUT)  # start's grace period, read at call time
            container.remove(force=True)
        except docker.errors.NotFound:
            continue  # gone meanwhile: what stop wants
        done.append((each, container.id))
        print("stopped %s %s" % (each, container.id), file=out or sys.stdout)
    if not done:
        print("absent", file=out or sys.stdout)
    return done
