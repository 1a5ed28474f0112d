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
want=$(cat pyproject.toml setup.py tank_log/format/_native.pyx | sha256sum | cut -d' ' -f1)
built=$(ls tank_log/format/_native.*.so 2>/dev/null || true)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ -z "$built" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    TANK_LOG_REQUIRE_NATIVE=1 .venv/bin/python -m pip install --quiet -e ".[dev,airflow]"
    echo "$want" > "$stamp"
fi
# Delta's jars for Spark (delta-spark, delta-storage; hadoop-aws and its AWS SDK for s3a://), fetched once with Maven
# into .jars/ (tank_spark/jars.py; ~700 MB, mostly the AWS SDK, cached in ~/.m2): skipped when present for this
# scripts/spark-jars/pom.xml and pyspark. Jobs never fetch anything. Needs mvn (apt-get install maven).
.venv/bin/python -m tank_spark.jars install
# Spark drivers map a class-data archive of their JDK and Spark jars (tank_spark/class_archive.py): ~4 s less per
# job start. Built once (~40 s), again after Spark or the JDK changed; a driver without it just starts slower.
.venv/bin/python -m tank_spark.class_archive --if-missing >/dev/null ||
    echo "setup: no Spark class archive built; jobs start without it" >&2
