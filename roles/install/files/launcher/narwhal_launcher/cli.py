"""The launcher's command line (ARCHITECTURE.md §7). Runs on the engine host as `python3 launch_engine.pyz`.

  launch_engine.pyz --role-env PATH plan         write <NARWHAL_RUN_DIR>/plan.json, print the docker run argv
  launch_engine.pyz --role-env PATH start [--force]
                                                 write the plan, then start (or keep) container narwhal-<engine>,
                                                 write <NARWHAL_RUN_DIR>/deployment.json; runs the image check
                                                 first (or reuses a matching checked.json) and starts nothing when
                                                 it fails
  launch_engine.pyz --role-env PATH check        write the plan, run the image check in a short-lived container of
                                                 the recorded image, write <NARWHAL_RUN_DIR>/checked.json
  launch_engine.pyz --role-env PATH probe-version [--timeout S]
                                                 wait for /health, GET /version, compare it with checked.json's
                                                 vllm_api_version, write <NARWHAL_RUN_DIR>/version-probe.json

Inputs: the role environment file written by prepare (KEY=VALUE, no shell expansion) and the launch record it
names (NARWHAL_RECORD: one `engines.<name>` object of config/engine-launch.*.json). The container comes from
the collection's planner (_plan.container_spec), the same function discovery and prepare call.

Entrypoint choice: the plan sets the entrypoint to ["vllm"] and the command to ["serve", <mount>, ...]. Real
vllm/vllm-openai images have ENTRYPOINT `vllm serve` (recent) or `python3 -m vllm.entrypoints.openai.api_server`
(older); overriding it explicitly makes the process argv independent of the image, and the split
"vllm" / "serve ..." is exactly what `docker run --entrypoint vllm IMAGE serve ...` produces, so the recorded
argv and the container's Config.Entrypoint/Config.Cmd agree one to one.

Errors exit with status 2 and one line on stderr naming the field or entry and the fix; an unexpected error
exits with status 3 and its traceback. Both are printed with secrets redacted (the API key the launcher read,
secret-looking NAME=VALUE pairs and flags, tokens), as every message of the planner is.
"""
import argparse
import shlex
import sys
import traceback

from ansible_collections.narwhal.deploy.plugins.module_utils import _plan
from narwhal_launcher.common import LaunchError, prepare


def main(argv=None):
    parser = argparse.ArgumentParser(prog="launch_engine.pyz", description="Plan and start one vLLM engine.")
    parser.add_argument("--role-env", required=True, help="the engine's role environment file")
    parser.add_argument("action", choices=("plan", "start", "check", "probe-version"))
    parser.add_argument("--force", action="store_true", help="start: rerun the image check and replace the "
                        "container even if unchanged (e.g. after an API key rotation, which the plan hash does not "
                        "see)")
    parser.add_argument("--timeout", type=float, default=300.0, help="probe-version: seconds to wait for /health")
    parser.add_argument("--address", help="probe-version: the engine's address (default: the role env's "
                        "NARWHAL_ADVERTISED_ADDRESS)")
    args = parser.parse_args(argv)
    try:
        if args.action == "plan":
            print(" ".join(shlex.quote(a) for a in prepare(args.role_env).argv))
        elif args.action == "check":
            from narwhal_launcher.image_check import check
            check(args.role_env)
        elif args.action == "probe-version":
            from narwhal_launcher.probe import probe_version
            probe_version(args.role_env, timeout=args.timeout, address=args.address)
        else:
            from narwhal_launcher.start import start
            start(args.role_env, force=args.force)
    except LaunchError as exc:
        print("launch_engine: error: %s" % _plan.redact_text(" ".join(str(exc).split())), file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - the unexpected: its traceback, secrets redacted (the key, tokens)
        print("launch_engine: unexpected error (a bug or a broken host), secrets redacted:\n%s"
              % _plan.redact_text(traceback.format_exc()), file=sys.stderr)
        return 3
    return 0
