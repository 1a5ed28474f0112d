"""Prometheus metrics (tank_log/metrics.py), read back with prometheus_client's own parser: `tank-log stats
--format prometheus` equals `stats --json`, the export lag against a real Delta table counts exactly the messages
appended since the export, and a job's `--metrics-file` equals its report (and keeps its last success and data-loss
total across runs)."""

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_job_export import run_job as run_export
from test_lakehouse_guard import _logs, _retention, _roll

pytestmark = pytest.mark.spark
CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_stats_in_prometheus_format_equal_the_json_and_measure_the_export_lag(tmp_path):
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10)], 21)
    table = str(tmp_path / "table")
    assert run_export("--data-dir", base, "--table", table).returncode == 0  # 1..30
    _roll(pdir, [31, 41], 51)  # 30 messages the table lacks
    r = subprocess.run([*CLI, "stats", base, "--json"], capture_output=True, text=True)
    (row,) = json.loads(r.stdout)
    prom = tmp_path / "stats.prom"
    r = subprocess.run(
        [*CLI, "stats", base, "--format", "prometheus", "--export-table", table, "--metrics-file", str(prom)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    assert got == samples(prom.read_text())  # the file holds what stdout shows
    labels = (("partition", "0"), ("topic", "logs"))
    assert got[("tank_log_partition_bytes", labels)] == row["bytes"]
    assert got[("tank_log_partition_messages", labels)] == row["messages"] == 60
    assert got[("tank_log_partition_last_seq", labels)] == row["last_seq"] == 60
    assert got[("tank_log_partition_segments", labels)] == row["segments"]
    lag = (*labels, ("table", table))
    lag = tuple(sorted(lag))
    assert got[("tank_log_export_lag_messages", lag)] == 30
    assert got[("tank_log_export_lag_seconds", lag)] > 0
    assert run_export("--data-dir", base, "--table", table).returncode == 0
    r = subprocess.run(
        [*CLI, "stats", base, "--format", "prometheus", "--export-table", table], capture_output=True, text=True
    )
    assert samples(r.stdout)[("tank_log_export_lag_messages", lag)] == 0
    assert samples(r.stdout)[("tank_log_export_lag_seconds", lag)] == 0


def test_a_jobs_metrics_file_equals_its_report_across_runs(tmp_path):
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    table = str(tmp_path / "table")
    assert run_export("--data-dir", base, "--table", table).returncode == 0
    _roll(pdir, [41, 51, 61], 71)
    prom = tmp_path / "retention.prom"
    r, rep = _retention(base, tmp_path, "one", "--keep-unexported", table, "--metrics-file", str(prom))
    assert r.returncode == 0, r.stderr[-3000:]
    got = samples(prom.read_text())
    job = (("job", "retention"),)
    assert got[("tank_log_job_last_run_ok", job)] == 1
    first_success = got[("tank_log_job_last_success_timestamp_seconds", job)]
    assert got[("tank_log_job_duration_seconds", job)] == pytest.approx(rep["duration_s"], abs=0.01)
    for status, n in rep["summary"]["by_status"].items():
        assert got[("tank_log_job_partitions", (("job", "retention"), ("status", status)))] == n
    kept = rep["partitions"][0]["kept_unexported"]
    labels = (("partition", "0"), ("table", table), ("topic", "logs"))
    assert got[("tank_log_retention_kept_unexported_bytes", labels)] == kept["bytes"]
    assert not any(name == "tank_log_retention_holdback_limit_bytes" for name, _ in got)  # no bound set

    # within a bound: the bound beside what is kept (what an alert compares)
    r, rep = _retention(
        base, tmp_path, "bound", "--keep-unexported", table, "--max-holdback-size", "1mb", "--metrics-file", str(prom)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = samples(prom.read_text())
    assert rep["partitions"][0]["kept_unexported"]["max_bytes"] == 1 << 20
    assert got[("tank_log_retention_kept_unexported_bytes", labels)] == rep["partitions"][0]["kept_unexported"]["bytes"]
    assert got[("tank_log_retention_holdback_limit_bytes", labels)] == 1 << 20
    first_success = got[("tank_log_job_last_success_timestamp_seconds", job)]

    # past the bound: data-loss; the run fails, the last success stays the earlier one, the loss is counted
    r, rep = _retention(
        base, tmp_path, "two", "--keep-unexported", table, "--max-holdback-size", "100", "--metrics-file", str(prom)
    )
    assert r.returncode == 1 and rep["partitions"][0]["status"] == "data-loss"
    got = samples(prom.read_text())
    assert got[("tank_log_job_last_run_ok", job)] == 0
    assert got[("tank_log_job_last_success_timestamp_seconds", job)] == first_success
    assert got[("tank_log_retention_data_loss_events", (("partition", "0"), ("topic", "logs")))] == 1
    assert not any(name == "tank_log_retention_kept_unexported_bytes" for name, _ in got)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("retention.prom.")]  # no temporary left


def test_the_cli_compaction_writes_its_metrics(tmp_path):
    from conftest import many_small_partitions

    base = many_small_partitions(tmp_path / "b", 3)
    prom = tmp_path / "m" / "compact.prom"
    r = subprocess.run([*CLI, "compact", base, "--broker-stopped", "--metrics-file", str(prom)], capture_output=True)
    assert r.returncode == 0
    got = samples(prom.read_text())
    job = (("job", "tank-log compact"),)
    assert got[("tank_log_job_last_run_ok", job)] == 1
    assert got[("tank_log_job_partitions", (*job, ("status", "compacted")))] == 3
