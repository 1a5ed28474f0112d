"""delta-spark, Delta's own engine, against our export and import, both ways, on one shared Spark session with Delta's
jars (conftest `spark`): Spark reads every table the delta-rs export writes; the export appends exactly once to tables
Spark made and maintains, with the features Spark users turn on, or refuses them before writing; the import reads
what Spark wrote; the delta-spark engine (`--engine spark`) exports exactly once, alone, rerun, crashed, beside
another export and alternating with the delta-rs engine, locally and on S3 through s3a."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from conftest import DATASETS, ROOT, copy_tree, data_dir, load_dump, run_job_script, wait_for_hold
from test_job_export import Lake, roll_and_append

from tank_log.errors import JobConfigError
from tank_log.lakehouse import app_id, default_source, table_id
from tank_spark.export.location import TableLocation

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_SCHEMA = (
    "struct<topic:string,partition:int,seq:bigint,ts:timestamp,key:binary,value:binary,date:date,ts_raw:decimal(20,0),"
    "source:string>"
)


def export(*argv):
    """The export job in this process (`main`: its options, plan and exit code), small enough for the driver: the
    delta-rs engine without Spark."""
    from tank_spark.export.job import main

    return main(["--master", "local[1]", *argv])


def export_on(spark, *argv):
    """The export job's own `prepare` and `execute` on the shared session (what `main` runs once Spark started):
    the delta-spark engine without a Spark start per run."""
    from tank_spark.context import build_context
    from tank_spark.export import job
    from tank_spark.job_options import job_parser

    parser = job_parser("export_delta", "")
    job.add_options(parser)
    args = parser.parse_args(["--master", "local[2]", *argv])
    ctx = build_context("export_delta", args)
    return job.execute(ctx, job.prepare(ctx, args), spark)


def spark_rows(spark, uri, options=None):
    """(topic, partition, seq, ts ms, key, value) of every row delta-spark reads, sorted."""
    loc = TableLocation.of(uri, options)
    df = spark.read.format("delta").options(**loc.spark_options()).load(loc.spark_path())
    df = df.selectExpr("topic", "partition", "seq", "coalesce(unix_millis(ts), cast(ts_raw as bigint))", "key", "value")
    return sorted(
        (r[0], r[1], r[2], r[3], bytes(r[4]) if r[4] is not None else None, bytes(r[5])) for r in df.collect()
    )


def dump_rows(name, topics=None):
    return sorted(
        (t, p, seq, ts, key, value)
        for (t, p), msgs in load_dump(name).items()
        if topics is None or t in topics
        for seq, ts, key, value in msgs
    )


def spark_transactions(spark, uri):
    """The app transactions delta-spark's own snapshot of the table holds: {app id: version}."""
    jvm = spark._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
    delta_log.clearCache()
    txns = delta_log.forTable(spark._jsparkSession, uri).unsafeVolatileSnapshot().transactions()
    it = txns.iterator()
    out = {}
    while it.hasNext():
        kv = it.next()
        out[kv._1()] = kv._2()
    return out


def recorded_versions(uri):
    """The app transactions our one pass over the table's log reads (`lakehouse.delta.app_transactions`)."""
    from deltalake import DeltaTable
    from pyarrow.fs import LocalFileSystem

    from tank_log.lakehouse.delta import app_transactions

    return app_transactions(DeltaTable(uri), LocalFileSystem(), uri)


def files_read(df):
    """How many files a query's scans read (Spark's `numFiles` metric, after data skipping)."""
    df.collect()
    leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
    n = 0
    for i in range(leaves.size()):
        metrics = leaves.apply(i).metrics()
        if metrics.contains("numFiles"):
            n += metrics.apply("numFiles").value()
    return n


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_spark_reads_what_the_delta_rs_export_writes(spark, tmp_path, name):
    """Every fixture: the same rows as the broker's dump, the types, the partition values (the UTC date of ts), the
    app transactions, and file statistics Spark skips files with."""
    from deltalake import DeltaTable

    table = str(tmp_path / "t")
    assert export("--data-dir", data_dir(name), "--table", table, "--target-file-size", "64kb") == 0
    expected = dump_rows(name)
    assert spark_rows(spark, table) == expected
    df = spark.read.format("delta").load(table)
    assert df.schema.simpleString() == SPARK_SCHEMA
    assert df.where("date <> to_date(ts) OR (ts IS NULL) <> (date IS NULL)").count() == 0  # session time zone: UTC
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()
    assert list(detail.partitionColumns) == ["topic", "date"]
    ours = DeltaTable(table)
    recorded = spark_transactions(spark, table)
    for (topic, partition), msgs in load_dump(name).items():
        aid = app_id(table_id(ours), topic, partition, default_source())
        assert recorded[aid] == ours.transaction_version(aid) >= msgs[-1][0]
    # data skipping: a filter on seq reads only the files whose [min, max] of seq can hold it
    stats = pa.table(ours.get_add_actions(flatten=True)).to_pydict()
    assert files_read(df) == len(stats["path"])
    holding = sum(lo <= 3 for lo in stats["min.seq"])  # the files whose seq range can hold seq <= 3
    assert files_read(df.where("seq <= 3")) == holding
    assert holding < len(stats["path"]) or name != "A_multi"  # A_multi's partitions span several files


def spark_made(spark, uri, columns, props=None, cluster_by=None, generated=None, options=None):
    """A table delta-spark creates with the export's columns (optionally plus a generated one), its partitioning
    (none for a clustered table) and table properties."""
    from delta.tables import DeltaTable

    loc = TableLocation.of(uri, options)
    for k, v in loc.spark_options().items():
        spark.conf.set(f"spark.hadoop.{k}", v)
    b = DeltaTable.create(spark).location(loc.spark_path()).addColumns(columns)
    if generated:
        b = b.addColumn(generated[0], generated[1], generatedAlwaysAs=generated[2])
    b = b.clusterBy(*cluster_by) if cluster_by else b.partitionedBy("topic", "date")
    for k, v in (props or {}).items():
        b = b.property(k, v)
    b.execute()


def delta_version(spark, uri):
    return spark.sql(f"DESCRIBE HISTORY delta.`{uri}` LIMIT 1").first().version


# feature: (table properties, Spark's own work on the table, what the refusal of the delta-rs engine names (None:
# it appends), of the delta-spark engine, and of delta-rs reading the table (the import; None: it reads what Spark
# reads))
DV = {"delta.enableDeletionVectors": "true"}
FEATURES = {
    "defaults": ({}, None, None, None, None),
    "deletion vectors after a DELETE": (
        {"delta.enableDeletionVectors": "true"},
        "DELETE",
        None,
        None,
        "deletionVectors",
    ),
    "column mapping by name": ({"delta.columnMapping.mode": "name"}, None, *["columnMapping"] * 3),
    "v2 checkpoints": (
        {"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "1"},
        None,
        None,
        None,
        "v2Checkpoint",
    ),
    "a checkpoint every commit": ({"delta.checkpointInterval": "1"}, None, None, None, None),
    "OPTIMIZE ZORDER and VACUUM": ({}, "OPTIMIZE", None, None, None),
    "a CHECK constraint": ({}, "CHECK", "checkConstraints", None, None),
    "a generated column": ({}, "GENERATED", "generatedColumns", None, None),
    "liquid clustering": ({}, "CLUSTER", "clustering", None, None),
    "row tracking": ({"delta.enableRowTracking": "true"}, None, "rowTracking", None, None),
    "in-commit timestamps": ({"delta.enableInCommitTimestamps": "true"}, None, "inCommitTimestamp", None, None),
    "change data feed": ({"delta.enableChangeDataFeed": "true"}, None, None, None, None),
}


def check_delta_rs_reads(table, spark_read, refusal):
    """delta-rs, as the import reads a table (`check_readable`, then its data), reads the rows Spark reads, or
    refuses naming the feature."""
    from tank_spark.import_delta import check_readable

    loc = TableLocation.of(table)
    if refusal is None:
        check_readable(loc, loc.open())
        d = loc.open().to_pyarrow_table(columns=["topic", "partition", "seq"]).to_pydict()
        assert sorted(zip(d["topic"], d["partition"], d["seq"], strict=True)) == [r[:3] for r in spark_read]
        return
    with pytest.raises(JobConfigError, match=refusal):
        check_readable(loc, loc.open())


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """A table the delta-rs export made of C_misc's timeroll topic (once for every feature): its Spark schema, and
    its rows for Spark to write itself."""
    ref = str(tmp_path_factory.mktemp("reference") / "ref")
    assert export("--data-dir", data_dir("C_misc"), "--table", ref, "--topics", "timeroll") == 0
    df = spark.read.format("delta").load(ref)
    return df.schema, df


@pytest.mark.parametrize("feature", list(FEATURES))
def test_our_export_appends_exactly_once_to_a_table_spark_made(spark, reference, tmp_path, feature, capsys):
    """Spark creates the table with the feature; each engine exports to its own such table, Spark maintains it
    (DELETE, OPTIMIZE ZORDER, VACUUM), new messages come, each engine exports again: Spark reads every message once
    (less what it deleted). Or the delta-rs engine refuses before writing, in one line naming the feature; the
    delta-spark engine writes every such table Spark reads."""
    props, upkeep, *refusals, read_refusal = FEATURES[feature]
    columns, rows = reference
    for engine, refused in zip(("deltalake", "spark"), refusals, strict=True):
        base = copy_tree(data_dir("C_misc"), str(tmp_path / f"data-{engine}"))
        table = str(tmp_path / f"t-{engine}")
        generated = ("seq_bucket", "BIGINT", "seq DIV 100") if upkeep == "GENERATED" else None
        cluster = ["topic", "seq"] if upkeep == "CLUSTER" else None
        spark_made(spark, table, columns, props, cluster_by=cluster, generated=generated)
        if upkeep == "CHECK":
            spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT seq_positive CHECK (seq > 0)")
        args = ["--data-dir", base, "--table", table, "--topics", "timeroll", "--engine", engine]
        if cluster:
            args.append("--partition-by=")
        version = delta_version(spark, table)
        if refused and engine == "deltalake":
            capsys.readouterr()
            code = export(*args)  # the refusal comes before anything is written, without Spark
            err = capsys.readouterr().err
            assert code == 2, err[-2000:]
            line = [x for x in err.splitlines() if x.startswith("export_delta:")]
            assert len(line) == 1 and refused in line[0] and "Traceback" not in err, err[-2000:]
        elif refused:
            with pytest.raises(JobConfigError, match=refused):
                export_on(spark, *args)
        if refused:
            assert delta_version(spark, table) == version  # nothing committed ...
            assert [f for _, _, fs in os.walk(table) for f in fs if f.endswith(".parquet")] == []  # ... or written
            rows.write.format("delta").mode("append").save(table)  # Spark writes them itself
            check_delta_rs_reads(table, spark_rows(spark, table), read_refusal)
            continue
        if engine == "deltalake":
            assert export(*args) == 0
        else:
            export_on(spark, *args)
        expected = dump_rows("C_misc", {"timeroll"})
        assert spark_rows(spark, table) == expected, feature
        if upkeep == "DELETE":
            spark.sql(f"DELETE FROM delta.`{table}` WHERE seq % 10 = 0")
            expected = [r for r in expected if r[2] % 10]
            metrics = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first().operationMetrics
            assert int(metrics["numDeletionVectorsAdded"]) > 0  # rows deleted through deletion vectors
        elif upkeep == "OPTIMIZE":
            spark.sql(f"OPTIMIZE delta.`{table}` ZORDER BY (seq)")
            spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
        appended = roll_and_append(base, "timeroll", 30)
        if engine == "deltalake":
            assert export(*args) == 0
        else:
            export_on(spark, *args)
        got = spark_rows(spark, table)
        assert [r[:3] for r in got] == sorted([r[:3] for r in expected] + [a[:3] for a in appended]), feature
        assert recorded_versions(table) == spark_transactions(spark, table), feature  # read in one pass
        if generated:
            assert spark.read.format("delta").load(table).where("seq_bucket <> seq DIV 100").count() == 0
        check_delta_rs_reads(table, got, read_refusal)


def test_the_import_reads_what_spark_wrote_optimized_and_vacuumed(spark, tmp_path):
    """Spark writes the rows (the export's columns), OPTIMIZE ZORDER, VACUUM: the import (delta-rs) restores
    exactly what Spark reads. Once Spark turned on deletion vectors and deleted rows, the import refuses, naming the
    feature, before it writes anything."""
    table = str(tmp_path / "t")
    ref = str(tmp_path / "ours")
    assert export("--data-dir", data_dir("C_misc"), "--table", ref) == 0
    rows = spark.read.format("delta").load(ref)
    spark_made(spark, table, rows.schema)
    for part in (0, 1):  # two Spark writes, compacted by OPTIMIZE, the old files vacuumed
        rows.where(f"partition = {part}").write.format("delta").mode("append").save(table)
    spark.sql(f"OPTIMIZE delta.`{table}` ZORDER BY (seq)")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    restored = str(tmp_path / "restored")
    r = _import(restored, table)
    assert r.returncode == 0, r.stderr[-3000:]
    again = str(tmp_path / "again")
    assert export("--data-dir", restored, "--table", again) == 0  # what was imported, as our export reads it
    assert spark_rows(spark, again) == spark_rows(spark, table)

    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{table}` WHERE seq % 10 = 0")
    r = _import(str(tmp_path / "restored2"), table)
    assert r.returncode == 2 and "deletionVectors" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len([x for x in r.stderr.splitlines() if x.startswith("import_delta:")]) == 1
    assert not os.path.exists(tmp_path / "restored2")  # refused before the base path was made


def _import(base, table):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "jobs", "import_delta.py"), "--master", "local[1]", "--data-dir", base,
         "--table", table],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"),
    )  # fmt: skip


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    return Lake(tmp_path, request.getfixturevalue("s3_server") if request.param == "s3" else None)


def test_engine_spark_exactly_once_rerun_crash_and_alternating_engines(spark, tmp_path, lake, monkeypatch):
    """The delta-spark engine: a first export, a rerun with nothing new, a run that dies after one partition's
    commit and its rerun, then runs alternating with the delta-rs engine on the same table — each (topic, partition,
    seq) exactly once, read by Spark and by delta-rs."""
    for k, v in lake.env.items():
        monkeypatch.setenv(k, v)
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--table", lake.uri, *lake.flags, "--topics", "events,seqgap"]
    results, summary = export_on(spark, *args, "--engine", "spark")
    expected = dump_rows("A_multi", {"events", "seqgap"})
    assert summary["rows"] == len(expected) and summary["engine"] == "spark"
    assert spark_rows(spark, lake.uri, lake.options) == expected
    version = lake.table().version()

    _, summary = export_on(spark, *args, "--engine", "spark")  # nothing new: nothing committed
    assert summary["rows"] == 0 and lake.table().version() == version

    # new messages in the 3 partitions of events; the job's driver dies after the first partition's commit
    appended = roll_and_append(base, "events", 20)
    r = run_job_script(
        "export_delta", *args, "--engine", "spark", env_extra={**lake.env, "TANK_LOG_EXPORT_CRASH": "before-commit"}
    )
    assert r.returncode == 137, r.stderr[-3000:]
    assert lake.table().version() == version + 1  # one partition committed, the others not
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 40 and summary["by_status"] == {"exported": 2, "up-to-date": 2}
    assert [r[:3] for r in spark_rows(spark, lake.uri, lake.options)] == sorted(
        [r[:3] for r in expected] + [a[:3] for a in appended]
    )

    # alternating with the delta-rs engine on the same table
    for engine in ("deltalake", "spark", "deltalake"):
        appended += roll_and_append(base, "events", 10)
        if engine == "deltalake":
            assert export(*args) == 0
        else:
            export_on(spark, *args, "--engine", "spark")
    want = sorted([r[:3] for r in expected] + [a[:3] for a in appended])
    assert [r[:3] for r in spark_rows(spark, lake.uri, lake.options)] == want
    d = lake.table().to_pyarrow_table(columns=["topic", "partition", "seq"]).to_pydict()
    assert sorted(zip(d["topic"], d["partition"], d["seq"], strict=True)) == want


def test_engine_spark_two_exports_at_once_and_under_spark_submit(tmp_path, lake, monkeypatch):
    """Under spark-submit without flags (Delta's jars come from the checkout): run A (delta-spark) plans and waits
    before its commits; run B (delta-rs) exports the same partitions; A finds the recorded versions moved, re-plans,
    commits nothing twice. Locally and on S3."""
    for k, v in lake.env.items():
        monkeypatch.setenv(k, v)
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--table", lake.uri, *lake.flags, "--topics", "seqgap,small"]
    hold = str(tmp_path / "release")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD=hold, PYTHONPATH=ROOT)
    env["PATH"] = os.path.dirname(submit) + os.pathsep + env["PATH"]  # spark-submit finds its Spark through python
    a = subprocess.Popen(
        [submit, "--master", "local[2]", os.path.join(ROOT, "jobs", "export_delta.py"), *args, "--engine", "spark",
         "--report", str(tmp_path / "a.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_hold(hold + ".ready", a, timeout=400)
        assert export(*args) == 0  # B: the delta-rs engine
        open(hold, "w").close()
        out, err = a.communicate(timeout=400)
        err = out + err  # spark-submit passes the driver's stderr to its stdout
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 0, err[-3000:]
    assert "re-planning" in err
    report = json.load(open(tmp_path / "a.json"))
    assert report["summary"]["rows"] == 0 and report["summary"]["engine"] == "spark"
    d = lake.table().to_pyarrow_table(columns=["topic", "partition", "seq"]).to_pydict()
    got = sorted(zip(d["topic"], d["partition"], d["seq"], strict=True))
    assert got == [r[:3] for r in dump_rows("A_multi", {"seqgap", "small"})]


def spark_stream(spark, base, table, checkpoint, start_after_table=False):
    """A Spark user's streaming job: the `tank` source (topic events) into the table through delta-spark's streaming
    sink, once over what exists (availableNow). Returns the query's id (the app id of the sink's `txn`)."""
    reader = spark.readStream.format("tank").option("topics", "events")
    if start_after_table:
        reader = reader.option("startAfterTable", table)
    derived = ["to_date(ts) AS date"]  # as docs/guides/export-continuous.md (the source gives `ts_raw`)
    rows = reader.load(base).selectExpr("*", *derived)
    query = (
        rows.writeStream.format("delta")
        .partitionBy("topic", "date")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(table)
    )
    query.awaitTermination()
    assert query.exception() is None
    return query.id


def continuous_once(spark, *argv):
    """Our continuous export on the shared session until its first micro-batch is committed, then stopped as an
    operator stops it (SIGTERM: the batch in flight finishes)."""
    checkpoint = argv[argv.index("--checkpoint") + 1]

    def stop_after_first_batch():
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(checkpoint, "commits", "0")) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_after_first_batch, daemon=True)
    stopper.start()
    results, summary = export_on(spark, *argv, "--continuous", "--trigger-interval", "1s")
    stopper.join()
    return results, summary


def assert_refused(spark, table, args, checkpoint, capsys, partitions, writer):
    """Our batch export (exit 2, one line), our continuous export (before its query starts) and the delta-spark
    engine refuse, naming the table, each partition and seq range, and the writer; the table is left as it was, and
    delta-rs reads what Spark reads."""
    from tank_spark.export.other_writers import OtherWriter

    version, files = delta_version(spark, table), sorted(f for _, _, fs in os.walk(table) for f in fs)
    capsys.readouterr()
    assert export(*args) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("export_delta:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert f"table {table}:" in lines[0] and "STREAMING UPDATE" in lines[0] and f"app id {writer}" in lines[0]
    for (topic, partition), (lo, hi) in partitions.items():
        assert f"{topic}/{partition} holds seqs {lo}..{hi} ({hi - lo + 1} rows)" in lines[0], lines[0]
    with pytest.raises(OtherWriter, match="written by table version"):
        export_on(spark, *args, "--continuous", "--checkpoint", checkpoint)
    with pytest.raises(OtherWriter, match="STREAMING UPDATE"):
        export_on(spark, *args, "--engine", "spark")
    assert delta_version(spark, table) == version
    assert sorted(f for _, _, fs in os.walk(table) for f in fs) == files
    check_delta_rs_reads(table, spark_rows(spark, table), None)


def test_continuous_export_then_a_spark_streaming_job_then_refused(spark, tmp_path, capsys):
    """Our continuous export, then a Spark Structured Streaming job (delta-spark's sink, `startAfterTable`) continues
    from the versions the table records: every message once. Then our exports refuse the partitions that job wrote
    past those versions, before writing anything."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--topics", "events"]
    _, summary = continuous_once(spark, *args, "--checkpoint", str(tmp_path / "ours"))
    expected = [r[:3] for r in dump_rows("A_multi", {"events"})]
    assert summary["batches"] == 1 and [r[:3] for r in spark_rows(spark, table)] == expected

    appended = roll_and_append(base, "events", 10)
    writer = spark_stream(spark, base, table, str(tmp_path / "theirs"), start_after_table=True)
    expected = sorted(expected + [a[:3] for a in appended])
    assert [r[:3] for r in spark_rows(spark, table)] == expected  # continued after our export: nothing twice

    roll_and_append(base, "events", 5)
    theirs = {(t, p): (min(s for t2, p2, s, _ in appended if (t2, p2) == (t, p)), s) for t, p, s, _ in appended}
    assert_refused(spark, table, args, str(tmp_path / "ours"), capsys, theirs, writer)
    assert [r[:3] for r in spark_rows(spark, table)] == expected


def test_a_spark_streaming_job_then_our_exports_refuse(spark, tmp_path, capsys):
    """A Spark Structured Streaming job writes the table first (delta-spark's sink, its own `txn`): our exports, batch
    and continuous, refuse its partitions before writing, naming the seqs and the query."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    writer = spark_stream(spark, base, table, str(tmp_path / "theirs"))
    expected = [r[:3] for r in dump_rows("A_multi", {"events"})]
    assert [r[:3] for r in spark_rows(spark, table)] == expected
    theirs = {}
    for t, p, s in expected:
        theirs[(t, p)] = (min(theirs.get((t, p), (s,))[0], s), s)
    args = ["--data-dir", base, "--table", table, "--topics", "events"]
    assert_refused(spark, table, args, str(tmp_path / "ours"), capsys, theirs, writer)


# docs/guides/export.md's table of Spark's features: the first words of each row → its FEATURES entry
DOC_ROWS = {
    "Spark's defaults": "defaults",
    "deletion vectors": "deletion vectors after a DELETE",
    "column mapping": "column mapping by name",
    "v2 checkpoints": "v2 checkpoints",
    "a checkpoint every commit": "a checkpoint every commit",
    "`OPTIMIZE": "OPTIMIZE ZORDER and VACUUM",
    "a `CHECK` constraint": "a CHECK constraint",
    "a generated column": "a generated column",
    "liquid clustering": "liquid clustering",
    "row tracking": "row tracking",
    "in-commit timestamps": "in-commit timestamps",
    "change data feed": "change data feed",
}
STREAMING_ROW = ("a Spark streaming job", "STREAMING UPDATE")  # the two streaming tests above


def test_the_docs_feature_table_says_what_these_tests_assert():
    """Every row of the docs' feature table is a FEATURES entry (or the streaming tests), every entry has its row,
    and each cell says what the test asserts: appends or the refusal it names, and what Spark and delta-rs read."""
    with open(os.path.join(ROOT, "docs", "guides", "export.md"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("| feature (Spark) |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines[start + 2 : end]]
    seen = []
    for label, rs, spark_engine, by_spark, by_delta_rs in rows:
        if label.startswith(STREAMING_ROW[0]):
            for cell in (rs, spark_engine):
                assert cell.startswith(f"refused: `{STREAMING_ROW[1]}`"), cell
            assert by_spark == by_delta_rs == "yes"
            seen.append(STREAMING_ROW[0])
            continue
        key = next(v for k, v in DOC_ROWS.items() if label.startswith(k))
        seen.append(key)
        _, _, *refusals, read_refusal = FEATURES[key]
        for cell, refused in zip((rs, spark_engine), refusals, strict=True):
            assert cell.startswith("appends") if refused is None else f"`{refused}`" in cell, (label, cell)
            assert refused is not None or not cell.startswith("refused"), (label, cell)
        assert by_spark.startswith("yes"), label
        if read_refusal is None:
            assert by_delta_rs == "yes", label
        else:
            assert by_delta_rs.startswith("refused") and f"`{read_refusal}`" in by_delta_rs, label
    assert sorted(seen) == sorted([*FEATURES, STREAMING_ROW[0]])
