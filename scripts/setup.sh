#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install tank-log with its dev and airflow extras, compiling its codec core
# (Cython + gcc). Idempotent: reinstalls only when pyproject.toml, setup.py or the compiled core's source changed
# since the last successful install, or when the compiled core is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.tank-log-installed
pyx=$(find tank_log -name '*.pyx' | sort)
want=$(cat pyproject.toml setup.py $pyx | sha256sum | cut -d' ' -f1)
missing=0
for f in $pyx; do
    ls "${f%.pyx}".*.so >/dev/null 2>&1 || missing=1
done
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ "$missing" = 1 ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    TANK_LOG_REQUIRE_NATIVE=1 .venv/bin/python -m pip install --quiet -e ".[dev,airflow]"
    echo "$want" > "$stamp"
fi
# Spark drivers map a class-data archive of their JDK and Spark jars (tank_spark/class_archive.py): ~4 s less per
# job start. Built once (~40 s), again after Spark or the JDK changed; a driver without it just starts slower.
.venv/bin/python -m tank_spark.class_archive --if-missing >/dev/null ||
    echo "setup: no Spark class archive built; jobs start without it" >&2
