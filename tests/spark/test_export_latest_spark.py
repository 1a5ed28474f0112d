"""`--mode latest --engine spark` (tank_spark/export/latest.py, `_merge_with_delta_spark`): the latest rows computed
as the deltalake engine computes them, applied by delta-spark's MERGE with each partition's recorded version in the
MERGE's own commit (Delta's idempotent DML). On the two-partition `kvlive` topic of B2_compaction_live (keys,
updates, tombstones): the same table as the deltalake engine's, both engines taking turns on one table, a rerun
merging nothing, a run killed between its two partitions' MERGEs then rerun, typed Avro values with bad newer ones;
`tank-log audit` of each table says ok. Iceberg tables (tank_spark/export/iceberg_spark.py, `merge_with_iceberg_spark`):
Spark SQL's MERGE staged and published by one pyiceberg commit with the versions, the same scenario plus a commit of
another writer between staging and publishing, a MERGE that changes nothing, a table in a REST catalog, and a
merge-on-read table refused. The runs share the suite's Spark session, but for the killed ones."""

import json
import os
import threading
import time

import pytest
from conftest import copy_tree, data_dir, duckdb_with, run_job_script
from deltalake import DeltaTable
from test_delta_spark import export, export_on, spark_transactions
from test_export_iceberg_rest import server  # noqa: F401 (the module's REST catalog server)
from test_export_latest import produce, state
from test_typed_export import LATEST_CFG, LATEST_FIRST, TS, config, good, latest_messages, latest_state, rows

from tank_log.storage.writer import write_segment

TOPIC = "kvlive"


def versions(spark, uri):
    """{"topic:partition": version} of the app transactions delta-spark reads (the app ids name the table too)."""
    return {a.split("@", 1)[1].split(":", 1)[1]: v for a, v in spark_transactions(spark, uri).items()}


def audit_ok(base, table, capsys, *flags):
    from tank_log.tools.cli import main

    capsys.readouterr()
    rc = main(["audit", base, "--table", table, "--json", *flags])
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
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_typed_values_keep_each_keys_latest_value_that_decodes(spark, tmp_path, capsys, fmt):
    """Avro values: a key whose newest value does not decode keeps its older row; the bad value is a dead letter,
    committed before the MERGE; the same tables as the deltalake engine's."""
    from test_export_typed_spark import forget_catalogs

    from tank_log.storage.appender import PartitionAppender

    base, table, ref = str(tmp_path / "data"), str(tmp_path / "t"), str(tmp_path / "ref")
    d = os.path.join(base, "clicks", "0")
    os.makedirs(d)
    write_segment(d, latest_messages(1, LATEST_FIRST), active=True, ts=TS // 1000)
    args = ["--config", config(tmp_path, **LATEST_CFG), "--data-dir", base, "--format", fmt]
    forget_catalogs(spark)  # an earlier test's Iceberg table's SQLite catalog
    _, summary = export_on(spark, *args, "--table", table, "--engine", "spark")
    assert summary["dead_lettered"] == 2
    assert latest_state(table, fmt) == [("a", 3, 3, "/p3"), ("b", 2, 2, "/p2")]
    assert rows(table + "_dead_letters", "seq,key", fmt) == [(5, b"b"), (8, b"d")]
    app = PartitionAppender(d)
    app.append(latest_messages(9, [(b"b", good(9)[:6]), (b"a", good(10)), (b"d", good(11))]))
    _, summary = export_on(spark, *args, "--table", table, "--engine", "spark")
    assert summary["dead_lettered"] == 1
    assert latest_state(table, fmt) == [("a", 10, 10, "/p10"), ("b", 2, 2, "/p2"), ("d", 11, 11, "/p11")]
    assert rows(table + "_dead_letters", "seq", fmt) == [(5,), (8,), (9,)]
    assert export(*args, "--table", ref) == 0  # delta-rs or pyiceberg, in one run
    assert latest_state(ref, fmt) == latest_state(table, fmt)
    found = audit_ok(base, table, capsys, "--format", fmt)[0]
    assert (found["unaccounted"], found["dead_lettered"]["count"]) == (0, 3)


def test_a_merge_on_read_iceberg_table_is_refused_before_spark_starts(tmp_path, capsys):
    """Spark's MERGE into a merge-on-read Iceberg table writes delete files, which the spark engine's commit does not
    publish: refused in one line, exit 2, nothing written (the deltalake engine merges such a table)."""
    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    ice = str(tmp_path / "ice")
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest", "--table", ice, "--format", "iceberg"]
    assert export(*args) == 0
    with iceberg_table(ice).transaction() as tx:
        tx.set_properties({"write.merge.mode": "merge-on-read"})
    produce(base, TOPIC)
    capsys.readouterr()
    assert export(*args, "--engine", "spark") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"export_delta: table {ice}: write.merge.mode is merge-on-read: --mode latest --engine spark merges "
        "copy-on-write Iceberg tables (its commit publishes data files, not delete files); use --engine deltalake"
    )
    assert iceberg_versions(ice) == {"kvlive:0": 8000, "kvlive:1": 5000}
    assert export(*args) == 0 and iceberg_versions(ice) == {"kvlive:0": 8005, "kvlive:1": 5005}


def iceberg_state(path):
    """`state` of an Iceberg latest table, through pyiceberg."""
    from tank_log.lakehouse import TableLocation

    d = TableLocation.of(path, {}, "iceberg").existing().table.scan().to_arrow().to_pydict()
    keys = list(zip(d["topic"], d["partition"], d["key"], strict=True))
    assert len(keys) == len(set(keys))
    return dict(zip(keys, zip(d["seq"], d["value"], strict=True), strict=True))


def iceberg_table(path):
    """pyiceberg's table."""
    from tank_log.lakehouse import TableLocation

    return TableLocation.of(path, {}, "iceberg").existing().table


def iceberg_versions(path):
    """{"topic:partition": version} of the table's properties (the app ids name the table and source too)."""
    from tank_log.lakehouse import TableLocation

    props = TableLocation.of(path, {}, "iceberg").existing().properties()
    return {k.split("@", 1)[1].split(":", 1)[1]: int(v) for k, v in props.items() if "@" in k and "#" not in k}


@pytest.mark.spark
@pytest.mark.slow
def test_iceberg_tables_merge_through_spark_as_through_pyiceberg(spark, tmp_path, capsys, caplog, monkeypatch):
    """`--format iceberg`: Spark SQL's MERGE, staged (write-audit-publish) and published by one pyiceberg commit with
    the recorded versions (tank_spark/export/iceberg_spark.py). The same table as the Delta export's; a rerun merges
    nothing; the engines take turns; a run killed after Spark staged its MERGE and before the commit leaves the table
    as it was, and the rerun merges once; pyiceberg, DuckDB and Spark read the same rows."""
    from test_export_typed_spark import forget_catalogs, spark_frame

    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    ref, ice = str(tmp_path / "ref"), str(tmp_path / "ice")
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest"]
    on_iceberg = [*args, "--table", ice, "--format", "iceberg", "--engine", "spark"]
    assert export(*args, "--table", ref) == 0
    forget_catalogs(spark)  # an earlier test's table's SQLite catalog
    _, summary = export_on(spark, *on_iceberg)
    assert summary["engine"] == "spark" and summary["by_status"] == {"exported": 2}, summary
    want = state(ref)
    assert iceberg_state(ice) == want
    assert iceberg_versions(ice) == versions(spark, ref) == {"kvlive:0": 8000, "kvlive:1": 5000}
    assert summary["merge"] == {"num_target_rows_inserted": len(want)} | dict.fromkeys(
        ("num_target_rows_updated", "num_target_rows_deleted"), 0
    )
    snapshots = iceberg_table(ice).snapshots()  # one: the staged MERGE's published, the staged one removed
    assert len(snapshots) == 1 and "wap.id" not in snapshots[0].summary.additional_properties

    _, summary = export_on(spark, *on_iceberg)  # a rerun merges nothing
    assert summary["by_status"] == {"up-to-date": 2} and len(iceberg_table(ice).snapshots()) == 1

    # the engines take turns: new messages merged by Spark (an update, a tombstone, a new key in each partition:
    # Spark's copy-on-write MERGE rewrites files, the commit removes those it replaced), then more by pyiceberg
    produce(base, TOPIC)
    _, summary = export_on(spark, *on_iceberg)
    assert summary["by_status"] == {"exported": 2}
    assert summary["merge"] == {f"num_target_rows_{k}": 2 for k in ("inserted", "updated", "deleted")}
    assert iceberg_table(ice).current_snapshot().summary.operation.value == "overwrite"
    produce(base, TOPIC)
    assert export(*args, "--table", ice, "--format", "iceberg") == 0

    # another writer commits (an empty append) after Spark staged the MERGE, before its commit: the staged MERGE is
    # not published onto it, the run re-plans and merges onto the new snapshot
    from tank_spark.export import iceberg_spark

    publish = iceberg_spark.commit_staged

    def another_writer_first(*a):
        monkeypatch.setattr(iceberg_spark, "commit_staged", publish)
        tx = iceberg_table(ice).transaction()
        with tx.update_snapshot().fast_append():
            pass
        tx.commit_transaction()
        return publish(*a)

    produce(base, TOPIC)
    monkeypatch.setattr(iceberg_spark, "commit_staged", another_writer_first)
    caplog.clear()
    _, summary = export_on(spark, *on_iceberg)
    assert summary["by_status"] == {"exported": 2} and "re-planning (attempt 2)" in caplog.text
    assert "Spark staged its MERGE on snapshot" in caplog.text
    assert summary["merge"] == {
        "num_target_rows_inserted": 0,
        "num_target_rows_updated": 4,
        "num_target_rows_deleted": 0,
    }

    # killed after Spark staged its MERGE, before the commit: nothing of it in the table, the rerun merges it once
    produce(base, TOPIC)
    before, recorded = iceberg_state(ice), iceberg_versions(ice)
    r = run_job_script(*["export_delta", *on_iceberg], env_extra={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-3000:]
    assert "dying after writing" in r.stderr
    assert iceberg_state(ice) == before and iceberg_versions(ice) == recorded
    assert [s.summary.additional_properties.get("wap.id") is not None for s in iceberg_table(ice).snapshots()][-1]
    forget_catalogs(spark)
    _, summary = export_on(spark, *on_iceberg)
    assert summary["by_status"] == {"exported": 2}

    once = str(tmp_path / "once")  # everything in one run of the deltalake engine into Delta
    assert export(*args, "--table", once) == 0
    assert iceberg_state(ice) == state(once) != want
    assert iceberg_versions(ice) == versions(spark, once)
    by_pyiceberg = str(tmp_path / "by_pyiceberg")  # and into Iceberg: every column, typed as pyiceberg writes them
    assert export(*args, "--table", by_pyiceberg, "--format", "iceberg") == 0
    every = [("partition", "ascending"), ("key", "ascending")]
    got, written = (iceberg_table(t).scan().to_arrow().sort_by(every) for t in (ice, by_pyiceberg))
    assert got.schema == written.schema and got.to_pylist() == written.to_pylist()
    metadata = iceberg_table(ice).metadata_location.removeprefix("file://")
    duck = duckdb_with("avro", "iceberg").execute(
        f"SELECT topic, partition, key, seq, value FROM iceberg_scan('{metadata}')"
    )
    assert {(t, p, k): (s, v) for t, p, k, s, v in duck.fetchall()} == state(once)
    forget_catalogs(spark)
    frame = spark_frame(spark, ice, "iceberg").select("topic", "partition", "key", "seq", "value")
    assert {(t, p, bytes(k)): (s, bytes(v)) for t, p, k, s, v in frame.collect()} == state(once)
    audit_ok(base, ice, capsys, "--format", "iceberg")

    # a MERGE that changes no row (a tombstone of a key the table never held): the versions advance, nothing else
    from tank_log.format.bundle import Message
    from tank_log.storage.appender import PartitionAppender
    from tank_log.storage.datadir import partitions_at

    for part in partitions_at(base, [TOPIC]):
        app = PartitionAppender(part.path)
        app.append([Message(app.next_seq, 1_800_000_000_000, b"never-held", b"")])
    forget_catalogs(spark)
    _, summary = export_on(spark, *on_iceberg)
    assert summary["by_status"] == {"exported": 2}
    assert summary["merge"] == {f"num_target_rows_{k}": 0 for k in ("inserted", "updated", "deleted")}
    assert iceberg_state(ice) == state(once)
    assert iceberg_versions(ice) == {k: v + 1 for k, v in versions(spark, once).items()}


@pytest.mark.spark
@pytest.mark.slow
def test_an_iceberg_table_in_a_rest_catalog_merges_through_spark(spark, tmp_path, server):  # noqa: F811
    """A table named in Iceberg's REST catalog (the reference server): Spark's staged MERGE is published through the
    REST protocol's commit; new messages rewrite files; a rerun merges nothing; the rows are the Delta export's."""
    from test_export_iceberg_rest import config

    base = copy_tree(data_dir("B2_compaction_live"), str(tmp_path / "data"))
    ref = str(tmp_path / "ref")
    args = ["--data-dir", base, "--topics", TOPIC, "--mode", "latest"]
    on_rest = ["--config", config(tmp_path, server, "tank.latest"), *args, "--engine", "spark"]
    for _ in range(2):
        _, summary = export_on(spark, *on_rest)
        assert summary["by_status"] == {"exported": 2}, summary
        assert export(*args, "--table", ref) == 0
        produce(base, TOPIC)
    _, summary = export_on(spark, *on_rest)
    assert export(*args, "--table", ref) == 0
    _, again = export_on(spark, *on_rest)
    assert summary["by_status"] == {"exported": 2} and again["by_status"] == {"up-to-date": 2}
    d = server.catalog().load_table("tank.latest").scan().to_arrow().to_pydict()
    keys = list(zip(d["topic"], d["partition"], d["key"], strict=True))
    assert len(keys) == len(set(keys))
    assert dict(zip(keys, zip(d["seq"], d["value"], strict=True), strict=True)) == state(ref)
