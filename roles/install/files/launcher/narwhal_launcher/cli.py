"""The launcher's command line (docs/vllm-requirements.md, "The launcher's duties"). Runs on the engine host as
`python3 launch_engine.pyz`.

  launch_engine.pyz --role-env PATH plan         write <NARWHAL_RUN_DIR>/plan.json, print the docker run argv
  launch_engine.pyz --role-env PATH start [--force] [--ready-timeout S]
                                                 write the plan, run the image check first (or reuse a matching
                                                 checked.json; nothing is touched when it fails), then keep
                                                 container narwhal-<engine> when it runs with this plan hash
                                                 (prints `unchanged`), or replace it rolling: the old container
                                                 is stopped and renamed narwhal-<engine>-previous, the new one
                                                 must answer /health and a /version equal to checked.json's
                                                 within S seconds (default 300; the launch stage passes
                                                 the site's NARWHAL_ENGINE_READY_TIMEOUT, default 900; its
                                                 exit is seen at once), writing version-probe.json.
                                                 Ready: -previous is removed, deployment.json written,
                                                 stdout `started|replaced <name> <id>`.
                                                 Not ready: the new container is stopped and kept as
                                                 narwhal-<engine>-failed, the previous one renamed back and
                                                 started, rollback.json written, exit 2 with one message
  launch_engine.pyz --role-env PATH start --hold-previous ...
                                                 a host after the head of an engine across hosts (--headless):
                                                 started when its container keeps running for 3 s (no HTTP API;
                                                 the head's /health proves the engine), its replaced container kept
                                                 stopped as narwhal-<engine>-previous until finish
  launch_engine.pyz --role-env PATH finish [--rollback [--stop-only]]
                                                 after the head's start: drop -previous (`kept <name>`), or with
                                                 --rollback keep the new container as -failed and restore and start
                                                 -previous (`rolled back <name> <id>`)
  launch_engine.pyz --role-env PATH stop         stop and remove narwhal-<engine> and its -previous/-failed
                                                 companions (only containers labelled as this engine's); prints
                                                 `stopped <name> <id>` per container, or `absent`
  launch_engine.pyz --role-env PATH status [--address A]
                                                 read only: print one JSON document of the running container
                                                 against the installed run (plan hash, run id, image, /health,
                                                 /version, NIXL counters, listening ports, version probe age,
                                                 rollback.json) with `problems`, `serving`, `as_recorded`; exit
                                                 0 whenever the document was produced
  launch_engine.pyz --role-env PATH preview      read only: what start would do (start, replace or unchanged) and,
                                                 for a replacement, the unified diff of the running run's plan.json
                                                 against the installed plan, as one JSON document (--check --diff)
  launch_engine.pyz --role-env PATH preview --keep-unchanged [--ready-timeout S]
                                                 the same, and when the action is unchanged, start in the same
                                                 command (kept and probed; exit 2 when it does not serve): the
                                                 document adds `kept` (start's line) and `records` (the sha256 of
                                                 each file of the installed run's directory on the host)
  launch_engine.pyz --role-env PATH check        write the plan, run the image check in a short-lived container of
                                                 the recorded image, write <NARWHAL_RUN_DIR>/checked.json
  launch_engine.pyz --role-env PATH probe-version [--timeout S] [--address A] [--health-only]
                                                 wait for /health, GET /version, compare it with checked.json's
                                                 vllm_api_version, write <NARWHAL_RUN_DIR>/version-probe.json

Inputs: the role environment file written by prepare (KEY=VALUE, no shell expansion) and the launch record it
names (NARWHAL_RECORD: one `engines.<name>` object of config/engine-launch.*.json). The container comes from
the collection's planner (_plan/container.py::container_spec), the same function discovery and prepare call.

Entrypoint choice: the plan sets the entrypoint to ["vllm"] and the command to ["serve", <mount>, ...]. Real
vllm/vllm-openai images have ENTRYPOINT `vllm serve` (recent) or `python3 -m vllm.entrypoints.openai.api_server`
(older); overriding it explicitly makes the process argv independent of the image, and the split
"vllm" / "serve ..." is exactly what `docker run --entrypoint vllm IMAGE serve ...` produces, so the recorded
argv and the container's Config.Entrypoint/Config.Cmd agree one to one.

Containers: narwhal-<engine> carries the labels org.narwhal.engine, org.narwhal.plan-hash (the plan's hash,
run-independent) and org.narwhal.run-id (the run that created it; set at create time, outside the plan hash).

Errors exit with status 2 and one line on stderr naming the field or entry and the fix; an unexpected error
exits with status 3 and its traceback. Both are printed with secrets redacted (the API key the launcher read,
secret-looking NAME=VALUE pairs and flags, tokens), as every message of the planner is.
"""
import argparse
import shlex
import sys
import traceback

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text
from narwhal_launcher.common import LaunchError, prepare


def main(argv=None):
    parser = argparse.ArgumentParser(prog="launch_engine.pyz", description="Plan and start one vLLM engine.")
    parser.add_argument("--role-env", required=True, help="the engine's role environment file")
    parser.add_argument("action", choices=("plan", "start", "stop", "status", "preview", "check", "probe-version",
                                           "finish"))
    parser.add_argument("--force", action="store_true", help="start: rerun the image check and replace the "
                        "container even if unchanged (an API key rotation needs none: the engine's key guard reads "
                        "the new key file)")
    parser.add_argument("--timeout", type=float, default=300.0, help="probe-version: seconds to wait for /health")
    parser.add_argument("--ready-timeout", type=float, help="start: seconds a new container gets to answer /health "
                        "and /version before start rolls back (default 300; the launch stage passes the site's "
                        "NARWHAL_ENGINE_READY_TIMEOUT, default 900)")
    parser.add_argument("--hold-previous", action="store_true", help="start, on a host after the head of an engine "
                        "across hosts: keep the replaced container as <name>-previous until finish")
    parser.add_argument("--health-only", action="store_true", help="probe-version: wait for /health alone (a "
                        "container of another run than the installed one)")
    parser.add_argument("--stop-only", action="store_true", help="finish --rollback: restore but leave stopped")
    parser.add_argument("--rollback", action="store_true", help="finish: restore the previous container instead of "
                        "dropping it")
    parser.add_argument("--keep-unchanged", action="store_true", help="preview: when the engine is unchanged, "
                        "start it in the same command (kept, /health and /version probed) and report its run's "
                        "records' sha256")
    parser.add_argument("--address", help="probe-version, status: the engine's address (default: the role env's "
                        "NARWHAL_ADVERTISED_ADDRESS)")
    args = parser.parse_args(argv)
    try:
        if args.action == "plan":
            print(" ".join(shlex.quote(a) for a in prepare(args.role_env).argv))
        elif args.action == "check":
            from narwhal_launcher.image_check import check
            check(args.role_env)
        elif args.action == "probe-version":
            from narwhal_launcher.health import probe_version
            probe_version(args.role_env, timeout=args.timeout, address=args.address, health_only=args.health_only)
        elif args.action == "stop":
            from narwhal_launcher.stop import stop
            stop(args.role_env)
        elif args.action == "preview":
            from narwhal_launcher.preview import preview
            preview(args.role_env, keep_unchanged=args.keep_unchanged, ready_timeout=args.ready_timeout)
        elif args.action == "status":
            from narwhal_launcher.status import status
            status(args.role_env, address=args.address)
        elif args.action == "finish":
            from narwhal_launcher.start import finish
            finish(args.role_env, rollback=args.rollback, stop_only=args.stop_only)
        else:
            from narwhal_launcher.start import start
            start(args.role_env, force=args.force, ready_timeout=args.ready_timeout, hold_previous=args.hold_previous)
    except LaunchError as exc:
        print("launch_engine: error: %s" % redact_text(" ".join(str(exc).split())), file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - the unexpected: its traceback, secrets redacted (the key, tokens)
        print("launch_engine: unexpected error (a bug or a broken host), secrets redacted:\n%s"
              % redact_text(traceback.format_exc()), file=sys.stderr)
        return 3
    return 0
