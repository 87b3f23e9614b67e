"""`preview`: what `start` would do, changing nothing (launch.yml --check --diff). Read-only: no plan.json, no
image check, no container touched. Prints one JSON document: the action (start, replace or unchanged, as `start`
decides it without --force), the container, the running and the installed plan hashes and runs, the installed
run's directory on the host, and the plan
difference (a unified diff of the running run's recorded plan against the installed one) when it is replaced.

`preview --keep-unchanged` (launch, not --check): when the action is unchanged, `start` runs in the same command
(it keeps the container and probes /health and /version against checked.json; a failure exits 2 as start's does),
and the document adds `kept` (start's stdout line), `records` (the sha256 of every file of the installed run's
directory on the host, after start) and `deployment` (its deployment.json, which holds no secret), so that an
unchanged engine costs launch one SSH command: the controller fetches only the records its copy lacks
(roles/launch/tasks/fetch.yml) without a second read."""
import difflib
import hashlib
import io
import json
import os
import stat
import sys

from ansible_collections.narwhal.deploy.plugins.module_utils._plan.labels import PLAN_HASH_LABEL, RUN_ID_LABEL, redacted
from narwhal_launcher.common import container_labels, container_state, installed, read_json_file, role
from narwhal_launcher.status import docker_facts, redact_strings


def plan_lines(document):
    """The plan as sorted JSON lines (what the diff compares); secrets are redacted in recorded plans already."""
    if not document:
        return []
    return json.dumps(document, indent=1, sort_keys=True).splitlines()


def decide(container, running_hash, digest):
    """start's decision, pure: keep a running container of this plan hash, else start or replace."""
    if container is None:
        return "start"
    if container_state(container) == "running" and running_hash == digest:
        return "unchanged"
    return "replace"


def record_digests(directory):
    """{name: sha256} of the regular files directly in the run directory (symbolic links are not followed)."""
    digests = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return digests
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            continue
        with os.fdopen(fd, "rb") as fh:
            h = hashlib.sha256()
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        digests[name] = h.hexdigest()
    return digests


def preview(role_env_path, out=None, keep_unchanged=False, ready_timeout=None):
    role_env, _record, plan, digest = installed(role_env_path)
    name, engine = plan["name"], plan["engine"]
    container, _companions, docker_error = docker_facts(name, engine)
    labels = container_labels(container) if container is not None else {}
    running_hash, running_run = labels.get(PLAN_HASH_LABEL), labels.get(RUN_ID_LABEL)
    action = decide(container, running_hash, digest)
    doc = {"engine": engine, "container": name, "action": action, "docker_error": docker_error,
           "container_state": container_state(container) if container is not None else None,
           "plan_hash_running": running_hash, "run_id_running": running_run,
           "plan_hash_installed": digest, "run_id_installed": role_env.get("NARWHAL_RUN_ID", ""),
           "run_dir_installed": role(role_env, "NARWHAL_RUN_DIR"), "diff": []}
    if action == "replace":
        runs = os.path.dirname(role(role_env, "NARWHAL_RUN_DIR"))
        before = read_json_file(os.path.join(runs, running_run, "plan.json")) if running_run else None
        old = (before or {}).get("plan")
        doc["diff"] = list(difflib.unified_diff(
            plan_lines(old), plan_lines(redacted(plan)), lineterm="",
            fromfile="running plan %s (run %s)" % ((running_hash or "?")[:19], running_run or "?"),
            tofile="installed plan %s (run %s)" % (digest[:19], doc["run_id_installed"])))
        if old is None:
            doc["diff"].insert(0, "(the running container's recorded plan is not on this host: no difference shown)")
    if keep_unchanged and action == "unchanged":
        from narwhal_launcher.start import start
        line = io.StringIO()
        start(role_env_path, out=line, ready_timeout=ready_timeout)
        doc["kept"] = line.getvalue().strip()
        doc["records"] = record_digests(doc["run_dir_installed"])
        doc["deployment"] = read_json_file(os.path.join(doc["run_dir_installed"], "deployment.json"))
    doc = redact_strings(doc)
    print(json.dumps(doc, indent=1, sort_keys=True), file=out or sys.stdout)
    return doc
