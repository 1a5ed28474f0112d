"""The import job: a Delta table written by the export (or any table with its columns) → TANK partitions under a
broker base path, with the `tank` data source writer's staging (`sink.py`): rehydrate a broker, seed a new cluster.

Planning (driver, before Spark starts): the table's (topic, partition)s with their row counts and seq ranges; for
each, the target partition's last seq. A partition that exists is refused (reported failed) unless `--append`,
which imports only its rows above that last seq (so re-running an import adds nothing twice). Values come back
byte for byte from `binary` tables and from `utf8` tables (`raw_value` holds the rows that were not UTF-8); a `json`
table holds decoded columns, not the producer's bytes, and is refused. The write is one Spark job of a few tasks per
core, or, for a table of at most `in_driver_max_bytes` (the files of the selected topics), the driver's threads
without Spark: each reads its partitions' rows from the table (delta-rs, any storage the export supports) file by
file in seq order, as Arrow batches straight into the segment writer (the rows never cross into the JVM, nor become
Python objects: a SparkContext is all the job starts), and stages them; the driver's commit moves every partition
into place at once (a failed run leaves nothing).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from tank_log.errors import ImportRefused, JobConfigError, RunFailed, TankFormatError
from tank_log.format.arrow import skip_pandas_detection
from tank_log.format.broker_config import PartitionConfig, load_config, parse_config
from tank_log.format.names import partition_id_problem, topic_name_problem
from tank_log.jobs.flags import add_source, add_storage_option, add_table_format
from tank_log.lakehouse import LakeTable, TableLocation, text_column
from tank_log.maintenance.outcome import Status
from tank_log.storage.fsutil import atomic_write, fsync_dir
from tank_log.storage.holders import held_reason, holders
from tank_log.storage.staging import (
    StagedPartition,
    abort_import,
    existing_last_seq,
    new_run_id,
    open_import,
    recover_imports,
)
from tank_spark.context import JobContext, driver_cores
from tank_spark.export.topic_config import LOOKBACK, recorded_topic_configs
from tank_spark.report import count_by
from tank_spark.runner import JobResult, run_job
from tank_spark.schema import ROW_SCHEMA, TS_RAW
from tank_spark.sink import REQUIRED, commit_staged, stage_rows
from tank_spark.tasks import Workers, map_dealt

if TYPE_CHECKING:
    import pyarrow.dataset as ds
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
    segment_bytes: int = PartitionConfig().segment_bytes  # where its segments roll (`_segment_bytes`)
    refused: str | None = None  # why the target partition cannot be written (damage found by `existing_last_seq`)


@dataclass(frozen=True)
class ImportSettings:
    location: TableLocation
    base: str
    append: bool
    segment_bytes: int | None
    value_is_text: bool
    table_bytes: int  # the size of the table's files holding the selected topics (`in_driver`)
    # topic (and `<topic>/<N>` for a partition's) → the `config` text the export recorded
    topic_configs: dict[str, str] = field(default_factory=dict)
    rows_of: ds.Expression | None = None  # the rows of the broker being restored (`source_rows`; None: every row)


Prepared: TypeAlias = tuple[ImportSettings, list[ImportPlan]]
Keys: TypeAlias = dict[tuple[str, int], tuple[int, int, int]]
"""Per (topic, partition), in the order the table first holds them: (rows, first seq, last seq)."""


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--table",
        help="the table to import: a path or URI, or with a REST --catalog its name (namespace.table); default "
        "export.table",
    )
    add_storage_option(p, "--table")
    add_table_format(p)
    p.add_argument(
        "--append",
        action="store_true",
        help="continue partitions that exist with their rows above the partition's last seq (default: refuse them)",
    )
    p.add_argument("--segment-bytes", metavar="SIZE", help="roll segments at this size (default: log.segment.bytes)")
    add_source(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Prepared:
    from tank_log.jobs.config import parse_size_arg
    from tank_log.lakehouse import storage_options
    from tank_log.lakehouse.location import catalog_setting, locate

    if len(ctx.data_dirs) != 1:
        raise JobConfigError("import writes into one base path: pass one --data-dir")
    base = ctx.data_dirs[0]
    cfg = ctx.config.export
    table = args.table or cfg.table
    if not table:
        raise JobConfigError("no table: pass --table PATH_OR_URI or set export.table")
    fmt = args.format or cfg.format
    catalog = catalog_setting(args.catalog, cfg.catalog, fmt, "--catalog/export.catalog")
    location = locate(table, storage_options(cfg.storage_options, args.storage_option), fmt, catalog)
    delta = location.open()
    if delta is None:
        raise JobConfigError(f"no {fmt} table at {location}")
    check_readable(location, delta)
    names = {f.name: f for f in delta.arrow_schema()}
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise JobConfigError(f"table {location} lacks column(s) {', '.join(missing)}: not a tank-log export")
    value_type = names["value"].type
    if value_type not in (pa.binary(), pa.large_binary(), pa.string(), pa.large_string(), pa.binary_view()):
        raise JobConfigError(
            f"table {location}: value is {value_type}; only binary and utf8 exports keep the producer's bytes "
            "(a json export holds decoded columns)"
        )
    check_column_types(location, names)
    segment_bytes = parse_size_arg(args.segment_bytes, "--segment-bytes") if args.segment_bytes else None
    rows_of = source_rows(location, delta, args.source or cfg.source)
    keys = checked_keys(ctx, location, delta, rows_of)  # before anything is written: a refused table writes nothing
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
        segment_bytes,
        pa.types.is_string(value_type) or pa.types.is_large_string(value_type),
        _table_bytes(delta, ctx.topics),
        recorded_topic_configs(delta.history(limit=LOOKBACK)),
        rows_of,
    )
    return settings, plan_import(settings, keys)


def source_rows(location: TableLocation, delta: LakeTable, source: str | None) -> ds.Expression | None:
    """The filter of the rows of broker `source` (its own, and those written before sources if the table says they
    are its, `lakehouse.owns_unsourced`); None: every row, for a table of one source (or none) when no source is
    given.

    Raises:
        JobConfigError: a table holding several brokers' rows and no source given (they would collide), or a source
            the table holds no rows of; naming the sources it holds.
    """
    import pyarrow.dataset as pds

    from tank_log.lakehouse import LEGACY_SOURCE_KEY, check_source, owns_unsourced

    if "source" not in delta.arrow_schema().names:
        return None
    found: set[str] = set()
    for batch in delta.to_pyarrow_dataset().to_batches(columns=["source"], use_threads=False):  # not the whole column
        found.update(s for s in pc.unique(batch.column(0)).to_pylist() if s is not None)
    held = sorted(found)
    if source is None:
        if len(held) > 1:
            raise JobConfigError(
                f"table {location} holds the rows of {len(held)} brokers ({', '.join(held)}): pass --source NAME "
                "(or export.source), the broker whose partitions to restore"
            )
        return None
    check_source(source, "--source")
    owned = owns_unsourced(source, delta.properties().get(LEGACY_SOURCE_KEY))
    if source not in held and not owned:
        raise JobConfigError(
            f"table {location} holds no rows of source {source!r} (it holds {', '.join(held) or 'none'})"
        )
    mine = text_column("source") == source
    return mine | pds.field("source").is_null() if owned else mine


def check_readable(location: TableLocation, delta: LakeTable) -> None:
    """Refuse, before anything is written, a table whose rows the reader of its format would not read as they are
    (`LakeTable.check_readable`: e.g. Delta's column mapping or deletion vectors).

    Raises:
        JobConfigError: one line naming the table and the feature.
    """
    delta.check_readable()


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _is_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))


# column → (whether a type is one the writer reads as the message's, the rule in words)
COLUMN_TYPES: dict[str, tuple[Callable[[pa.DataType], bool], str]] = {
    "topic": (_is_text, "a string (the topic's directory name, §1.3)"),
    "partition": (pa.types.is_integer, "an integer (a partition id in 0..65529, §8)"),
    "seq": (pa.types.is_integer, "an integer (a seq is a u64 >= 1, §3.6)"),
    "ts": (pa.types.is_timestamp, "a timestamp (the message's time, §3.7)"),
    "key": (_is_bytes, "binary (the message's key bytes, §3.8)"),
    TS_RAW.name: (lambda t: pa.types.is_decimal(t) or pa.types.is_integer(t), "a decimal or an integer (ms, §3.7)"),
}


def check_column_types(location: TableLocation, fields: dict[str, pa.Field]) -> None:
    """Refuse, before anything is read or written, a table whose key columns have types no tank-log export writes
    (a seq as a string or a float, a partition as a string, a ts as a string, ...): the writer would fail on them
    mid-run, or read them wrong.

    Raises:
        JobConfigError: one line naming the table, the column, the type found and the rule.
    """
    for column, (fits, rule) in COLUMN_TYPES.items():
        if column in fields and not fits(fields[column].type):
            raise JobConfigError(
                f"table {location}: column {column} is of type {fields[column].type}; it must be {rule}: "
                "not a tank-log export; nothing was imported"
            )


def checked_keys(
    ctx: JobContext, location: TableLocation, delta: LakeTable, rows_of: ds.Expression | None = None
) -> Keys:
    """The table's (topic, partition)s of the selected topics with their row counts and seq ranges, checked before
    anything is written: every row has topic, partition and seq; each topic is a directory name the broker loads
    (§1.3) and each partition id is in 0..65529 (§8), so nothing is ever written outside the base path; seqs are at
    least 1 and unique in their partition (§3.6); `value` (and `ts` unless `ts_raw` holds the row's time) is not
    null.

    One pass over the key columns, a row group at a time (`_key_units`): memory holds one row group's keys and a
    summary per partition, never the table's keys. Seqs are unique within each row group (checked as it is read);
    across row groups, a partition whose row groups' seq ranges overlap (the export writes each file's share above
    the previous one's) has its seqs read again, alone (`_duplicate_in`): memory then holds that partition's seqs.

    Raises:
        JobConfigError: one line naming the table, the column, the value and the rule.
    """
    dataset = delta.to_pyarrow_dataset()
    cond = _selected(ctx.topics, rows_of)
    nulls = dict.fromkeys(("topic", "partition", "seq"), 0)
    topics: dict[str, None] = {}  # in the order the table holds them
    keys: dict[tuple[str, int], list[int]] = {}  # [rows, first seq, last seq]
    overlap: set[tuple[str, int]] = set()  # partitions with a row group's seqs within the range of earlier ones'
    duplicate: dict[tuple[str, int], int] = {}  # a seq found twice in one row group
    read = 0
    for unit in _key_units(dataset, cond):
        # one thread: fewer Arrow workers still finishing the scan when a refusal ends the process (jobs/exits.py)
        t = _files(dataset, [unit]).to_table(columns=["topic", "partition", "seq"], filter=cond, use_threads=False)
        if not t.num_rows:
            continue
        read += t.num_rows
        for column in nulls:
            nulls[column] += t[column].null_count
        t = t.drop_null()
        topics.update(dict.fromkeys(pc.unique(t["topic"]).to_pylist()))
        g = t.group_by(["topic", "partition"], use_threads=False).aggregate(
            [("seq", "count"), ("seq", "count_distinct"), ("seq", "min"), ("seq", "max")]
        )
        for topic, partition, n, distinct, low, high in zip(
            *(
                g[c].to_pylist()
                for c in ("topic", "partition", "seq_count", "seq_count_distinct", "seq_min", "seq_max")
            ),
            strict=True,
        ):
            k = (topic, partition)
            s = keys.get(k)
            if s is None:
                keys[k] = [n, low, high]
            else:
                if low <= s[2] and high >= s[1]:
                    overlap.add(k)
                s[0], s[1], s[2] = s[0] + n, min(s[1], low), max(s[2], high)
            if distinct != n and k not in duplicate:
                mine = t.filter(pc.and_(pc.equal(t["topic"], topic), pc.equal(t["partition"], partition)))
                duplicate[k] = _duplicate_of(mine["seq"]) or 0
        del t, g
    if not read:
        raise JobConfigError(f"table {location} has no rows{' of these topics' if ctx.topics else ''}")

    def refuse(column: str, what: str) -> JobConfigError:
        return JobConfigError(f"table {location}: column {column}: {what}; nothing was imported")

    for column, n in nulls.items():
        if n:
            raise refuse(column, f"null in {n} row(s) (every row needs topic, partition and seq)")
    for topic in topics:
        problem = topic_name_problem(topic)
        if problem:
            raise refuse("topic", f"{topic!r} {problem}")
    for (topic, partition), (_, low, _) in keys.items():
        problem = partition_id_problem(partition)
        if problem:
            raise refuse("partition", f"{partition} (topic {topic!r}) {problem}")
        if low < 1:
            raise refuse("seq", f"{low} (topic {topic!r}, partition {partition}) is below 1 (seqs are u64 >= 1, §3.6)")
        dup = duplicate.get((topic, partition))
        if dup is None and (topic, partition) in overlap:
            dup = _duplicate_in(dataset, cond, topic, partition)
        if dup is not None:
            raise refuse(
                "seq", f"{dup} appears more than once in topic {topic!r} partition {partition} (seqs are unique)"
            )
    _check_not_null(ctx, dataset, refuse)
    return {k: (n, lo, hi) for k, (n, lo, hi) in keys.items()}


def _selected(topics: frozenset[str] | None, rows_of: ds.Expression | None) -> ds.Expression | None:
    """The filter of the rows to import: those of broker `rows_of` (`source_rows`) and of `topics`."""

    cond = rows_of
    if topics is not None:
        mine = text_column("topic").isin(sorted(topics))
        cond = mine if cond is None else cond & mine
    return cond


def _key_units(dataset: ds.Dataset, cond: ds.Expression | None) -> Iterator[Any]:
    """The dataset's files that may hold rows of `cond`, each split into its row groups (Parquet's unit of reading):
    what `checked_keys` reads at a time."""
    for fragment in dataset.get_fragments(filter=cond) if cond is not None else dataset.get_fragments():
        split = getattr(fragment, "split_by_row_group", None)
        yield from split() if split is not None else (fragment,)


def _duplicate_of(seq: pa.ChunkedArray | pa.Array) -> int | None:
    """The smallest seq that `seq` holds more than once (None: every one once)."""
    s = pc.sort_indices(seq)
    ordered = pc.take(seq, s)
    if len(ordered) < 2:
        return None
    same = pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    at = pc.index(same, True).as_py()
    return None if at < 0 else int(ordered[at].as_py())


def _duplicate_in(dataset: ds.Dataset, cond: ds.Expression | None, topic: str, partition: int) -> int | None:
    """The smallest seq that a partition's rows (of `cond`) hold more than once: its seqs read alone."""
    import pyarrow.dataset as pds

    mine = (text_column("topic") == topic) & (pds.field("partition") == partition)
    if cond is not None:
        mine = mine & cond
    return _duplicate_of(dataset.to_table(columns=["seq"], filter=mine, use_threads=False)["seq"])


def _check_not_null(ctx: JobContext, dataset: ds.Dataset, refuse: Callable[[str, str], Exception]) -> None:
    """`value` and `ts` not null (a null `ts` is fine where `ts_raw` holds the time, a null `value` where `raw_value`
    holds the bytes). Counted with the Parquet files'
    statistics: a row group without nulls is not read (0.04 s for 300,000 rows of 1 KB values, where reading them
    takes 5 s)."""
    import pyarrow.dataset as pds

    for column in ("value", "ts"):
        cond = pds.field(column).is_null()
        if column == "ts" and "ts_raw" in dataset.schema.names:
            cond = cond & pds.field("ts_raw").is_null()
        if column == "value" and "raw_value" in dataset.schema.names:  # utf8: the bytes that are not UTF-8
            cond = cond & pds.field("raw_value").is_null()
        if ctx.topics is not None:
            cond = cond & text_column("topic").isin(sorted(ctx.topics))
        n = dataset.count_rows(filter=cond, use_threads=False)
        if n:
            raise refuse(column, f"null in {n} row(s) (a message needs its {'bytes' if column == 'value' else 'time'})")


def plan_import(settings: ImportSettings, keys: Keys, dataset: ds.Dataset | None = None) -> list[ImportPlan]:
    """Per (topic, partition) of the table's (checked) keys: what would be imported. Appending, a partition that
    exists gets the count and range of its rows above its last seq (`_above`; `dataset`: the table's, else opened)."""
    existing: dict[tuple[str, int], int | None] = {}
    refused: dict[tuple[str, int], str] = {}
    for t, p in keys:
        try:
            existing[(t, p)] = existing_last_seq(os.path.join(settings.base, t, str(p)), t, p)
        except (ImportRefused, TankFormatError) as err:  # a torn or damaged target: never sealed or continued
            existing[(t, p)], refused[(t, p)] = None, str(err)
    stats: dict[tuple[str, int], tuple[int, int | None, int | None]] = dict(keys)
    if settings.append:  # only the rows above each partition's end
        lasts = {k: e for k, e in existing.items() if e is not None and e >= keys[k][1]}
        if any(e < keys[k][2] for k, e in lasts.items()):
            if dataset is None:
                dataset = settings.location.existing().to_pyarrow_dataset()
            stats.update(_above(dataset, _selected(None, settings.rows_of), lasts))
        else:
            stats.update(dict.fromkeys(lasts, (0, None, None)))
    return [
        ImportPlan(
            t,
            p,
            *stats[(t, p)],
            existing[(t, p)],
            settings.segment_bytes or _segment_bytes(settings, t, p),
            refused.get((t, p)),
        )
        for t, p in sorted(existing)
    ]


def _above(
    dataset: ds.Dataset, cond: ds.Expression | None, lasts: dict[tuple[str, int], int]
) -> dict[tuple[str, int], tuple[int, int | None, int | None]]:
    """Per partition of `lasts` (its last seq), the count and range of its rows above it: one pass over the key
    columns of those partitions' topics, a row group at a time."""

    mine = text_column("topic").isin(sorted({t for t, _ in lasts}))
    cond = mine if cond is None else cond & mine
    ends = pa.table(
        {
            "topic": pa.array([t for t, _ in lasts], pa.string()),
            "partition": pa.array([p for _, p in lasts], pa.int64()),
            "existing": pa.array(list(lasts.values()), pa.int64()),
        }
    )
    out: dict[tuple[str, int], tuple[int, int | None, int | None]] = dict.fromkeys(lasts, (0, None, None))
    for unit in _key_units(dataset, cond):
        t = _files(dataset, [unit]).to_table(columns=["topic", "partition", "seq"], filter=cond, use_threads=False)
        t = t.set_column(0, "topic", pc.cast(t["topic"], pa.string()))
        t = t.set_column(1, "partition", pc.cast(t["partition"], pa.int64()))
        t = t.join(ends, ["topic", "partition"], join_type="inner", use_threads=False)
        t = t.filter(pc.greater(t["seq"], t["existing"]))
        if not t.num_rows:
            continue
        g = t.group_by(["topic", "partition"], use_threads=False).aggregate(
            [("seq", "count"), ("seq", "min"), ("seq", "max")]
        )
        for topic, partition, n, low, high in zip(
            *(g[c].to_pylist() for c in ("topic", "partition", "seq_count", "seq_min", "seq_max")), strict=True
        ):
            was_n, was_low, was_high = out[(topic, partition)]
            out[(topic, partition)] = (
                was_n + n,
                low if was_low is None else min(was_low, low),
                high if was_high is None else max(was_high, high),
            )
    return out


def _segment_bytes(settings: ImportSettings, topic: str, partition: int) -> int:
    """Where a partition's segments roll: its `log.segment.bytes` (§1.5) — the partition's `config` over the
    topic's, each the one in the base path or, where it has none, the one the export recorded (which the import
    restores, after the segments are in place)."""
    config = PartitionConfig()
    for key, path in (
        (topic, os.path.join(settings.base, topic, "config")),
        (f"{topic}/{partition}", os.path.join(settings.base, topic, str(partition), "config")),
    ):
        if os.path.exists(path):
            config = load_config(path, config)[0]
        elif key in settings.topic_configs:
            recorded, problems = parse_config(settings.topic_configs[key], path, config)
            if not any(p.severity == "error" for p in problems):  # one the import would not restore does not count
                config = recorded
    return config.segment_bytes


def _table_bytes(delta: LakeTable, topics: frozenset[str] | None) -> int:
    """The size of the table's files that hold rows of `topics` (all, when the table is not partitioned by topic)."""
    files = delta.file_stats()
    if topics is not None and "partition.topic" in files.column_names:
        files = files.filter(pc.is_in(files["partition.topic"], pa.array(sorted(topics))))
    return int(pc.sum(files["size_bytes"]).as_py() or 0)


def _has_work(settings: ImportSettings, p: ImportPlan) -> bool:
    return bool(p.rows) and (p.existing_last is None or settings.append)


def needs_spark(ctx: JobContext, prepared: Prepared) -> bool:
    """Spark starts only to write rows of more than `in_driver_max_bytes` of table files: a dry run, a run that finds
    nothing to import (every partition refused or up to date) and a small import run on the driver, without a JVM."""
    settings, plans = prepared
    return not ctx.dry_run and any(_has_work(settings, p) for p in plans) and not in_driver(ctx, settings)


def in_driver(ctx: JobContext, settings: ImportSettings) -> bool:
    """Whether the driver's threads write the import themselves: its table files (of the selected topics) hold at
    most `in_driver_max_bytes`. Spark's start, first job and stop cost seconds (bench/RESULTS.md), more than such an
    import takes in the driver."""
    within = bool(ctx.in_driver_max_bytes) and settings.table_bytes <= ctx.in_driver_max_bytes
    log.info(
        "import: %s bytes of table files, %s in_driver_max_bytes (%s bytes): %s",
        f"{settings.table_bytes:,}",
        "within" if within else "more than",
        f"{ctx.in_driver_max_bytes:,}",
        "in the driver" if within else "on Spark's executors",
    )
    return within


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
        if p.refused is not None:
            r.update(status=Status.FAILED, error=p.refused if settings.append else f"exists, damaged: {p.refused}")
        elif p.existing_last is not None and not settings.append:
            r.update(status=Status.FAILED, error=f"exists (last seq {p.existing_last}): pass --append to continue it")
        elif not p.rows:
            r.update(status=Status.UP_TO_DATE)
        else:
            r["status"] = Status.DRY_RUN if ctx.dry_run else Status.PENDING
            work.append(p)
        results.append(r)
    damaged = [p for p in plans if p.refused is not None and p.rows and settings.append]
    if damaged and not ctx.dry_run:  # as a task's refusal: one line, and nothing of any partition is written
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise RunFailed(f"import refused, nothing was imported: {damaged[0].refused}{more}")
    if work and not ctx.dry_run:
        log.info("import: writing %d partitions (%d rows) into %s", len(work), sum(p.rows for p in work), settings.base)
        workers: Workers = sc if sc is not None else driver_cores(ctx)  # None: `in_driver`
        staged = {(s.topic, s.partition): s for s in _stage(workers, settings, work)}
        for r in results:
            s = staged.get((r["topic"], r["partition"]))
            if s is not None:
                r.update(status=Status.IMPORTED, segments=s.segments, bytes=s.bytes)
    restored, not_restored = _restore_configs(settings, plans, dry_run=ctx.dry_run)
    elapsed = time.monotonic() - t0
    rows = sum(p.rows for p in work)
    summary = {
        "table": str(settings.location),
        "base": settings.base,
        "partitions": len(plans),
        "by_status": count_by(results),
        "rows": rows,
        "import_s": round(elapsed, 3),
        "executed_on": "executors" if sc is not None else "driver",
        "rows_per_s": round(rows / elapsed) if elapsed and not ctx.dry_run else None,
        "topic_configs_restored": [k for k in restored if "/" not in k],
        "topic_configs_not_restored": {k: v for k, v in not_restored.items() if "/" not in k},
        "partition_configs_restored": [k for k in restored if "/" in k],
        "partition_configs_not_restored": {k: v for k, v in not_restored.items() if "/" in k},
    }
    return [{**r, "status": str(r["status"])} for r in results], summary


def _restore_configs(
    settings: ImportSettings, plans: list[ImportPlan], *, dry_run: bool
) -> tuple[list[str], dict[str, str]]:
    """Write each imported topic's `config`, and each imported partition's, as the export recorded them (atomically),
    where there is none yet: a topic's policy and limits come back with its data (§1.5). Runs after the segments are
    in place (a refused or failed run leaves no file behind); the segments were already rolled at the restored
    `log.segment.bytes` (`_segment_bytes`). Returns what was restored (or, in a dry run, would be) — topics, and
    partitions as `<topic>/<N>` — and what was not, with why: nothing recorded for a topic, a config of its own in
    the base path, or a recorded one that would abort the broker."""
    restored: list[str] = []
    not_restored: dict[str, str] = {}
    targets = [(t, os.path.join(settings.base, t, "config"), True) for t in sorted({p.topic for p in plans})]
    targets += [  # the partitions this run wrote or found up to date: not one it refused
        (f"{p.topic}/{p.partition}", os.path.join(settings.base, p.topic, str(p.partition), "config"), False)
        for p in plans
        if p.refused is None and (p.existing_last is None or settings.append)
    ]
    for key, path, is_topic in targets:
        text = settings.topic_configs.get(key)
        if text is None:
            if is_topic:
                not_restored[key] = f"none recorded in the table's last {LOOKBACK} commits (the topic had none?)"
            continue
        if os.path.exists(path):
            with open(path, "rb") as fh:
                if fh.read() != text.encode():
                    not_restored[key] = f"{path} exists and differs from the recorded one: kept"
            continue
        errors = [p for p in parse_config(text, path)[1] if p.severity == "error"]
        if errors:
            not_restored[key] = f"the recorded config would abort the broker: {errors[0].message}"
            continue
        if not dry_run:
            if not os.path.isdir(os.path.dirname(path)):
                continue  # nothing of the topic or partition was written (refused or failed)
            atomic_write(path, text.encode())
        restored.append(key)
    for key, why in not_restored.items():
        log.warning("import: the config of %s was not restored: %s", key, why)
    return restored, not_restored


def _stage(workers: Workers, settings: ImportSettings, work: list[ImportPlan]) -> list[StagedPartition]:
    """Executors (or the driver's threads) read each partition's rows from the table and stage it
    (`sink.stage_rows`: Arrow straight into the segment encoder, rows never pass through the JVM); the driver commits
    them all at once (`sink.commit_staged`).
    A failed task fails the run and leaves nothing: the abort waits for the tasks still running (`staging`'s writers'
    lock). A partition a task refuses (`ImportRefused`: rows that cannot continue it) comes back as its message, so
    the run fails with that one line (RunFailed), not a Java stack trace, and leaves nothing either."""
    run_id = new_run_id()
    base, append = settings.base, settings.append
    open_import(base, run_id)

    def task(items: Iterable[tuple[int, ImportPlan]]) -> Iterator[StagedPartition | str]:
        skip_pandas_detection()  # pyarrow would import pandas for its first filter scalar (format/arrow.py)
        dataset = None  # the table is opened once per task (its log read once), not per partition
        for _, p in items:
            if dataset is None:
                dataset = settings.location.existing().to_pyarrow_dataset()
            try:
                rows = _read(dataset, settings.value_is_text, p, settings.rows_of)
                yield from stage_rows(base, run_id, rows, append, p.segment_bytes)
            except ImportRefused as refused:  # a result, not a failed task: one line, no Java stack trace
                yield str(refused)
                return

    try:
        done = map_dealt(workers, work, task)
    except BaseException:
        abort_import(base, run_id)
        raise
    refusals = [r for r in done if isinstance(r, str)]
    if refusals:
        abort_import(base, run_id)
        more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
        raise RunFailed(f"import refused, nothing was imported: {refusals[0]}{more}")
    staged = [s for s in done if isinstance(s, StagedPartition)]
    commit_staged(base, run_id, staged)
    return staged


def _read(
    dataset: ds.Dataset, value_is_text: bool, p: ImportPlan, rows_of: ds.Expression | None = None
) -> Iterator[pa.RecordBatch]:
    """One partition's rows from the table's dataset (above its existing last seq), sorted by seq, as the writer's
    rows, file by file: the files holding its rows in the order of their first seq, each one's share sorted, so
    memory holds one file's share of the partition, never the whole table (files whose seq ranges interleave are
    read together and sorted as one)."""
    import pyarrow.dataset as ds

    cond = (text_column("topic") == p.topic) & (ds.field("partition") == p.partition)
    if p.existing_last is not None:
        cond = cond & (ds.field("seq") > p.existing_last)
    if rows_of is not None:
        cond = cond & rows_of
    cols = [c for c in (*REQUIRED, TS_RAW.name, "raw_value") if c in dataset.schema.names]
    spans = []  # (first seq, last seq, file) of each file with rows of the partition
    for fragment in dataset.get_fragments(filter=cond):
        seq = _files(dataset, [fragment]).to_table(filter=cond, columns=["seq"], use_threads=False)["seq"]
        if len(seq):
            spans.append((pc.min(seq).as_py(), pc.max(seq).as_py(), fragment))
    spans.sort(key=lambda s: s[0])
    groups: list[list[Any]] = []
    end = None
    for first, last, fragment in spans:
        if groups and end is not None and first <= end:  # interleaves with the previous file(s)
            groups[-1].append(fragment)
        else:
            groups.append([fragment])
        end = last if end is None else max(end, last)
    for group in groups:
        t = _files(dataset, group).to_table(filter=cond, columns=cols, use_threads=False)
        seq = t["seq"]
        if len(seq) > 1 and not pc.all(pc.greater(seq.slice(1), seq.slice(0, len(seq) - 1))).as_py():
            t = t.sort_by("seq")
        value = t["value"]
        if value_is_text:  # utf8 exports: the bytes of undecodable values are in raw_value
            value = pc.if_else(pc.is_null(t["raw_value"]), pc.cast(value, pa.binary()), t["raw_value"])
        ts_raw = t[TS_RAW.name] if TS_RAW.name in t.column_names else pa.nulls(t.num_rows, TS_RAW.type)
        out = _as_rows(p, [t["topic"], t["partition"], t["seq"], t["ts"], t["key"], value, ts_raw])
        del t, value
        yield from out.to_batches(max_chunksize=64 * 1024)


def _as_rows(p: ImportPlan, columns: list[Any]) -> pa.Table:
    """The columns (of the types `check_column_types` lets through) as the writer's rows (`ROW_SCHEMA`): a `ts` of
    any unit to µs (ns to µs drops what a ms ts cannot hold anyway), narrower or wider integers to the writer's.

    Raises:
        ImportRefused: a value the writer's type cannot hold (a seq above 2**63-1, a ts beyond year 294,246 in µs),
            naming the column.
    """
    out = []
    for f, column in zip(ROW_SCHEMA, columns, strict=True):
        if column.type == f.type:
            out.append(column)
            continue
        safe = not (f.name == "ts" and column.type.unit == "ns")
        try:
            out.append(pc.cast(column, f.type, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ImportRefused(
                f"{p.topic}/{p.partition}: column {f.name} ({column.type}) does not fit {f.type}: {err}"
            ) from None
    return pa.Table.from_arrays(out, schema=ROW_SCHEMA)


def _files(dataset: ds.Dataset, fragments: list[Any]) -> ds.Dataset:
    """The dataset of some of `dataset`'s files (their partition values kept)."""
    import pyarrow.dataset as ds

    return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


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
