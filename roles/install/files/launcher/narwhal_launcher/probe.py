"""`probe-version`: wait for /health (showing the container's end if it dies), GET /version and compare it
with checked.json's vllm_api_version; writes version-probe.json."""
import json
import os
import sys
import time

from ansible_collections.narwhal.deploy.plugins.module_utils import _plan
from narwhal_launcher.common import (
    LaunchError,
    docker_client,
    load_record,
    read_api_key,
    read_json_file,
    read_role_env,
    role,
    run_dir,
    write_private,
)


def _http_get(url, timeout):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def probe_url(role_env, path, address=None):
    address = (address or role_env.get("NARWHAL_ADVERTISED_ADDRESS", "")).strip("[]") or "127.0.0.1"
    if ":" in address:
        address = "[%s]" % address
    return "http://%s:%d%s" % (address, _plan._port(role_env, "NARWHAL_HTTP_PORT"), path)


def container_exit(sdk, name, secret=None, lines=25):
    """(exit code, last log lines) when the container `name` has stopped; None while it runs, or when Docker
    cannot be asked (`sdk` None: the health wait then runs to its timeout). `secret` is redacted."""
    if sdk is None:
        return None
    docker, client = sdk
    try:
        container = client.containers.get(name)
    except docker.errors.APIError:  # NotFound included: only a stopped container is a definite answer
        return None
    if container.status not in ("exited", "dead"):
        return None
    code = container.attrs.get("State", {}).get("ExitCode")
    try:
        tail = container.logs(tail=lines).decode("utf-8", "replace")
    except docker.errors.APIError as exc:
        tail = "(logs unavailable: %s)" % exc
    if secret:
        tail = tail.replace(secret, _plan.REDACTED)
    return code, tail.rstrip()


def probe_version(role_env_path, timeout=300.0, interval=1.0, address=None, out=None):
    """Wait for /health (200), GET /version, compare with checked.json's vllm_api_version. The engine is
    reached at `address` (default: the role env's NARWHAL_ADVERTISED_ADDRESS, else 127.0.0.1)."""
    role_env = read_role_env(role_env_path)
    record = load_record(role(role_env, "NARWHAL_RECORD"))
    plan = _plan.container_spec(record, role_env)
    digest = _plan.plan_hash(plan)
    directory = run_dir(role_env)
    checked = read_json_file(os.path.join(directory, "checked.json"))
    if not checked or not checked.get("vllm_api_version"):
        raise LaunchError("%s/checked.json is missing or unreadable; run `launch_engine.pyz check` (or start) first"
                          % directory)
    if checked.get("plan_hash") != digest:
        raise LaunchError("%s/checked.json is for plan %s, the current plan is %s; run start (or check) again"
                          % (directory, checked.get("plan_hash"), digest))
    health, version_url = probe_url(role_env, "/health", address), probe_url(role_env, "/version", address)
    try:
        sdk = docker_client()
    except LaunchError:
        sdk = None
    try:
        secret = read_api_key(role_env.get("NARWHAL_API_KEY_FILE", ""))
    except LaunchError:
        secret = None
    began = time.time()
    last = "no answer"
    while True:
        try:
            status, _body = _http_get(health, timeout=min(10.0, max(1.0, timeout)))
            if status == 200:
                break
            last = "HTTP %d" % status
        except OSError as exc:
            last = str(getattr(exc, "reason", exc))
        if time.time() - began >= timeout:
            raise LaunchError("%s did not answer 200 within %d s (last: %s); see the engine container's logs "
                              "(docker logs narwhal-%s)" % (health, timeout, last, role_env.get("NARWHAL_ENGINE")))
        dead = container_exit(sdk, plan["name"], secret)
        if dead:
            raise LaunchError("engine container %s exited (code %s) before %s answered; its last log lines:\n%s"
                              % (plan["name"], dead[0], health, dead[1]))
        time.sleep(interval)
    waited = round(time.time() - began, 3)
    try:
        status, body = _http_get(version_url, timeout=10)
        served = json.loads(body.decode("utf-8")).get("version") if status == 200 else None
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise LaunchError("GET %s failed (%s); the engine is not a vLLM OpenAI server" % (version_url, exc))
    if status != 200 or not isinstance(served, str):
        raise LaunchError("GET %s answered HTTP %s without a version; the engine is not a vLLM OpenAI server"
                          % (version_url, status))
    expected = checked["vllm_api_version"]
    result = {"engine": role_env.get("NARWHAL_ENGINE", ""), "run_id": role_env.get("NARWHAL_RUN_ID", ""),
              "url": version_url, "version": served, "expected": expected, "ok": served == expected,
              "plan_hash": digest, "image_id": checked.get("image_id")}
    # No timestamps in the file: an unchanged engine probed again leaves it byte-for-byte the same.
    write_private(os.path.join(directory, "version-probe.json"), result)
    result["health_wait_s"] = waited
    if not result["ok"]:
        raise LaunchError("GET %s answered version %s but checked.json vllm_api_version is %s; the running engine "
                          "is not the checked image: stop it and run start again" % (version_url, served, expected))
    print("version ok: %s %s = checked %s" % (version_url, served, expected), file=out or sys.stdout)
    return result
