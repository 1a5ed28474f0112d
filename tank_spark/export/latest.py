"""Current-state tables (`export.mode: latest`, `--mode latest`): one row per live key of each (topic, partition).

A table's mode is recorded in its configuration when it is created (`MODE_KEY`) and fixed from then on: a run with
the other mode is refused. Each run reads the partitions' new ranges (since their recorded versions), reduces them
in bulk to the latest message of each key by compaction's rule (`tank_log.format.latest`: the highest seq wins, a
tombstone is a key with an empty value; keyless messages are counted and skipped), first per read range on the
executors or the driver's threads and then across ranges on the driver, and MERGEs that into the table (delta-rs's
MERGE; an Iceberg table merges it with the touched partitions' rows and overwrites them), matched on topic +
partition + key: a newer message updates the key's row, a tombstone deletes it, a new
live key is inserted. The MERGE's commit carries every partition's new app-transaction version, so a rerun, or a
rerun after a crash before the commit, changes nothing twice.

`--engine spark` computes the same rows and applies them to a Delta table with delta-spark's MERGE, one commit per
partition: Delta's idempotent DML records the partition's version (the session's `txnAppId`/`txnVersion`, the app id
the deltalake engine records too) in that MERGE's own commit, so a run killed between two partitions' MERGEs leaves
the merged ones recorded and its rerun merges the others; both engines can take turns on one table. An Iceberg table
(`iceberg_spark.merge_with_iceberg_spark`) takes one Spark SQL MERGE of every partition, staged (write-audit-publish)
and published by one pyiceberg commit with the new versions, as the deltalake engine's single commit.

Typed values (`dead_letters.py`) decode before the reduction: a value that does not decode is a dead letter, never
a key's latest, so the table holds each key's latest message that decodes (a key whose newest message is bad keeps
its older row; the dead-letter table names the newer message). The dead letters commit first, then the MERGE, by
append's exactly-once rule.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError
from tank_log.format.latest import TOMBSTONE
from tank_log.lakehouse import LEGACY_SOURCE_KEY, MODE_KEY, SOURCE_COLUMN, CommitConflict, table_mode
from tank_log.lakehouse.partitioning import check_rewritable
from tank_spark.export.commit import ConcurrentExport, commit, user_metadata
from tank_spark.export.corruption import Cut, RangeOutcome, cut_at_corruption
from tank_spark.export.dead_letters import BadRecords, BadRun
from tank_spark.export.files import Written
from tank_spark.export.hooks import HOLD_BEFORE_COMMIT, crash_after_first_partition, crash_before_commit, hold
from tank_spark.export.iceberg_spark import check_merge_mode, merge_with_iceberg_spark
from tank_spark.export.orphans import RunTooOld, check_run_age
from tank_spark.export.plan import ExportSettings, PartitionPlan, Prepared, plan_export
from tank_spark.export.rows import direct_ranges, table_batches
from tank_spark.export.run_id import new_run_id
from tank_spark.export.topic_config import topic_config_metadata
from tank_spark.tasks import Workers, map_dealt

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from tank_log.lakehouse import LakeTable
    from tank_spark.context import JobContext
    from tank_spark.ranges import SegmentRange

log = logging.getLogger(__name__)

SCOPE = ("topic", "partition")  # a key is a key within its (topic, partition) (of one source: one per run)
KEY = (SOURCE_COLUMN, *SCOPE, "key")  # the MERGE matches a row by these columns


def table_configuration(settings: ExportSettings) -> dict[str, str]:
    """What a new table records of itself: its mode (nothing for append: tables made before modes existed read the
    same), and that its creator's source owns the versions recorded without one (there are none)."""
    mode = {MODE_KEY: settings.mode} if settings.mode != "append" else {}
    return {**mode, **({LEGACY_SOURCE_KEY: settings.source} if settings.source else {})}


def check_mode(prepared: Prepared) -> None:
    """Refuse a run whose mode is not its table's, and what a latest run does not take (before Spark starts).

    Raises:
        JobConfigError: one line naming the table and both modes, or the flags that clash with --mode latest.
    """
    settings, _, table = prepared
    if table is not None and not settings.upkeep_only and table_mode(table) != settings.mode:
        raise JobConfigError(
            f"table {settings.table} was created with export mode {table_mode(table)}, this run's mode is "
            f"{settings.mode}: a table's mode is fixed when it is created (export to another table)"
        )
    if settings.mode != "latest":
        return
    check_rewritable(settings.partition_by, f"--mode latest into {settings.table}", settings.table_format)
    if table is not None and settings.engine == "spark" and settings.table_format == "iceberg":
        check_merge_mode(settings.table, table)
    if settings.replay_dead_letters:
        raise JobConfigError(
            "--mode latest does not take --replay-dead-letters: a replayed value is older than its key's messages "
            "merged since (export the topics again into a new table with the settings that decode them)"
        )
    clashes = {
        "--continuous": settings.continuous,
        "--value-format json": settings.value_format == "json" and not settings.typed,  # a DDL schema: Spark SQL
        # producer timestamps are not ordered by seq: a cut by time could keep an older value of a key as its latest
        "--since": settings.since_ms is not None,
    }
    bad = [f for f, on in clashes.items() if on]
    if bad:
        raise JobConfigError(
            f"--mode latest does not take {', '.join(bad)}: its MERGE runs in batch runs, with binary, utf8 or "
            "typed values (--value-schema-file)"
        )


@dataclass
class LatestRun:
    """What a latest run read and merged: its plans, those after corruption (`cut`), the kept ranges' outcomes, per
    partition the keys merged and the keyless messages skipped, delta-rs's MERGE metrics, the table version."""

    plans: list[PartitionPlan]  # as planned (after a concurrent commit: re-planned)
    cut: Cut
    outcomes: list[RangeOutcome]
    keys: dict[tuple[str, int], int] = field(default_factory=dict)
    tombstones: dict[tuple[str, int], int] = field(default_factory=dict)
    keyless: dict[tuple[str, int], int] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)
    version: int | None = None
    bad: BadRun | None = None  # typed values: those that did not decode


def merge_latest(
    ctx: JobContext,
    spark: SparkSession | None,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    attempts: int,
) -> LatestRun:
    """Read and reduce every partition's new range, then MERGE it into the table with the new versions, in one
    commit (`--engine spark`: `_merge_with_delta_spark`, one per partition); after a concurrent commit, re-plan and
    read again (at most `attempts` runs in all).

    Raises:
        ConcurrentExport: another export kept committing to these partitions (nothing committed).
    """
    attempt = 1
    while True:
        try:
            return _merge_once(ctx, spark, workers, settings, schema, plans, new_run_id())
        except ConcurrentExport as conflict:
            if attempt == attempts:
                raise ConcurrentExport(
                    f"{conflict}; nothing committed after {attempts} attempts: another export commits to these "
                    "partitions meanwhile"
                ) from None
            attempt += 1
            log.warning("export: %s; nothing committed, re-planning (attempt %d)", conflict, attempt)
            plans, _ = plan_export(ctx, settings)


def _merge_once(
    ctx: JobContext,
    spark: SparkSession | None,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
    run_id: str,
) -> LatestRun:
    bad = BadRun.start(settings, plans)
    ranges = direct_ranges(ctx, settings, plans)
    reduced, outcomes, dead = _read_reduced(workers, ranges, settings, schema, run_id, bad)
    cut = cut_at_corruption(plans, outcomes, settings.on_corruption)
    if bad is not None:  # on_bad_record fail: a partition holding a bad value is not merged
        cut = bad.settle(settings, Written([], outcomes, *dead), cut)
    kept = [o for o in outcomes if o.index in cut.kept]
    run = LatestRun(plans, cut, kept, bad=bad)
    parts = [t for i, t, _ in reduced if i in cut.kept]
    by_index = {o.index: o for o in outcomes}
    for i, _, keyless in reduced:
        key = by_index[i].key
        if i in cut.kept and keyless:
            run.keyless[key] = run.keyless.get(key, 0) + keyless
    source = _across_ranges(parts, schema)
    for (topic, partition), n in _count_by_partition(source).items():
        run.keys[(topic, partition)] = n
    for (topic, partition), n in _count_by_partition(source.filter(source[TOMBSTONE])).items():
        run.tombstones[(topic, partition)] = n
    work = [p for p in cut.plans if p.has_work]
    if not work:
        if bad is not None:
            bad.discard(settings)
        return run
    if settings.engine != "spark":  # delta-spark's: after the first partition's MERGE
        crash_before_commit(len(source))  # test hook
    hold(HOLD_BEFORE_COMMIT)  # test hook
    if bad is not None:
        try:
            check_run_age(run_id, settings.orphan_horizon_ms)
            _check_versions(settings, work)  # a concurrent export: nothing committed, not even the dead letters
        except (RunTooOld, ConcurrentExport):
            bad.discard(settings)
            raise
        bad.commit(settings, cut.plans, run_id)  # first: dead_letters.py
    if settings.engine == "spark" and settings.table_format == "iceberg":
        assert spark is not None  # `in_driver`: only delta-rs exports run without Spark
        run.version, run.metrics = merge_with_iceberg_spark(
            spark, settings, schema, source, work, run_id, keys=KEY, tombstone=TOMBSTONE
        )
    elif settings.engine == "spark":
        assert spark is not None
        run.version, run.metrics = _merge_with_delta_spark(spark, settings, source, work, run_id)
    else:
        run.version, run.metrics = _merge(settings, schema, source, work, run_id)
    return run


def _read_reduced(
    workers: Workers,
    ranges: list[SegmentRange],
    settings: ExportSettings,
    schema: pa.Schema,
    run_id: str,
    bad: BadRun | None,
) -> tuple[list[tuple[int, pa.Table, int]], list[RangeOutcome], tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Per range (executors or the driver's threads): its rows reduced to the latest per key, in the table's columns
    with the tombstone flag, and its keyless count; every range's outcome; and for typed values the dead letters'
    files and each range's bad values (`files.Written`), the bad ones left out before the reduction."""
    from tank_spark.export.corruption import TrackedRead

    dead_writer = None
    if bad is not None and bad.table is not None:  # on_bad_record dead_letter
        from tank_spark.export.dead_letters import dead_letter_settings
        from tank_spark.export.files import make_file_writer
        from tank_spark.export.schema import DEAD_LETTER_SCHEMA

        dead = dead_letter_settings(settings)
        dead_writer = make_file_writer(
            dead.location, DEAD_LETTER_SCHEMA, dead.partition_by, dead.target_file_bytes, run_id
        )
    after = bad.dead_after if bad is not None else {}

    def task(it: Iterable[tuple[int, SegmentRange]]) -> Iterator[tuple[str, Any]]:
        from tank_log.format.latest import latest_per_key
        from tank_spark.export.dead_letters import BadRecords
        from tank_spark.ranges import read_range
        from tank_spark.schema import ROW_SCHEMA

        for i, r in it:
            read = TrackedRead(i, r, read_range)
            rows = pa.Table.from_batches(list(read), ROW_SCHEMA)
            yield ("outcome", read.outcome())
            if not settings.typed:
                if rows.num_rows:
                    latest = latest_per_key(rows, SCOPE)
                    flags = latest.rows[TOMBSTONE]
                    out = pa.Table.from_batches(list(table_batches(latest.rows.to_batches(), settings, schema)), schema)
                    yield ("rows", (i, out.append_column(TOMBSTONE, flags), latest.keyless))
                continue
            records = BadRecords(
                i, r.path, r.topic, r.partition, settings.on_bad_record, after.get((r.topic, r.partition))
            )
            good, keyless = _decoded(rows, records, settings, schema)
            if good.num_rows:
                yield ("rows", (i, latest_per_key(good, SCOPE).rows, keyless))
            elif keyless:
                yield ("rows", (i, good, keyless))
            if records.dead and dead_writer is not None:
                for meta in dead_writer(records.dead):
                    for m in meta.to_pylist():
                        yield ("dead", {**m, "range": i})
            yield ("bad", records.summary())

    out = map_dealt(workers, ranges, task)
    found = {k: [v for kind, v in out if kind == k] for k in ("rows", "outcome", "dead", "bad")}
    return found["rows"], found["outcome"], (found["dead"], found["bad"])


def _decoded(rows: pa.Table, records: BadRecords, settings: ExportSettings, schema: pa.Schema) -> tuple[pa.Table, int]:
    """A range's keyed rows decoded into the table's columns with their tombstone flags (the bad ones left out:
    `records` keeps them), and its keyless count (skipped before decoding: a latest table holds none)."""
    import numpy as np
    import pyarrow.compute as pc

    from tank_log.format.messages import tombstones

    keyed = rows.filter(pc.is_valid(rows["key"]))
    lengths = pc.binary_length(keyed["value"]).to_numpy(zero_copy_only=False)
    flags = pa.array(tombstones(np.ones(len(lengths), bool), lengths))
    good = pa.Table.from_batches(list(records.split(keyed.to_batches(), settings, schema)), schema)
    decoded = pc.is_in(keyed["seq"], value_set=good["seq"].combine_chunks())  # one range: one partition's seqs
    return good.append_column(TOMBSTONE, flags.filter(decoded)), rows.num_rows - keyed.num_rows


def _across_ranges(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """The latest row of each key over all kept ranges: the MERGE's source, one row per key."""
    from tank_log.format.latest import latest_per_key

    if not parts:
        return schema.empty_table().append_column(TOMBSTONE, pa.array([], pa.bool_()))
    return latest_per_key(pa.concat_tables(parts), SCOPE).rows


def _count_by_partition(rows: pa.Table) -> dict[tuple[str, int], int]:
    counts = rows.group_by(list(SCOPE)).aggregate([("key", "count")]).to_pydict()
    return {(t, p): n for t, p, n in zip(counts["topic"], counts["partition"], counts["key_count"], strict=True)}


def _check_versions(settings: ExportSettings, work: list[PartitionPlan]) -> LakeTable:
    """The table, after checking that its recorded versions are still the planned ones (delta-rs does not skip an
    already-recorded version by itself).

    Raises:
        ConcurrentExport: a partition's version moved since this run planned.
    """
    table = settings.location.existing()
    for p in work:
        now = table.recorded_version(p.topic, p.partition)
        if now != p.previous:
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: the table's recorded version moved from {p.previous} to {now} "
                f"since this run planned (a concurrent export)"
            )
    return table


def _merge(
    settings: ExportSettings, schema: pa.Schema, source: pa.Table, work: list[PartitionPlan], run_id: str
) -> tuple[int, dict[str, int]]:
    """One MERGE commit with every partition's new version, against the table's latest version (an empty source
    commits the versions alone)."""
    table = _check_versions(settings, work)
    if not source.num_rows:  # nothing keyed: only the versions advance
        return commit(settings, schema, [], work, run_id), {}
    try:
        metrics = table.merge_latest(
            source,
            keys=KEY,
            order="seq",
            tombstone=TOMBSTONE,
            versions={p.app_id: p.end for p in work if p.app_id and p.end is not None},
            run_id=run_id,
            metadata=topic_config_metadata((p.base_path, p.topic) for p in work),
        )
    except CommitConflict as err:
        raise ConcurrentExport(str(err)) from None
    version = table.version()
    log.info("export: merged %d keys into table version %s: %s", source.num_rows, version, metrics)
    return version, metrics


TXN_CONF = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")  # idempotent DML
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentTransactionException")


def _merge_with_delta_spark(
    spark: SparkSession, settings: ExportSettings, source: pa.Table, work: list[PartitionPlan], run_id: str
) -> tuple[int, dict[str, int]]:
    """engine=spark: one delta-spark MERGE per partition, matched and conditioned as delta-rs's (`merge_latest` of
    `tank_log.lakehouse.delta`), with the partition's new version in the MERGE's own commit: Delta's idempotent DML
    takes the app transaction from the session (`TXN_CONF`) and skips a version not above the recorded one. Not
    atomic across partitions: a run that dies midway leaves the merged partitions recorded, the next merges the
    others. A partition with nothing keyed records its version with an empty append (`commit.write_with_delta_spark`'s
    options).

    Raises:
        ConcurrentExport: a partition's recorded version moved since planning, or Delta refused a MERGE that met
            another writer's commit (nothing of that partition merged).
    """
    import pyarrow.compute as pc
    from delta.tables import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    from tank_log.lakehouse.table import merge_match, owns_unsourced
    from tank_spark.context import FIXED_CONF

    loc = settings.location
    path, options = loc.spark_path(), loc.spark_options()
    for k, v in FIXED_CONF.items():  # a session the job did not start (tank_spark.context) writes the same files
        spark.conf.set(k, v)
    metrics: dict[str, int] = {}
    for p in work:
        table = _check_versions(settings, [p])
        assert p.app_id is not None and p.end is not None  # a partition with work of a table that exists
        rows = source.filter(pc.and_(pc.equal(source["topic"], p.topic), pc.equal(source["partition"], p.partition)))
        try:
            spark.conf.set(USER_METADATA_CONF, user_metadata(settings, p, run_id))
            if not rows.num_rows:  # nothing keyed: the version alone
                empty = rows.drop_columns([TOMBSTONE])
                empty = spark.createDataFrame(empty, from_arrow_schema(empty.schema, prefer_timestamp_ntz=True))
                empty.write.format("delta").mode("append").options(**options).option("txnAppId", p.app_id).option(
                    "txnVersion", p.end
                ).save(path)
            else:
                spark.conf.set(TXN_CONF[0], p.app_id)
                spark.conf.set(TXN_CONF[1], str(p.end))
                columns = [c for c in rows.column_names if c != TOMBSTONE]
                values: dict[str, str | Column] = {c: f"s.`{c}`" for c in columns}
                unsourced = owns_unsourced(loc.source, table.properties().get(LEGACY_SOURCE_KEY))
                newer = "s.seq > t.seq"
                out = (
                    DeltaTable.forPath(spark, path, options)
                    .alias("t")
                    .merge(
                        # the Spark types of the append path (`rows.typed_frame`): a local timestamp is TIMESTAMP_NTZ
                        spark.createDataFrame(rows, from_arrow_schema(rows.schema, prefer_timestamp_ntz=True)).alias(
                            "s"
                        ),
                        " AND ".join(merge_match(k, unsourced) for k in KEY),
                    )
                    .whenMatchedDelete(f"s.{TOMBSTONE} AND {newer}")
                    .whenMatchedUpdate(f"NOT s.{TOMBSTONE} AND {newer}", values)
                    .whenNotMatchedInsert(f"NOT s.{TOMBSTONE}", values)
                    .execute()
                )
                for k, n in _merge_metrics(out).items():
                    metrics[k] = metrics.get(k, 0) + n
        except Exception as err:
            conflict = _conflict(err)
            if conflict is None:
                raise
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: delta-spark's MERGE met another commit: {conflict}"
            ) from None
        finally:
            for k in (*TXN_CONF, USER_METADATA_CONF):
                spark.conf.unset(k)
        log.info("export: %s/%s: merged %d keys through delta-spark", p.topic, p.partition, rows.num_rows)
        crash_after_first_partition()  # test hook
    return loc.existing().version(), metrics


def _merge_metrics(out: Any) -> dict[str, int]:
    """delta-spark's MERGE metrics (its result's one row) under delta-rs's names; none for a skipped MERGE."""
    rows = out.collect() if out is not None else []
    if not rows:
        return {}
    got = rows[0].asDict()
    names = {"inserted": "num_inserted_rows", "updated": "num_updated_rows", "deleted": "num_deleted_rows"}
    return {f"num_target_rows_{k}": int(got[v]) for k, v in names.items() if got.get(v) is not None}


def _conflict(err: BaseException) -> str | None:
    """One line of delta-spark's refusal of a commit that conflicts with a concurrent one; None for other errors."""
    java = getattr(err, "java_exception", None) or getattr(err, "_origin", None)
    while java is not None:
        if java.getClass().getSimpleName() in CONFLICTS:
            return " ".join(str(java.getMessage()).split())[:300]
        java = java.getCause()
    return None
