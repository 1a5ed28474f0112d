"""Export options tried together: a table partitioned by `partition` (whose files hold no such column) exported to
again, in both modes and with both engines."""

import pytest
from conftest import copy_tree, data_dir
from deltalake import DeltaTable
from test_delta_spark import export
from test_job_export import roll_and_append

from tank_log.errors import JobConfigError
from tank_log.storage.datadir import partitions_at
from tank_log.tools.demo import write_demo

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def on_disk(base, topics=None):
    """(topic, partition, seq) of every message under `base`."""
    return sorted((p.topic, p.id, m.seq) for p in partitions_at(base, topics) for s in p.segments for m in s.messages())


def table_rows(table):
    d = DeltaTable(table).to_pyarrow_table(columns=["topic", "partition", "seq", "key", "value"]).to_pydict()
    return sorted(zip(d["topic"], d["partition"], d["seq"], d["key"], d["value"], strict=True))


COMBINATIONS = [
    ("A_multi", "topic,partition", "append"),
    ("demo", "partition,date", "append"),
    ("A_multi", "topic,partition", "latest"),
    ("demo", "partition,date", "latest"),
]


@pytest.mark.parametrize(("data", "partition_by", "mode"), COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_a_table_partitioned_by_partition_takes_every_later_export(tmp_path, data, partition_by, mode):
    """The Parquet files of a table partitioned by `partition` hold no `partition` column (Delta keeps its value in
    the file's add action): the look for another writer's rows reads it from there. A rerun with nothing new, a dry
    run and a run with new messages all succeed, and the table holds each message once (append) or each key's last
    value (latest)."""
    base = str(tmp_path / "base")
    if data == "demo":
        write_demo(base)
    else:
        copy_tree(data_dir(data), base)
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--partition-by", partition_by, "--mode", mode]
    assert export(*args) == 0
    assert DeltaTable(table).metadata().partition_columns == partition_by.split(",")
    first = table_rows(table)
    version = DeltaTable(table).version()
    assert export(*args) == 0  # nothing new
    assert export(*args, "--dry-run") == 0
    assert DeltaTable(table).version() == version and table_rows(table) == first
    topic = sorted({r[0] for r in first})[0]
    appended = roll_and_append(base, topic, 5)
    assert export(*args, "--dry-run") == 0 and DeltaTable(table).version() == version
    assert export(*args) == 0
    assert export(*args) == 0 and DeltaTable(table).version() == version + 1
    rows = table_rows(table)
    if mode == "append":
        assert [r[:3] for r in rows] == on_disk(base)
    else:  # every appended message has key b"new": the table holds its last value, once per partition
        new = [r for r in rows if r[3] == b"new"]
        last = {(t, p): v for t, p, _, v in appended}
        assert sorted((t, p, v) for t, p, _, _, v in new) == sorted((t, p, v) for (t, p), v in last.items())
        assert [r for r in rows if r[3] != b"new"] == [r for r in first if r[3] != b"new"]


def test_engine_spark_exports_again_to_a_table_partitioned_by_partition(spark, tmp_path):
    """The same with the delta-spark engine, and alternating with the delta-rs engine on the same table."""
    from test_delta_spark import export_on

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--partition-by", "topic,partition", "--topics", "events,small"]
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] > 0
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 0
    _, summary = export_on(spark, *args, "--engine", "spark", "--dry-run")
    assert export(*args) == 0 and export(*args, "--dry-run") == 0
    roll_and_append(base, "events", 7)
    assert export(*args) == 0
    roll_and_append(base, "small", 3)
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 3
    assert [r[:3] for r in table_rows(table)] == on_disk(base, ["events", "small"])


def test_engine_spark_reports_its_files_and_writes_microseconds_on_any_session(spark, tmp_path):
    """The delta-spark engine on a session the job did not start (Spark's default: INT96): its report counts the
    files and bytes its commits added, and `ts` is written as 64-bit microseconds all the same."""
    import os

    import pyarrow.parquet as pq
    from test_delta_spark import export_on

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    key = "spark.sql.parquet.outputTimestampType"
    spark.conf.set(key, "INT96")
    results, summary = export_on(spark, "--data-dir", base, "--table", table, "--engine", "spark")
    files = DeltaTable(table).file_uris()
    assert summary["files"] == len(files) > 0
    assert summary["bytes"] == sum(os.path.getsize(f) for f in files)
    assert sum(r["files"] for r in results) == len(files) and all(r["files"] > 0 for r in results)
    for f in files:
        ts = pq.read_metadata(f).schema.column(pq.read_schema(f).get_field_index("ts"))
        assert ts.physical_type == "INT64", f"{f}: ts stored as {ts.physical_type}"


def test_the_iceberg_export_reports_its_engine(tmp_path):
    """An Iceberg export commits through pyiceberg: its report says so, not `deltalake`."""
    import json

    report = tmp_path / "r.json"
    args = ["--data-dir", data_dir("A_multi"), "--table", str(tmp_path / "t"), "--report", str(report)]
    assert export(*args, "--format", "iceberg", "--catalog", f"sqlite:///{tmp_path}/catalog.db") == 0
    assert json.loads(report.read_text())["summary"]["engine"] == "pyiceberg"


def test_engine_spark_exports_the_partitions_a_check_constraint_allows(spark, tmp_path):
    """A CHECK constraint of the table that one partition's rows violate: that partition fails in one line naming
    the constraint and the row (no Java traceback), the others are exported, and a rerun exports none twice."""
    from test_delta_spark import export_on, spark_made

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    ref = str(tmp_path / "ref")  # the columns the export writes, as Spark types
    assert export("--data-dir", data_dir("C_misc"), "--table", ref, "--topics", "timeroll") == 0
    spark_made(spark, table, spark.read.format("delta").load(ref).schema)
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT small_events CHECK (topic <> 'events' OR partition <> 1)")
    args = ["--data-dir", base, "--table", table, "--topics", "events", "--engine", "spark"]
    results, summary = export_on(spark, *args)
    by = {r["partition"]: r for r in results}
    assert by[1]["status"] == "failed" and "small_events" in by[1]["error"] and "\n" not in by[1]["error"]
    assert "Traceback" not in by[1]["error"] and "at org.apache" not in by[1]["error"]
    assert {p: r["status"] for p, r in by.items() if p != 1} == {0: "exported", 2: "exported"}
    assert summary["by_status"] == {"exported": 2, "failed": 1}
    got = sorted(r[:3] for r in spark.read.format("delta").load(table).select("topic", "partition", "seq").collect())
    assert got == [r for r in on_disk(base, ["events"]) if r[1] != 1]
    results, summary = export_on(spark, *args)
    assert summary["by_status"] == {"up-to-date": 2, "failed": 1}
    assert spark.read.format("delta").load(table).count() == len(got)


def _spark_table(spark, tmp_path, table, generated_date=False, props=None):
    """A table delta-spark creates with the export's columns (Spark types), partitioned by topic and date; with
    `generated_date`, `date` is GENERATED ALWAYS AS (CAST(ts AS DATE))."""
    from delta.tables import DeltaTable as SparkDeltaTable

    ref = str(tmp_path / "ref")  # the columns the export writes
    assert export("--data-dir", data_dir("C_misc"), "--table", ref, "--topics", "timeroll") == 0
    b = SparkDeltaTable.create(spark).location(table)
    for f in spark.read.format("delta").load(ref).schema.fields:
        gen = "CAST(ts AS DATE)" if generated_date and f.name == "date" else None
        b = b.addColumn(f.name, f.dataType, nullable=f.nullable, generatedAlwaysAs=gen)
    for k, v in (props or {}).items():
        b = b.property(k, v)
    b.partitionedBy("topic", "date").execute()


def test_engine_spark_writes_a_date_column_generated_from_ts(spark, tmp_path):
    """A table whose `date` is generated from ts: the delta-spark engine writes it (delta-spark checks each date
    against the expression), twice without duplicates; the delta-rs engine refuses it, naming the column."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    _spark_table(spark, tmp_path, table, generated_date=True)
    args = ["--data-dir", base, "--table", table, "--topics", "events,small"]
    from test_delta_spark import export_on

    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["by_status"] == {"exported": 4}
    roll_and_append(base, "small", 3)
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 3
    df = spark.read.format("delta").load(table)
    assert sorted(tuple(r) for r in df.select("topic", "partition", "seq").collect()) == on_disk(
        base, ["events", "small"]
    )
    assert df.where("date <> CAST(ts AS DATE)").count() == 0
    with pytest.raises(JobConfigError, match="column date: a generatedColumns column"):
        export_on(spark, *args, "--engine", "deltalake")


def test_the_delta_rs_refusal_names_every_feature_that_blocks_it(spark, tmp_path, capsys):
    """A table with row tracking, a CHECK constraint and a generated column: the delta-rs engine's refusal names
    all three in one line, not the first it met."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    _spark_table(spark, tmp_path, table, generated_date=True, props={"delta.enableRowTracking": "true"})
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT seq_positive CHECK (seq > 0)")
    capsys.readouterr()
    assert export("--data-dir", base, "--table", table, "--topics", "small") == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("export_delta:")]
    assert len(line) == 1 and "Traceback" not in err, err[-2000:]
    for named in ("rowTracking", "seq_positive (seq > 0)", "column date: a generatedColumns column"):
        assert named in line[0], line[0]
