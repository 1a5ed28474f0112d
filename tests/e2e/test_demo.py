"""The README's first command, `bash scripts/demo.sh`, as a new user runs it (a real shell, Spark in local mode)."""

import json
import os
import subprocess

from conftest import ROOT

import tank_log
from tank_log.maintenance.verify import verify_path


def test_the_demo_command_compacts_the_demo_data_on_spark_and_verifies_it(tmp_path):
    demo, report_path = tmp_path / "demo", tmp_path / "reports" / "compact-demo.json"
    r = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "demo.sh"), str(demo), str(report_path)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "== before compaction" in r.stdout and "== after compaction" in r.stdout
    assert "0 error(s), 0 warning(s)" in r.stderr  # `tank-log verify` of the result
    report = json.loads(report_path.read_text())
    assert report["status"] == "ok" and report["executed_on"] == "executors"
    assert report["tank_log_version"] == tank_log.__version__  # which version changed the data
    assert report["spark"]["master"].startswith("local")
    summary = report["summary"]
    compacted = summary["by_status"]["compacted"]
    assert compacted >= 1 and summary["partitions"] == compacted + summary["by_status"].get("skipped", 0)
    assert 0 < summary["bytes_after"] < summary["bytes_before"]
    assert 0 < summary["messages_after"] < summary["messages_before"]
    assert not [p for p in verify_path(str(demo)) if p.severity == "error"]
