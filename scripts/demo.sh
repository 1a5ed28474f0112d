#!/usr/bin/env bash
# One command: set up, write the demo data directory, run the compaction job on it (Spark local mode), then show
# statistics and verify the result.
#   bash scripts/demo.sh [DIR [REPORT]]    (defaults: ./demo-data, recreated; ./reports/compact-demo.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DIR=${1:-demo-data}
REPORT=${2:-reports/compact-demo.json}
rm -rf "$DIR"
mkdir -p "$(dirname "$REPORT")"
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
.venv/bin/tank-log demo "$DIR"
echo "== before compaction"
.venv/bin/tank-log stats "$DIR"
# the demo data is not served by a broker, hence --broker-stopped (docs/FORMAT.md §9: mutations need it stopped);
# --in-driver-max-bytes 0: on Spark's executors, although data this small runs in the driver's processes by default
.venv/bin/python jobs/compact.py --data-dir "$DIR" --broker-stopped --in-driver-max-bytes 0 \
    --report "$REPORT"
echo "== after compaction (report: $REPORT)"
.venv/bin/tank-log stats "$DIR"
.venv/bin/tank-log verify "$DIR"
