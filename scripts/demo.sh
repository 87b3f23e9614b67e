#!/usr/bin/env bash
# The main job on the built-in simulated two-host site: bring up two simulated engine hosts (SSH, own
# Docker daemons, fake GPUs replaying real tool output), run the pipeline as far as it exists, print what
# it produced, tear the site down (KEEP=1 keeps it; `scripts/demo.sh down` removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/collections
SITE=tests/harness/sites/demo.yml
STATE=.cache/narwhal-sim-demo
if [ "${1:-}" = down ]; then
  ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE" -e sim_state=absent
  exit 0
fi
start=$SECONDS
ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE"
echo "== site up in $((SECONDS - start)) s"
export NARWHAL_ENV_FILE=$PWD/tests/harness/sites/demo.env
export NARWHAL_API_KEY_FILE=$PWD/$STATE/engine-api.key NARWHAL_RUNS_DIR=$PWD/$STATE/runs
[ -s "$NARWHAL_API_KEY_FILE" ] || (umask 077; head -c 24 /dev/urandom | base64 > "$NARWHAL_API_KEY_FILE")
t=$SECONDS
ansible-playbook -i "$STATE/hosts.yml" playbooks/site.yml
echo "== pipeline in $((SECONDS - t)) s"
printf '\n== config/demo/deployment.env\n'; cat config/demo/deployment.env
printf '\n== config/fleet.demo.json\n'; cat config/fleet.demo.json
printf '\n== launch records (config/engine-launch.demo.json, mode %s; extracts and sources index in config/demo/)\n' \
  "$(stat -c %a config/engine-launch.demo.json)"
python - <<'PY'
import json
doc = json.load(open("config/engine-launch.demo.json"))
for name, r in doc["engines"].items():
    rt = r["runtime"]
    print(f"{name}: {r['role']:7} {r['accelerator']['count']}x {r['accelerator']['product']} "
          f"TP={r['tensor_parallel_size']} {r['gpu_visibility_env']}={','.join(r['gpu_ids'])[:60]}")
    print(f"    devices={len(r['accelerator_devices'])} transport={r['transfer']['transport']} "
          f"net={r['transfer']['net_devices']} image={rt['image_id'][:19]} pins={rt['expected_packages']} "
          f"block={rt['cache_plan']['block_size']} page={rt['cache_plan']['page_bytes']}B")
PY
printf '\n== prepared runs (%s)\n' "$NARWHAL_RUNS_DIR"
find "$NARWHAL_RUNS_DIR" -maxdepth 4 -type f | sed "s|^$PWD/||" | sort | head -40
printf '\n== transfer probes (each engine once as producer, once as consumer)\n'
python - "$NARWHAL_RUNS_DIR/probes.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"{r['producer']} -> {r['consumer']}: {'PASS' if r['ok'] else 'FAIL ' + '; '.join(r['reasons'])}, "
          f"{r['bytes']} bytes of KV from {r['remote_host']}:{r['remote_port']}, {r['latency_s']} s")
PY
printf '\n== the fleet as the router resolves it (scripts/narwhal-fleet)\n'
python scripts/narwhal-fleet --fleet config/fleet.demo.json --env-file "$NARWHAL_ENV_FILE" --deployment-env config/demo/deployment.env
if [ "${KEEP:-0}" != 1 ]; then
  ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE" -e sim_state=absent >/dev/null
  echo "== site removed (KEEP=1 keeps it)"
fi
echo "== demo done in $((SECONDS - start)) s"
