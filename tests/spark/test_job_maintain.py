"""jobs/maintain.py end to end on local Spark: one start-up, every step per partition, one report; the same files as
`tank-log maintain` (no Spark) on a copy."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, tree_digest

from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.tools.demo import write_demo

JOB = os.path.join(ROOT, "jobs", "maintain.py")


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_maintain_job_runs_every_step_and_equals_the_cli(tmp_path, where):
    """On Spark's executors (forced) and in the driver's processes (the default for data this small)."""
    base = write_demo(str(tmp_path / "a"), now_ms=1_790_000_000_000)
    copy = shutil.copytree(base, str(tmp_path / "b"))
    report_path = str(tmp_path / "r.json")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    r = subprocess.run(
        [sys.executable, JOB, "--master", "local[2]", "--data-dir", base, "--broker-stopped", "--report", report_path]
        + (["--in-driver-max-bytes=0"] if where == "executors" else []),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.load(open(report_path))
    assert report["job"] == "maintain" and report["status"] == "ok" and report["executed_on"] == where
    assert report["summary"]["by_status"] == {"maintained": 6} and report["summary"]["steps"]["verify"] == {"clean": 6}
    steps = {(p["topic"], p["partition"]): p["steps"] for p in report["partitions"]}
    assert steps[("profiles", 1)]["compaction"]["status"] == "compacted"
    assert steps[("orders", 2)]["retention"]["status"] == "deleted"
    assert "tank_log.progress: [6/6]" in r.stderr and "maintained (repair clean, retention" in r.stderr

    cli = subprocess.run(
        [sys.executable, "-m", "tank_log.tools.cli", "maintain", copy, "--broker-stopped"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert tree_digest(base) == tree_digest(copy) and read_cleanup_log(base) == read_cleanup_log(copy)
