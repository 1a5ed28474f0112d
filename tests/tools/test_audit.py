"""`tank-log audit`: a table against the log it was exported from, on the real broker's fixtures exported by the
export job (in the driver: the delta-rs / pyiceberg engines), then changed as other engines, retention and damage
change them."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import data_dir
from deltalake import DeltaTable, write_deltalake

from tank_log.format.bundle import Message
from tank_log.lakehouse import TableLocation, default_source, text_column
from tank_log.storage.appender import PartitionAppender
from tank_log.tools.audit import audit_table

pytestmark = pytest.mark.slow  # each test runs the export and the command line: seconds apiece


def export(*argv: str) -> int:
    from tank_spark.export.job import main

    return int(main(["--master", "local[1]", *argv]))


def audit(base: str, table: str, fmt: str = "delta", *extra: str) -> tuple[int, dict]:
    """The command line, as an operator runs it: its exit code and JSON report."""
    cmd = [sys.executable, "-m", "tank_log.tools.cli", "audit", "--table", table, "--format", fmt, "--json", *extra]
    done = subprocess.run([*cmd, base], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout)


def by_partition(report: dict) -> dict[tuple[str, int], dict]:
    return {(p["topic"], p["partition"]): p for p in report["partitions"]}


@pytest.fixture
def exported(tmp_path):
    base = str(tmp_path / "base")
    shutil.copytree(data_dir("A_multi"), base)
    table = str(tmp_path / "table")
    assert export("--data-dir", base, "--table", table) == 0
    return base, table


def test_a_whole_export_is_ok(exported):
    base, table = exported
    code, report = audit(base, table)
    assert code == 0 and report["verdict"] == "ok"
    parts = by_partition(report)
    assert len(parts) == 6
    for p in parts.values():
        assert p["verdict"] == "ok" and p["log_messages"] == p["table_rows"] and p["unaccounted"] == 0
    assert parts[("events", 1)]["log_messages"] == 8496


def test_rows_deleted_by_another_engine_are_missing(exported):
    base, table = exported
    DeltaTable(table).delete("topic = 'events' and partition = 1 and seq >= 100 and seq <= 150")
    code, report = audit(base, table)
    assert code == 1 and report["verdict"] == "unaccounted"
    p = by_partition(report)[("events", 1)]
    assert p["verdict"] == "unaccounted"
    assert p["missing"] == {"count": 51, "ranges": [[100, 150]], "runs": 1}
    assert by_partition(report)[("events", 0)]["verdict"] == "ok"


def test_rows_appended_twice_are_duplicates(exported):
    base, table = exported
    again = (
        DeltaTable(table).to_pyarrow_dataset().to_table(filter=(ds.field("topic") == "small") & (ds.field("seq") <= 3))
    )
    write_deltalake(table, again, mode="append")
    code, report = audit(base, table)
    assert code == 1
    assert by_partition(report)[("small", 0)]["duplicates"]["ranges"] == [[1, 3]]


def test_messages_not_exported_yet_are_pending_not_a_failure(tmp_path):
    base = str(tmp_path / "base")
    shutil.copytree(data_dir("A_multi"), base)
    table = str(tmp_path / "table")
    assert export("--data-dir", base, "--table", table, "--topics", "events") == 0
    code, report = audit(base, table)
    assert code == 0 and report["verdict"] == "pending"
    small = by_partition(report)[("small", 0)]
    assert small["verdict"] == "pending" and small["pending"]["count"] == 720 and small["recorded_seq"] is None


def test_segments_deleted_by_retention_after_the_export_are_accounted_for(exported):
    base, table = exported
    for f in glob.glob(os.path.join(base, "events", "1", "1-1004_*.ilog")) + [os.path.join(base, "events/1/1.index")]:
        os.unlink(f)
    code, report = audit(base, table)
    assert code == 0, report
    p = by_partition(report)[("events", 1)]
    assert p["verdict"] == "ok" and p["deleted_since_export"]["ranges"] == [[1, 1004]]


def test_a_damaged_log_is_named_and_fails(exported):
    base, table = exported
    seg = glob.glob(os.path.join(base, "events", "1", "1005-2828_*.ilog"))[0]
    with open(seg, "r+b") as fh:
        fh.truncate(os.path.getsize(seg) - 100)
    code, report = audit(base, table)
    assert code == 1 and report["verdict"] == "damaged"
    p = by_partition(report)[("events", 1)]
    assert p["verdict"] == "damaged" and any("1005-2828" in d for d in p["damaged"])


def test_the_human_table_names_each_finding(exported):
    base, table = exported
    DeltaTable(table).delete("topic = 'events' and partition = 2 and seq = 7")
    cmd = [sys.executable, "-m", "tank_log.tools.cli", "audit", "--table", table, base]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "events/2: missing: 1 seq(s) 7" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("verdict: unaccounted")


def test_a_latest_table_holds_each_live_key_once(tmp_path):
    base = str(tmp_path / "base")
    shutil.copytree(data_dir("B_before"), base)
    table = str(tmp_path / "latest")
    assert export("--data-dir", base, "--table", table, "--mode", "latest") == 0
    code, report = audit(base, table)
    assert code == 0, report
    p = by_partition(report)[("kv", 0)]
    assert p["verdict"] == "ok" and p["table_rows"] > 0
    # a key's row taken back to an older message of the key is stale; a key's row removed is missing
    dt = DeltaTable(table)
    rows = dt.to_pyarrow_dataset().to_table()
    victim = rows.slice(0, 1)
    dt.delete(f"seq = {victim['seq'][0].as_py()}")
    code, report = audit(base, table)
    assert code == 1
    p = by_partition(report)[("kv", 0)]
    assert p["missing"]["count"] == 1 and p["missing"]["ranges"] == [[victim["seq"][0].as_py()] * 2]


def test_a_latest_table_of_string_views_is_audited_by_topic_and_source(tmp_path):
    """The latest-mode export's MERGE (delta-rs, DataFusion) writes `topic` and `source` as `string_view`; pyarrow
    has no kernel comparing them with a string, so a filter by topic or source over a file of two topics ended the
    audit in a traceback."""
    base = tmp_path / "base"
    for topic, policy in (("kv", "cleanup"), ("raw", "delete")):
        (base / topic).mkdir(parents=True)
        (base / topic / "config").write_text(f"log.cleanup.policy={policy}\n")
        appender = PartitionAppender(base / topic / "0")
        appender.append([Message(seq, 1_700_000_000_000 + seq, b"k%d" % (seq % 5), b"v") for seq in range(1, 9)])
    table = str(tmp_path / "latest")
    flags = ("--mode", "latest", "--partition-by=", "--source", "model")
    assert export("--data-dir", str(base), "--table", table, *flags) == 0
    views = {str(f.type) for p in glob.glob(os.path.join(table, "*.parquet")) for f in pq.read_schema(p)}
    assert "string_view" in views  # the files this test is about
    code, report = audit(str(base), table, "delta", "--source", "model")
    assert code == 0 and report["verdict"] == "ok"
    assert {p["topic"]: p["table_rows"] for p in report["partitions"]} == {"kv": 5, "raw": 5}


def test_text_column_compares_string_view_files(tmp_path):
    """A file of `string_view` strings in a dataset whose schema says string: a plain field comparison has no kernel,
    `text_column` compares."""
    path = str(tmp_path / "views.parquet")
    pq.write_table(pa.table({"topic": pa.array(["a", "b"], pa.string_view()), "seq": [1, 2]}), path)
    data = ds.dataset(path, schema=pa.schema([("topic", pa.string()), ("seq", pa.int64())]))
    with pytest.raises(pa.ArrowNotImplementedError):
        data.to_table(filter=ds.field("topic") == "a")
    assert data.to_table(filter=text_column("topic") == "a")["seq"].to_pylist() == [1]


def test_an_iceberg_table(tmp_path):
    base = str(tmp_path / "base")
    shutil.copytree(data_dir("A_multi"), base)
    table = str(tmp_path / "ice")
    assert export("--data-dir", base, "--table", table, "--format", "iceberg") == 0
    code, report = audit(base, table, "iceberg")
    assert code == 0 and report["verdict"] == "ok"
    assert sum(p["table_rows"] for p in report["partitions"]) == 17537


def test_usage_errors_exit_2_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "tank_log.tools.cli", "audit", "--table", str(tmp_path / "none"), str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_library_call(exported):
    base, table = exported
    here = default_source()
    report = audit_table(base, TableLocation.of(table, source=here).existing(), table, ["small"], here)
    assert [(p.topic, p.verdict) for p in report.partitions] == [("small", "ok")]
    assert report.exit_code == 0


def test_each_broker_audits_its_own_rows(tmp_path):
    """Two brokers with same-named partitions export into one table: each audit holds its own log against its own
    rows and recorded versions, and a broker whose rows another engine deleted is the only one unaccounted."""
    table = str(tmp_path / "table")
    bases = {}
    for name in ("broker-a", "broker-b"):
        bases[name] = str(tmp_path / name)
        shutil.copytree(data_dir("A_multi"), bases[name])
        assert export("--data-dir", bases[name], "--table", table, "--source", name) == 0
    for name, base in bases.items():
        code, report = audit(base, table, "delta", "--source", name)
        assert code == 0 and report["source"] == name
        assert sum(p["table_rows"] for p in report["partitions"]) == 17537
    stats = [sys.executable, "-m", "tank_log.tools.cli", "stats", "--export-table", table, "--json"]
    for source, lag in (("broker-b", 0), ("broker-c", 17537)):  # stats' export lag is the source's too
        done = subprocess.run([*stats, "--source", source, bases["broker-b"]], capture_output=True, text=True)
        assert sum(p["export_lag_messages"] for p in json.loads(done.stdout)) == lag, done.stderr
    DeltaTable(table).delete("source = 'broker-b' and topic = 'small' and seq = 5")
    assert audit(bases["broker-a"], table, "delta", "--source", "broker-a")[0] == 0
    code, report = audit(bases["broker-b"], table, "delta", "--source", "broker-b")
    assert code == 1 and by_partition(report)[("small", 0)]["missing"]["ranges"] == [[5, 5]]


def test_a_range_of_partitions_at_a_time_finds_the_same(exported, monkeypatch):
    """The table read a range of partitions at a time, down to one partition a range (`ROW_BUDGET` below a
    partition's rows), finds what one read of every topic finds: rows missing, rows twice, and a partition the base
    no longer has (every row deleted since export)."""
    from tank_log.tools import audit as module

    base, table = exported
    DeltaTable(table).delete("topic = 'events' and partition = 1 and seq >= 100 and seq <= 150")
    again = (
        DeltaTable(table).to_pyarrow_dataset().to_table(filter=(ds.field("topic") == "events") & (ds.field("seq") <= 3))
    )
    write_deltalake(table, again, mode="append")
    shutil.rmtree(os.path.join(base, "events", "0"))
    here = default_source()

    def report() -> dict:
        return audit_table(base, TableLocation.of(table, source=here).existing(), table, None, here).to_dict()

    whole = report()
    parts = by_partition(whole)
    assert parts[("events", 0)]["log_messages"] == 0 and parts[("events", 0)]["deleted_since_export"]["count"] > 0
    assert parts[("events", 1)]["missing"]["count"] == 51 and parts[("events", 2)]["duplicates"]["ranges"] == [[1, 3]]
    for budget in (1, 20000):  # a partition a range; ranges of several partitions
        monkeypatch.setattr(module, "ROW_BUDGET", budget)
        assert report() == whole, budget
