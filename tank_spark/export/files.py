"""Executors write Parquet files under the table and return their metadata (path, size, partition values, Delta
statistics, per-partition counts) for the driver's commit."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa

from tank_log.lakehouse import TableLocation
from tank_log.lakehouse.partitioning import partition_keys, partition_names
from tank_spark.export.plan import ExportSettings
from tank_spark.export.rows import table_batches
from tank_spark.export.run_id import file_name
from tank_spark.ranges import parse_partition_key, partition_key
from tank_spark.schema import TS_RAW
from tank_spark.tasks import Workers, map_dealt

if TYPE_CHECKING:
    from tank_spark.export.corruption import RangeOutcome
    from tank_spark.ranges import SegmentRange

FileWriter = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""mapInArrow's function: row batches in, a batch of the written files' metadata (`FILE_META_SCHEMA`) per file out."""

FILE_META_SCHEMA = (
    "path string, size long, partition_values string, num_records long, stats string, "
    "modification_time long, counts string"
)


NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # the directory of a null partition value (Delta/Hive convention)


ROW_GROUP_BYTES = 32 << 20  # rows (in memory) per Parquet row group: each goes out while later rows decode


def make_file_writer(
    location: TableLocation, schema: pa.Schema, partition_by: tuple[str, ...], target_bytes: int, run_id: str
) -> FileWriter:
    """mapInArrow function: write each task's rows as Parquet files under the table (any filesystem of
    `location`), return their metadata. A file is written a row group at a time as its rows arrive (an object
    store uploads its parts meanwhile) and closed at `target_bytes` of rows."""
    names = partition_names(partition_by)  # the directories' (a transform's: `ts_day`), in the spec's order
    n = itertools.count()  # numbers the task's files: each Spark task gets its own copy of this function (called once
    # per range, or once by mapInArrow); in the driver, threads share it (`tasks.in_threads`: `next` is atomic)

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        open_files: dict[tuple[str | None, ...], _ParquetFile] = {}

        def new_file(key: tuple[str | None, ...]) -> _ParquetFile:
            values = dict(zip(names, key, strict=True))
            rel_dir = "/".join(
                f"{c}={NULL_PARTITION if v is None else quote(str(v), safe='')}" for c, v in values.items()
            )
            name = file_name(run_id, task, next(n))
            return _ParquetFile(location, f"{rel_dir}/{name}" if rel_dir else name, values, schema)

        out = []
        try:
            for batch in batches:
                batch = batch.select(schema.names).cast(schema)
                if not batch.num_rows:
                    continue
                # a transform's values: columns of `keyed` (a bucket: the format's)
                keyed, columns = partition_keys(batch, partition_by, location.format)
                for key, rows in group_rows(keyed, columns):
                    if key not in open_files:
                        open_files[key] = new_file(key)
                    f = open_files[key]
                    f.add(batch if rows is None else batch.take(rows))
                    if f.bytes_in >= target_bytes:
                        out.append(open_files.pop(key).close())
            while open_files:
                out.append(open_files.popitem()[1].close())
        finally:
            for f in open_files.values():  # a failed task: its files are never committed (orphans, removed later)
                f.abandon()
        if out:
            yield pa.RecordBatch.from_pylist(out)

    return write


class _ParquetFile:
    """One Parquet file being written: rows are buffered up to ROW_GROUP_BYTES, then written as a row group; its
    Delta statistics and per-partition counts are summed over the row groups."""

    def __init__(self, location: TableLocation, rel: str, values: dict[str, Any], schema: pa.Schema):
        self.location, self.rel, self.values = location, rel, values
        # held by the directory names (a generated partition column only there: not a column of `schema`)
        self.dropped = [] if location.partition_columns_in_files else [c for c in values if c in schema.names]
        self.data_schema = pa.schema([f for f in schema if f.name not in self.dropped])
        self.writer: Any = None
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0
        self.bytes_in = 0  # rows added, in memory
        self.stats = FileStats()
        self.counts: dict[str, list[Any]] = {}

    def add(self, part: pa.RecordBatch) -> None:
        self.pending.append(part)
        self.pending_bytes += part.nbytes
        self.bytes_in += part.nbytes
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._write_group()

    def _write_group(self) -> None:
        table = pa.Table.from_batches(self.pending)
        self.pending, self.pending_bytes = [], 0
        merge_counts(self.counts, partition_counts(table))
        data = table.drop_columns(self.dropped)
        self.stats.add(data)
        if self.writer is None:
            self.writer = self.location.open_parquet(self.rel, self.data_schema)
        self.writer.write_table(data, row_group_size=data.num_rows)

    def close(self) -> dict[str, Any]:
        if self.pending or self.writer is None:
            self._write_group()
        self.writer.close()
        return {
            "path": self.rel,
            "size": self.location.size(self.rel),
            "partition_values": json.dumps({c: None if v is None else str(v) for c, v in self.values.items()}),
            "num_records": self.stats.rows,
            "stats": json.dumps(self.stats.to_dict()),
            "modification_time": int(time.time() * 1000),
            "counts": json.dumps(self.counts),
        }

    def abandon(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()


@dataclass
class Written:
    """What `write_direct` wrote: the table's files and the dead letters' (each with the `range` it came from),
    each range's outcome (a malformed chunk stops that range, not the run) and, for typed values, each range's bad
    values (`dead_letters.BadRecords.summary`)."""

    files: list[dict[str, Any]]
    outcomes: list[RangeOutcome]
    dead_files: list[dict[str, Any]]
    bad: list[dict[str, Any]]


def write_direct(
    workers: Workers,
    ranges: Sequence[SegmentRange],
    settings: ExportSettings,
    schema: pa.Schema,
    run_id: str,
    dead_after: dict[tuple[str, int], int | None] | None = None,
    table_files: bool = True,
) -> Written:
    """Read, decode and write Parquet files per range (a few Spark tasks per core, `tasks.deal`, or the driver's
    threads: `workers`). Typed values decode in bulk per batch; the bad ones go by `on_bad_record`: with
    `dead_letter`, into files of the dead-letter table, except those at or below `dead_after` of their partition
    (that table's recorded versions: they are there already). Without `table_files` (engine spark, whose writer
    writes the table's rows) the good rows are decoded and dropped: only the dead letters' files are written."""
    from tank_spark.export.corruption import TrackedRead

    writer = make_file_writer(settings.location, schema, settings.partition_by, settings.target_file_bytes, run_id)
    dead_writer = None
    if settings.typed and settings.on_bad_record == "dead_letter":
        from tank_spark.export.dead_letters import dead_letter_settings
        from tank_spark.export.schema import DEAD_LETTER_SCHEMA

        dead = dead_letter_settings(settings)
        dead_writer = make_file_writer(
            dead.location, DEAD_LETTER_SCHEMA, dead.partition_by, dead.target_file_bytes, run_id
        )
    after = dead_after or {}

    def task(it: Iterable[tuple[int, SegmentRange]]) -> Iterator[tuple[str, Any]]:
        from tank_spark.export.dead_letters import BadRecords
        from tank_spark.ranges import read_range

        for i, r in it:
            read = TrackedRead(i, r, read_range)
            if not settings.typed:
                for meta in writer(table_batches(read, settings, schema)):
                    for m in meta.to_pylist():
                        yield ("file", {**m, "range": i})
                yield ("outcome", read.outcome())
                continue
            bad = BadRecords(i, r.path, r.topic, r.partition, settings.on_bad_record, after.get((r.topic, r.partition)))
            good = bad.split(read, settings, schema)
            if table_files:
                for meta in writer(good):
                    for m in meta.to_pylist():
                        yield ("file", {**m, "range": i})
            else:
                for _ in good:  # decoded for its bad values only: Spark's writer writes the good rows
                    pass
            if bad.dead and dead_writer is not None:
                for meta in dead_writer(bad.dead):
                    for m in meta.to_pylist():
                        yield ("dead", {**m, "range": i})
            yield ("outcome", read.outcome())
            yield ("bad", bad.summary())

    out = map_dealt(workers, ranges, task)
    return Written(*([v for kind, v in out if kind == k] for k in ("file", "outcome", "dead", "bad")))


def group_rows(batch: pa.RecordBatch, columns: tuple[str, ...]) -> list[tuple[tuple[str | None, ...], pa.Array | None]]:
    """(partition values as strings — None for null —, row indices or None for all rows) per distinct value
    combination."""
    import numpy as np
    import pyarrow.compute as pc

    if not columns:
        return [((), None)]
    codes = np.zeros(batch.num_rows, dtype=np.int64)
    dictionaries = []
    for c in columns:
        enc = pc.dictionary_encode(batch.column(c))
        dictionaries.append(enc.dictionary.to_pylist())
        indices = pc.fill_null(enc.indices, len(enc.dictionary))  # null → the extra slot
        codes = codes * (len(enc.dictionary) + 1) + indices.to_numpy(zero_copy_only=False)
    uniq, inverse = np.unique(codes, return_inverse=True)
    rows_of: list[pa.Array | None]
    if len(uniq) == 1:
        rows_of = [None]
    else:
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
        rows_of = [pa.array(order[bounds[i] : bounds[i + 1]]) for i in range(len(uniq))]
    out: list[tuple[tuple[str | None, ...], pa.Array | None]] = []
    for i, code in enumerate(uniq.tolist()):
        key: list[str | None] = []
        for d in reversed(dictionaries):
            code, idx = divmod(code, len(d) + 1)
            key.append(None if idx == len(d) else str(d[idx]))
        out.append((tuple(reversed(key)), rows_of[i]))
    return out


STRING_STATS_CHARS = 32  # a string column's min/max are cut to this many characters, as Delta's writers cut them


class FileStats:
    """Delta per-file statistics, summed over a file's row groups: numRecords, min/max of numeric, timestamp, date and
    string columns (none for a column holding NaN), null counts.

    Strings get bounds too: a reader that prunes files by these statistics may take a column without bounds for one
    that matches nothing (delta-rs' dataset does, for a filter on `topic` or `source`). A long string's bounds are
    cut as Delta's writers cut them: the min to its prefix, the max to its prefix with the last character raised
    (`string_bounds`)."""

    def __init__(self) -> None:
        self.rows = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}
        self.types: dict[str, pa.DataType] = {}
        self.no_bounds: set[str] = set()

    def add(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += table.num_rows
        for name, col in zip(table.column_names, table.columns, strict=True):
            t = self.types.setdefault(name, col.type)
            if pa.types.is_nested(t):  # typed values' structs, lists, maps: no statistics (Delta nests a struct's)
                continue
            self.nulls[name] = self.nulls.get(name, 0) + col.null_count
            if not (
                pa.types.is_integer(t)
                or pa.types.is_floating(t)
                or pa.types.is_timestamp(t)
                or pa.types.is_date(t)
                or pa.types.is_string(t)
                or pa.types.is_large_string(t)
            ) or col.null_count == len(col):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if pa.types.is_floating(t) and any(isinstance(v, float) and v != v for v in (lo, hi)):
                self.no_bounds.add(name)
                continue
            self.mins[name] = lo if name not in self.mins else min(self.mins[name], lo)
            self.maxs[name] = hi if name not in self.maxs else max(self.maxs[name], hi)

    def to_dict(self) -> dict[str, Any]:
        mins, maxs = {}, {}
        for name, lo in self.mins.items():
            if name in self.no_bounds:
                continue
            hi, t = self.maxs[name], self.types[name]
            if pa.types.is_timestamp(t):
                lo, hi = (
                    v.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z") for v in (lo, hi)
                )
            elif pa.types.is_date(t):
                lo, hi = lo.isoformat(), hi.isoformat()
            elif isinstance(lo, str):
                bounds = string_bounds(lo, hi)
                if bounds is None:
                    continue
                lo, hi = bounds
            mins[name], maxs[name] = lo, hi
        return {"numRecords": self.rows, "minValues": mins, "maxValues": maxs, "nullCount": self.nulls}


def string_bounds(lo: str, hi: str) -> tuple[str, str] | None:
    """A string column's (min, max) as statistics: each at most `STRING_STATS_CHARS` characters, the min a prefix of
    the least value (never above it), the max the greatest value's prefix with its last raisable character raised
    (never below it); None when no such max exists (every character of the prefix is the highest code point)."""
    n = STRING_STATS_CHARS
    if len(hi) <= n:
        return lo[:n], hi
    prefix = hi[:n]
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters: step over them
            code = 0xE000
        if code <= 0x10FFFF:
            return lo[:n], prefix[:i] + chr(code)
    return None


@dataclass
class WrittenCounts:
    """What files hold of one TANK partition (summed over files; `bytes` counts each file holding it whole)."""

    rows: int = 0
    quarantined: int = 0
    first_row_seq: int | None = None
    last_row_seq: int | None = None
    files: int = 0
    bytes: int = 0

    def add(self, other: WrittenCounts) -> None:
        self.rows += other.rows
        self.quarantined += other.quarantined
        firsts = [s for s in (self.first_row_seq, other.first_row_seq) if s is not None]
        lasts = [s for s in (self.last_row_seq, other.last_row_seq) if s is not None]
        self.first_row_seq = min(firsts) if firsts else None
        self.last_row_seq = max(lasts) if lasts else None
        self.files += other.files
        self.bytes += other.bytes


def count_files(files: list[dict[str, Any]]) -> dict[tuple[str, int], WrittenCounts]:
    """Per TANK partition, what the written files (their metadata, FILE_META_SCHEMA) hold."""
    out: dict[tuple[str, int], WrittenCounts] = {}
    for f in files:
        for key, (rows, lo, hi, bad) in json.loads(f["counts"]).items():
            c = WrittenCounts(rows, bad, lo, hi, 1, f["size"])
            out.setdefault(parse_partition_key(key), WrittenCounts()).add(c)
    return out


def merge_counts(into: dict[str, list[Any]], more: dict[str, list[Any]]) -> None:
    """Add one row group's `partition_counts` to a file's."""
    for key, (n, lo, hi, e) in more.items():
        if key in into:
            a = into[key]
            into[key] = [a[0] + n, min(a[1], lo), max(a[2], hi), a[3] + e]
        else:
            into[key] = [n, lo, hi, e]


def partition_counts(table: pa.Table) -> dict[str, Any]:
    """Per TANK partition in a file: [rows, min seq, max seq, decode errors] (for the run report)."""
    aggs = [("seq", "count"), ("seq", "min"), ("seq", "max")]
    for quarantine in ("decode_error", TS_RAW.name):
        if quarantine in table.column_names:
            aggs.append((quarantine, "count"))  # counts non-null values: the rows with an error / a ts out of range
    g = table.group_by(["topic", "partition"]).aggregate(aggs).to_pydict()
    zeros = [0] * len(g["topic"])
    decode_errors, ts_out = g.get("decode_error_count", zeros), g.get(f"{TS_RAW.name}_count", zeros)
    errors = [a + b for a, b in zip(decode_errors, ts_out, strict=True)]
    return {
        partition_key(t, p): [n, lo, hi, e]
        for t, p, n, lo, hi, e in zip(
            g["topic"], g["partition"], g["seq_count"], g["seq_min"], g["seq_max"], errors, strict=True
        )
    }
