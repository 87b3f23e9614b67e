#!/usr/bin/env bash
# The CI short form of the day-two benchmark (issue 36, docs/day-two.md "In CI"): on its own simulated 2 prefill +
# 2 decode site (d2-day-two, bench/day_two.py), the fleet-wide upgrade roll to narwhal-sim/engine-standin:next, then
# a prefill's host cut off while `site` replaces a decode (a planned replace with a host lost: the run goes on for the
# others, exit status 4, the closing table naming the host) and `site` again once it is back, each under steady
# OpenAI-client traffic through the router, asserting that no request failed (for the cut: none once the router had
# dropped the host), no answer differed from its greedy reference and the fleet ended whole (--strict). The stand-in
# loads at once (--load-s 0: CI keeps today's speed). Needs the sim images (scripts/build-images.sh sim, which
# builds engine-standin:next too) and the venv (scripts/bootstrap.sh). Exit status: bench/day_two.py's (1 names
# every operation that lost a request). The site is removed afterwards, also on failure.
# Usage: bench/day-two-short.sh [OUT_DIR]   (default runs/day-two-ci)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
out=${1:-runs/day-two-ci}
if ! docker image inspect narwhal-sim/engine-standin:next >/dev/null 2>&1; then
  echo "day-two short form: no image narwhal-sim/engine-standin:next (scripts/build-images.sh sim builds it)" >&2
  exit 1
fi
rm -rf "$out"
exec bench/day_two.py --ops upgrade,host-cut --load-s 0 --cut-s 1 --rate 5 --strict --out "$out"
