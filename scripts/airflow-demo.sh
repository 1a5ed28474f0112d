#!/usr/bin/env bash
# One command: a local Airflow for the demo, then one run of the nightly compaction DAG on fresh demo data.
#   bash scripts/airflow-demo.sh           set up (below) and run `airflow dags test tank_compaction_nightly`
#   bash scripts/airflow-demo.sh setup     set up only; then: source .airflow/env.sh && airflow dags test <dag id>
# Set-up (idempotent, everything under $TANK_LOG_AIRFLOW_DIR, default ./.airflow): AIRFLOW_HOME and its database,
# the dags folder airflow/dags, the connection spark_default (master local[2]), the Variables the DAGs read
# (tank_log_home, tank_log_config, tank_log_reports, tank_log_broker_stopped=true: demo data has no broker), a job
# config whose data_dirs is the demo data, DAGs reserialized (so they are listed at once), and env.sh to source.
# Task retries are 0 here: `airflow dags test` would otherwise wait out the retry delay of a failed task.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
bash scripts/setup.sh
WORK=$(mkdir -p "${TANK_LOG_AIRFLOW_DIR:-.airflow}" && cd "${TANK_LOG_AIRFLOW_DIR:-.airflow}" && pwd)

cat > "$WORK/env.sh" <<EOF
export AIRFLOW_HOME="$WORK/home"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/airflow/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export PATH="$ROOT/.venv/bin:\$PATH"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
export SPARK_LOCAL_IP=\${SPARK_LOCAL_IP:-127.0.0.1}
export TANK_LOG_DAG_RETRIES=0
EOF
# shellcheck source=/dev/null
source "$WORK/env.sh"
cat > "$WORK/job.yaml" <<EOF
# The demo's job configuration (paths are relative to this file).
data_dirs: [demo-data]
broker_stopped: true
spark: {master: "local[2]"}
EOF

echo "== Airflow home: $AIRFLOW_HOME"
airflow db migrate > "$WORK/migrate.log" 2>&1 || { tail -30 "$WORK/migrate.log"; exit 1; }
airflow connections delete spark_default > /dev/null 2>&1 || true
airflow connections add spark_default --conn-type spark --conn-host 'local[2]' > /dev/null
airflow variables set tank_log_home "$ROOT" > /dev/null
airflow variables set tank_log_config "$WORK/job.yaml" > /dev/null
airflow variables set tank_log_reports "$WORK/reports" > /dev/null
airflow variables set tank_log_broker_stopped true > /dev/null
airflow dags reserialize > "$WORK/reserialize.log" 2>&1 || { tail -30 "$WORK/reserialize.log"; exit 1; }
airflow dags list 2>/dev/null | grep -E "^(dag_id|tank_)" || true

if [ "${1:-run}" = setup ]; then
    echo "== ready: source $WORK/env.sh && airflow dags test tank_compaction_nightly"
    exit 0
fi
rm -rf "$WORK/demo-data" "$WORK/reports"
tank-log demo "$WORK/demo-data"
echo "== airflow dags test tank_compaction_nightly"
airflow dags test tank_compaction_nightly > "$WORK/dags-test.log" 2>&1 || true
report=$(ls "$WORK"/reports/compact-*.json 2>/dev/null | head -1)
if [ -z "$report" ]; then
    tail -40 "$WORK/dags-test.log"
    echo "the DAG run wrote no report (log: $WORK/dags-test.log)" >&2
    exit 1
fi
python - "$report" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print(json.dumps({k: report.get(k) for k in ("job", "status", "summary")}, indent=2))
sys.exit(0 if report["status"] == "ok" else 1)
EOF
echo "== done: report $report, Airflow log $WORK/dags-test.log"
