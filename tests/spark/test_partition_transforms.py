"""`export.partition_by` with Iceberg's partition transforms (`tank_log.lakehouse.partitioning`): the spec written at
table creation and read back by pyiceberg, rows pruned on a filter (pyiceberg's scan planning) and read whole by
DuckDB, a second export onto the table (its spec respected: another `partition_by` refused, naming both); Delta's
equivalent (`day(ts)` is the `date` column), and the transforms it has none of refused in one line."""

import json
import subprocess
import sys

import pytest
from conftest import copy_tree, data_dir, duckdb_with, run_job_script
from test_job_export import dump_rows, roll_and_append

from tank_log.errors import JobConfigError
from tank_log.lakehouse import partitioning
from tank_log.lakehouse.location import TableLocation

TOPICS = {"events", "seqgap"}
NEW_DAY = "2027-01-15"  # the day of the messages `roll_and_append` writes (ts 1,800,000,000,000 ms)


def export(base, table, *flags, report=None):
    more = ["--report", str(report)] if report else []
    args = ["--data-dir", base, "--topics", ",".join(sorted(TOPICS)), "--table", table, *flags, *more]
    return run_job_script("export_delta", *args, where="driver")


@pytest.mark.slow
def test_iceberg_transforms_written_pruned_and_kept(tmp_path):
    """`topic, day(ts), bucket(4, key)`: pyiceberg reads the spec back (identity, day, bucket[4]); DuckDB reads every
    message of the fixture; a second export with another partition_by is refused naming the table's spec, and with
    the table's it appends the new day's messages once. A filter on ts plans only the new day's files, one on key only
    its bucket's, and both return exactly the rows the filter keeps of the whole table; the audit finds each seq
    once."""
    import pyarrow.compute as pc
    from pyiceberg.expressions import EqualTo, GreaterThanOrEqual

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    spec = ["--format", "iceberg", "--partition-by", "identity(topic), day(ts), bucket(4, key)"]
    r = export(base, table, *spec)
    assert r.returncode == 0, r.stderr[-3000:]
    t = TableLocation.of(table, fmt="iceberg").existing().table
    fields = [(f.name, str(f.transform)) for f in t.spec().fields]
    assert fields == [("topic", "identity"), ("ts_day", "day"), ("key_bucket", "bucket[4]")]
    assert [f.name for f in t.schema().fields][:5] == ["topic", "partition", "seq", "ts", "key"]  # hidden: no columns
    duck = duckdb_with("avro", "iceberg").execute(
        f"SELECT topic, partition, seq, value FROM iceberg_scan('{t.metadata_location}')"
    )
    assert sorted(duck.fetchall()) == dump_rows("A_multi", TOPICS)

    r = export(base, table, "--format", "iceberg")  # the default partition_by: topic, date
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is partitioned by ['topic', 'day(ts)', 'bucket(4, key)'], not ['topic', 'date']" in r.stderr, r.stderr
    appended = roll_and_append(base, "events", 25)
    r = export(base, table, *spec, report=tmp_path / "2.json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.load(open(tmp_path / "2.json"))["summary"]["rows"] == len(appended) == 75

    t = TableLocation.of(table, fmt="iceberg").existing().table
    everything = t.scan().to_arrow()
    expected = sorted(dump_rows("A_multi", TOPICS) + appended)
    assert (
        sorted(zip(*(everything[c].to_pylist() for c in ("topic", "partition", "seq", "value")), strict=True))
        == expected
    )
    files = {f.file.file_path: f.file.partition for f in t.scan().plan_files()}
    new_day = t.scan(row_filter=GreaterThanOrEqual("ts", f"{NEW_DAY}T00:00:00+00:00"))
    planned = [f.file.file_path for f in new_day.plan_files()]
    assert planned and len(planned) < len(files) and all(f"ts_day={NEW_DAY}" in p for p in planned)
    assert sorted(new_day.to_arrow()["seq"].to_pylist()) == sorted(s for _, _, s, _ in appended)

    audit = [sys.executable, "-m", "tank_log.tools.cli", "audit", base, "--table", table, "--format", "iceberg"]
    r = subprocess.run([*audit, "--topics", ",".join(sorted(TOPICS))], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "verdict: ok" in r.stdout, r.stdout + r.stderr[-3000:]  # each seq once

    key = everything.filter(pc.is_valid(everything["key"]))["key"][0].as_py()
    one_key = t.scan(row_filter=EqualTo("key", key))
    buckets = {files[f.file.file_path][2] for f in one_key.plan_files()}
    assert len(buckets) == 1 and len(list(one_key.plan_files())) < len(files)
    want = everything.filter(pc.equal(everything["key"], key))
    assert sorted(one_key.to_arrow()["seq"].to_pylist()) == sorted(want["seq"].to_pylist())


@pytest.mark.slow
def test_delta_takes_day_as_its_date_column_and_refuses_other_generated_columns(tmp_path):
    """`identity(topic), day(ts)` makes the Delta table partitioned by topic and date (the UTC date of ts) that the
    export always wrote. The delta-rs engine appends to a table whose generated columns are exactly those of its spec
    (`ts_hour`, `key_bucket`), and refuses, before anything is written, one with any other generated column, or
    whose generated column has another expression than this export's (naming it)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    r = export(base, table, "--partition-by", "identity(topic), day(ts)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert DeltaTable(table).metadata().partition_columns == ["topic", "date"]

    ours = DeltaTable(table).schema().to_arrow()
    for name, extra, refusal in [
        ("own", [], None),
        ("seq_div", [("seq_div", pa.int64(), "seq DIV 100", False)], "column seq_div: a generatedColumns column"),
        ("local hour", [("ts_hour", pa.string(), "date_format(ts, 'yyyy-MM-dd HH')", True)], "column ts_hour: a gen"),
    ]:
        made = str(tmp_path / name)
        own = [("ts_hour", pa.string(), "date_format(ts, 'yyyy-MM-dd-HH')", True)] if not extra else extra
        own.append(("key_bucket", pa.int32(), "pmod(hash(key), 4)", True))
        fields = [pa.field(n, t, metadata={"delta.generationExpression": e}) for n, t, e, _ in own]
        parts = ["topic", *(n for n, _, _, part in own if part)]
        DeltaTable.create(made, schema=pa.schema(list(pa.schema(ours)) + fields), partition_by=parts)
        r = export(base, made, "--partition-by", "topic, hour(ts), bucket(4, key)")
        if refusal is None:
            assert r.returncode == 0, r.stderr[-3000:]
            assert DeltaTable(made).to_pyarrow_table().num_rows == len(dump_rows("A_multi", TOPICS))
            continue
        assert r.returncode == 2 and refusal in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert DeltaTable(made).version() == 0
    r = export(base, str(tmp_path / "own"), "--partition-by", "topic, hour(ts), bucket(8, key)")  # another width
    assert r.returncode == 2 and "is partitioned by ['topic', 'hour(ts)', 'bucket(4, key)'], not" in r.stderr
    r = export(base, str(tmp_path / "latest"), "--partition-by", "topic, hour(ts)", "--mode", "latest")
    assert r.returncode == 2 and "which delta-rs's MERGE does not write here" in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "latest").exists()


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("topic,date", ("topic", "date")),
        ("identity(topic), day(ts)", ("topic", "day(ts)")),
        (["month(ts)", "bucket(16,key)"], ("month(ts)", "bucket(16, key)")),
        ("hour( ts ),partition", ("hour(ts)", "partition")),
    ],
)
def test_terms_are_kept_in_one_spelling(value, parsed):
    assert partitioning.parse(value) == parsed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("day(seq)", "day(seq): not a partition transform of this export"),
        ("bucket(0, key)", "bucket(N, COL) takes 1 <= N <= 65536"),
        ("bucket(key)", "bucket(N, COL) takes"),
        ("day(ts),ts_day", "ts_day: not a partition column or transform"),
        ("topic,identity(topic)", "topic: partitioned by twice"),
        ("truncate(4, key)", "truncate(4, key): not a partition transform"),
    ],
)
def test_bad_terms_are_one_line(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        partitioning.parse(value)


def test_formats_translate_or_refuse():
    assert partitioning.for_format(("topic", "day(ts)"), "delta") == ("topic", "date")
    assert partitioning.for_format(("date", "day(ts)"), "delta") == ("date",)
    assert partitioning.for_format(("topic", "hour(ts)"), "iceberg") == ("topic", "hour(ts)")
    spec = partitioning.for_format(("identity(topic)", "month(ts)", "bucket(8, partition)"), "delta")
    assert spec == ("topic", "month(ts)", "bucket(8, partition)")
    assert [(c.name, c.type, c.expression) for c in partitioning.delta_columns(spec)] == [
        ("ts_month", "string", "date_format(ts, 'yyyy-MM')"),
        ("partition_bucket", "integer", "pmod(hash(partition), 8)"),
    ]
    assert [partitioning.delta_term(c.name, c.expression) for c in partitioning.delta_columns(spec)] == list(spec[1:])
    assert partitioning.delta_term("ts_hour", None) == "ts_hour"  # a plain column of that name
    assert partitioning.delta_term("ts_hour", "date_format(ts, 'HH')") == "ts_hour"
    with pytest.raises(JobConfigError, match=r"--mode latest into t: the table is partitioned by transforms \(day"):
        partitioning.check_rewritable(("topic", "day(ts)"), "--mode latest into t")
    with pytest.raises(JobConfigError, match=r"\(bucket\(2, key\)\), which delta-rs's MERGE does not write"):
        partitioning.check_rewritable(("topic", "date", "bucket(2, key)"), "--mode latest into t", "delta")
    partitioning.check_rewritable(("topic", "date"), "--mode latest into t", "delta")


def test_buckets_are_icebergs():
    """The writer's buckets (Murmur3, as Iceberg's spec says) are those pyiceberg's own transform gives, for keys
    (bytes), topics (strings) and partitions (ints), nulls kept null."""
    import pyarrow as pa
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import BinaryType, IntegerType, StringType

    for values, kind in [
        ([b"k1", b"", None, b"\xff\x00key"], BinaryType()),
        (["events", "caf\u00e9", None], StringType()),
        ([0, 1, 7, -3, None], IntegerType()),
    ]:
        batch = pa.RecordBatch.from_pydict({"c": values})
        want = [BucketTransform(16).transform(kind)(v) for v in values]
        assert partitioning._buckets(batch.column("c"), 16).to_pylist() == want


OWN_COLUMNS = ("topic", "partition", "seq", "ts", "key", "value", "date", "ts_raw", "source")  # what the export writes
GENERATED = ("ts_hour", "ts_month", "key_bucket")
DELTA_SPEC = "topic, hour(ts), month(ts), bucket(4, key)"
INCONSISTENT = (  # a row whose generated columns are not what their expressions give (null-safe)
    "NOT (ts_hour <=> date_format(ts, 'yyyy-MM-dd-HH')) OR NOT (ts_month <=> date_format(ts, 'yyyy-MM')) "
    "OR NOT (key_bucket <=> pmod(hash(key), 4))"
)
NEW_HOUR = "2027-01-15-08"  # the hour of the messages `roll_and_append` writes


@pytest.mark.spark
@pytest.mark.slow
def test_delta_generated_columns_are_sparks(spark, tmp_path):
    """Delta's equivalents of hour, month and bucket: generated columns (`ts_hour`, `ts_month`, `key_bucket`) the
    table is partitioned by. delta-spark, the oracle, computes for its own append (rows given without them) the
    values our files hold for the same ts and key: no row of the table differs from its expressions, after our
    exports (delta-rs engine, with --optimize, then --engine spark, whose delta-spark writes compute them) and
    Spark's append. Spark
    prunes a filter on ts to the files of its hours, and one naming the key's bucket to that bucket's; DuckDB and
    deltalake read the rows Spark reads; another spec is refused naming the table's."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import functions as F
    from test_delta_spark import export_on, files_read

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    r = export(base, table, "--partition-by", DELTA_SPEC)
    assert r.returncode == 0, r.stderr[-3000:]
    assert DeltaTable(table).metadata().partition_columns == ["topic", *GENERATED]
    df = spark.read.format("delta").load(table)
    assert df.where(INCONSISTENT).count() == 0

    # delta-spark appends rows given without the generated columns (as a Spark user would): it computes them
    given = spark.createDataFrame(df.where("seq <= 5").select(*OWN_COLUMNS).collect(), df.select(*OWN_COLUMNS).schema)
    given.withColumn("seq", -F.col("seq")).write.format("delta").mode("append").save(table)
    assert df.where("seq < 0").count() == given.count() > 0

    r = export(base, table, "--partition-by", "topic, day(ts)")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "is partitioned by ['topic', 'hour(ts)', 'month(ts)', 'bucket(4, key)'], not ['topic', 'date']" in r.stderr
    appended = roll_and_append(base, "events", 25)
    r = export(base, table, "--partition-by", DELTA_SPEC, "--optimize")  # delta-rs compacts each partition's files
    assert r.returncode == 0 and "optimize rewrote" in r.stderr, r.stderr[-3000:]
    appended += roll_and_append(base, "seqgap", 10)
    args = ["--data-dir", base, "--topics", ",".join(sorted(TOPICS)), "--table", table, "--partition-by", DELTA_SPEC]
    spark.conf.set("spark.sql.session.timeZone", "Pacific/Kiritimati")  # a user's session: the export writes UTC
    assert export_on(spark, *args, "--engine", "spark")[1]["engine"] == "spark"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    df = spark.read.format("delta").load(table)
    assert df.where(INCONSISTENT).count() == 0
    assert df.where("seq > 0").count() == len(dump_rows("A_multi", TOPICS)) + len(appended) == 16481 + 85

    # Spark turns a filter on ts into one on ts_hour (and ts_month): only the new hour's files are read
    actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pydict()
    new_files = sum(h == NEW_HOUR for h in actions["partition.ts_hour"])
    new_hour = df.where("ts >= '2027-01-15 08:00:00' AND ts < '2027-01-15 09:00:00'")
    assert 0 < files_read(new_hour) == new_files < len(actions["path"])
    assert sorted(r.seq for r in new_hour.select("seq").collect()) == sorted(s for _, _, s, _ in appended)
    # a hash is no expression Delta derives partition filters from: a query names the key's bucket to prune by it
    bucket = spark.sql("SELECT pmod(hash(X'6e6577'), 4)").first()[0]  # the key of the appended messages: b"new"
    one_key = df.where("key = X'6e6577' AND key_bucket = pmod(hash(X'6e6577'), 4)")
    assert files_read(one_key) == sum(b == bucket for b in actions["partition.key_bucket"]) < len(actions["path"])
    assert one_key.count() == len(appended)

    # DuckDB and deltalake read the rows (generated columns too) Spark reads
    columns = ("topic", "partition", "seq", "value", *GENERATED)
    want = sorted(tuple(r) for r in df.select(*columns).collect())
    duck = duckdb_with("delta").execute(f"SELECT {', '.join(columns)} FROM delta_scan('{table}')").fetchall()
    assert sorted(duck) == want
    d = DeltaTable(table).to_pyarrow_table(columns=list(columns)).to_pydict()
    assert sorted(zip(*(d[c] for c in columns), strict=True)) == want


@pytest.mark.spark
@pytest.mark.slow
def test_delta_buckets_are_sparks_hash(spark):
    """The writer's Delta buckets are Spark's `pmod(hash(COL), N)` for keys of every tail length (Spark's Murmur3
    mixes the last len % 4 bytes unlike Murmur3's own), strings (UTF-8), ints and nulls (the seed's bucket)."""
    import os

    import pyarrow as pa

    keys = [os.urandom(n) for n in range(13) for _ in range(4)] + [b"\x80\xff\x7f", None]
    texts = ["events", "caf\u00e9", "", "\u6f22\u5b57x", None]
    ints = [0, 1, 7, -3, 2**31 - 1, None]
    for values, kind in [(keys, "binary"), (texts, "string"), (ints, "int")]:
        df = spark.createDataFrame([(v,) for v in values], f"c {kind}")
        want = [r[0] for r in df.selectExpr("pmod(hash(c), 13)").collect()]
        arrow = pa.array(values, {"binary": pa.binary(), "string": pa.string(), "int": pa.int32()}[kind])
        assert partitioning._spark_buckets(arrow, 13).to_pylist() == want, kind
