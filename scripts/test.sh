#!/usr/bin/env bash
# One command: set up, lint (ruff), type-check (mypy), build the docs (mkdocs --strict), run the whole test suite.
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # type-checks tank_log and tank_spark, strictly ([tool.mypy] in pyproject.toml)
# the docs site: a broken link or anchor, a missing page or a failing reference generator fails the run. Not --quiet:
# it hides the warnings (and with them the reason the build aborts); the suite also runs README.md's own command.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$site"
rm -rf "$site"
# two workers (TANK_LOG_TEST_WORKERS; 0 for one process): most tests wait on real processes about half the time, so
# a second worker fills the idle core; each steals tests from the other when it runs out. Each worker starts with its
# slowest tests (tests/slowest_first.py: by this checkout's last measures, else tests/durations.json, which a whole
# run with --store-durations rewrites)
.venv/bin/python -m pytest -n "${TANK_LOG_TEST_WORKERS:-2}" --dist worksteal "$@"
