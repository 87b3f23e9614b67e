#!/usr/bin/env bash
# The main job on the built-in simulated site: bring up two simulated engine hosts (SSH, own Docker
# daemons, fake GPUs replaying real tool output) and a router host, all bare (no image, no checkpoint); the
# proving ground's registry (tests/harness/registry.sh: TLS from a test CA, htpasswd) on the site's management
# gateway with the engine and router images pushed to it; run the pipeline, whose deliver stage pulls the images
# and syncs the checkpoint; print what it produced, tear the site down and stop the registry (KEEP=1 keeps both;
# `scripts/demo.sh down` removes them).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/collections
SITE=tests/harness/sites/demo.yml
STATE=.cache/narwhal-sim-demo
ENV_FILE=tests/harness/sites/demo.env
REGISTRY=$STATE/registry   # the registry's certificates, credentials, config, log and blobs (kept for the next demo)
if [ "${1:-}" = down ]; then
  ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE" -e sim_state=absent
  tests/harness/registry.sh down "$REGISTRY"
  exit 0
fi
start=$SECONDS
ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE"
echo "== site up in $((SECONDS - start)) s"
# The registry listens on the management network's gateway, the controller's address on the network the hosts'
# own dockerd pull over (their default route), and nowhere else; demo.env's references name it.
env_value() { sed -n "s/^$1=//p" "$ENV_FILE"; }
ref=$(env_value NARWHAL_IMAGE); hostport=${ref%%/*}
# (the network's bridge on the controller holds it: IPAM shows no gateway when Docker chose it)
net_id=$(docker network inspect -f '{{.Id}}' narwhal-sim-demo-mgmt)
gateway=$(ip -4 -o addr show "br-${net_id:0:12}" | awk '{split($4, a, "/"); print a[1]; exit}')
if [ "$gateway" != "${hostport%:*}" ]; then
  echo "demo: $ENV_FILE names the registry ${hostport%:*}, the management network's gateway is '$gateway'" >&2
  exit 1
fi
pushes=()
for key in NARWHAL_IMAGE NARWHAL_ROUTER_IMAGE; do  # the local harness image of each reference, under its own name
  ref=$(env_value "$key"); pushes+=("${ref#*/}=${ref#*/}")
done
t=$SECONDS
tests/harness/registry.sh up "$REGISTRY" "${hostport%:*}" "${hostport##*:}" "${pushes[@]}"
echo "== registry https://$hostport up and images pushed in $((SECONDS - t)) s"
# The collection as an operator uses it: built, installed into a collections path, and run by FQCN from a
# project directory of its own (.env, inventory, ansible.cfg; config/ and runs/ are written there).
PROJECT=${NARWHAL_DEMO_PROJECT:-$PWD/$STATE/project}
COLLECTIONS=$PROJECT/collections
rm -rf "$STATE/dist" "$COLLECTIONS" && mkdir -p "$STATE/dist" "$PROJECT/inventory"
ansible-galaxy collection build --force --output-path "$STATE/dist" . >/dev/null
# its one dependency, ansible.posix (galaxy.yml), as the ansible package bundles it (Galaxy is not reachable here)
mkdir -p "$COLLECTIONS/ansible_collections/ansible"
cp -a collections/ansible_collections/ansible/posix/. "$COLLECTIONS/ansible_collections/ansible/posix"
ansible-galaxy collection install --offline --force -p "$COLLECTIONS" "$STATE"/dist/narwhal-deploy-*.tar.gz >/dev/null
echo "== collection installed: $(ls "$STATE"/dist) -> $COLLECTIONS"
unset ANSIBLE_COLLECTIONS_PATH NARWHAL_ENV_FILE
cp "$ENV_FILE" "$PROJECT/.env"
# what demo.env names in the project: the registry's credentials (0600) and CA, the checkpoint to deliver
mkdir -p "$PROJECT/registry"
install -m 0600 "$REGISTRY/auth.json" "$PROJECT/registry/auth.json"
install -m 0644 "$REGISTRY/ca.crt" "$PROJECT/registry/ca.crt"
python tests/harness/models/shards.py "$PROJECT/models/tiny-llama" --like tests/harness/models/tiny-llama
# a new site: the image pins of a former demo (another registry's digests) do not hold for it
rm -f "$PROJECT/config/demo/image-pins.json"
cp "$STATE/hosts.yml" "$PROJECT/inventory/hosts.yml"
printf 'plugin: narwhal.deploy.fleet_groups\n' > "$PROJECT/inventory/narwhal.yml"
printf '[defaults]\ninventory = inventory\ncollections_path = %s\nhost_key_checking = False\nforks = 32\n'\
'[ssh_connection]\npipelining = True\n' "$COLLECTIONS" > "$PROJECT/ansible.cfg"
KEY=$PROJECT/config/engine-api.key
mkdir -p "$PROJECT/config"
[ -s "$KEY" ] || (umask 077; head -c 24 /dev/urandom | base64 > "$KEY")
cd "$PROJECT"
t=$SECONDS
ansible-playbook narwhal.deploy.site
echo "== pipeline in $((SECONDS - t)) s (from $PROJECT)"
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
    print(f"    delivered: image_digest={rt.get('image_digest')} model_manifest={rt.get('model_manifest')}")
PY
printf '\n== prepared runs (runs/)\n'
find runs -maxdepth 4 -type f | sort | head -40
printf '\n== transfer probes (each engine once as producer, once as consumer)\n'
python - runs/probes.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"{r['producer']} -> {r['consumer']}: {'PASS' if r['ok'] else 'FAIL ' + '; '.join(r['reasons'])}, "
          f"{r['bytes']} bytes of KV from {r['remote_host']}:{r['remote_port']}, {r['latency_s']} s")
PY
printf '\n== status (read-only; runs/status-<stamp>.json; exits non-zero when an engine is not serving as recorded)\n'
ansible-playbook narwhal.deploy.status | sed -n '/Show the engines/,/^$/p'
printf '\n== the fleet as the router resolves it (the installed scripts/narwhal-fleet)\n'
python "$COLLECTIONS/ansible_collections/narwhal/deploy/scripts/narwhal-fleet"
printf '\n== traffic through the router (runs/router-traffic-router-1.json) and one request through it\n'
python - runs/routers/router-1.json runs/router-traffic-router-1.json config/engine-api.key config/tls/ca.crt <<'PY'
import json, os, ssl, sys, urllib.request
router, traffic, key = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), open(sys.argv[3]).read().strip()
# the router answers over TLS, verified against the site CA prepare made (NARWHAL_TLS=site, docs/tls.md)
tls = ssl.create_default_context(cafile=sys.argv[4]) if os.path.exists(sys.argv[4]) else None
print(f"router {router['url']} (vllm-router {router['vllm_router_version']}): prefill "
      f"{[w['url'] for w in router['workers']['prefill']]}, decode {[w['url'] for w in router['workers']['decode']]}")
for r in traffic["requests"]:
    print(f"  {r['endpoint']:11} {'stream' if r['stream'] else '-':6} {r['prompt']:5} tokens={r['prompt_tokens']} "
          f"kv={r['kv']} equal={r['equal']} {'PASS' if r['ok'] else 'FAIL ' + '; '.join(r['problems'])}")
print(f"  served: {traffic['served']}, keyless client: HTTP {traffic['auth']['none']}")
body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello from the narwhal demo"}],
        "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(router["url"] + "/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=60, context=tls))
print(f"POST {router['url']}/v1/chat/completions -> {answer['choices'][0]['message']['content']!r} "
      f"(usage {answer['usage']})")
PY
cd "$REPO"
export ANSIBLE_COLLECTIONS_PATH=$REPO/collections
if [ "${KEEP:-0}" != 1 ]; then
  ansible-playbook -i localhost, tests/harness/site.yml -e @"$SITE" -e sim_state=absent >/dev/null
  tests/harness/registry.sh down "$REGISTRY"
  echo "== site removed, registry stopped (KEEP=1 keeps both)"
fi
echo "== demo done in $((SECONDS - start)) s"
