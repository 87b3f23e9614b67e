#!/usr/bin/env bash
# Build the proving ground's images locally (no registry): a Debian root filesystem made with
# mmdebstrap and `docker import`, then a small Dockerfile layer on top. Every image is tagged with a
# hash of its inputs and skipped when that tag already exists, so a second run costs ~1 s.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=tests/harness/images
SUITE=bookworm
MIRROR=${NARWHAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export DOCKER_BUILDKIT=0

log() { printf '[images] %s\n' "$*" >&2; }

hash_of() {  # hash_of FILE_OR_DIR... -> 12 hex chars over names and contents
  (for p in "$@"; do
     if [ -d "$p" ]; then (cd "$p" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); else sha256sum "$p"; fi
   done; echo "$SUITE") | sha256sum | cut -c1-12
}

rootfs() {  # rootfs NAME VARIANT -> prints the tag
  local name=$1 variant=$2 list=$IMAGES/$1.rootfs tag
  tag="narwhal-sim/$name-rootfs:$(hash_of "$list" <(echo "$variant"))"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "building $tag (mmdebstrap --variant=$variant, about 1-2 min)"
    local start=$SECONDS pkgs
    pkgs=$(grep -v '^\s*#' "$list" | grep -v '^\s*$' | paste -sd, -)
    local tar; tar=$(mktemp --suffix=.tar)
    mmdebstrap --variant="$variant" --include="$pkgs" "$SUITE" "$tar" "$MIRROR" 2>&1 | grep -E '^(E|W):' >&2 || true
    [ -s "$tar" ] || { rm -f "$tar"; echo "mmdebstrap failed for $name" >&2; exit 1; }
    docker import "$tar" "$tag" >/dev/null
    rm -f "$tar"
    log "built $tag in $((SECONDS - start)) s"
  fi
  echo "$tag"
}

layer() {  # layer DIR BASE_TAG [IMAGE_NAME DOCKERFILE] -> builds $IMAGES/DIR on BASE_TAG, tags :<hash> and :latest
  local dir=$1 base=$2 name=${3:-$1} dockerfile=${4:-Dockerfile} tag
  tag="narwhal-sim/$name:$(hash_of "$IMAGES/$dir" <(echo "$base $dockerfile"))"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "building $tag"
    docker build -q --build-arg "BASE=$base" -f "$IMAGES/$dir/$dockerfile" -t "$tag" "$IMAGES/$dir" >/dev/null
  fi
  docker tag "$tag" "narwhal-sim/$name:latest"
  echo "$tag"
}

main() {
  local what=${1:-all} host_base engine_base
  case $what in
    host|all) host_base=$(rootfs host apt); layer host "$host_base" ;;&
    engine|all) engine_base=$(rootfs engine minbase); layer engine-standin "$engine_base"
      layer engine-standin "$engine_base" engine-standin-rocm Dockerfile.rocm ;;
  esac
}
main "$@"
