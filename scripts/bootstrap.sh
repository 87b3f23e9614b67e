#!/usr/bin/env bash
# One bootstrap for a fresh machine (Debian/Ubuntu, as root) or an operator's workstation:
#   system packages -> Docker engine -> venv -> collections -> harness images.
# Every step is skipped when it is already done. Usage: scripts/bootstrap.sh [--no-harness]
#   --no-harness   controller only (venv + collections): what an operator needs to deploy a real site.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${NARWHAL_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
HARNESS=1
[ "${1:-}" = "--no-harness" ] && HARNESS=0
ANSIBLE_BUNDLE=ansible==12.3.0   # the PyPI bundle for ansible-core 2.19; only two collections are unpacked

step() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'bootstrap: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS; timing() { printf '   (%s: %d s)\n' "$1" "$((SECONDS - t0))" >&2; t0=$SECONDS; }

need_system() {  # apt packages the controller and the harness use
  local pkgs=(openssh-client rsync)
  # prometheus: the real Prometheus the unit tests scrape the stand-in engines and the router with
  # (tests/unit/roles/monitoring); they run the binary on a free port, never the package's service. Its promtool
  # checks and unit-tests the alert rules (tests/unit/plugins/module_utils/_monitor/test_rules_promtool.py)
  [ "$HARNESS" = 1 ] && pkgs+=(docker.io mmdebstrap prometheus)
  # docker-registry (distribution 2.8) + apache2-utils (htpasswd -B), openssl, curl: the proving ground's registry
  # (tests/harness/registry.sh runs the binary as a process of its own, never the package's service)
  [ "$HARNESS" = 1 ] && pkgs+=(docker-registry apache2-utils openssl curl)
  local missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ "${#missing[@]}" = 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing system packages: ${missing[*]}. This script installs them only as root on Debian/Ubuntu;
install them with your package manager (Docker Engine, mmdebstrap, OpenSSH client, rsync, Prometheus, the distribution
registry (docker-registry), htpasswd (apache2-utils), openssl, curl), then rerun."
  fi
  step "apt-get install ${missing[*]}"
  apt-get update -qq
  # prometheus's and docker-registry's postinst start a daemon (:9090, :5000) where an init system runs: a policy-rc.d
  # that refuses every start for the install (a Docker Engine installed with them is started by need_docker), then
  # the services disabled
  local guard="" rc=0 svc
  if [[ " ${missing[*]} " =~ " "(prometheus|docker-registry)" " ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# scripts/bootstrap.sh: no service starts during its apt-get install\nexit 101\n' > "$guard"
    chmod 0755 "$guard"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  [ -n "$guard" ] && rm -f "$guard"
  [ "$rc" = 0 ] || die "apt-get install ${missing[*]} failed (exit $rc)"
  for svc in prometheus docker-registry; do
    [[ " ${missing[*]} " == *" $svc "* ]] || continue
    if [ -d /run/systemd/system ]; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif command -v update-rc.d >/dev/null; then
      update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  done
  timing apt
}

need_docker() {
  docker info >/dev/null 2>&1 && return 0
  command -v dockerd >/dev/null || die "no Docker engine answers and dockerd is not installed"
  [ "$(id -u)" = 0 ] || die "no Docker engine answers; start it (systemctl start docker) or run as root"
  step "starting dockerd"
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    systemctl start docker
  else
    mkdir -p /var/log
    # A daemon killed with its session leaves pid files behind; remove them only when no dockerd runs.
    if ! pgrep -x dockerd >/dev/null; then
      rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
    fi
    setsid dockerd >/var/log/narwhal-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && { timing dockerd; return 0; }; sleep 1; done
  die "dockerd did not answer within 60 s; see /var/log/narwhal-dockerd.log"
}

need_venv() {
  local stamp=$VENV/.narwhal-requirements req_hash
  req_hash=$(cat requirements.txt requirements/*.txt | sha256sum | cut -c1-16)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req_hash" ] && return 0
  step "venv at $VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements/dev.txt 2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c "import ansible, molecule, dotenv, jsonschema, docker" || die "venv install failed"
  echo "$req_hash" > "$stamp"
  timing venv
}

need_collections() {
  local dest=collections/ansible_collections
  [ -f "$dest/community/docker/MANIFEST.json" ] && [ -f "$dest/ansible/posix/MANIFEST.json" ] && return 0
  step "community.docker + ansible.posix from the PyPI '$ANSIBLE_BUNDLE' wheel (Galaxy is not needed)"
  local tmp; tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps -d "$tmp" "$ANSIBLE_BUNDLE" 2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" - "$tmp" "$dest" <<'PY'
import pathlib, sys, zipfile
tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(tmp.glob("ansible-*.whl"))
wanted = ("ansible_collections/community/docker/", "ansible_collections/ansible/posix/")
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith(wanted) and not name.endswith("/"):
            target = dest / name[len("ansible_collections/"):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
PY
  rm -rf "$tmp"
  timing collections
}

need_system
[ "$HARNESS" = 1 ] && need_docker
need_venv
need_collections
if [ "$HARNESS" = 1 ]; then
  step "harness images (cached by a hash of their inputs): ${NARWHAL_IMAGES:-sim}"
  # sim = the simulated hosts and stand-in engines; `make test` / `make real` add the real CPU vLLM image
  # shellcheck disable=SC2086
  scripts/build-images.sh ${NARWHAL_IMAGES:-sim} >/dev/null
  timing images
fi
printf 'bootstrap: ready (venv %s)\n' "$VENV" >&2
