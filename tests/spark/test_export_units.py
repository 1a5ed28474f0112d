"""Export helpers that run on executors, tested without Spark."""

import datetime as dt
import json

import pyarrow as pa
import pytest
from conftest import data_dir, load_dump

from tank_spark.export.files import FileStats, group_rows
from tank_spark.export.plan import ExportSettings
from tank_spark.export.rows import table_batches
from tank_spark.export.rows import utf8_with_errors as _utf8
from tank_spark.export.schema import table_schema
from tank_spark.ranges import Bounds, plan_ranges, read_range


def whole_file_stats(table: pa.Table) -> dict:
    """Delta statistics of `table` taken as one row group."""
    stats = FileStats()
    stats.add(table)
    return stats.to_dict()


def write_file(location, rel: str, table: pa.Table) -> int:
    """`table` as a Parquet file at `rel` under the table (not committed); its size."""
    with location.open_parquet(rel, table.schema) as writer:
        writer.write_table(table)
    return location.size(rel)


def test_utf8_decoding_quarantines_invalid_rows():
    text, err = _utf8(pa.array([b"ok", b"\xff\xfe", b"", "é".encode()], pa.binary()))
    assert text.to_pylist() == ["ok", None, "", "é"]
    assert err.to_pylist() == [None, "invalid UTF-8", None, None]


def test_table_batches_from_segment_ranges():
    settings = ExportSettings("t", "deltalake", "utf8", None, ("topic", "date"), 1 << 20)
    schema = table_schema(settings)
    ranges = plan_ranges([data_dir("C_misc")], Bounds(seq_ranges={("bigmsg", 0): (2, None)}), True, 1 << 20)
    row_batches = (b for r in ranges for b in read_range(r))
    rows = [r for b in table_batches(row_batches, settings, schema) for r in b.to_pylist()]
    dump = [m for m in load_dump("C_misc")[("bigmsg", 0)] if m[0] >= 2]
    assert [r["seq"] for r in rows] == [m[0] for m in dump]
    for r, (_, ts, _, value) in zip(rows, dump, strict=True):
        assert r["date"] == dt.datetime.fromtimestamp(ts / 1000, dt.UTC).date()
        try:
            assert r["value"] == value.decode() and r["decode_error"] is None and r["raw_value"] is None
        except UnicodeDecodeError:
            assert r["value"] is None and r["decode_error"] == "invalid UTF-8" and r["raw_value"] == value


def test_group_rows_and_stats():
    b = pa.RecordBatch.from_pydict(
        {"topic": ["a", "b", "a"], "seq": [3, 1, 2], "ts": pa.array([1000, 2000, 3000], pa.timestamp("us", tz="UTC"))}
    )
    groups = {k: (None if r is None else r.to_pylist()) for k, r in group_rows(b, ("topic",))}
    assert groups == {("a",): [0, 2], ("b",): [1]}
    stats = whole_file_stats(pa.Table.from_batches([b]))
    assert stats["numRecords"] == 3 and stats["minValues"]["seq"] == 1 and stats["maxValues"]["seq"] == 3
    assert stats["minValues"]["ts"] == "1970-01-01T00:00:00.001Z" and stats["nullCount"]["topic"] == 0


def test_spark_ts_never_wraps():
    import numpy as np

    from tank_spark.ranges import spark_ts
    from tank_spark.schema import MAX_TS_MS

    ts, raw = spark_ts(np.array([0, MAX_TS_MS, MAX_TS_MS + 1, 2**63 // 1000, 2**64 - 1], dtype=np.uint64))
    assert pa.compute.cast(ts, pa.int64()).to_pylist() == [0, MAX_TS_MS * 1000, None, None, None]
    assert raw.to_pylist() == [None, None, MAX_TS_MS + 1, 2**63 // 1000, 2**64 - 1]
    ts, raw = spark_ts(np.array([5], dtype=np.uint64))
    assert ts.to_pylist()[0] == dt.datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=dt.UTC) and raw.null_count == 1


def test_cut_at_corruption_keeps_a_contiguous_prefix_or_nothing():
    from tank_spark.export.corruption import RangeOutcome, cut_at_corruption
    from tank_spark.export.plan import PartitionPlan

    plans = [PartitionPlan("b", "t", 0, "a0", 10, 100), PartitionPlan("b", "t", 1, "a1", None, 50)]
    outcomes = [
        RangeOutcome(0, "t", 0, 20, 11, 30),
        RangeOutcome(1, "t", 0, 5, 31, 40, "seg @7: bad"),  # stopped after seq 40
        RangeOutcome(2, "t", 0, 60, 41, 100),  # after the corruption: never committed
        RangeOutcome(3, "t", 1, 50, 1, 50),
    ]
    cut = cut_at_corruption(plans, outcomes, "prefix")
    assert cut.kept == {0, 1, 3}
    assert [(p.partition, p.end) for p in cut.plans] == [(0, 40), (1, 50)]
    assert cut.failures[("t", 0)]["exported_to_seq"] == 40 and cut.failures[("t", 0)]["error"] == "seg @7: bad"
    cut = cut_at_corruption(plans, outcomes, "skip")
    assert cut.kept == {3} and not cut.plans[0].has_work and cut.plans[0].previous == 10
    first_range_bad = [RangeOutcome(0, "t", 0, 0, None, None, "seg @0: bad"), *outcomes[2:]]
    cut = cut_at_corruption(plans, first_range_bad, "prefix")  # nothing before the corruption: nothing to commit
    assert cut.kept == {0, 3} and not cut.plans[0].has_work and cut.failures[("t", 0)]["exported_to_seq"] is None


def test_a_seq_beyond_spark_long_is_a_typed_error_with_file_and_offset(tmp_path):
    """A u64 seq ≥ 2**63 (valid TANK, §3.6) failed reads with ArrowInvalid from a cast."""
    import pytest

    from tank_log.errors import TankFormatError, UnrepresentableData
    from tank_log.format.bundle import Message, encode_bundle, frame

    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    huge = (1 << 63) + 5
    b1 = frame(encode_bundle([Message(1, 1, b"a", b"v"), Message(2, 1, b"b", b"v")], sparse=False))
    b2 = frame(encode_bundle([Message(huge, 2, b"c", b"v")], sparse=True))
    (pdir / f"1-{huge}_1795000000.ilog").write_bytes(b1 + b2)
    (ranges,) = [r for r in plan_ranges([str(tmp_path)], Bounds(), True, 1 << 20) if r.path]
    with pytest.raises(UnrepresentableData) as err:
        list(read_range(ranges))
    assert err.value.path == ranges.path and err.value.offset == len(b1)
    stopped: list[TankFormatError] = []
    assert sum(b.num_rows for b in read_range(ranges, stopped)) <= 2 and len(stopped) == 1


def test_planning_reports_a_segment_whose_index_contradicts_its_data(tmp_path):
    """The data source and the export read from index entries; a contradicting segment is an error of
    that segment (file and offset), not rows numbered differently from a full scan."""
    import pytest

    from tank_log.errors import TankFormatError
    from tank_log.format.bundle import Message
    from tank_log.format.index import encode_index, read_index
    from tank_log.storage.writer import BundlePolicy, write_segment

    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    msgs = [Message(s, 1_700_000_000_000, b"k", b"v" * 50) for s in range(1, 62)]
    w = write_segment(pdir, msgs, ts=1795000000, policy=BundlePolicy(max_messages=1), index_interval=0)
    index = str(pdir / "1.index")
    entries = read_index(index)
    entries[30] = (entries[30][0] - 1, entries[30][1])
    with open(index, "wb") as fh:
        fh.write(encode_index(entries))
    (r,) = [r for r in plan_ranges([str(tmp_path)], Bounds(min_seq=40), True, 1 << 20) if r.path]
    with pytest.raises(TankFormatError, match="index entry") as err:
        list(read_range(r))
    assert err.value.path == index and err.value.offset == entries[30][1] and w.messages == 61


def test_s3_commits_never_overwrite_another_writers_log_entry(s3_server):
    """The commit mechanism the export relies on (delta-rs >= 1.0: a conditional PUT of each log entry, no
    locking provider): a writer behind the log never replaces a concurrent writer's entry, it commits after it."""
    import boto3
    import pyarrow as pa
    from conftest import _boto_credentials, new_bucket

    from tank_spark.export.location import TableLocation

    new_bucket(s3_server, "race")
    loc = TableLocation.of(
        "s3://race/t", {**s3_server["env"], "AWS_ENDPOINT_URL": s3_server["endpoint"], "AWS_ALLOW_HTTP": "true"}
    )
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema([("a", pa.int64())])
    write_deltalake(loc.uri, pa.table({"a": [1]}), storage_options=loc.options)
    behind = loc.open()  # at version 0
    other = {"commitInfo": {"timestamp": 1, "operation": "WRITE", "note": "the concurrent writer"}}
    client = boto3.client("s3", endpoint_url=s3_server["endpoint"], **_boto_credentials(s3_server))
    client.put_object(Bucket="race", Key="t/_delta_log/00000000000000000001.json", Body=json.dumps(other).encode())
    behind.create_write_transaction([], mode="append", schema=schema, partition_by=[])
    entry = client.get_object(Bucket="race", Key="t/_delta_log/00000000000000000001.json")["Body"].read()
    assert b"the concurrent writer" in entry  # kept
    assert DeltaTable(loc.uri, storage_options=loc.options).version() == 2  # ours came after it


def test_table_locations():
    from tank_spark.export.location import TableLocation

    assert TableLocation.of("file:///lake/t").uri == "/lake/t" and TableLocation.of("rel/t").is_local
    s3 = TableLocation.of("s3://b/p/t", {"aws_endpoint_url": "http://127.0.0.1:9000", "AWS_SECRET_ACCESS_KEY": "s"})
    assert not s3.is_local and s3.options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert str(s3) == "s3://b/p/t" and "AWS_SECRET" not in repr(s3)  # credentials never printed
    opts = s3._s3_options()
    assert opts["endpoint_override"] == "127.0.0.1:9000" and opts["scheme"] == "http" and opts["secret_key"] == "s"
    with pytest.raises(ValueError, match="unsupported scheme hdfs://"):
        TableLocation.of("hdfs://nn/t")


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    """An empty table location on a local path or on the loopback S3 server."""
    from tank_spark.export.location import TableLocation

    if request.param == "local":
        return TableLocation.of(str(tmp_path / "t"))
    from conftest import new_bucket

    s3 = request.getfixturevalue("s3_server")
    bucket = f"orphans-{abs(hash(str(tmp_path))) % 10**8}"
    new_bucket(s3, bucket)
    return TableLocation.of(
        f"s3://{bucket}/t", {**s3["env"], "AWS_ENDPOINT_URL": s3["endpoint"], "AWS_ALLOW_HTTP": "true"}
    )


def test_the_orphan_sweep_removes_only_old_files_of_runs_that_never_committed(location):
    """Of the files under the table, only those named by a run that never committed, older than the
    horizon, go; committed runs (even files no longer in the snapshot), other writers' files and in-flight runs stay.
    A dry run removes nothing and reports the same."""
    import time

    from deltalake import CommitProperties, write_deltalake

    from tank_spark.export.orphans import sweep_orphans
    from tank_spark.export.run_id import COMMIT_KEY, file_name, new_run_id

    rows = pa.table({"seq": [1, 2, 3]})
    now = dt.datetime.now(dt.UTC)
    later_ms = int(now.timestamp() * 1000) + 3600_000  # sweep "an hour from now": every file is 1 h old
    committed = new_run_id(now - dt.timedelta(hours=3))
    crashed = new_run_id(now - dt.timedelta(hours=2))
    in_flight = new_run_id(now + dt.timedelta(minutes=59))  # started 1 min before the sweep
    write_deltalake(
        location.uri,
        rows,
        storage_options=location.options or None,
        commit_properties=CommitProperties(custom_metadata={COMMIT_KEY: committed}),
    )
    sizes = {
        rel: write_file(location, rel, rows)
        for rel in (
            file_name(committed, "00000-0", 0),  # e.g. removed from the snapshot by optimize: committed all the same
            f"topic=a/{file_name(crashed, '00000-0', 0)}",
            f"topic=b/{file_name(crashed, '00001-1', 3)}",
            file_name(in_flight, "00000-0", 0),
            "part-00000-0f0e0d0c-1111-2222-3333-444455556666-c000.snappy.parquet",  # another writer's name
        )
    }
    table = location.open()
    before = {f.rel for f in location.data_files()}
    dry = sweep_orphans(location, table, 30 * 60_000, dry_run=True, now_ms=later_ms)
    assert {f.rel for f in location.data_files()} == before
    swept = sweep_orphans(location, table, 30 * 60_000, now_ms=later_ms)
    gone = {rel for rel in sizes if crashed in rel}
    assert (swept.files, swept.bytes, swept.runs, swept.recent_files) == (2, sum(sizes[r] for r in gone), (crashed,), 1)
    assert (dry.files, dry.bytes, dry.runs, dry.dry_run) == (2, swept.bytes, (crashed,), True)
    assert {f.rel for f in location.data_files()} == before - gone
    assert location.open().to_pyarrow_table().num_rows == 3
    # the same sweep now: every file is younger than the horizon, nothing goes
    fresh = sweep_orphans(location, location.open(), 30 * 60_000, now_ms=int(time.time() * 1000))
    assert (fresh.files, fresh.recent_files) == (0, 1)


def test_the_orphan_sweep_leaves_runs_it_cannot_prove_uncommitted(tmp_path):
    """A table exported by an earlier version recorded another id in its commits: files of runs that started
    before that commit are left to vacuum."""
    from deltalake import CommitProperties, write_deltalake

    from tank_spark.export.location import TableLocation
    from tank_spark.export.orphans import sweep_orphans
    from tank_spark.export.run_id import COMMIT_KEY, file_name, new_run_id

    location = TableLocation.of(str(tmp_path / "t"))
    now = dt.datetime.now(dt.UTC)
    early = new_run_id(now - dt.timedelta(hours=2))
    write_deltalake(location.uri, pa.table({"seq": [1]}))
    write_file(location, file_name(early, "00000-0", 0), pa.table({"seq": [1]}))
    write_deltalake(
        location.uri,
        pa.table({"seq": [2]}),
        mode="append",
        commit_properties=CommitProperties(custom_metadata={COMMIT_KEY: "1a2b3c4d"}),  # the old, unrelated id
    )
    late = new_run_id(now + dt.timedelta(seconds=2))
    write_file(location, file_name(late, "00000-0", 0), pa.table({"seq": [3]}))
    swept = sweep_orphans(location, location.open(), 60_000, now_ms=int(now.timestamp() * 1000) + 3600_000)
    assert swept.runs == (late,)


def test_a_run_older_than_the_orphan_horizon_does_not_commit():
    from tank_spark.export.orphans import RunTooOld, check_run_age
    from tank_spark.export.run_id import new_run_id, started_ms

    run = new_run_id()
    check_run_age(run, 60_000, now_ms=started_ms(run) + 59_999)
    with pytest.raises(RunTooOld, match="longer than the orphan horizon"):
        check_run_age(run, 60_000, now_ms=started_ms(run) + 60_000)


def test_an_export_tasks_modules_do_not_load_the_job_config():
    """plan.py imports the config parsers on the driver only: tasks unpickle plan.py, and tank_log.jobs.config would
    load the compaction package into every Python worker (bench/RESULTS.md, "Spark's Python workers")."""
    import subprocess
    import sys

    code = (
        "import sys, tank_spark.export.files, tank_spark.export.corruption, tank_spark.ranges\n"
        "print(sorted(m for m in sys.modules if m == 'tank_log.jobs.config' or 'compaction' in m))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_a_file_is_written_a_row_group_at_a_time_with_the_statistics_of_the_whole(tmp_path, monkeypatch):
    """The task writes each file as its rows arrive (a row group per ROW_GROUP_BYTES, so an object store uploads
    while later rows decode); its rows, Delta statistics and per-partition counts are those of all its rows, and a
    file closes at the target size."""
    import json

    import numpy as np
    import pyarrow.parquet as pq

    from tank_spark.export import files
    from tank_spark.export.location import TableLocation

    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("score", pa.float64()),
            ("value", pa.binary()),
        ]
    )
    rng = np.random.default_rng(7)

    def batch(lo: int, n: int, partition: int) -> pa.RecordBatch:
        seq = np.arange(lo, lo + n)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(["t"] * n),
                pa.array([partition] * n, pa.int32()),
                pa.array(seq),
                pa.array(rng.integers(0, 2**40, n), pa.timestamp("us", tz="UTC")),
                pa.array([None if s % 7 == 0 else float(rng.normal()) for s in seq]),
                pa.array([b"v" * 100] * n),
            ],
            schema=schema,
        )

    batches = [batch(1 + i * 1000, 1000, i % 2) for i in range(12)]
    monkeypatch.setattr(files, "ROW_GROUP_BYTES", 150_000)  # ~1.2 batches per row group
    location = TableLocation.of(str(tmp_path / "table"))
    write = files.make_file_writer(location, schema, ("topic",), 700_000, "run1")
    metas = [m for out in write(iter(batches)) for m in out.to_pylist()]
    assert len(metas) == 2  # 12 batches of ~125 kB: a file closes past 700 kB
    got = [pq.read_table(tmp_path / "table" / m["path"]) for m in metas]
    assert all(pq.ParquetFile(tmp_path / "table" / m["path"]).num_row_groups > 2 for m in metas)
    rows_at = 0
    for m, table in zip(metas, got, strict=True):
        whole = pa.Table.from_batches(batches).slice(rows_at, table.num_rows)
        rows_at += table.num_rows
        assert table.equals(whole.drop_columns(["topic"]))
        assert json.loads(m["stats"]) == whole_file_stats(whole.drop_columns(["topic"]))
        assert json.loads(m["counts"]) == files.partition_counts(whole)
        assert m["num_records"] == table.num_rows and m["size"] == (tmp_path / "table" / m["path"]).stat().st_size
    assert rows_at == 12_000


def test_an_export_that_keeps_losing_its_commit_fails_in_one_line(caplog):
    """A batch export beside a continuous one on the same partitions loses the race to commit every time it
    re-plans; once its attempts are spent the run fails with the reason in one line (exit 1), not an internal
    error with a traceback (found by the fleet soak)."""
    from tank_spark.export.commit import ConcurrentExport
    from tank_spark.report import RunReport  # noqa: F401 (the runner's report module loads)
    from tank_spark.runner import _logged_failure

    err = ConcurrentExport("t/0: the table's recorded version moved from 7 to 9 since this run planned")
    with caplog.at_level("ERROR"):
        error = _logged_failure("export_delta", err)
    assert error == str(err) and "internal error" not in error
    assert not any(r.exc_info for r in caplog.records)


def test_other_rows_read_partition_values_a_file_does_not_hold(tmp_path):
    """A file of a table partitioned by topic and partition holds neither column: its rows are those of its
    partition values, and a file of another partition is never read for this one."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from tank_spark.export.other_writers import _may_hold, _rows_above

    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"seq": pa.array([5, 6, 7], pa.int64())}), path)
    fs = pafs.LocalFileSystem()
    wanted = {("a", 1): 5, ("a", 2): None, ("b", 1): None}
    assert _rows_above(fs, path, wanted, {"topic": "a", "partition": 1}) == {("a", 1): (6, 7, 2)}
    assert _rows_above(fs, path, wanted, {"topic": "a", "partition": 2}) == {("a", 2): (5, 7, 3)}
    assert _rows_above(fs, path, wanted, {"topic": "c", "partition": 1}) == {}
    add = {"partition.topic": "a", "partition.partition": 1, "max.seq": 7}
    assert _may_hold(add, "a", 1, 6) and not _may_hold(add, "a", 1, 7) and not _may_hold(add, "a", 2, None)


def test_string_bounds_hold_every_value_in_32_characters():
    from tank_spark.export.files import string_bounds

    assert string_bounds("events", "small") == ("events", "small")
    lo, hi = string_bounds("a" * 40, "é" * 40)
    assert lo == "a" * 32 and lo <= "a" * 40 and len(hi) == 32 and hi > "é" * 40 and hi == "é" * 31 + "ê"
    top = chr(0x10FFFF)
    assert string_bounds("a", "b" + top * 40) == ("a", "c")
    assert string_bounds("a", top * 40) is None
    assert string_bounds("a", "x" * 31 + chr(0xD7FF) + "y")[1] == "x" * 31 + chr(0xE000)


def test_a_table_without_partitions_filters_by_topic_and_source_in_delta_rs(tmp_path):
    """delta-rs' dataset prunes a file whose statistics give a filtered column no bounds: with string bounds in the
    statistics, a filter on `topic` or `source` of an unpartitioned table finds every row (it found none)."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from tank_spark.export.job import main

    table = str(tmp_path / "table")
    assert main(["--master", "local[1]", "--data-dir", data_dir("A_multi"), "--table", table, "--partition-by="]) == 0
    dataset = DeltaTable(table).to_pyarrow_dataset()
    assert dataset.to_table(filter=ds.field("topic") == "small").num_rows == 720
    source = dataset.to_table(columns=["source"])["source"][0].as_py()
    assert dataset.to_table(filter=ds.field("source") == source).num_rows == 17537


def test_a_table_whose_files_give_strings_no_bounds_is_read_whole(tmp_path):
    """Tables written before string bounds (or by writers that leave some columns without statistics): the import,
    the audit and our readers of the table filter by topic and still find every row, where delta-rs' dataset
    pruned them all and the import restored nothing with exit 0."""
    import glob

    from tank_spark.export.job import main as export
    from tank_spark.import_delta import main as import_table

    table = str(tmp_path / "table")
    assert export(["--master", "local[1]", "--data-dir", data_dir("A_multi"), "--table", table, "--partition-by="]) == 0
    for path in glob.glob(f"{table}/_delta_log/*.json"):  # the statistics as written before: no string bounds
        lines = []
        for line in open(path).read().splitlines():
            action = json.loads(line)
            if "add" in action and action["add"].get("stats"):
                stats = json.loads(action["add"]["stats"])
                for bound in ("minValues", "maxValues"):
                    for column in ("topic", "source"):
                        stats[bound].pop(column, None)
                action["add"]["stats"] = json.dumps(stats)
            lines.append(json.dumps(action))
        open(path, "w").write("\n".join(lines) + "\n")
    base = str(tmp_path / "restored")
    assert import_table(["--master", "local[1]", "--data-dir", base, "--table", table]) == 0
    from tank_log.tools.stats import stats_path

    counts = {(s.topic, s.partition): s.messages for s in stats_path(base)}
    assert counts[("small", 0)] == 720 and sum(counts.values()) == 17537
