"""The Spark data source "tank" (PySpark Python Data Source API) against the fixtures' dumps."""

import os

import pyarrow as pa
import pytest
from conftest import DATASETS, data_dir, load_dump
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from tank_spark.ranges import Bounds, plan_ranges

COLS = ["topic", "partition", "seq", "ts_ms", "key", "value"]


def expected_df(spark, name, keep=lambda row: True):
    """The dump as a DataFrame (built from Arrow: much faster than from Python rows)."""
    rows = [
        (t, p, seq, ts, key, value)
        for (t, p), msgs in load_dump(name).items()
        for seq, ts, key, value in msgs
        if keep((t, p, seq, ts))
    ]
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 6
    types = [pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.binary(), pa.binary()]
    table = pa.table([pa.array(list(c), t) for c, t in zip(cols, types, strict=True)], names=COLS)
    return spark.createDataFrame(table)


def read(spark, path, **options):
    df = spark.read.format("tank")
    for k, v in options.items():
        df = df.option(k, str(v))
    return df.load(path).withColumn("ts_ms", F.unix_millis("ts")).select(*COLS)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_each_fixture_reads_as_its_dump(spark, name):
    assertDataFrameEqual(read(spark, data_dir(name)), expected_df(spark, name))


def test_pyspark_test_package_agrees(spark):
    from pyspark_test import assert_pyspark_df_equal

    actual = read(spark, data_dir("M_mirror")).orderBy("seq")
    assert_pyspark_df_equal(actual, expected_df(spark, "M_mirror").orderBy("seq"))


def test_schema(spark):
    df = spark.read.format("tank").load(data_dir("C_misc"))
    assert df.schema.simpleString() == (
        "struct<topic:string,partition:int,seq:bigint,ts:timestamp,key:binary,value:binary,ts_raw:decimal(20,0)>"
    )


def test_torn_active_tail_is_not_an_error(spark, fixture_copy):
    base = fixture_copy("B2_compaction_live")
    with open(os.path.join(base, "kvlive", "0", "7888_1795261097.log"), "ab") as fh:
        fh.write(b"\xc0\x05\x01\x02")  # an incomplete bundle: an append in flight
    assertDataFrameEqual(read(spark, base), expected_df(spark, "B2_compaction_live"))


def test_options_prune_and_filter(spark):
    base = data_dir("A_multi")
    assertDataFrameEqual(
        read(spark, base, topics="seqgap,small", min_seq=2000, max_seq=4000),
        expected_df(spark, "A_multi", lambda r: r[0] in ("seqgap", "small") and 2000 <= r[2] <= 4000),
    )
    assertDataFrameEqual(
        read(spark, base, topics="events", partitions="1", include_active="false"),
        expected_df(spark, "A_multi", lambda r: r[:2] == ("events", 1) and r[2] < 7377),
    )
    lo, hi = 1760000000500, 1760000002000
    assertDataFrameEqual(
        read(spark, base, min_ts=lo, max_ts="2025-10-09T08:53:22+00:00"),
        expected_df(spark, "A_multi", lambda r: lo <= r[3] <= hi),
    )


def test_pruning_skips_segments_and_seeks():
    base = data_dir("A_multi")
    every = plan_ranges([base], Bounds(), True, 64 << 20)
    some = plan_ranges([base], Bounds(topics={"small"}, min_seq=300, max_seq=330), True, 64 << 20)
    assert len(every) == 45
    assert [(r.base, r.start > 0) for r in some] == [(213, True), (322, False)]  # seek inside 213-321 by index


def test_large_segments_split_at_index_entries(spark):
    base = data_dir("B_after")
    ranges = plan_ranges([base], Bounds(), True, 16 << 10)
    assert len(ranges) > 10 and all(r.start == 0 or r.stop is None or r.start < r.stop for r in ranges)
    assertDataFrameEqual(read(spark, base, split_bytes=16 << 10), expected_df(spark, "B_after"))


def test_repeated_queries_on_one_dataframe(spark):
    df = read(spark, data_dir("A_multi"))
    assert df.count() == 17537
    assert df.filter("topic = 'seqgap' and seq >= 3000 and seq < 3100").count() == 13
    assert df.count() == 17537


def test_where_pushdown_is_refused_not_wrong(spark):
    """With pushdown=true, a count filtered on a partition and then a plain count of the same DataFrame both returned
    the filtered count (Spark reused the scan the filtered query planned). The option is refused, naming the options
    that prune exactly; WHERE clauses are evaluated by Spark and counts are right."""
    base = data_dir("A_multi")
    with pytest.raises(Exception, match="option pushdown=true is refused"):
        read(spark, base, pushdown="true").filter("partition = 2").count()
    df = read(spark, base)
    assert df.filter("partition = 2").count() == 5685
    assert df.count() == 17537
    df = read(spark, base, topics="events", partitions="2")
    assert df.count() == 5685


def test_missing_path_is_a_clear_error(spark):
    with pytest.raises(Exception, match="base path not found"):
        spark.read.format("tank").load("/nonexistent/tank").count()


def test_timestamps_out_of_range_are_null_with_the_raw_value(spark, tmp_path):
    """A u64 ts beyond 9999-12-31 never wraps: ts is null and ts_raw holds the exact value."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition
    from tank_spark.schema import MAX_TS_MS

    stamps = [1, MAX_TS_MS, MAX_TS_MS + 1, 2**62, 2**64 - 1]
    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    write_partition(pdir, [Message(i + 1, ts, None, b"v") for i, ts in enumerate(stamps)])
    rows = spark.read.format("tank").load(str(tmp_path)).orderBy("seq").collect()
    assert [r["ts_raw"] for r in rows] == [None, None, MAX_TS_MS + 1, 2**62, 2**64 - 1]
    assert [r["ts"] is None for r in rows] == [False, False, True, True, True]
    assert rows[1]["ts"].year == 9999
    millis = spark.read.format("tank").load(str(tmp_path)).orderBy("seq").select(F.unix_millis("ts")).collect()
    assert [m[0] for m in millis] == [1, MAX_TS_MS, None, None, None]


def _cut_without_index(base):
    """events/1's RO segment 2829-4682 without its index and with its second bundle cut out: the bundles after it
    decode with seqs 16 lower than the broker gave them."""
    from tank_log.storage.segment import Segment

    pdir = os.path.join(base, "events", "1")
    path = os.path.join(pdir, "2829-4682_1795261032.ilog")
    os.unlink(os.path.join(pdir, "2829.index"))
    data, h = open(path, "rb").read(), list(Segment(path).bundles())[1]
    with open(path, "wb") as fh:
        fh.write(data[: h.offset] + data[h.offset + h.size :])
    return path


@pytest.mark.parametrize("max_seq", [3000, 4000, 4681])
def test_a_bounded_read_checks_the_rest_of_its_segment(fixture_copy, max_seq):
    """A read stopped by `max_seq` skipped the end check, so renumbered rows came out without an error. The rest of
    the segment is now walked, headers only, and the cut is a hole; a bound below the segment reads as before."""
    from tank_log.storage.completeness import HoleError
    from tank_spark.ranges import read_range

    base = fixture_copy("A_multi")
    path = _cut_without_index(base)
    ranges = plan_ranges([base], Bounds(topics={"events"}, partitions={1}, max_seq=max_seq), False, 1 << 30)
    with pytest.raises(HoleError, match=r"seqs 2829\.\.4682 not read \(\[name-last\]") as err:
        for r in ranges:
            list(read_range(r))
    assert err.value.path == path
    below = plan_ranges([base], Bounds(topics={"events"}, partitions={1}, max_seq=2828), False, 1 << 30)
    seqs = [s for r in below for b in read_range(r) for s in b.column("seq").to_pylist()]
    assert seqs == list(range(1, 2829))


def test_a_bounded_spark_read_fails_on_a_cut_bundle(spark, fixture_copy):
    base = fixture_copy("A_multi")
    _cut_without_index(base)
    with pytest.raises(Exception, match=r"seqs 2829\.\.4682 not read"):
        read(spark, base, topics="events", partitions="1", max_seq=4000).count()
