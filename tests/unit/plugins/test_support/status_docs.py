"""Status documents as the launcher's `status` writes them and roles/status keeps them (status_engine), for the tests
of a status run that repairs (_launch/repair.py, _launch/peers.py::after_restart, the filter repair_plan)."""

PLAN = "sha256:" + "a" * 64
LAUNCHED = "2026-12-03T08:00:10Z"  # deployment.json recorded_at of every engine's launch
STARTED = "2026-12-03T08:00:05.123456789Z"  # State.StartedAt of every container as launched
FLEET = [{"engine": "engine-1", "role": "prefill"}, {"engine": "engine-2", "role": "decode"},
         {"engine": "engine-3", "role": "prefill"}, {"engine": "engine-4", "role": "decode"}]
GOOD = {"vllm": "0.32.0+cpu", "nixl": "1.5.1", "connector": "NixlConnector"}
OLD_NIXL = dict(GOOD, nixl="1.4.1")


def status_doc(engine, state="running", started=STARTED, restarts=0, cid=None, action="started", running_plan=PLAN,
               installed=PLAN, deployment=True, serving=None, member=0, host=None):
    """One host's status document: `state` None for no container; `serving` (also as_recorded) defaults to
    whether it runs."""
    container = None if state is None else {
        "name": "narwhal-" + engine, "id": cid or "c-" + engine, "state": state, "running": state == "running",
        "restart_count": restarts, "started_at": started, "exit_code": 0 if state == "running" else 137,
        "ours": True, "engine_label": engine}
    serving = state == "running" if serving is None else serving
    out = {"engine": engine, "container_name": "narwhal-" + engine, "container": container, "docker_error": None,
           "plan_hash_running": running_plan if container else None, "plan_hash_installed": installed,
           "run_id_installed": "run-1",
           "deployment": {"container_id": "c-" + engine, "action": action, "run_id": "run-1", "plan_hash": installed,
                          "recorded_at": LAUNCHED} if deployment else None,
           "serving": serving, "as_recorded": serving, "inventory_host": host or engine}
    if member:
        out["member"] = member
    return out


def fleet_docs(**changes):
    """The documents of FLEET's four engines serving as launched; engine_1=dict(...) changes one (status_doc's
    arguments)."""
    return [status_doc(e["engine"], **changes.get(e["engine"].replace("-", "_"), {})) for e in FLEET]
