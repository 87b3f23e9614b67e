#!/usr/bin/env bash
# ansible-test sanity for narwhal.deploy, offline-safe and repeatable on a fresh machine.
#
#   scripts/sanity.sh [extra ansible-test sanity args, e.g. --test pylint]
#
# ansible-test runs only from a path ending in ansible_collections/<ns>/<name>/, so the checkout's
# git-tracked and untracked-not-ignored files are copied to <tmp>/ansible_collections/narwhal/deploy
# and the run happens there (never through collections/ansible_collections/narwhal/deploy, a link back
# to this checkout). Results (log, junit) land in tests/output/sanity/ of the checkout.
#
# Offline: ansible-test bootstraps pip in each venv it creates with a get-pip.py downloaded from its CI
# file host, which these machines cannot reach. It looks in ~/.ansible/test/cache/get_pip_<ver>.py
# first; we put a stand-in there that uses the stdlib ensurepip, then pip-installs the requested pip
# from the configured indexes (pip config: find-links/extra-index/constraints stay in force).
#
# Caching: ansible-test keeps one venv per sanity test under ~/.ansible/test/venv (keyed by a hash of
# its requirements), so only the first run installs anything.
#
# Env: NARWHAL_VENV (default .venv), SANITY_PYTHON (default 3.11), SANITY_KEEP=1 keeps the temp copy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${NARWHAL_VENV:-$ROOT/.venv}
PYVER=${SANITY_PYTHON:-3.11}
OUT=$ROOT/tests/output/sanity
CACHE=$HOME/.ansible/test/cache

die() { printf 'sanity: %s\n' "$*" >&2; exit 2; }
[ -x "$VENV/bin/ansible-test" ] || die "no ansible-test in $VENV; run scripts/bootstrap.sh --no-harness first"
export PATH=$VENV/bin:$PATH
unset ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS ANSIBLE_CONFIG  # scripts/test.sh sets these for the checkout
command -v rsync >/dev/null || die "rsync is missing (apt-get install rsync)"
t_start=$SECONDS

# One run at a time per user: concurrent runs would race on the shared venv cache.
mkdir -p "$CACHE"
exec 9>"$CACHE/.narwhal-sanity.lock"
flock -w 1800 9 || die "another sanity run holds $CACHE/.narwhal-sanity.lock"

# --- offline pip bootstrap for ansible-test's venvs ---------------------------------------------------
pip_ver=$(python -c '
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$PYVER"'"))["pip"])') \
  || die "cannot read the pip version ansible-test bootstraps (ansible_test internals changed?)"
get_pip=$CACHE/get_pip_${pip_ver//./_}.py
marker='# narwhal.deploy offline get-pip stand-in (scripts/sanity.sh)'
shim=$(cat <<EOF
$marker
# ansible-test runs this as get-pip.py: argv = pip options + "pip==X.Y" [+ --no-setuptools --no-wheel].
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--upgrade"] + args)
EOF
)
# Leave a real get-pip.py (downloaded where the host was reachable) alone; refresh our own stand-in.
if [ ! -e "$get_pip" ] || head -n1 "$get_pip" | grep -qxF "$marker"; then
  [ "$(cat "$get_pip" 2>/dev/null)" = "$shim" ] || printf '%s\n' "$shim" > "$get_pip"
fi

# --- copy the checkout into an ansible_collections/narwhal/deploy path ---------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/narwhal-sanity.XXXXXX")
if [ "${SANITY_KEEP:-0}" = 1 ]; then trap 'echo "sanity: kept $TMP" >&2' EXIT; else trap 'rm -rf "$TMP"' EXIT; fi
DEST=$TMP/ansible_collections/narwhal/deploy
mkdir -p "$DEST"
# Tracked (incl. modified) + untracked-not-ignored files; not the collections/ link farm, venvs, caches,
# run records or local site config. --ignore-missing-args: tracked files deleted in the work tree.
git ls-files -z -co --exclude-standard \
  | grep -zvE '^(collections|\.venv|\.cache|runs|tests/output)/|^config/[^/]*\.local\.json$' \
  | rsync -a --from0 --files-from=- --ignore-missing-args "$ROOT/" "$DEST/"

# --- run -----------------------------------------------------------------------------------------------
# --requirements: the controller is $VENV (already has ansible-core's requirements, so this installs
# nothing there); each sanity test gets its own cached venv. --venv would rebuild a controller venv
# inside the temp copy on every run, which is slower and gains nothing here.
# One test is skipped: no-illegal-filenames (Windows file names). The simulated hosts' sysfs trees under
# tests/harness/profiles/*/sys must use Linux sysfs names such as bus/pci/devices/0000:83:00.0, and the
# test crashes on them before its ignore list applies. tests/harness is excluded from the built
# collection (galaxy.yml build_ignore). Every other test works offline with the stand-in above or
# skips itself (shellcheck, pslint: binaries not installed).
rm -rf "$OUT"; mkdir -p "$OUT"
set +e
( cd "$DEST" && ansible-test sanity --python "$PYVER" --requirements --color no --junit \
    --skip-test no-illegal-filenames "$@" ) 2>&1 \
  | tee "$OUT/sanity.log"
rc=${PIPESTATUS[0]}
set -e
[ -d "$DEST/tests/output" ] && cp -a "$DEST/tests/output/." "$OUT/" 2>/dev/null || true

# --- summary -------------------------------------------------------------------------------------------
echo
echo "== sanity summary (python $PYVER, $((SECONDS - t_start)) s; log: ${OUT#"$ROOT"/}/sanity.log)"
ran=$(grep -c '^Running sanity test ' "$OUT/sanity.log" || true)
echo "   tests run: $ran"
# Tests that skip themselves (shellcheck, pslint: program not installed) say so in a WARNING.
grep -E '^WARNING: (Required program|Skipping)' "$OUT/sanity.log" | sed 's/^/   /' || true
if [ "$rc" = 0 ]; then
  echo "   result: PASS"
else
  echo "   result: FAIL (ansible-test exit $rc)"
  grep -E "^ERROR: " "$OUT/sanity.log" | sed "s/^/   /" | head -n 60 || true
  sed -n "/^FATAL: The .* sanity test/,\$p" "$OUT/sanity.log" | sed "s/^/   /" || true
  if grep -q '^Traceback ' "$OUT/sanity.log"; then  # a crash stops every later test: say where
    last=$(grep '^Running sanity test ' "$OUT/sanity.log" | tail -n1)
    echo "   ansible-test crashed in: ${last#Running sanity test }  (later tests did not run;"
    echo "   rerun with --skip-test <name> to see the rest)"
    grep -A6 -E '^[A-Za-z_.]*(Exception|Error): ' "$OUT/sanity.log" | tail -n 7 | sed 's/^/   /' || true
  fi
fi
exit "$rc"
