#!/usr/bin/env bash
# One command: set up, lint (ruff), type-check (mypy), run the whole test suite. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # type-checks tank_log and tank_spark, strictly ([tool.mypy] in pyproject.toml)
.venv/bin/python -m pytest "$@"
