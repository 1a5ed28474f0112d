"""The import job: a Delta table written by the export (or any table with its columns) → TANK partitions under a
broker base path, with the `tank` data source writer's staging (`sink.py`): rehydrate a broker, seed a new cluster.

Planning (driver, before Spark starts): the table's (topic, partition)s with their row counts and seq ranges; for
each, the target partition's last seq. A partition that exists is refused (reported failed) unless `--append`,
which imports only its rows above that last seq (so re-running an import adds nothing twice). Values come back
byte for byte from `binary` tables and from `utf8` tables (`raw_value` holds the rows that were not UTF-8); a `json`
table holds decoded columns, not the producer's bytes, and is refused. The write is one Spark job of a few tasks per
core: each reads its partitions' rows from the table (delta-rs, any storage the export supports), sorted by seq, and
stages them (the rows never cross into the JVM: a SparkContext is all the job starts); the driver's commit moves
every partition into place at once (a failed job leaves nothing).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from tank_log.errors import JobConfigError
from tank_log.format.arrow import skip_pandas_detection
from tank_log.maintenance.outcome import Status
from tank_log.storage.fsutil import fsync_dir
from tank_log.storage.holders import held_reason, holders
from tank_log.storage.staging import (
    StagedPartition,
    abort_import,
    existing_last_seq,
    new_run_id,
    open_import,
    recover_imports,
)
from tank_spark.context import JobContext
from tank_spark.export.location import TableLocation
from tank_spark.report import count_by
from tank_spark.runner import JobResult, run_job
from tank_spark.schema import ROW_SCHEMA, TS_RAW
from tank_spark.sink import REQUIRED, commit_staged, stage_rows
from tank_spark.tasks import deal

if TYPE_CHECKING:
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from pyspark import SparkContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportPlan:
    topic: str
    partition: int
    rows: int  # rows to import (above `existing_last` when appending)
    first_seq: int | None
    last_seq: int | None
    existing_last: int | None  # the target partition's last seq (None: absent or empty)


@dataclass(frozen=True)
class ImportSettings:
    location: TableLocation
    base: str
    append: bool
    segment_bytes: int | None
    value_is_text: bool


Prepared: TypeAlias = tuple[ImportSettings, list[ImportPlan]]


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", help="the Delta table to import: a path or URI (default export.table)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE", help="as for the export")
    p.add_argument(
        "--append",
        action="store_true",
        help="continue partitions that exist with their rows above the partition's last seq (default: refuse them)",
    )
    p.add_argument("--segment-bytes", metavar="SIZE", help="roll segments at this size (default: log.segment.bytes)")


def prepare(ctx: JobContext, args: argparse.Namespace) -> Prepared:
    from tank_log.jobs.config import parse_size_arg
    from tank_log.lakehouse import storage_options

    if len(ctx.data_dirs) != 1:
        raise JobConfigError("import writes into one base path: pass one --data-dir")
    base = ctx.data_dirs[0]
    table = args.table or ctx.config.export.table
    if not table:
        raise JobConfigError("no Delta table: pass --table PATH_OR_URI or set export.table")
    try:
        location = TableLocation.of(table, storage_options(ctx.config.export.storage_options, args.storage_option))
    except ValueError as err:
        raise JobConfigError(str(err)) from None
    delta = location.open()
    if delta is None:
        raise JobConfigError(f"no Delta table at {location}")
    check_readable(location, delta)
    names = {f.name: f for f in pa.schema(delta.schema().to_arrow())}
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise JobConfigError(f"table {location} lacks column(s) {', '.join(missing)}: not a tank-log export")
    value_type = names["value"].type
    if value_type not in (pa.binary(), pa.large_binary(), pa.string(), pa.large_string(), pa.binary_view()):
        raise JobConfigError(
            f"table {location}: value is {value_type}; only binary and utf8 exports keep the producer's bytes "
            "(a json export holds decoded columns)"
        )
    if not os.path.isdir(base):  # a new base path (`build_context` checked its parent): seeding a new cluster
        if ctx.dry_run:
            log.info("import: would create the base path %s", base)
        else:
            os.mkdir(base)
            fsync_dir(os.path.dirname(base))
            log.info("import: created the base path %s", base)
    held = holders([base]) if os.path.isdir(base) else []
    if held and not ctx.dry_run:
        raise JobConfigError(f"{base}: {held_reason(held)}")
    if not ctx.dry_run:
        for action in recover_imports(base):
            log.warning("import: %s", action)
    settings = ImportSettings(
        location,
        base,
        args.append,
        parse_size_arg(args.segment_bytes, "--segment-bytes") if args.segment_bytes else None,
        pa.types.is_string(value_type) or pa.types.is_large_string(value_type),
    )
    return settings, plan_import(ctx, settings, delta)


def check_readable(location: TableLocation, delta: DeltaTable) -> None:
    """Refuse, before anything is written, a table delta-rs cannot read all of: column mapping, or a reader feature its
    reader refuses, e.g. deletion vectors (Spark's DELETE, UPDATE or MERGE on a table with
    `delta.enableDeletionVectors`), whose deleted rows a reader must leave out.

    Raises:
        JobConfigError: one line naming the table and the feature.
    """
    from deltalake.exceptions import DeltaProtocolError

    mode = delta.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":  # delta-rs reads the columns of such a table's files as nulls (checked with delta-spark's)
        raise JobConfigError(
            f"table {location} uses table feature columnMapping (delta.columnMapping.mode={mode}), which delta-rs "
            "does not read (its columns would come back null)"
        )
    try:
        delta.to_pyarrow_dataset()
    except DeltaProtocolError as err:
        raise JobConfigError(
            f"table {location}: delta-rs cannot read it: {err} (Spark can drop the feature: ALTER TABLE ... DROP "
            "FEATURE <feature>)"
        ) from None


def plan_import(ctx: JobContext, settings: ImportSettings, delta: DeltaTable) -> list[ImportPlan]:
    """Per (topic, partition) of the table: what would be imported (one pass over the table's key columns)."""
    keys = delta.to_pyarrow_dataset().to_table(columns=["topic", "partition", "seq"])
    if ctx.topics is not None:
        keys = keys.filter(pc.is_in(keys["topic"], pa.array(sorted(ctx.topics))))
    if not keys.num_rows:
        raise JobConfigError(f"table {settings.location} has no rows{' of these topics' if ctx.topics else ''}")
    pairs = keys.group_by(["topic", "partition"]).aggregate([]).to_pydict()
    existing = {
        (t, p): existing_last_seq(os.path.join(settings.base, t, str(p)), t, p)
        for t, p in zip(pairs["topic"], pairs["partition"], strict=True)
    }
    if settings.append and any(v is not None for v in existing.values()):  # only the rows above each partition's end
        lasts = pa.table(
            {
                "topic": pa.array([t for t, _ in existing], keys["topic"].type),
                "partition": pa.array([p for _, p in existing], keys["partition"].type),
                "existing": pa.array(list(existing.values()), pa.int64()),
            }
        )
        joined = keys.join(lasts, ["topic", "partition"])
        keys = joined.filter(
            pc.or_kleene(pc.is_null(joined["existing"]), pc.greater(joined["seq"], joined["existing"]))
        )
    g = keys.group_by(["topic", "partition"]).aggregate([("seq", "count"), ("seq", "min"), ("seq", "max")]).to_pydict()
    stats = {
        (t, p): (n, lo, hi)
        for t, p, n, lo, hi in zip(g["topic"], g["partition"], g["seq_count"], g["seq_min"], g["seq_max"], strict=True)
    }
    return [ImportPlan(t, p, *stats.get((t, p), (0, None, None)), existing[(t, p)]) for t, p in sorted(existing)]


def _has_work(settings: ImportSettings, p: ImportPlan) -> bool:
    return bool(p.rows) and (p.existing_last is None or settings.append)


def needs_spark(ctx: JobContext, prepared: Prepared) -> bool:
    """Spark starts only to write rows: a dry run, or a run that finds nothing to import (every partition refused or
    up to date), is decided on the driver."""
    settings, plans = prepared
    return not ctx.dry_run and any(_has_work(settings, p) for p in plans)


def execute(ctx: JobContext, prepared: Prepared, sc: SparkContext | None) -> JobResult:
    settings, plans = prepared
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    work = []
    for p in plans:
        r: dict[str, Any] = {
            "topic": p.topic,
            "partition": p.partition,
            "rows": p.rows,
            "first_seq": p.first_seq,
            "last_seq": p.last_seq,
            "existing_last_seq": p.existing_last,
        }
        if p.existing_last is not None and not settings.append:
            r.update(status=Status.FAILED, error=f"exists (last seq {p.existing_last}): pass --append to continue it")
        elif not p.rows:
            r.update(status=Status.UP_TO_DATE)
        else:
            r["status"] = Status.DRY_RUN if ctx.dry_run else Status.PENDING
            work.append(p)
        results.append(r)
    if work and not ctx.dry_run:
        log.info("import: writing %d partitions (%d rows) into %s", len(work), sum(p.rows for p in work), settings.base)
        assert sc is not None  # `needs_spark`: rows to write start Spark
        staged = {(s.topic, s.partition): s for s in _stage(sc, settings, work)}
        for r in results:
            s = staged.get((r["topic"], r["partition"]))
            if s is not None:
                r.update(status=Status.IMPORTED, segments=s.segments, bytes=s.bytes)
    elapsed = time.monotonic() - t0
    rows = sum(p.rows for p in work)
    summary = {
        "table": str(settings.location),
        "base": settings.base,
        "partitions": len(plans),
        "by_status": count_by(results),
        "rows": rows,
        "import_s": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed) if elapsed and not ctx.dry_run else None,
    }
    return [{**r, "status": str(r["status"])} for r in results], summary


def _stage(sc: SparkContext, settings: ImportSettings, work: list[ImportPlan]) -> list[StagedPartition]:
    """Executors read each partition's rows from the table and stage it (`sink.stage_rows`: Arrow straight into the
    segment encoder, rows never pass through the JVM); the driver commits them all at once (`sink.commit_staged`).
    A failed task fails the run and leaves nothing: the abort waits for the tasks still running (`staging`'s writers'
    lock)."""
    run_id = new_run_id()
    base, append, segment_bytes = settings.base, settings.append, settings.segment_bytes
    open_import(base, run_id)

    def task(items: Iterable[tuple[int, ImportPlan]]) -> Iterator[StagedPartition]:
        skip_pandas_detection()  # pyarrow would import pandas for its first filter scalar (format/arrow.py)
        dataset = None  # the table is opened once per task (its log read once), not per partition
        for _, p in items:
            if dataset is None:
                dataset = settings.location.existing().to_pyarrow_dataset()
            yield from stage_rows(base, run_id, _read(dataset, settings.value_is_text, p), append, segment_bytes)

    try:
        staged = deal(sc, work).mapPartitions(task).collect()
    except BaseException:
        abort_import(base, run_id)
        raise
    commit_staged(base, run_id, staged)
    return staged


def _read(dataset: ds.Dataset, value_is_text: bool, p: ImportPlan) -> Iterator[pa.RecordBatch]:
    """One partition's rows from the table's dataset (above its existing last seq), sorted by seq, as the writer's
    rows."""
    import pyarrow.dataset as ds

    cond = (ds.field("topic") == p.topic) & (ds.field("partition") == p.partition)
    if p.existing_last is not None:
        cond = cond & (ds.field("seq") > p.existing_last)
    cols = [c for c in (*REQUIRED, TS_RAW.name, "raw_value") if c in dataset.schema.names]
    t = dataset.to_table(filter=cond, columns=cols).sort_by("seq")
    value = t["value"]
    if value_is_text:  # utf8 exports: the bytes of undecodable values are in raw_value
        value = pc.if_else(pc.is_null(t["raw_value"]), pc.cast(value, pa.binary()), t["raw_value"])
    ts_raw = t[TS_RAW.name] if TS_RAW.name in t.column_names else pa.nulls(t.num_rows, TS_RAW.type)
    out = pa.table([t["topic"], t["partition"], t["seq"], t["ts"], t["key"], value, ts_raw], schema=ROW_SCHEMA)
    yield from out.to_batches(max_chunksize=64 * 1024)


def main(argv: list[str] | None = None) -> int:
    return run_job(
        "import_delta",
        "Import a Delta table (a tank-log export) into TANK partitions under a base path.",
        add_options,
        prepare,
        execute,
        argv,
        sql=False,
        needs_spark=needs_spark,
        new_data_dir=True,
    )
