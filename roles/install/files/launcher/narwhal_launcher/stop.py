"""`stop`: stop and remove the engine's container and its -previous/-failed companions. Each gets SIGTERM and the
grace its own command line asks for (start.container_grace: --shutdown-timeout + worker teardown + a margin), so
vLLM drains its in-flight requests before the container is killed. Only containers whose
engine label names this engine are touched; a container of one of those names that is not ours is refused
before anything is stopped. Idempotent: nothing there prints `absent`."""
import sys

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import NotFound
from narwhal_launcher import start as _start
from narwhal_launcher.common import (
    companions,
    container_name,
    engine_api,
    read_role_env,
    refuse_foreign,
    role,
)


def stop(role_env_path, out=None):
    """-> [(name, id)] of the containers stopped and removed; prints one line each, or `absent`."""
    engine = role(read_role_env(role_env_path), "NARWHAL_ENGINE")
    name = container_name(role_env_path)
    api = engine_api()
    found = [(n, c and refuse_foreign(c, n, engine)) for n, c in companions(api, name).items()]  # refuse first
    done = []
    for each, container in found:
        if container is None:
            continue
        try:
            # SIGTERM, then the container's own drain (--shutdown-timeout) + worker teardown + a margin before SIGKILL
            api.stop(container["Id"], timeout=_start.container_grace(api.container(container["Id"])))
            api.remove(container["Id"], force=True)
        except NotFound:
            continue  # gone meanwhile: what stop wants
        done.append((each, container["Id"]))
        print("stopped %s %s" % (each, container["Id"]), file=out or sys.stdout)
    if not done:
        print("absent", file=out or sys.stdout)
    return done
