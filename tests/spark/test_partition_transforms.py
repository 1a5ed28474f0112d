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
def test_delta_takes_day_as_its_date_column_and_refuses_the_rest(tmp_path):
    """Delta has no transforms: `identity(topic), day(ts)` makes the table partitioned by topic and date (the UTC date
    of ts) that the export always wrote; hour(ts) and bucket are refused in one line naming the term and the format,
    before anything is written."""
    from deltalake import DeltaTable

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    r = export(base, table, "--partition-by", "identity(topic), day(ts)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert DeltaTable(table).metadata().partition_columns == ["topic", "date"]
    for term in ("hour(ts)", "bucket(8, key)"):
        r = export(base, str(tmp_path / "other"), "--partition-by", f"topic,{term}")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert f"{term}: a delta table has no partition transforms" in r.stderr and "use format iceberg" in r.stderr
    assert not (tmp_path / "other").exists()


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
    with pytest.raises(JobConfigError, match=r"month\(ts\): a delta table has no partition transforms"):
        partitioning.for_format(("month(ts)",), "delta")
    with pytest.raises(JobConfigError, match=r"--mode latest into t: the table is partitioned by transforms \(day"):
        partitioning.check_rewritable(("topic", "day(ts)"), "--mode latest into t")


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
