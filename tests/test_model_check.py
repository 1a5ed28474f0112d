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
from conftest import ROOT, copy_tree, data_dir


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
    out = run_model_check(tmp_path, "--short-spark", "--seed", "1")  # every example starts with an export on Spark
    assert '"spark session started": 1' in out and "executors" in out


@pytest.mark.slow
def test_an_import_killed_past_its_commit_point_is_finished_by_running_it_again_with_append(tmp_path):
    """The import guide's advice after an interrupted import: run it again with `--append`. An import SIGKILLed
    right after it moved its first partition in (past its commit point; the model's kill at a file operation), then
    `--append`: exit 0 and exactly the messages of an import that was not interrupted. The same import run again
    without `--append` loses nothing either, but refuses the partitions the killed run committed, naming `--append`
    (exit 1)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from model_check import _messages_on_disk, killed_job

    src = copy_tree(data_dir("A_multi"), str(tmp_path / "src"))
    table = str(tmp_path / "table")
    export = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]"]
    done = subprocess.run([*export, "--data-dir", src, "--table", table], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def imported(base, *more):
        return killed_job("import", 0, {}, "--data-dir", base, "--table", table, *more)

    whole = str(tmp_path / "whole")
    killed, code, trace = imported(whole)
    assert not killed and code == 0, trace[-3000:]
    want = _messages_on_disk(whole)
    assert sum(map(len, want.values())) > 0
    moves = [line.split()[2].rstrip(":") for line in trace.splitlines()
             if line.startswith("file op") and " rename " in line and ".tank-import-" in line.split()[4]
             and ".tank-import-" not in line.split()[5]]  # fmt: skip
    assert moves, trace[-3000:]  # the commit moves staged partitions into the base path
    for then in (["--append"], []):
        base = str(tmp_path / f"killed{len(then)}")
        killed, _, err = killed_job("import", int(moves[0]), {}, "--data-dir", base, "--table", table)
        assert killed, err[-3000:]
        assert any(n.startswith(".tank-import-") for n in os.listdir(base))  # interrupted inside its commit
        again = subprocess.run(
            [sys.executable, os.path.join(ROOT, "jobs", "import_delta.py"), "--master", "local[1]", "--data-dir", base,
             "--table", table, *then], capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert _messages_on_disk(base) == want
        if then:
            assert again.returncode == 0, again.stderr[-3000:]
        else:
            assert again.returncode == 1 and "pass --append to continue it" in again.stdout + again.stderr, again
