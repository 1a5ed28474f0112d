"""Executors write Parquet files under the table and return their metadata (path, size, partition values, Delta
statistics, per-partition counts) for the driver's commit."""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from urllib.parse import quote

import pyarrow as pa

from tank_spark.export.location import TableLocation
from tank_spark.export.plan import ExportSettings
from tank_spark.export.rows import table_batches
from tank_spark.export.run_id import file_name
from tank_spark.ranges import parse_partition_key, partition_key
from tank_spark.schema import TS_RAW
from tank_spark.tasks import map_dealt

FILE_META_SCHEMA = (
    "path string, size long, partition_values string, num_records long, stats string, "
    "modification_time long, counts string"
)


NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # the directory of a null partition value (Delta/Hive convention)


def make_file_writer(
    location: TableLocation, schema: pa.Schema, partition_by: tuple[str, ...], target_bytes: int, run_id: str
):
    """mapInArrow function: write each task's rows as Parquet files under the table (any filesystem of
    `location`), return their metadata."""
    n = [0]  # the task's files so far: each task gets its own copy of this function, called once per range or once

    def write(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        pending: dict[tuple, list[pa.RecordBatch]] = {}
        sizes: dict[tuple, int] = {}

        def flush(key):
            table = pa.Table.from_batches(pending.pop(key))
            sizes.pop(key)
            values = dict(zip(partition_by, key, strict=True))
            rel_dir = "/".join(
                f"{c}={NULL_PARTITION if v is None else quote(str(v), safe='')}" for c, v in values.items()
            )
            name = file_name(run_id, task, n[0])
            n[0] += 1
            rel = f"{rel_dir}/{name}" if rel_dir else name
            data = table.drop_columns(list(partition_by))
            return {
                "path": rel,
                "size": location.write_parquet(rel, data),
                "partition_values": json.dumps({c: None if v is None else str(v) for c, v in values.items()}),
                "num_records": table.num_rows,
                "stats": json.dumps(file_stats(data)),
                "modification_time": int(time.time() * 1000),
                "counts": json.dumps(partition_counts(table)),
            }

        out = []
        for batch in batches:
            batch = batch.select(schema.names).cast(schema)
            if not batch.num_rows:
                continue
            for key, rows in group_rows(batch, partition_by):
                part = batch if rows is None else batch.take(rows)
                pending.setdefault(key, []).append(part)
                sizes[key] = sizes.get(key, 0) + part.nbytes
                if sizes[key] >= target_bytes:
                    out.append(flush(key))
        for key in list(pending):
            out.append(flush(key))
        if out:
            yield pa.RecordBatch.from_pylist(out)

    return write


def write_direct(spark, ranges, settings: ExportSettings, schema: pa.Schema, run_id: str):
    """Read, decode and write Parquet files per range (a few Spark tasks per core, `tasks.deal`; in this process when
    `spark` is None). Returns the files' metadata (each with the `range` it came from) and each range's outcome (a
    malformed chunk stops that range, not the run)."""
    from tank_spark.export.corruption import TrackedRead

    writer = make_file_writer(settings.location, schema, settings.partition_by, settings.target_file_bytes, run_id)

    def task(it):
        from tank_spark.ranges import read_range

        for i, r in it:
            read = TrackedRead(i, r, read_range)
            for meta in writer(table_batches(read, settings, schema)):
                for m in meta.to_pylist():
                    yield ("file", {**m, "range": i})
            yield ("outcome", read.outcome())

    out = map_dealt(spark and spark.sparkContext, ranges, task)
    return [v for kind, v in out if kind == "file"], [v for kind, v in out if kind == "outcome"]


def group_rows(batch: pa.RecordBatch, columns: tuple[str, ...]):
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
    if len(uniq) == 1:
        rows_of = [None]
    else:
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
        rows_of = [pa.array(order[bounds[i] : bounds[i + 1]]) for i in range(len(uniq))]
    out = []
    for i, code in enumerate(uniq.tolist()):
        key = []
        for d in reversed(dictionaries):
            code, idx = divmod(code, len(d) + 1)
            key.append(None if idx == len(d) else str(d[idx]))
        out.append((tuple(reversed(key)), rows_of[i]))
    return out


def file_stats(table: pa.Table) -> dict:
    """Delta per-file statistics: numRecords, min/max of numeric and timestamp columns, null counts."""
    import pyarrow.compute as pc

    mins, maxs, nulls = {}, {}, {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        nulls[name] = col.null_count
        t = col.type
        if not (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)
        ) or col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if pa.types.is_timestamp(t):
            lo, hi = (v.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z") for v in (lo, hi))
        elif pa.types.is_date(t):
            lo, hi = lo.isoformat(), hi.isoformat()
        elif pa.types.is_floating(t) and any(isinstance(v, float) and v != v for v in (lo, hi)):
            continue
        mins[name], maxs[name] = lo, hi
    return {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


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


def count_files(files: list[dict]) -> dict[tuple[str, int], WrittenCounts]:
    """Per TANK partition, what the written files (their metadata, FILE_META_SCHEMA) hold."""
    out: dict[tuple[str, int], WrittenCounts] = {}
    for f in files:
        for key, (rows, lo, hi, bad) in json.loads(f["counts"]).items():
            c = WrittenCounts(rows, bad, lo, hi, 1, f["size"])
            out.setdefault(parse_partition_key(key), WrittenCounts()).add(c)
    return out


def partition_counts(table: pa.Table) -> dict:
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
