#!/usr/bin/env bash
# Starts the real services idemguard's tests use, on free loopback ports
# under one temporary directory, and exports their addresses:
#
#   IDEMGUARD_REDIS_ADDR           standalone Redis
#   IDEMGUARD_REDIS_CLUSTER_ADDRS  3-master Redis Cluster
#   IDEMGUARD_REDLOCK_ADDRS        3 independent Redis nodes for Redlock
#   IDEMGUARD_REDIS_REPLICATION    a master and its replica ("master,replica")
#   IDEMGUARD_POSTGRES_DSN         PostgreSQL 15, database idemguard
#   IDEMGUARD_REDIS_SERVER         the redis-server binary, for tests that start their own
#   IDEMGUARD_POSTGRES_BIN         PostgreSQL's bin directory, for tests that start their own
#
# Usage:
#   tools/services.sh run CMD [ARG...]  start, run CMD with the variables set, stop (even on failure)
#   tools/services.sh up [DIR]          start and leave running; the variables go to DIR/env
#   tools/services.sh down [DIR]        stop what `up` started
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
log() { echo "services: $*" >&2; }

install_redis() {
  # redis-server, and the interpreters of the gateway tests' upstreams
  # (node, python3), each installed when missing.
  local pkgs=()
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || pkgs+=(redis-server)
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v python3 >/dev/null || pkgs+=(python3)
  [ ${#pkgs[@]} -gt 0 ] || return 0
  log "installing ${pkgs[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${pkgs[@]}" >&2
}

# free_port prints a loopback port nothing listens on, not handed out before.
# Ports and their cluster bus ports (port+10000) stay in 10000-32767, below
# Linux's ephemeral range (32768-60999): a port a client connection holds
# there accepts no connection, so it looks free, yet redis-server cannot
# bind it.
USED=" "
free_port() {
  local p
  while :; do
    p=$(( 10000 + RANDOM % 12768 ))
    [[ $USED == *" $p "* ]] && continue
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
      # cluster nodes also use port+10000 for their bus
      if (( p + 10000 < 65536 )) && ! (exec 3<>/dev/tcp/127.0.0.1/$((p + 10000))) 2>/dev/null; then
        USED+="$p $((p + 10000)) "
        echo "$p"
        return
      fi
    fi
  done
}

wait_redis() {
  local port=$1 i
  for i in $(seq 1 200); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  log "redis on port $port did not start"; return 1
}

start_redis() { # port dir [extra args...]
  local port=$1 dir=$2; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --save "" --appendonly no \
    --enable-debug-command yes "$@" >/dev/null
  wait_redis "$port" || { tail -n 5 "$dir/redis.log" >&2; return 1; }
}

start_all() {
  local dir=$1
  install_redis
  chmod 755 "$dir"
  local env="$dir/env"; : >"$env"

  local p; p=$(free_port)
  start_redis "$p" "$dir/redis"
  echo "export IDEMGUARD_REDIS_ADDR=127.0.0.1:$p" >>"$env"

  local cluster=() addrs=() i
  for i in 1 2 3; do
    p=$(free_port)
    start_redis "$p" "$dir/cluster$i" --cluster-enabled yes --cluster-config-file "$dir/cluster$i/nodes.conf" \
      --cluster-node-timeout 2000
    cluster+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${cluster[@]}" --cluster-yes >"$dir/cluster-create.log" 2>&1 \
    || { cat "$dir/cluster-create.log" >&2; return 1; }
  local node ok=0
  for i in $(seq 1 200); do
    ok=1
    for node in "${cluster[@]}"; do
      redis-cli -p "${node##*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || { ok=0; break; }
    done
    [ "$ok" = 1 ] && break
    sleep 0.05
  done
  [ "$ok" = 1 ] || { log "the cluster ${cluster[*]} did not reach cluster_state:ok"; return 1; }
  echo "export IDEMGUARD_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${cluster[*]}")" >>"$env"

  addrs=()
  for i in 1 2 3; do
    p=$(free_port)
    start_redis "$p" "$dir/redlock$i"
    addrs+=("127.0.0.1:$p")
  done
  echo "export IDEMGUARD_REDLOCK_ADDRS=$(IFS=,; echo "${addrs[*]}")" >>"$env"

  local mp rp
  mp=$(free_port); start_redis "$mp" "$dir/master"
  rp=$(free_port); start_redis "$rp" "$dir/replica" --replicaof 127.0.0.1 "$mp"
  echo "export IDEMGUARD_REDIS_REPLICATION=127.0.0.1:$mp,127.0.0.1:$rp" >>"$env"

  p=$(free_port)
  mkdir -p "$dir/pg"
  chown postgres:postgres "$dir/pg"
  runuser -u postgres -- "$PGBIN/initdb" -D "$dir/pg/data" -A trust -U postgres >"$dir/pg/initdb.log" 2>&1 \
    || { cat "$dir/pg/initdb.log" >&2; return 1; }
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/log" -w -t 60 \
    -o "-p $p -k $dir/pg -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=300" \
    start >/dev/null
  runuser -u postgres -- "$PGBIN/createdb" -h 127.0.0.1 -p "$p" -U postgres idemguard
  echo "export IDEMGUARD_POSTGRES_DSN=postgres://postgres@127.0.0.1:$p/idemguard?sslmode=disable" >>"$env"

  echo "export IDEMGUARD_REDIS_SERVER=$(command -v redis-server)" >>"$env"
  echo "export IDEMGUARD_POSTGRES_BIN=$PGBIN" >>"$env"
  log "started; addresses in $env"
}

stop_all() {
  local dir=$1 f
  [ -d "$dir" ] || return 0
  if [ -f "$dir/pg/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/pg/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  for f in "$dir"/*/redis.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

cmd=${1:-}; shift || true
case "$cmd" in
  run)
    [ $# -gt 0 ] || { echo "usage: $0 run CMD [ARG...]" >&2; exit 2; }
    dir=$(mktemp -d /tmp/idemguard-services.XXXXXX)
    trap 'stop_all "$dir"' EXIT
    trap 'exit 130' INT TERM
    start_all "$dir"
    # shellcheck disable=SC1091
    . "$dir/env"
    export IDEMGUARD_REQUIRE_SERVICES=1
    "$@"
    ;;
  up)
    dir=${1:-/tmp/idemguard-dev}
    stop_all "$dir"; mkdir -p "$dir"
    start_all "$dir"
    cat "$dir/env"
    ;;
  down)
    stop_all "${1:-/tmp/idemguard-dev}"
    ;;
  *)
    echo "usage: $0 run CMD [ARG...] | up [DIR] | down [DIR]" >&2; exit 2 ;;
esac
