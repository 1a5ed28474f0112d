#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install tank-log with its dev and airflow extras. Idempotent: reinstalls
# only when pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.tank-log-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[dev,airflow]"
    echo "$want" > "$stamp"
fi
