#!/usr/bin/env bash
# PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) must answer before the tests run under
# CI=true: start whichever is installed but stopped, and fail loudly if one cannot be reached.
set -euo pipefail

answers() {  # host port: does anything accept a TCP connection there?
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_for() {  # name port
    for _ in $(seq 60); do
        answers 127.0.0.1 "$2" && { echo "services: $1 is up on 127.0.0.1:$2"; return 0; }
        sleep 0.5
    done
    echo "services: $1 does not answer on 127.0.0.1:$2 and could not be started" >&2
    return 1
}

start_postgres() {
    if command -v pg_lsclusters >/dev/null; then  # Debian's postgresql-common
        pg_lsclusters --no-header | while read -r version cluster _port status _rest; do
            [ "$status" = online ] || pg_ctlcluster "$version" "$cluster" start || true
        done
    elif command -v service >/dev/null; then
        service postgresql start || true
    fi
}

start_redis() {
    if command -v redis-server >/dev/null; then  # keeps nothing on disk, like the machine's own
        redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize yes
    elif command -v service >/dev/null; then
        service redis-server start || true
    fi
}

answers 127.0.0.1 5432 || { echo "services: starting PostgreSQL"; start_postgres; }
answers 127.0.0.1 6379 || { echo "services: starting Redis"; start_redis; }
wait_for PostgreSQL 5432
wait_for Redis 6379
