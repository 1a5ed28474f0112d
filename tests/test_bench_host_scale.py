"""bench/host_scale.py --short: a tiny host through every nightly step, so the benchmark keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --short leaves out the steps that start Spark at any size (maintain_executors, import_executors): a few seconds
STEPS = ["maintain_cli", "maintain_job", "export_delta", "export_iceberg", "import_delta", "audit"]


@pytest.mark.slow
@pytest.mark.spark
def test_short_run_reports_every_step_of_the_host(tmp_path):
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "host_scale.py"), "--short", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    # the table: a header, a rule, one row per step
    header = next(i for i, line in enumerate(lines) if line.startswith("| size | step | load before | load during |"))
    rows = [line for line in lines[header + 2 :] if line.startswith("| ")]
    assert [row.split(" | ")[1] for row in rows] == STEPS
    # then the JSON blob
    blob = json.loads("\n".join(lines[lines.index("{") :]))
    (size,) = blob["sizes"]
    host = size["host"]
    assert 15 <= host["partitions"] <= 25 and host["bytes"] < 10e6
    assert list(size["steps"]) == STEPS
    for name, step in size["steps"].items():
        assert step["exit"] == 0 and step["wall_s"] > 0 and step["cpu_s"] > 0, name
        assert step["peak_rss_mib"] > 10 and step["processes"] >= 1, name
        assert 10 < step["driver_rss_mib"] <= step["peak_rss_mib"], name  # the step's own process, and the tree's
        low, mean, high = step["load_during"]  # sampled every second while it ran
        assert 0 <= low <= mean <= high, name
        assert step["growth"] == 1.0, name  # one size: its own reference
        assert step["s_per_gb"] > 0 and step["ms_per_partition"] > 0, name
    assert size["steps"]["export_delta"]["table_files"] > 0
    assert size["steps"]["export_iceberg"]["table_files"] > 0
    assert size["steps"]["export_delta"]["table_mb"] > 0
    assert {size["steps"][s]["executed_on"] for s in ("maintain_job", "export_delta", "import_delta")} == {"driver"}
    assert size["steps"]["export_delta"]["written_mb"] > 0  # the tree's bytes written are counted
    # maintain did its work: retention deleted from the delete topics, compaction shrank the cleanup topics
    assert host["bytes_after_maintain"] < host["bytes"]
