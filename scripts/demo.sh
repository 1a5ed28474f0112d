#!/usr/bin/env bash
# One command: set up, write the demo data directory, show its statistics and verify it.
#   bash scripts/demo.sh [DIR]      (default: ./demo-data, recreated)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DIR=${1:-demo-data}
rm -rf "$DIR"
.venv/bin/tank-log demo "$DIR"
.venv/bin/tank-log stats "$DIR"
.venv/bin/tank-log verify "$DIR"
