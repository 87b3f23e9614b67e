#!/usr/bin/env bash
# Runs every quality gate of narwhal.deploy; `make test` (the README's test command) calls it after
# scripts/bootstrap.sh. Usage: scripts/test.sh [lint|unit|sanity|molecule]... (default: all, in that order)
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
    *) echo "unknown gate $g" >&2; exit 2 ;;
  esac
done
printf '\n===== timings\n'; printf '  %s\n' "${timings[@]}"
