#!/usr/bin/env bash
# The proving ground's real registry (docs/proving-ground.md, "A real registry"): Debian's docker-registry
# (distribution 2.8) on the controller, htpasswd authentication (bcrypt) and TLS from a test CA, as a process of its own.
#
#   tests/harness/registry.sh up DIR ADDRESS PORT [LOCAL=NAME ...]
#       makes (once) in DIR a test CA, a server certificate for ADDRESS (IP SAN), a user and a generated password
#       (htpasswd -B), the registry's config.yml; starts `docker-registry serve` in the background (setsid,
#       DIR/registry.pid, DIR/registry.log) listening on ADDRESS:PORT only, and waits until /v2/ answers 401 without
#       credentials. A registry already running from DIR on ADDRESS:PORT is reused. Then pushes each local image
#       LOCAL of the controller's daemon as ADDRESS:PORT/NAME (see push) and prints how long each push took.
#   tests/harness/registry.sh push DIR LOCAL=NAME ...
#       trusts DIR/ca.crt on the controller's daemon (/etc/docker/certs.d/ADDRESS:PORT/ca.crt), logs in with a
#       throw-away docker --config (password on stdin), tags, pushes, removes the tag it added.
#   tests/harness/registry.sh down DIR
#       stops the registry, removes the controller daemon's trust of it; DIR (certificates, credentials, the
#       pushed blobs under DIR/data) stays for the next `up`.
#
# What the operator side uses (all in DIR): ca.crt (NARWHAL_REGISTRY_CA_FILE), auth.json (Docker's config.json
# with the right credentials, 0600: NARWHAL_REGISTRY_AUTH_FILE), auth-wrong.json (the same user, a wrong password,
# 0600: the refusal test), other-ca.crt (a CA that did not sign the registry's certificate: the refusal test),
# address (ADDRESS:PORT). The password is in DIR/password (0600), never in an argument.
set -euo pipefail
REGISTRY_BIN=${REGISTRY_BIN:-/usr/bin/docker-registry}
USER_NAME=narwhal
CERT_DAYS=30

die() { printf 'registry: %s\n' "$*" >&2; exit 1; }
say() { printf 'registry: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

running_pid() {  # the pid of the registry DIR started, when it still runs
  local dir=$1 pid
  [ -s "$dir/registry.pid" ] || return 1
  pid=$(cat "$dir/registry.pid")
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$REGISTRY_BIN")" ] || return 1
  echo "$pid"
}

answers() {  # answers DIR ADDR:PORT: /v2/ over TLS (our CA) refuses an anonymous client with 401
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$1/ca.crt" "https://$2/v2/" || true)
  [ "$code" = 401 ]
}

make_ca() {  # make_ca KEY CRT CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1" -out "$2" -days "$CERT_DAYS" \
    -subj "/CN=$3" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
}

certificates() {  # certificates DIR ADDRESS: the CA (kept), a server certificate for ADDRESS (made again when needed)
  local dir=$1 addr=$2
  (
    umask 077
    if [ ! -s "$dir/ca.key" ] || ! openssl x509 -checkend 86400 -noout -in "$dir/ca.crt" >/dev/null 2>&1; then
      make_ca "$dir/ca.key" "$dir/ca.crt" "narwhal proving-ground registry CA"
      rm -f "$dir/server.crt"
    fi
    if [ ! -s "$dir/other-ca.crt" ]; then  # a CA nobody's certificate is signed with (its key is thrown away)
      make_ca "$dir/other-ca.key" "$dir/other-ca.crt" "narwhal proving-ground unrelated CA" && rm -f "$dir/other-ca.key"
    fi
    if [ -s "$dir/server.crt" ] && openssl verify -CAfile "$dir/ca.crt" "$dir/server.crt" >/dev/null 2>&1 \
        && openssl x509 -checkend 86400 -noout -in "$dir/server.crt" >/dev/null 2>&1 \
        && openssl x509 -noout -ext subjectAltName -in "$dir/server.crt" 2>/dev/null | grep -qx "    IP Address:$addr"; then
      exit 0
    fi
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/server.key" \
      -out "$dir/server.csr" -subj "/CN=$addr" 2>/dev/null
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
      -days "$CERT_DAYS" -out "$dir/server.crt" 2>/dev/null \
      -extfile <(printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n' "$addr")
    rm -f "$dir/server.csr"
  )
  chmod 0644 "$dir/ca.crt" "$dir/other-ca.crt" "$dir/server.crt"
}

credentials() {  # credentials DIR ADDR:PORT: the user's password (made once), htpasswd, the operator's auth files
  local dir=$1 hostport=$2
  (
    umask 077
    [ -s "$dir/password" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=\n' > "$dir/password"
    # -i: the password from stdin, never in argv; -B: bcrypt (the only hash distribution's htpasswd accepts)
    htpasswd -B -c -i "$dir/htpasswd" "$USER_NAME" < "$dir/password" 2>/dev/null
    auth_file() {  # auth_file FILE PASSWORD-SUFFIX: Docker's config.json, as `docker login` writes it
      local token
      token=$( { printf '%s:' "$USER_NAME"; cat "$dir/password"; printf '%s' "$2"; } | base64 -w0)
      printf '{\n  "auths": {\n    "%s": {\n      "auth": "%s"\n    }\n  }\n}\n' "$hostport" "$token" > "$1.part"
      chmod 0600 "$1.part" && mv "$1.part" "$1"
    }
    auth_file "$dir/auth.json" ""
    auth_file "$dir/auth-wrong.json" "-wrong"
  )
}

config() {  # config DIR ADDR:PORT
  local dir=$1 hostport=$2
  cat > "$dir/config.yml" <<EOF
# tests/harness/registry.sh: the proving ground's registry (distribution 2.8, Debian's docker-registry)
version: 0.1
log:
  level: info
  fields:
    service: narwhal-proving-ground-registry
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $hostport
  tls:
    certificate: $dir/server.crt
    key: $dir/server.key
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: narwhal-proving-ground
    path: $dir/htpasswd
EOF
}

stop() {  # stop DIR: the registry DIR started, TERM then KILL
  local dir=$1 pid
  if pid=$(running_pid "$dir"); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    say "stopped (pid $pid)"
  fi
  rm -f "$dir/registry.pid"
}

up() {
  [ "$#" -ge 3 ] || die "usage: $0 up DIR ADDRESS PORT [LOCAL=NAME ...]"
  local dir=$1 addr=$2 port=$3 hostport pid
  shift 3
  [[ $addr =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "ADDRESS must be an IPv4 address (got '$addr')"
  [[ $port =~ ^[0-9]+$ ]] || die "PORT must be a number (got '$port')"
  for tool in "$REGISTRY_BIN" htpasswd openssl curl; do
    command -v "$tool" >/dev/null || die "$tool is missing: scripts/bootstrap.sh installs docker-registry, apache2-utils, openssl and curl"
  done
  mkdir -p "$dir/data" && chmod 0700 "$dir"
  dir=$(cd "$dir" && pwd)
  hostport=$addr:$port
  if pid=$(running_pid "$dir") && [ "$(cat "$dir/address" 2>/dev/null)" = "$hostport" ] && answers "$dir" "$hostport"; then
    say "already running on $hostport (pid $pid), reused"
  else
    stop "$dir"
    certificates "$dir" "$addr"
    credentials "$dir" "$hostport"
    config "$dir" "$hostport"
    echo "$hostport" > "$dir/address"
    setsid "$REGISTRY_BIN" serve "$dir/config.yml" >> "$dir/registry.log" 2>&1 < /dev/null &
    echo $! > "$dir/registry.pid"
    local t0; t0=$(now)
    for _ in $(seq 150); do
      answers "$dir" "$hostport" && break
      running_pid "$dir" >/dev/null || { tail -n 20 "$dir/registry.log" >&2; die "docker-registry exited (log: $dir/registry.log)"; }
      sleep 0.2
    done
    answers "$dir" "$hostport" || { tail -n 20 "$dir/registry.log" >&2; die "https://$hostport/v2/ did not answer 401 within 30 s"; }
    say "up on https://$hostport (pid $(cat "$dir/registry.pid"), answering in $(since "$t0") s; log $dir/registry.log)"
  fi
  [ "$#" = 0 ] || push "$dir" "$@"
}

push() {
  [ "$#" -ge 2 ] || die "usage: $0 push DIR LOCAL=NAME ..."
  local dir hostport conf out pair local_ref ref t0 digest
  [ -s "$1/address" ] || die "$1 holds no registry: run '$0 up' first"
  dir=$(cd "$1" && pwd); shift
  hostport=$(cat "$dir/address")
  answers "$dir" "$hostport" || die "the registry of $dir does not answer on $hostport: run '$0 up' first"
  # the controller's daemon trusts the test CA for this registry only (Docker reads certs.d at each push)
  mkdir -p "/etc/docker/certs.d/$hostport" 2>/dev/null && install -m 0644 "$dir/ca.crt" "/etc/docker/certs.d/$hostport/ca.crt" \
    || die "cannot write /etc/docker/certs.d/$hostport/ca.crt (pushes need root to trust the test CA)"
  conf=$(mktemp -d) && CONF=$conf  # the throw-away login, removed on exit
  trap 'rm -rf "${CONF:-}"' EXIT
  out=$(docker --config "$conf" login -u "$USER_NAME" --password-stdin "$hostport" < "$dir/password" 2>&1) \
    || die "docker login $hostport failed: $out"
  for pair in "$@"; do
    [[ $pair == *=* ]] || die "'$pair' is not LOCAL=NAME"
    local_ref=${pair%%=*} ref=$hostport/${pair#*=}
    docker image inspect "$local_ref" >/dev/null 2>&1 || die "no local image $local_ref on the controller's daemon"
    docker tag "$local_ref" "$ref"
    t0=$(now)
    digest=$(docker --config "$conf" push "$ref" | sed -n 's/.*digest: \(sha256:[0-9a-f]*\).*/\1/p') \
      || { docker image rm "$ref" >/dev/null 2>&1 || true; die "docker push $ref failed"; }
    say "pushed $local_ref as $ref in $(since "$t0") s ($digest, $(docker image inspect -f '{{.Size}}' "$local_ref") bytes)"
    docker image rm "$ref" >/dev/null  # the tag added above only: $local_ref keeps the image
  done
  rm -rf "$conf"
}

down() {
  [ "$#" = 1 ] || die "usage: $0 down DIR"
  local dir=$1 hostport
  [ -d "$dir" ] || { say "no registry in $dir"; return 0; }
  stop "$dir"
  hostport=$(cat "$dir/address" 2>/dev/null || true)
  if [ -n "$hostport" ] && cmp -s "$dir/ca.crt" "/etc/docker/certs.d/$hostport/ca.crt"; then
    rm -rf "/etc/docker/certs.d/${hostport:?}"
  fi
}

case ${1:-} in
  up|push|down) cmd=$1; shift; "$cmd" "$@" ;;
  *) die "usage: $0 up DIR ADDRESS PORT [LOCAL=NAME ...] | push DIR LOCAL=NAME ... | down DIR" ;;
esac
