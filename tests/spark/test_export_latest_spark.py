"""`--mode latest --engine spark` (tank_spark/export/latest.py, `_merge_with_delta_spark`): the latest rows computed
as the deltalake engine computes them, applied by delta-spark's MERGE with each partition's recorded version in the
MERGE's own commit (Delta's idempotent DML). On the two-partition `kvlive` topic of B2_compaction_live (keys,
updates, tombstones): the same table as the deltalake engine's, both engines taking turns on one table, a rerun
merging nothing, a run killed between its two partitions' MERGEs then rerun, typed Avro values with bad newer ones;
`tank-log audit` of each table says ok. The runs share the suite's Spark session, but for the killed one."""

import json
import os
import threading
import time

import pytest
from conftest import copy_tree, data_dir, run_job_script
from deltalake import DeltaTable
from test_delta_spark import export, export_on, spark_transactions
from test_export_latest import produce, state
from test_typed_export import LATEST_CFG, LATEST_FIRST, TS, config, good, latest_messages, latest_state, rows

from tank_log.storage.writer import write_segment

TOPIC = "kvlive"


def versions(spark, uri):
    """{"topic:partition": version} of the app transactions delta-spark reads (the app ids name the table too)."""
    return {a.split("@", 1)[1].split(":", 1)[1]: v for a, v in spark_transactions(spark, uri).items()}


def audit_ok(base, table, capsys):
    from tank_log.tools.cli import main

    capsys.readouterr()
    rc = main(["audit", base, "--table", table, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert {p["verdict"] for p in out["partitions"]} == {"ok"}, out
    return {p["partition"]: p for p in out["partitions"]}


def test_a_run_after_two_merges_reads_the_files_delta_rs_merged(tmp_path):
    """delta-rs's MERGE writes strings as string_view: the next run's check for other writers' rows reads such a file
    (one MERGE wrote both partitions' rows in it) and compares its `source` (no Spark: the deltalake engine)."""
    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest", "--table", str(tmp_path / "t")]
    assert export(*args) == 0
    for _ in range(2):
        produce(base, TOPIC)
        assert export(*args) == 0


@pytest.mark.spark
@pytest.mark.slow
def test_spark_merges_what_deltalake_merges_and_the_engines_take_turns(spark, tmp_path, capsys, caplog, monkeypatch):
    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    ref, uri = str(tmp_path / "ref"), str(tmp_path / "table")
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest"]
    assert export(*args, "--table", ref) == 0
    _, summary = export_on(spark, *args, "--table", uri, "--engine", "spark")
    assert summary["engine"] == "spark" and summary["by_status"] == {"exported": 2}
    want = state(ref)
    assert state(uri) == want and len({k[1] for k in want}) == 2
    # one MERGE commit per partition, each recording its partition's version, as delta-rs recorded them
    assert versions(spark, uri) == versions(spark, ref) == {"kvlive:0": 8000, "kvlive:1": 5000}
    assert DeltaTable(uri).version() == 2
    assert summary["merge"]["num_target_rows_inserted"] == len(want)

    # a rerun merges nothing
    _, summary = export_on(spark, *args, "--table", uri, "--engine", "spark")
    assert summary["by_status"] == {"up-to-date": 2} and DeltaTable(uri).version() == 2

    # the engines take turns: new messages merged by delta-rs, then more by delta-spark
    produce(base, TOPIC)
    assert export(*args, "--table", uri) == 0
    produce(base, TOPIC)
    _, summary = export_on(spark, *args, "--table", uri, "--engine", "spark")
    assert summary["by_status"] == {"exported": 2}

    # a delta-spark run held before its MERGEs while delta-rs merges the same messages: it re-plans, merges nothing
    produce(base, TOPIC)
    hold = str(tmp_path / "release")
    monkeypatch.setenv("TANK_LOG_EXPORT_HOLD", hold)
    held: dict = {}
    run = threading.Thread(target=lambda: held.update(out=export_on(spark, *args, "--table", uri, "--engine", "spark")))
    run.start()
    deadline = time.monotonic() + 120
    while not os.path.exists(hold + ".ready") and run.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(hold + ".ready")
    monkeypatch.delenv("TANK_LOG_EXPORT_HOLD")  # this process's next run is not held
    caplog.clear()
    assert export(*args, "--table", uri) == 0
    merged = DeltaTable(uri).version()
    open(hold, "w").close()
    run.join(120)
    assert held["out"][1]["by_status"] == {"up-to-date": 2} and "re-planning (attempt 2)" in caplog.text
    assert DeltaTable(uri).version() == merged

    once = str(tmp_path / "once")
    assert export(*args, "--table", once) == 0
    assert state(uri) == state(once) != want
    assert versions(spark, uri) == versions(spark, once)
    audit_ok(base, uri, capsys)


@pytest.mark.spark
@pytest.mark.slow
def test_a_run_killed_between_two_partitions_merges_is_completed_by_the_rerun(spark, tmp_path, capsys):
    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    ref, uri = str(tmp_path / "ref"), str(tmp_path / "table")
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest"]
    assert export(*args, "--table", ref) == 0
    r = run_job_script(
        "export_delta", *args, "--table", uri, "--engine", "spark", env_extra={"TANK_LOG_EXPORT_CRASH": "before-commit"}
    )
    assert r.returncode == 137, r.stderr[-3000:]
    assert "dying after one partition's commit" in r.stderr
    merged = versions(spark, uri)
    assert len(merged) == 1  # one partition merged and recorded, the other not
    ((app, version),) = merged.items()
    assert versions(spark, ref)[app] == version
    results, _ = export_on(spark, *args, "--table", uri, "--engine", "spark")
    assert sorted(r["status"] for r in results) == ["exported", "up-to-date"]
    assert state(uri) == state(ref)
    assert versions(spark, uri) == versions(spark, ref)
    audit_ok(base, uri, capsys)


@pytest.mark.spark
@pytest.mark.slow
def test_typed_values_keep_each_keys_latest_value_that_decodes(spark, tmp_path, capsys):
    """Avro values: a key whose newest value does not decode keeps its older row; the bad value is a dead letter,
    committed before the MERGE; the same tables as the deltalake engine's."""
    from tank_log.storage.appender import PartitionAppender

    base, table, ref = str(tmp_path / "data"), str(tmp_path / "t"), str(tmp_path / "ref")
    d = os.path.join(base, "clicks", "0")
    os.makedirs(d)
    write_segment(d, latest_messages(1, LATEST_FIRST), active=True, ts=TS // 1000)
    args = ["--config", config(tmp_path, **LATEST_CFG), "--data-dir", base]
    _, summary = export_on(spark, *args, "--table", table, "--engine", "spark")
    assert summary["dead_lettered"] == 2
    assert latest_state(table) == [("a", 3, 3, "/p3"), ("b", 2, 2, "/p2")]
    assert rows(table + "_dead_letters", "seq,key") == [(5, b"b"), (8, b"d")]
    app = PartitionAppender(d)
    app.append(latest_messages(9, [(b"b", good(9)[:6]), (b"a", good(10)), (b"d", good(11))]))
    _, summary = export_on(spark, *args, "--table", table, "--engine", "spark")
    assert summary["dead_lettered"] == 1
    assert latest_state(table) == [("a", 10, 10, "/p10"), ("b", 2, 2, "/p2"), ("d", 11, 11, "/p11")]
    assert rows(table + "_dead_letters", "seq") == [(5,), (8,), (9,)]
    assert export(*args, "--table", ref) == 0  # delta-rs, in one run
    assert latest_state(ref) == latest_state(table)
    found = audit_ok(base, table, capsys)[0]
    assert (found["unaccounted"], found["dead_lettered"]["count"]) == (0, 3)
