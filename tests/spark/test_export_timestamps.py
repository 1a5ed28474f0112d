"""Timestamps far from today (the epoch, past 2262-04-11 where a 64-bit nanosecond count ends, 3000, 9999-12-31)
written by both engines and read back the same by delta-rs, DuckDB, Polars, delta-spark and our import: both engines
write `ts` as 64-bit microseconds, never Parquet INT96."""

import datetime as dt
import os

import pytest
from conftest import duckdb_with, run_job_script
from deltalake import DeltaTable
from test_delta_spark import _import

from tank_log.format.bundle import Message
from tank_log.storage.datadir import partitions_at
from tank_log.storage.partition_writer import write_partition
from tank_spark.schema import MAX_TS_MS

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# ts of each message: the epoch, the last µs a 64-bit ns count holds and just past it, 3000-01-01, the last ms of
# 9999 (the largest ts a row keeps: tank_spark.schema.MAX_TS_MS)
FAR = [
    0,
    1,
    9_223_372_036_854,
    9_223_372_036_855,
    int(dt.datetime(2262, 4, 12, tzinfo=dt.UTC).timestamp() * 1000),
    int(dt.datetime(3000, 1, 1, tzinfo=dt.UTC).timestamp() * 1000),
    MAX_TS_MS,
]


@pytest.fixture(scope="module")
def far_tables(tmp_path_factory):
    """A partition whose messages have the ts of FAR, exported by each engine into its own table (as jobs run)."""
    root = tmp_path_factory.mktemp("far")
    base = root / "data"
    pdir = base / "far" / "0"
    pdir.mkdir(parents=True)
    write_partition(pdir, [Message(i + 1, ts, b"k%d" % i, b"v%d" % i) for i, ts in enumerate(FAR)])
    tables = {}
    for engine in ("deltalake", "spark"):
        tables[engine] = str(root / engine)
        r = run_job_script(
            "export_delta", "--data-dir", str(base), "--table", tables[engine], "--engine", engine, where="driver"
        )
        assert r.returncode == 0, r.stderr[-3000:]
    return tables


WANT = [(i + 1, ts) for i, ts in enumerate(FAR)]  # (seq, ts ms)


def _ms(micros):
    return None if micros is None else micros // 1000


@pytest.mark.parametrize("engine", ["deltalake", "spark"])
def test_far_timestamps_read_back_by_delta_rs_duckdb_and_polars(far_tables, engine):
    """Each engine writes ts as 64-bit microseconds (never INT96, which readers take as nanoseconds and wrap past
    2262-04-11): delta-rs, DuckDB and Polars read every ts back exactly."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = far_tables[engine]
    t = DeltaTable(table)
    for f in t.file_uris():
        ts = pq.read_metadata(f).schema.column(pq.read_schema(f).get_field_index("ts"))
        assert ts.physical_type == "INT64", f"{f}: ts stored as {ts.physical_type}"
    got = t.to_pyarrow_table(columns=["seq", "ts"]).sort_by("seq")
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    rows = got.to_pydict()
    micros = pa.compute.cast(got["ts"], pa.int64()).to_pylist()
    assert list(zip(rows["seq"], [_ms(m) for m in micros], strict=True)) == WANT

    con = duckdb_with("delta")
    duck = con.execute(f"SELECT seq, epoch_us(ts) FROM delta_scan('{table}') ORDER BY seq").fetchall()
    assert [(s, _ms(m)) for s, m in duck] == WANT

    pl = pytest.importorskip("polars")
    frame = pl.read_delta(table).sort("seq")
    assert list(zip(frame["seq"].to_list(), frame["ts"].dt.epoch("ms").to_list(), strict=True)) == WANT


@pytest.mark.parametrize("engine", ["deltalake", "spark"])
def test_far_timestamps_read_back_by_delta_spark_and_the_import(spark, far_tables, tmp_path, engine):
    """delta-spark reads the same ts; our import puts each message back with its exact ts."""
    table = far_tables[engine]
    rows = spark.read.format("delta").load(table).selectExpr("seq", "unix_micros(ts)").collect()
    assert sorted((r[0], _ms(r[1])) for r in rows) == WANT

    base = str(tmp_path / "restored")
    r = _import(base, table)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted((m.seq, m.ts) for p in partitions_at(base) for s in p.segments for m in s.messages())
    assert got == WANT
    assert os.path.isdir(os.path.join(base, "far", "0"))


def test_a_table_with_int96_files_from_an_older_version_reads_back(spark, far_tables, tmp_path):
    """A table the spark engine wrote before it set TIMESTAMP_MICROS holds INT96 files (here: the rows rewritten by
    delta-spark with Spark's default), then gets new files from today's export: delta-spark, DuckDB and our import
    read every ts exactly, the INT96 files' and the INT64 files' alike."""
    import pyarrow.parquet as pq

    from tank_spark.context import FIXED_CONF

    table = str(tmp_path / "old")
    key = "spark.sql.parquet.outputTimestampType"
    spark.conf.set(key, "INT96")
    try:
        spark.read.format("delta").load(far_tables["deltalake"]).write.format("delta").partitionBy(
            "topic", "date"
        ).save(table)
    finally:
        spark.conf.set(key, FIXED_CONF[key])
    kinds = {
        pq.read_metadata(f).schema.column(pq.read_schema(f).get_field_index("ts")).physical_type
        for f in DeltaTable(table).file_uris()
    }
    assert kinds == {"INT96"}
    rows = spark.read.format("delta").load(table).selectExpr("seq", "unix_micros(ts)").collect()
    assert sorted((r[0], _ms(r[1])) for r in rows) == WANT
    con = duckdb_with("delta")
    duck = con.execute(f"SELECT seq, epoch_us(ts) FROM delta_scan('{table}') ORDER BY seq").fetchall()
    assert [(s, _ms(m)) for s, m in duck] == WANT

    base = str(tmp_path / "restored")
    r = _import(base, table)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted((m.seq, m.ts) for p in partitions_at(base) for s in p.segments for m in s.messages())
    assert got == WANT
