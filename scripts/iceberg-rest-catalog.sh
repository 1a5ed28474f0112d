#!/usr/bin/env bash
# The Apache Iceberg reference REST catalog (RESTCatalogServer, iceberg-open-api's test fixture) on this host, for
# the tests and for trying tables by name (docs/guides/export-iceberg.md):
#
#   scripts/iceberg-rest-catalog.sh install          fetch its jars into .jars/iceberg-rest/ (once; scripts/setup.sh)
#   scripts/iceberg-rest-catalog.sh start PORT DIR   start it on port PORT, its state in DIR; returns once it answers
#   scripts/iceberg-rest-catalog.sh stop DIR         stop the one started with DIR (its process group)
#
# DIR holds the catalog's SQLite database (catalog.db: it survives a stop, so a restart finds its tables), the
# warehouse where it puts new tables (warehouse/<namespace>/<table>), the server's log (server.log) and its pid
# (server.pid). Clients use http://127.0.0.1:PORT (the reference server takes a port, not an address: it listens on
# every interface of the host). Exit codes: 0 done, 1 failed (the log's last lines say why), 2 usage.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM=$ROOT/scripts/iceberg-rest/pom.xml
JARS=${TANK_LOG_ICEBERG_REST_JARS:-$ROOT/.jars/iceberg-rest}
MAIN=org.apache.iceberg.rest.RESTCatalogServer
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1
START_TIMEOUT_S=${TANK_LOG_ICEBERG_REST_START_TIMEOUT:-90}

usage() {
    echo "usage: $0 install | start PORT DIR | stop DIR" >&2
    exit 2
}

digest() { sha256sum "$POM" | cut -d' ' -f1; }

install() {
    # Idempotent: skipped when the folder was filled for this pom. Maven resolves into a temporary folder beside it,
    # which replaces the folder only once complete.
    if [ "$(cat "$JARS/.installed" 2>/dev/null)" = "$(digest)" ]; then
        echo "already installed: $(ls "$JARS"/*.jar | wc -l) jars in $JARS"
        return
    fi
    command -v mvn >/dev/null || { echo "$0: mvn not found: Maven fetches the catalog's jars (apt-get install maven)" >&2; exit 1; }
    mkdir -p "$(dirname "$JARS")"
    tmp=$(mktemp -d "$(dirname "$JARS")/.iceberg-rest.XXXXXX")
    trap 'rm -rf "${tmp:-}"' EXIT
    if ! mvn -B -q -f "$POM" "$DEPENDENCY_PLUGIN:copy-dependencies" -DincludeScope=runtime \
        -DoutputDirectory="$tmp/jars" </dev/null >"$tmp/mvn.log" 2>&1; then
        echo "$0: mvn failed:" >&2
        tail -20 "$tmp/mvn.log" >&2
        exit 1
    fi
    digest >"$tmp/jars/.installed"
    sync "$tmp/jars"/* 2>/dev/null || sync
    if [ -e "$JARS" ]; then mv "$JARS" "$tmp/old"; fi
    mv "$tmp/jars" "$JARS"
    echo "fetched: $(ls "$JARS"/*.jar | wc -l) jars in $JARS"
}

alive() { [ -f "$1/server.pid" ] && kill -0 "$(cat "$1/server.pid")" 2>/dev/null; }

start() {
    local port=$1 dir=$2
    [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || { echo "$0: port $port: expected 1-65535" >&2; exit 2; }
    [ "$(cat "$JARS/.installed" 2>/dev/null)" = "$(digest)" ] ||
        { echo "$0: the catalog's jars are not in $JARS: run bash scripts/setup.sh (or $0 install)" >&2; exit 1; }
    mkdir -p "$dir/warehouse"
    dir=$(cd "$dir" && pwd)
    if alive "$dir"; then
        echo "$0: a catalog started with $dir runs already (pid $(cat "$dir/server.pid")): stop it first" >&2
        exit 1
    fi
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
        echo "$0: port $port: something answers there already" >&2
        exit 1
    fi
    # The server reads its catalog's properties from CATALOG_* variables (CATALOG_REST_PORT: rest.port); others
    # the caller has set are dropped. setsid: the server leads its own process group, which stop kills.
    env $(env | sed -n 's/^\(CATALOG_[A-Za-z0-9_]*\)=.*/-u \1/p') \
        CATALOG_URI="jdbc:sqlite:$dir/catalog.db" CATALOG_WAREHOUSE="$dir/warehouse" CATALOG_REST_PORT="$port" \
        setsid java -cp "$JARS/*" "$MAIN" </dev/null >>"$dir/server.log" 2>&1 &
    echo $! >"$dir/server.pid"
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -sf -o /dev/null "http://127.0.0.1:$port/v1/config"; do
        if ! alive "$dir"; then
            echo "$0: the catalog server exited while starting; $dir/server.log ends:" >&2
            tail -5 "$dir/server.log" >&2
            rm -f "$dir/server.pid"
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "$0: the catalog server did not answer on port $port within ${START_TIMEOUT_S}s; stopping it" >&2
            stop "$dir"
            exit 1
        fi
        sleep 0.2
    done
    echo "iceberg REST catalog: http://127.0.0.1:$port (pid $(cat "$dir/server.pid"), state in $dir)"
}

stop() {
    local dir=$1 pid
    if [ ! -f "$dir/server.pid" ]; then
        echo "no catalog started with $dir"
        return
    fi
    pid=$(cat "$dir/server.pid")
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do  # 10 s for a clean stop, then SIGKILL
        kill -0 -- "-$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 -- "-$pid" 2>/dev/null; then
        kill -KILL -- "-$pid" 2>/dev/null || true
        while kill -0 -- "-$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$dir/server.pid"
    echo "iceberg REST catalog stopped (pid $pid)"
}

case "${1:-}" in
    install) [ $# -eq 1 ] || usage; install ;;
    start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
    stop) [ $# -eq 2 ] || usage; stop "$2" ;;
    *) usage ;;
esac
