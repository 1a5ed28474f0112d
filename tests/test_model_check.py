"""The model-based check of the whole product (`bench/model_check.py`) in its two short modes, each a few seeded
examples against a model of the log and of the table, ending with `violations: 0`:

- `--short` (10 examples of 20 steps, nothing that needs Spark): produce, the broker's life, compaction (also
  killed), retention, repair, damage, the export in the driver (delta-rs or pyiceberg; every format × mode ×
  partition_by × guard, binary and utf8 values), the export SIGKILLed before its commit or dying at its crash hook
  and run again (3 times a run: each is a process of its own), retention and the import SIGKILLed at a random file
  operation and run again, delta-rs OPTIMIZE/VACUUM, the import into a fresh base path and `--append` into it;
- `--short-spark` (2 examples of 15 steps, every export needing Spark: engine spark, JSON values or the export on
  executors, on one Spark session): produce, the export (also killed), the import and `--append`, delta-spark
  OPTIMIZE, DELETE and VACUUM on the table, and its rows read by delta-spark too.

The continuous export and the real broker (`TANK_BIN`/`TANK_CLI`) are in the long runs (bench/RESULTS.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT


def run_model_check(tmp_path, *flags):
    script = os.path.join(ROOT, "bench", "model_check.py")
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the examples' data: removed with the test's directory
    env.pop("TANK_BIN", None)  # the real broker: in the long runs
    done = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("violations: 0")
    assert '"combinations"' in done.stdout
    return done.stdout


@pytest.mark.slow
def test_every_combination_keeps_the_invariants(tmp_path):
    out = run_model_check(tmp_path, "--short", "--seed", "1")
    assert '"profile": "nospark"' in out


@pytest.mark.slow
@pytest.mark.spark
def test_every_combination_on_spark_keeps_the_invariants(tmp_path):
    out = run_model_check(tmp_path, "--short-spark", "--seed", "2")
    assert '"spark session started": 1' in out and "executors" in out
