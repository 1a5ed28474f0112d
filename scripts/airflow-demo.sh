#!/usr/bin/env bash
# A local Airflow running the six tank-log DAGs on demo data (docs/guides/airflow.md, "Run every DAG locally").
#   bash scripts/airflow-demo.sh           set up, then one `airflow dags test tank_compaction_nightly` on fresh data
#   bash scripts/airflow-demo.sh setup     set up only (idempotent; existing demo data is kept)
#   bash scripts/airflow-demo.sh start     start the demo broker, the API server, the scheduler and the DAG processor
#                                          in the background; returns once the UI serves and the DAGs are parsed
#   bash scripts/airflow-demo.sh wait      wait until no DAG run is queued or running or about to be (an Asset event
#                                          queued); print each run that finished since the last `wait`, with its
#                                          reports; exit 1 if one of them failed
#   bash scripts/airflow-demo.sh stop      stop the services (SIGTERM) and the demo broker (SIGINT); returns once no
#                                          process of theirs is left
#   bash scripts/airflow-demo.sh broker-start | broker-stop   the demo broker alone (the maintenance window's
#                                          start and stop commands)
# Everything lives under $TANK_LOG_AIRFLOW_DIR (default ./.airflow): env.sh to source, AIRFLOW_HOME (SQLite), the job
# config job.yaml (demo-data, the lake, retention that keeps what the lake has not received), the window's hosts.yaml
# (one broker serving broker-data on 127.0.0.1:$TANK_LOG_DEMO_BROKER_PORT, default 11011: the stand-in broker
# tank_log.tools.standin_broker, or the real TANK broker when TANK_BIN names its binary), reports/, logs/ (services,
# broker) and run/ (pid files). Setup reads TANK_LOG_AIRFLOW_PORT (the API server and UI, default 8080),
# TANK_LOG_DEMO_BROKER_PORT and TANK_BIN, and writes them into env.sh. TANK_LOG_AIRFLOW_SKIP_INSTALL=1 skips
# scripts/setup.sh (the test suite's venv is installed already).
# Task retries are 0 here: a failure shows at once, and `airflow dags test` would wait out a retry delay.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CMD=${1:-run}
WORK=$(mkdir -p "${TANK_LOG_AIRFLOW_DIR:-.airflow}" && cd "${TANK_LOG_AIRFLOW_DIR:-.airflow}" && pwd)
SERVICES=(api-server scheduler dag-processor)

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

need_setup() {
    if [ ! -f "$WORK/env.sh" ]; then
        echo "airflow-demo: $WORK/env.sh: not set up; run: bash scripts/airflow-demo.sh setup" >&2
        exit 2
    fi
    # shellcheck source=/dev/null
    source "$WORK/env.sh"
}

alive() {  # the pid file's process runs: it exists and is no zombie (one that exited, still to be reaped)
    local pid stat
    pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

port_free() {  # $1 port, $2 what listens there, $3 the variable that sets it: exit 2 when something else has it
    if (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; then
        echo "airflow-demo: 127.0.0.1:$1 (the $2) is in use by another process: choose another port," \
            "e.g. $3=$(($1 + 1)) bash scripts/airflow-demo.sh setup" >&2
        exit 2
    fi
}

setup() {
    [ "${TANK_LOG_AIRFLOW_SKIP_INSTALL:-}" = 1 ] || bash scripts/setup.sh
    local port=${TANK_LOG_AIRFLOW_PORT:-8080} broker_port=${TANK_LOG_DEMO_BROKER_PORT:-11011} secret
    for var in TANK_LOG_AIRFLOW_PORT=$port TANK_LOG_DEMO_BROKER_PORT=$broker_port; do
        if ! [[ ${var#*=} =~ ^[0-9]+$ ]] || [ "${var#*=}" -lt 1 ] || [ "${var#*=}" -gt 65535 ]; then
            echo "airflow-demo: ${var%%=*}=${var#*=}: expected a TCP port (1-65535)" >&2
            exit 2
        fi
    done
    mkdir -p "$WORK/reports" "$WORK/logs" "$WORK/run"
    # the API server signs the tokens its tasks use; every service must know the same secret
    secret=$(cat "$WORK/run/jwt_secret" 2>/dev/null || true)
    if [ -z "$secret" ]; then
        secret=$(.venv/bin/python -c "import secrets; print(secrets.token_hex(32))")
        (umask 077 && echo "$secret" > "$WORK/run/jwt_secret")
    fi
    (umask 077 && cat > "$WORK/env.sh" <<EOF
# The demo's Airflow (written by scripts/airflow-demo.sh setup): source it before any airflow command.
export TANK_LOG_AIRFLOW_DIR="$WORK"
export AIRFLOW_HOME="$WORK/home"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/airflow/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=8
# the API server (UI and REST API) and where tasks reach its execution API: the two must name the same port
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$port
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$port/execution/
export AIRFLOW__API_AUTH__JWT_SECRET=$secret
# no login: the UI listens on loopback only, and everyone who reaches it is an admin
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
# the Spark connection and the Variables the DAGs read
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
export AIRFLOW_VAR_TANK_LOG_HOME="$ROOT"
export AIRFLOW_VAR_TANK_LOG_CONFIG="$WORK/job.yaml"
export AIRFLOW_VAR_TANK_LOG_REPORTS="$WORK/reports"
export AIRFLOW_VAR_TANK_LOG_BROKER_STOPPED=true
export TANK_LOG_WINDOW_CONFIG="$WORK/hosts.yaml"
export TANK_LOG_DAG_RETRIES=0
# no schedules: a DAG runs when triggered, so the demo runs them in its order (retention, which keeps what the lake
# has not received, only after an export created the lake)
export TANK_COMPACTION_NIGHTLY_SCHEDULE=none TANK_RETENTION_HOURLY_SCHEDULE=none TANK_INDEX_VERIFY_WEEKLY_SCHEDULE=none
export TANK_EXPORT_NIGHTLY_SCHEDULE=none TANK_MAINTENANCE_WINDOW_SCHEDULE=none
export TANK_LOG_DEMO_BROKER_PORT=$broker_port
export TANK_BIN="${TANK_BIN:-}"
export PATH="$ROOT/.venv/bin:\$PATH"
export PYTHONPATH="$ROOT"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=\${SPARK_LOCAL_IP:-127.0.0.1}
EOF
    )
    # shellcheck source=/dev/null
    source "$WORK/env.sh"
    cat > "$WORK/job.yaml" <<EOF
# The demo's job configuration (paths are relative to this file). No broker serves demo-data: the jobs may change it.
data_dirs: [demo-data]
broker_stopped: true
spark: {master: "local[2]"}
retention:
  keep_unexported: {table: export}   # never delete what the lake (export.table) has not received
  topics:
    orders: {max_age: 7days}         # moved here from orders/config: the broker's own retention ignores the guard
export:
  table: lake
EOF
    cat > "$WORK/hosts.yaml" <<EOF
# The demo's maintenance window (TANK_LOG_WINDOW_CONFIG): one local broker serving broker-data.
maintenance_window: {spark_master: "local[1]"}
brokers:
  - name: demo-broker
    data_dirs: [broker-data]
    stop_command: TANK_LOG_AIRFLOW_DIR="$WORK" bash "$ROOT/scripts/airflow-demo.sh" broker-stop
    start_command: TANK_LOG_AIRFLOW_DIR="$WORK" bash "$ROOT/scripts/airflow-demo.sh" broker-start
    ready_check: tcp://127.0.0.1:$broker_port
    stop_timeout: 60s
    ready_timeout: 60s
EOF
    for data in demo-data broker-data; do
        if [ ! -d "$WORK/$data" ]; then
            demo_data "$WORK/$data"
        fi
    done
    echo "== Airflow home: $AIRFLOW_HOME"
    airflow db migrate > "$WORK/logs/migrate.log" 2>&1 || { tail -30 "$WORK/logs/migrate.log"; exit 1; }
    airflow dags reserialize > "$WORK/logs/reserialize.log" 2>&1 || { tail -30 "$WORK/logs/reserialize.log"; exit 1; }
}

demo_data() {  # the demo data, with `orders`' age limit moved from its topic config to job.yaml, as a topic that
    # keep_unexported guards needs (docs/guides/retention.md): the broker would delete by its own config, exported or not
    tank-log demo "$1" > /dev/null  # says where it wrote
    grep -v '^log.retention.secs=' "$1/orders/config" > "$1/orders/.config.tmp"
    mv "$1/orders/.config.tmp" "$1/orders/config"
}

broker_start() {
    need_setup
    local pidfile="$WORK/run/broker.pid" base="$WORK/broker-data" log="$WORK/logs/broker.log"
    if alive "$pidfile"; then
        echo "demo broker already runs (pid $(cat "$pidfile"))"
        return 0
    fi
    port_free "$TANK_LOG_DEMO_BROKER_PORT" "demo broker" TANK_LOG_DEMO_BROKER_PORT
    if [ -n "${TANK_BIN:-}" ]; then  # the real broker: SIGINT is its clean shutdown
        # shellcheck disable=SC2016 # the inner shell expands them: its pid is the broker's (exec)
        setsid sh -c 'echo $$ > "$1"; exec "$2" -p "$3" -l "127.0.0.1:$4"' sh "$pidfile" "$TANK_BIN" "$base" \
            "$TANK_LOG_DEMO_BROKER_PORT" >> "$log" 2>&1 < /dev/null &
    else
        setsid python -m tank_log.tools.standin_broker -p "$base" --port "$TANK_LOG_DEMO_BROKER_PORT" \
            --name demo-broker --pidfile "$pidfile" >> "$log" 2>&1 < /dev/null &
    fi
    for _ in $(seq 100); do [ -s "$pidfile" ] && break; sleep 0.1; done
    echo "demo broker started: ${TANK_BIN:-stand-in} on 127.0.0.1:$TANK_LOG_DEMO_BROKER_PORT, data $base"
}

broker_stop() {
    need_setup
    local pidfile="$WORK/run/broker.pid"
    if alive "$pidfile"; then
        kill -INT "$(cat "$pidfile")"
        echo "demo broker told to stop (SIGINT to pid $(cat "$pidfile"))"
    else
        echo "demo broker not running"
    fi
}

start() {
    need_setup
    alive "$WORK/run/api-server.pid" || port_free "$AIRFLOW__API__PORT" "Airflow API server" TANK_LOG_AIRFLOW_PORT
    alive "$WORK/run/broker.pid" || broker_start
    for svc in "${SERVICES[@]}"; do
        if alive "$WORK/run/$svc.pid"; then
            echo "$svc already runs (pid $(cat "$WORK/run/$svc.pid"))"
            continue
        fi
        setsid airflow "$svc" > "$WORK/logs/$svc.log" 2>&1 < /dev/null &
        echo $! > "$WORK/run/$svc.pid"
    done
    python "$ROOT/scripts/airflow_demo.py" ready
    echo "== Airflow UI: http://127.0.0.1:$AIRFLOW__API__PORT (logs: $WORK/logs, reports: $WORK/reports)"
}

stop() {  # every process of each service's session, then the broker's: see scripts/airflow_demo.py, `stop`
    need_setup
    python "$ROOT/scripts/airflow_demo.py" stop
}

run_one() {  # set up, then one run of the nightly compaction DAG on fresh demo data, in this process
    setup
    rm -rf "$WORK/demo-data" "$WORK/reports"
    demo_data "$WORK/demo-data"
    echo "== airflow dags test tank_compaction_nightly"
    airflow dags test tank_compaction_nightly > "$WORK/logs/dags-test.log" 2>&1 || true
    report=$(ls "$WORK"/reports/compact-*.json 2>/dev/null | head -1)
    if [ -z "$report" ]; then
        tail -40 "$WORK/logs/dags-test.log"
        echo "the DAG run wrote no report (log: $WORK/logs/dags-test.log)" >&2
        exit 1
    fi
    python - "$report" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print(json.dumps({k: report.get(k) for k in ("job", "status", "summary")}, indent=2))
sys.exit(0 if report["status"] == "ok" else 1)
EOF
    echo "== done: report $report, Airflow log $WORK/logs/dags-test.log"
}

case "$CMD" in
    run) run_one ;;
    setup)
        setup
        echo "== ready: bash scripts/airflow-demo.sh start, then: source $WORK/env.sh" ;;
    start) start ;;
    wait) need_setup; python "$ROOT/scripts/airflow_demo.py" wait ;;
    stop) stop ;;
    broker-start) broker_start ;;
    broker-stop) broker_stop ;;
    *) usage ;;
esac
