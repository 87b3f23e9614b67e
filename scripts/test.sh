#!/usr/bin/env bash
# Runs every quality gate of narwhal.deploy; `make test` (the README's test command) calls it after
# scripts/bootstrap.sh. Usage: scripts/test.sh [lint|unit|sanity|molecule|bench-smoke]...
# (default: lint unit sanity molecule, in that order; bench-smoke, 2.5-6 min, only when named)
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
  python -m pytest -q tests/unit || rc=$?
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

molecule_all() {
  for s in $MOLECULE_SCENARIOS; do run "molecule $s" molecule test -s "$s"; done
}

gates=("$@"); [ "${#gates[@]}" = 0 ] && gates=(lint unit sanity molecule)
for g in "${gates[@]}"; do
  case $g in
    lint) lint ;;
    unit) run pytest unit ;;
    sanity) run sanity sanity ;;
    molecule) molecule_all ;;
    bench-smoke) run "bench smoke" bench_smoke ;;
    *) echo "unknown gate $g" >&2; exit 2 ;;
  esac
done
printf '\n===== timings\n'; printf '  %s\n' "${timings[@]}"
