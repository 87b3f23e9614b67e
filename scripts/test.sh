#!/usr/bin/env bash
# Runs every quality gate of narwhal.deploy; `make test` (the README's test command) calls it after
# scripts/bootstrap.sh. Usage: scripts/test.sh [lint|unit|sanity|installed|day-two|molecule|bench-smoke]...
# (default: lint unit sanity installed day-two molecule, in that order; bench-smoke, 2.5-6 min, only when named).
# day-two is the day-two benchmark's short form (bench/day-two-short.sh, ~4.5 min): a planned replace and the upgrade
# roll under client traffic on a 2P2D simulated site, failing on any lost or changed answer (docs/day-two.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$PWD/collections
MOLECULE_SCENARIOS=${MOLECULE_SCENARIOS:-default real}
declare -a timings=()
run() {  # run NAME CMD...: time one gate
  local name=$1 start=$SECONDS; shift
  printf '\n===== %s\n' "$name"
  "$@"
  timings+=("$name: $((SECONDS - start)) s")
}

lint() {
  run ruff ruff check .
  run yamllint yamllint -s .
  run ansible-lint ansible-lint -q
}

unit() {
  # pytest exits 5 when it collected nothing: that is a broken suite here, never a pass.
  local rc=0
  # on every core (pytest-xdist), each test file on one worker (module fixtures such as a real router are set up once)
  python -m pytest -q -n auto --dist loadfile tests/unit || rc=$?
  [ "$rc" = 5 ] && { echo "pytest collected no tests: failing" >&2; return 1; }
  return "$rc"
}

sanity() { scripts/sanity.sh; }

bench_smoke() {  # N=2, one round: the benchmark still runs end to end and writes the documented JSON
  local out=bench/results/smoke
  bench/bench.py --hosts 2 --rounds 1 --launch-rounds 1 --no-memory --out "$out"
  python - "$out/bench.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
d = doc["discovery"]["2"]
assert d["rounds"] == 1 and d["setup_s"] > 0 and d["discover_cold_s"] > 0 and d["discover_warm_s"] > 0, d
assert d["warm_changed_max"] == 0 and d["warm_inspection_containers_max"] == 0, d
assert d["cold_inspection_containers_min"] >= 2, d
assert doc["launcher"]["all_running"] and doc["launcher"]["start_s"] > 0, doc["launcher"]
assert {g["goal"] for g in doc["goals"]} and doc["raw"]["discovery"]["2"]["rounds"], doc["goals"]
print("bench smoke: JSON ok")
PY
}

installed() {  # the built tarball installed into a fresh path; the demo site's pipeline by FQCN outside the checkout
  local project rc=0
  project=$(mktemp -d /tmp/narwhal-installed.XXXXXX)
  KEEP=1 NARWHAL_DEMO_PROJECT=$project scripts/demo.sh || rc=$?
  if [ "$rc" = 0 ]; then (cd "$project" && installed_day_two) || rc=$?; fi
  if [ "$rc" = 0 ]; then (cd "$project" && installed_refusals "$OLDPWD") || rc=$?; fi
  scripts/demo.sh down >/dev/null || true
  rm -rf "$project"
  return "$rc"
}

installed_day_two() {  # in the project directory, with the installed collection only (errexit is off here)
  # The demo's engine hosts have names of their own (gpu-a17.dc1.example is engine-1, gpu-b03.dc1.example engine-2,
  # by narwhal_node): -l takes the inventory name and the role; the tables show the engine next to the host.
  export ANSIBLE_COLLECTIONS_PATH=$PWD/collections
  unset NARWHAL_ENV_FILE
  local fail=0 step a=gpu-a17.dc1.example b=gpu-b03.dc1.example
  step() { echo "+ $*" >&2; "$@" || { echo "installed: FAILED: $*" >&2; fail=1; }; }
  step play site --tags probe probe.log
  step grep -q "engine-1 -> engine-2: PASS" probe.log
  step not grep -q "narwhal.deploy.discover : Plan the fleet" probe.log  # (argument validation is tagged always)
  step play status -l decode status.log
  step grep -Eq "engine-2 +$b +decode +running" status.log
  step not grep -q "engine-1 " status.log
  step play status -l "$a" status1.log
  step grep -Eq "engine-1 +$a +prefill +running" status1.log
  step not grep -q "engine-2 " status1.log
  step play stop -l decode stop1.log
  step grep -Eq "$b +: ok=[0-9]+ +changed=[1-9]" stop1.log
  step not play status status2.log
  step grep -q "engine-2 ($b): " status2.log
  step play stop -e narwhal_teardown=true stop2.log
  step play stop -e narwhal_teardown=true stop3.log
  step grep -Eq "$a +: ok=[0-9]+ +changed=0 " stop3.log
  step grep -Eq "$b +: ok=[0-9]+ +changed=0 " stop3.log
  return "$fail"
}

installed_refusals() {  # installed_refusals REPO: the deliver stage's refusals on the demo site (errexit is off here)
  # Each a short deliver run with one input changed through the process environment (it overrides .env) or one host
  # changed by docker exec; each refusal must name the host and the input to fix; the site is put back after each.
  export ANSIBLE_COLLECTIONS_PATH=$PWD/collections
  unset NARWHAL_ENV_FILE
  local fail=0 a=gpu-a17.dc1.example b=gpu-b03.dc1.example reg=$1/.cache/narwhal-sim-demo/registry
  local ref model hostport pinned shard=model-00002-of-00002.safetensors
  ref=$(sed -n 's/^NARWHAL_IMAGE=//p' .env) model=$(sed -n 's/^NARWHAL_MODEL_PATH=//p' .env)
  hostport=$(cat "$reg/address")
  step() { echo "+ $*" >&2; "$@" || { echo "installed: FAILED: $*" >&2; fail=1; }; }
  on() { docker exec -i "narwhal-sim-demo-$1" "${@:2}"; }
  image_id() { on "$1" docker image inspect -f '{{.Id}}' "$ref"; }
  # 1. a wrong password: engine-2's host lacks the image and pulls it with auth-wrong.json (the user, another password)
  pinned=$(image_id "$a")
  step on "$b" docker image rm -f "$(image_id "$b")"
  step not with_env NARWHAL_REGISTRY_AUTH_FILE="$reg/auth-wrong.json" play deliver refuse-auth.log
  step refused refuse-auth.log "$b" "$hostport" NARWHAL_REGISTRY_AUTH_FILE
  step not grep -qF "$(cat "$reg/password")" refuse-auth.log  # neither password is ever shown
  # 2. an unknown CA: NARWHAL_REGISTRY_CA_FILE names a CA that did not sign the registry's certificate
  step not with_env NARWHAL_REGISTRY_CA_FILE="$reg/other-ca.crt" play deliver refuse-ca.log
  step refused refuse-ca.log "$b" "$hostport" NARWHAL_REGISTRY_CA_FILE
  # the way back offline: NARWHAL_IMAGE_ARCHIVE_DIR holds a docker save archive of the pinned image (no registry
  # reached): copied to the host that lacks it, its sha256 checked there, loaded and tagged; nothing goes to the others
  mkdir -p archives && docker save "${ref#*/}" > archives/engine.tar && (cd archives && sha256sum engine.tar > engine.tar.sha256)
  step with_env NARWHAL_IMAGE_ARCHIVE_DIR=archives play deliver deliver-back.log
  step names deliver-back.log "$b" "load"
  step not names deliver-back.log "$a" "load"  # (its CA is put back: the refused run had replaced it)
  step test "$(image_id "$b")" = "$pinned"
  # 3. a tag that moved: the registry's tag names another image (the CUDA stand-in) and engine-2's host pulled it
  step "$1/tests/harness/registry.sh" push "$reg" "narwhal-sim/engine-standin:latest=${ref#*/}"
  step on "$b" sh -c 'c=$(mktemp -d); docker --config "$c" login -u narwhal --password-stdin "$0" >/dev/null &&
    docker --config "$c" pull -q "$1"; rc=$?; rm -rf "$c"; exit $rc' "$hostport" "$ref" < "$reg/password"
  step not play deliver refuse-moved.log
  step refused refuse-moved.log "$b" "$ref" deliver_image_repin
  step "$1/tests/harness/registry.sh" push "$reg" "${ref#*/}=${ref#*/}"  # the tag back where the pin is
  step on "$b" docker tag "$pinned" "$ref"
  # 4. a damaged shard: one byte of a shard on engine-1's host changed, its size and mtime kept (the fast check
  #    cannot see it): the full check names the host and the file, and the host gets the source's file again
  step on "$a" sh -c 'f=$0; t=$(stat -c %y "$f"); v=$(dd if="$f" bs=1 skip=4096 count=1 status=none | od -An -tu1);
    printf "\\$(printf %o $((255 - v)))" | dd of="$f" bs=1 seek=4096 conv=notrunc status=none; touch -d "$t" "$f"' \
    "$model/$shard"
  step not test "$(on "$a" sha256sum "$model/$shard" | cut -d' ' -f1)" = "$(sha256sum "models/tiny-llama/$shard" | cut -d' ' -f1)"
  step with_env NARWHAL_MODEL_VERIFY=full play deliver repair-shard.log
  step names repair-shard.log "$a" "$shard"
  step test "$(on "$a" sha256sum "$model/$shard" | cut -d' ' -f1)" = "$(sha256sum "models/tiny-llama/$shard" | cut -d' ' -f1)"
  # the site holds everything again: a deliver run changes nothing
  step play deliver deliver-last.log
  step grep -Eq "$a +: ok=[0-9]+ +changed=0 " deliver-last.log
  step grep -Eq "$b +: ok=[0-9]+ +changed=0 " deliver-last.log
  return "$fail"
}

names() {  # names LOG WORD...: one line of LOG holds every WORD
  local log=$1; shift
  awk -v n="$#" 'BEGIN { for (i = 1; i <= n; i++) w[i] = ARGV[i + 1]; ARGC = 2 }
    { ok = 1; for (i = 1; i <= n; i++) if (index($0, w[i]) == 0) ok = 0; if (ok) { found = 1; exit } }
    END { exit !found }' "$log" "$@"
}

refused() {  # refused LOG WORD...: one error line of LOG (fatal:, [ERROR], FAILED!) holds every WORD
  local log=$1; shift
  grep -E 'fatal:|\[ERROR\]|FAILED!' "$log" > "$log.errors" || return 1
  names "$log.errors" "$@"
}

with_env() {  # with_env KEY=VALUE CMD...: CMD (a function too) with KEY set in its process environment
  ( export "$1"; "${@:2}" )
}

play() {  # play BOOK ARGS... LOG: ansible-playbook narwhal.deploy.BOOK, output shown and kept in LOG
  local book=$1 log=${*: -1}; local args=("${@:2:$#-2}")
  ansible-playbook "narwhal.deploy.$book" ${args[@]+"${args[@]}"} 2>&1 | tee "$log"
}

not() { ! "$@"; }

molecule_all() {
  for s in $MOLECULE_SCENARIOS; do run "molecule $s" molecule test -s "$s"; done
}

gates=("$@"); [ "${#gates[@]}" = 0 ] && gates=(lint unit sanity installed day-two molecule)
for g in "${gates[@]}"; do
  case $g in
    lint) lint ;;
    unit) run pytest unit ;;
    sanity) run sanity sanity ;;
    molecule) molecule_all ;;
    installed) run "installed collection" installed ;;
    day-two) run "day-two short form" bench/day-two-short.sh ;;
    bench-smoke) run "bench smoke" bench_smoke ;;
    *) echo "unknown gate $g" >&2; exit 2 ;;
  esac
done
printf '\n===== timings\n'; printf '  %s\n' "${timings[@]}"
