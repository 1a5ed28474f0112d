"""The Delta export job: new messages of the selected topics → a Delta table, exactly once per (topic, partition).

Exactly-once, incremental: the last exported seq of every partition lives in the Delta table's own log as an
application transaction (app id from table + topic + partition, version = last exported seq). A run exports
seq (version, end] where `end` is fixed when the run is planned; executors write Parquet files into the table
directory; the driver commits all of them in ONE Delta transaction that also records every partition's new version.
A run that dies before the commit leaves only unreferenced files (invisible; `vacuum` removes them); the next run
exports the same messages once. A finished run re-run commits nothing. delta-rs does not skip an already-recorded
transaction version by itself, so the driver re-checks every version right before committing.

Engines: `deltalake` (delta-rs; default, no JVM jars) commits as above. `spark` (delta-spark) writes through
`df.write.format("delta")` with `txnAppId`/`txnVersion` per partition (one commit per partition: idempotent per
partition but not atomic across partitions); it needs Delta's jars on the Spark classpath (spark-submit
--packages io.delta:delta-spark_2.13:<version>), which are checked first with a clear error.

Table layout: partition columns (default `topic`, `date` — the UTC date of ts), target file size; values as
`binary` (default), `utf8`, or `json` with a schema (DDL) giving typed columns. Rows whose value cannot be decoded
are kept with the typed columns null, `decode_error` saying why and `raw_value` holding the bytes (a quarantine
column in the same atomic commit) — never dropped. Empty values (tombstones) decode to nulls without an error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from urllib.parse import quote

import pyarrow as pa

from tank_log.errors import JobConfigError
from tank_log.jobs.config import parse_partition_by, parse_size_arg
from tank_spark.runner import count_by, run_job

log = logging.getLogger(__name__)

BASE_COLUMNS = ["topic", "partition", "seq", "ts", "key"]
CRASH_ENV = "TANK_LOG_EXPORT_CRASH"  # test hook: "before-commit" → the driver dies after the files are written


def app_id(table: str, topic: str, partition: int) -> str:
    """Application transaction id of one partition in one table."""
    digest = hashlib.sha1(_table_key(table).encode()).hexdigest()[:12]
    return f"tank-log:{digest}:{topic}:{partition}"


def _table_key(table: str) -> str:
    return table if "://" in table else os.path.abspath(table)


@dataclass
class PartitionPlan:
    base_path: str
    topic: str
    partition: int
    app_id: str
    previous: int | None  # last exported seq recorded in the table (None: never exported)
    end: int | None  # last complete seq now (None: empty partition)

    @property
    def first(self) -> int:
        return (self.previous or 0) + 1

    @property
    def has_work(self) -> bool:
        return self.end is not None and self.end >= self.first


@dataclass(frozen=True)
class ExportSettings:
    table: str
    engine: str
    value_format: str
    value_schema: str | None
    partition_by: tuple[str, ...]
    target_file_bytes: int
    since_ms: int | None = None


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", help="the Delta table (path or URI)")
    p.add_argument("--engine", choices=("deltalake", "spark"), help="deltalake (delta-rs, default) or spark")
    p.add_argument("--value-format", choices=("binary", "utf8", "json"), help="how to store values (binary)")
    p.add_argument("--value-schema", metavar="DDL", help="with --value-format json: e.g. 'id long, name string'")
    p.add_argument("--partition-by", metavar="COLS", help="table partition columns (default topic,date)")
    p.add_argument("--target-file-size", metavar="SIZE", help="Parquet file size target, e.g. 128mb")
    p.add_argument(
        "--since",
        metavar="TIME",
        help="skip messages with ts before this (ISO date/time or ms); the recorded versions still advance past them",
    )


def prepare(ctx, args):
    """Flags over the `export` config section; then plan (before Spark starts, so bad input fails fast)."""
    cfg = ctx.config.export
    table = args.table or cfg.table
    if not table:
        raise JobConfigError("no Delta table: pass --table PATH or set export.table")
    engine = args.engine or cfg.engine
    fmt = args.value_format or cfg.value_format
    schema = args.value_schema or (cfg.value_schema if fmt == "json" else None)
    if fmt == "json" and not schema:
        raise JobConfigError("--value-format json needs --value-schema DDL (e.g. 'id long, name string')")
    if fmt != "json" and args.value_schema:
        raise JobConfigError("--value-schema is only for --value-format json")
    partition_by = (
        parse_partition_by(args.partition_by, "--partition-by") if args.partition_by is not None else cfg.partition_by
    )
    target = (
        parse_size_arg(args.target_file_size, "--target-file-size") if args.target_file_size else cfg.target_file_size
    )
    if "://" not in table and os.path.exists(table) and not os.path.isdir(table):
        raise JobConfigError(f"--table {table} exists and is not a directory")
    since = None
    if args.since:
        from tank_spark.source import parse_time_ms

        try:
            since = parse_time_ms(args.since)
        except ValueError:
            raise JobConfigError(f"--since {args.since!r}: expected an ISO date/time or ms since the epoch") from None
    settings = ExportSettings(table, engine, fmt, schema, partition_by, target, since)
    plans, delta_table = plan_export(ctx, settings)  # before Spark starts: unknown topics fail fast
    return settings, plans, delta_table


# ---- planning (driver) ------------------------------------------------------------------------------------------


def plan_export(ctx, settings: ExportSettings) -> tuple[list[PartitionPlan], object | None]:
    from deltalake import DeltaTable

    from tank_log.storage.datadir import last_complete_seq, scan_data_dir

    table = _open_table(settings.table)
    plans: list[PartitionPlan] = []
    seen: dict[tuple[str, int], str] = {}
    found_topics: set[str] = set()
    for base in ctx.data_dirs:
        for topic in scan_data_dir(base).topics:
            found_topics.add(topic.name)
            if ctx.topics is not None and topic.name not in ctx.topics:
                continue
            for part in topic.partitions:
                if part.key in seen:
                    raise JobConfigError(
                        f"{part.topic}/{part.id} exists in {seen[part.key]} and {base}: export one broker per table"
                    )
                seen[part.key] = base
                aid = app_id(settings.table, part.topic, part.id)
                previous = table.transaction_version(aid) if isinstance(table, DeltaTable) else None
                plans.append(PartitionPlan(base, part.topic, part.id, aid, previous, last_complete_seq(part)))
    if ctx.topics is not None:
        missing = sorted(ctx.topics - found_topics)
        if missing:
            raise JobConfigError(f"unknown topic(s): {', '.join(missing)} (not in {', '.join(ctx.data_dirs)})")
    return plans, table


def _open_table(table: str):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(table)
    except TableNotFoundError:
        return None


# ---- the rows to write ------------------------------------------------------------------------------------------


def table_schema(settings: ExportSettings, spark) -> pa.Schema:
    """The Arrow schema of the Delta table for these settings (partition columns included)."""
    fields = [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("seq", pa.int64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
    ]
    if settings.value_format == "binary":
        fields.append(pa.field("value", pa.binary()))
    elif settings.value_format == "utf8":
        fields.append(pa.field("value", pa.string()))
    else:
        fields += _json_fields(settings.value_schema, spark)
    if settings.value_format != "binary":
        fields += [pa.field("decode_error", pa.string()), pa.field("raw_value", pa.binary())]
    fields.append(pa.field("date", pa.date32()))
    return pa.schema(fields)


def _json_fields(ddl: str, spark) -> list[pa.Field]:
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    try:
        struct = StructType.fromDDL(ddl) if hasattr(StructType, "fromDDL") else spark.createDataFrame([], ddl).schema
    except Exception as err:
        raise JobConfigError(f"--value-schema {ddl!r}: {err}") from None
    reserved = set(BASE_COLUMNS) | {"date", "decode_error", "raw_value", "value"}
    clash = [f.name for f in struct.fields if f.name in reserved]
    if clash:
        raise JobConfigError(f"--value-schema: field(s) {', '.join(clash)} clash with the table's own columns")
    return [pa.field(f.name, to_arrow_type(f.dataType)) for f in struct.fields]


def decoded_frame(spark, ctx, settings: ExportSettings, plans: list[PartitionPlan]):
    """The DataFrame of rows to export, with the table's columns (decoded values, quarantine columns, date)."""
    from pyspark.sql import functions as F

    from tank_spark.source import format_seq_ranges, register

    register(spark)
    ranges = {(p.topic, p.partition): (p.first, p.end) for p in plans if p.has_work}
    df = spark.read.format("tank").option("seq_ranges", format_seq_ranges(ranges)).load(",".join(ctx.data_dirs))
    cols = [F.col(c) for c in BASE_COLUMNS]
    if settings.value_format == "binary":
        cols.append(F.col("value"))
    else:
        valid = F.is_valid_utf8("value")
        text = F.when(valid, F.col("value").cast("string"))
        if settings.value_format == "utf8":
            error = F.when(~valid, F.lit("invalid UTF-8"))
            cols.append(F.when(error.isNull(), text).alias("value"))
        else:
            ddl = settings.value_schema + ", _corrupt_record string"
            parsed = F.from_json(text, ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
            df = df.withColumn("_parsed", parsed)
            empty = F.length("value") == 0  # a tombstone or empty message: nulls, not an error
            error = F.when(~valid, F.lit("invalid UTF-8")).when(
                ~empty & (F.col("_parsed").isNull() | F.col("_parsed._corrupt_record").isNotNull()),
                F.lit("not valid JSON for the value schema"),
            )
            for f in _json_fields(settings.value_schema, spark):
                cols.append(F.when(error.isNull(), F.col(f"_parsed.`{f.name}`")).alias(f.name))
        cols += [error.alias("decode_error"), F.when(error.isNotNull(), F.col("value")).alias("raw_value")]
    cols.append(F.to_date(F.col("ts")).alias("date"))
    return df.select(*cols)


# ---- executors: rows without Spark SQL (binary, utf8) -------------------------------------------------------------


def direct_ranges(ctx, settings: ExportSettings, plans: list[PartitionPlan]):
    """Read tasks (segment ranges, TANK_FORMAT.md §4.4) covering every partition's (previous, end] range."""
    from tank_spark.source import DEFAULT_SPLIT_BYTES, Bounds, plan_ranges

    bounds = Bounds(
        seq_ranges={(p.topic, p.partition): (p.first, p.end) for p in plans if p.has_work}, min_ts=settings.since_ms
    )
    return [r for r in plan_ranges(list(ctx.data_dirs), bounds, True, DEFAULT_SPLIT_BYTES) if r.path]


def table_batches(ranges, settings: ExportSettings, schema: pa.Schema):
    """Batches of the table's schema for binary/utf8 values, straight from the segment files (executor side)."""
    import pyarrow.compute as pc

    from tank_spark.source import read_range

    for r in ranges:
        for b in read_range(r):
            cols = [b.column(c) for c in BASE_COLUMNS]
            value = b.column("value")
            if settings.value_format == "binary":
                cols.append(value)
            else:
                text, error = _utf8(value)
                cols += [text, error, pc.if_else(pc.is_null(error), pa.nulls(len(value), pa.binary()), value)]
            cols.append(pc.cast(pc.cast(b.column("ts"), pa.timestamp("us")), pa.date32()))  # the UTC date
            yield pa.RecordBatch.from_arrays(cols, schema=schema)


def _utf8(value: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(text, decode_error) of binary values; invalid UTF-8 → null text and an error."""
    try:
        return value.cast(pa.string()), pa.nulls(len(value), pa.string())
    except pa.ArrowInvalid:
        texts, errors = [], []
        for v in value.to_pylist():
            try:
                texts.append(v.decode("utf-8"))
                errors.append(None)
            except UnicodeDecodeError:
                texts.append(None)
                errors.append("invalid UTF-8")
        return pa.array(texts, pa.string()), pa.array(errors, pa.string())


def write_direct(spark, ranges, settings: ExportSettings, schema: pa.Schema, run_id: str) -> list[dict]:
    """One Spark task per range: read, decode, write Parquet files; returns the files' metadata."""
    writer = make_file_writer(
        _table_key(settings.table), schema, settings.partition_by, settings.target_file_bytes, run_id
    )

    def task(it):
        for meta in writer(table_batches(list(it), settings, schema)):
            yield from meta.to_pylist()

    return spark.sparkContext.parallelize(ranges, max(1, len(ranges))).mapPartitions(task).collect()


def count_direct(spark, ranges) -> dict[tuple[str, int], list[int]]:
    """Dry run: rows, min and max seq per partition."""
    from tank_spark.source import read_range

    def task(it):
        out = {}
        for r in it:
            for b in read_range(r):
                seqs = b.column("seq").to_numpy()
                c = out.setdefault((r.topic, r.partition), [0, int(seqs.min()), int(seqs.max())])
                c[0] += len(seqs)
                c[1], c[2] = min(c[1], int(seqs.min())), max(c[2], int(seqs.max()))
        yield from out.items()

    merged: dict[tuple[str, int], list[int]] = {}
    for key, (n, lo, hi) in spark.sparkContext.parallelize(ranges, max(1, len(ranges))).mapPartitions(task).collect():
        c = merged.setdefault(key, [0, lo, hi])
        c[0] += n
        c[1], c[2] = min(c[1], lo), max(c[2], hi)
    return merged


# ---- executors: Parquet files -----------------------------------------------------------------------------------

FILE_META_SCHEMA = (
    "path string, size long, partition_values string, num_records long, stats string, "
    "modification_time long, counts string"
)


def make_file_writer(table_path: str, schema: pa.Schema, partition_by: tuple[str, ...], target_bytes: int, run_id: str):
    """mapInArrow function: write each task's rows as Parquet files under the table, return their metadata."""

    def write(batches):
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        pending: dict[tuple, list[pa.RecordBatch]] = {}
        sizes: dict[tuple, int] = {}
        n = [0]

        def flush(key):
            table = pa.Table.from_batches(pending.pop(key))
            sizes.pop(key)
            values = dict(zip(partition_by, key, strict=True))
            rel_dir = "/".join(f"{c}={quote(str(v), safe='')}" for c, v in values.items())
            name = f"part-{run_id}-{task}-{n[0]:04d}.parquet"
            n[0] += 1
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(table_path, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            data = table.drop_columns(list(partition_by))
            pq.write_table(data, full, compression="snappy")
            return {
                "path": rel,
                "size": os.path.getsize(full),
                "partition_values": json.dumps({c: str(v) for c, v in values.items()}),
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


def group_rows(batch: pa.RecordBatch, columns: tuple[str, ...]):
    """(partition values as strings, row indices or None for all rows) per distinct value combination."""
    import numpy as np
    import pyarrow.compute as pc

    if not columns:
        return [((), None)]
    codes = np.zeros(batch.num_rows, dtype=np.int64)
    dictionaries = []
    for c in columns:
        enc = pc.dictionary_encode(batch.column(c))
        dictionaries.append(enc.dictionary.to_pylist())
        codes = codes * (len(enc.dictionary) + 1) + enc.indices.to_numpy(zero_copy_only=False)
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
            key.append(str(d[idx]))
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


def partition_counts(table: pa.Table) -> dict:
    """Per TANK partition in a file: [rows, min seq, max seq, decode errors] (for the run report)."""
    aggs = [("seq", "count"), ("seq", "min"), ("seq", "max")]
    if "decode_error" in table.column_names:
        aggs.append(("decode_error", "count"))  # counts non-null values: the rows with an error
    g = table.group_by(["topic", "partition"]).aggregate(aggs).to_pydict()
    errors = g.get("decode_error_count", [0] * len(g["topic"]))
    return {
        f"{t}/{p}": [n, lo, hi, e]
        for t, p, n, lo, hi, e in zip(
            g["topic"], g["partition"], g["seq_count"], g["seq_min"], g["seq_max"], errors, strict=True
        )
    }


# ---- driver: commit ---------------------------------------------------------------------------------------------


def create_table(settings: ExportSettings, schema: pa.Schema):
    from deltalake import DeltaTable

    return DeltaTable.create(settings.table, schema=schema, partition_by=list(settings.partition_by), mode="error")


def check_compatible(settings: ExportSettings, schema: pa.Schema, table) -> None:
    """Refuse an existing table whose columns or partitioning differ from what this export writes."""
    have_names = [f.name for f in table.schema().fields]
    if have_names != schema.names:
        raise JobConfigError(
            f"existing table {settings.table} has columns {have_names}, this export writes "
            f"{schema.names} (value format/schema differ?)"
        )
    parts = list(table.metadata().partition_columns)
    if parts != list(settings.partition_by):
        raise JobConfigError(
            f"existing table {settings.table} is partitioned by {parts}, not {list(settings.partition_by)}"
        )


def commit(
    table, settings: ExportSettings, schema: pa.Schema, files: list[dict], plans: list[PartitionPlan], run_id: str
) -> int:
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import AddAction

    for p in plans:  # delta-rs does not skip an already-recorded version by itself
        now = table.transaction_version(p.app_id)
        if now != p.previous:
            raise RuntimeError(
                f"{p.topic}/{p.partition}: the table's recorded version changed from {p.previous} "
                f"to {now} during this run (a concurrent export?); nothing committed"
            )
    actions = [
        AddAction(f["path"], f["size"], json.loads(f["partition_values"]), f["modification_time"], True, f["stats"])
        for f in files
    ]
    txns = [Transaction(p.app_id, p.end) for p in plans if p.has_work]
    table.create_write_transaction(
        actions,
        mode="append",
        schema=schema,
        partition_by=list(settings.partition_by),
        commit_properties=CommitProperties(app_transactions=txns, custom_metadata={"tank-log.run": run_id}),
    )
    return _open_table(settings.table).version()


def _check_delta_spark(spark) -> None:
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:
        raise JobConfigError(
            "engine spark needs Delta Lake's jars on the Spark classpath (e.g. spark-submit --packages "
            "io.delta:delta-spark_2.13:4.0.0 --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
            "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog); "
            "use --engine deltalake (no jars needed) otherwise"
        ) from None


# ---- the job ----------------------------------------------------------------------------------------------------


def execute(ctx, prepared, spark):
    from pyspark.sql import functions as F

    settings, plans, table = prepared
    t0 = time.monotonic()
    if settings.engine == "spark":
        _check_delta_spark(spark)
    schema = table_schema(settings, spark)
    if table is not None:
        check_compatible(settings, schema, table)
    work = [p for p in plans if p.has_work]
    results = {
        (p.topic, p.partition): {
            "topic": p.topic,
            "partition": p.partition,
            "path": p.base_path,
            "app_id": p.app_id,
            "previous_version": p.previous,
            "from_seq": p.first if p.has_work else None,
            "to_seq": p.end if p.has_work else None,
            "status": "pending" if p.has_work else "up-to-date",
            "rows": 0,
            "quarantined": 0,
            "files": 0,
            "bytes": 0,
        }
        for p in plans
    }
    summary = {"partitions": len(plans), "table": settings.table, "engine": settings.engine}
    if not work:
        summary.update(by_status=count_by(list(results.values())), rows=0, table_version=_version(table))
        return list(results.values()), summary
    sql_path = settings.value_format == "json" or settings.engine == "spark"
    if ctx.dry_run:
        if sql_path:
            agg = (
                decoded_frame(spark, ctx, settings, plans)
                .groupBy("topic", "partition")
                .agg(F.count("*").alias("rows"), F.min("seq").alias("min"), F.max("seq").alias("max"))
                .collect()
            )
            counts = {(r["topic"], r["partition"]): [r["rows"], r["min"], r["max"]] for r in agg}
        else:
            counts = count_direct(spark, direct_ranges(ctx, settings, plans))
        for key, (rows, lo, hi) in counts.items():
            results[key].update(rows=rows, first_row_seq=lo, last_row_seq=hi)
        for p in work:
            results[(p.topic, p.partition)]["status"] = "dry-run"
        summary.update(
            by_status=count_by(list(results.values())),
            rows=sum(r["rows"] for r in results.values()),
            table_version=_version(table),
        )
        return list(results.values()), summary
    if settings.engine == "spark":
        version = _write_with_delta_spark(decoded_frame(spark, ctx, settings, plans), settings, work)
        files: list[dict] = []
    else:
        table = table if table is not None else create_table(settings, schema)
        run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        if sql_path:
            writer = make_file_writer(
                _table_key(settings.table), schema, settings.partition_by, settings.target_file_bytes, run_id
            )
            df = decoded_frame(spark, ctx, settings, plans)
            files = [r.asDict() for r in df.mapInArrow(writer, FILE_META_SCHEMA).collect()]
        else:
            ranges = direct_ranges(ctx, settings, plans)
            log.info("export: %d partitions with new messages, %d read tasks", len(work), len(ranges))
            files = write_direct(spark, ranges, settings, schema, run_id)
        log.info("export: %d Parquet files written in %.2fs; committing", len(files), time.monotonic() - t0)
        if os.environ.get(CRASH_ENV) == "before-commit":
            log.error("%s=before-commit: dying after writing %d files, before the commit", CRASH_ENV, len(files))
            os._exit(137)
        t_commit = time.monotonic()
        version = commit(table, settings, schema, files, plans, run_id)
        log.info("export: committed table version %s in %.2fs", version, time.monotonic() - t_commit)
    for f in files:
        for key, (rows, lo, hi, bad) in json.loads(f["counts"]).items():
            topic, _, pid = key.rpartition("/")
            r = results[(topic, int(pid))]
            r["first_row_seq"] = min(lo, r.get("first_row_seq") or lo)
            r["last_row_seq"] = max(hi, r.get("last_row_seq") or hi)
            r["rows"] += rows
            r["quarantined"] += bad
            r["files"] += 1
            r["bytes"] += f["size"]
    for p in work:
        results[(p.topic, p.partition)]["status"] = "exported"
    rows = sum(r["rows"] for r in results.values())
    elapsed = time.monotonic() - t0
    summary.update(
        by_status=count_by(list(results.values())),
        rows=rows,
        bytes=sum(f["size"] for f in files),
        files=len(files),
        table_version=version,
        quarantined=sum(r["quarantined"] for r in results.values()),
        export_s=round(elapsed, 3),
        rows_per_s=round(rows / elapsed) if elapsed else None,
    )
    return list(results.values()), summary


def _version(table) -> int | None:
    return None if table is None else table.version()


def _write_with_delta_spark(df, settings: ExportSettings, work: list[PartitionPlan]) -> int | None:
    """engine=spark: one idempotent Delta commit per partition (txnAppId/txnVersion)."""
    from pyspark.sql import functions as F

    for p in work:
        (
            df.filter((F.col("topic") == p.topic) & (F.col("partition") == p.partition))
            .write.format("delta")
            .mode("append")
            .option("txnAppId", p.app_id)
            .option("txnVersion", p.end)
            .partitionBy(*settings.partition_by)
            .save(settings.table)
        )
    table = _open_table(settings.table)
    return _version(table)


def main(argv: list[str] | None = None) -> int:
    return run_job(
        "export_delta",
        "Export new messages to a Delta table, exactly once per partition.",
        add_options,
        prepare,
        execute,
        argv,
    )
