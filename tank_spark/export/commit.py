"""The driver's commit: create or check the table, then one commit with every file and every partition's new
recorded version (the table's format: `tank_log.lakehouse`); or delta-spark's per-partition idempotent writes
(engine spark)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse import CommitConflict, DataFile, LakeTable, default_source
from tank_log.lakehouse.partitioning import delta_columns
from tank_log.lakehouse.table import parse_app_id, summary, summary_json
from tank_spark import jars
from tank_spark.context import FIXED_CONF
from tank_spark.export.hooks import crash_after_first_partition
from tank_spark.export.plan import ExportSettings, PartitionPlan
from tank_spark.export.schema import EVOLVABLE, protobuf_numbers
from tank_spark.export.topic_config import topic_config_metadata

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def create_table(settings: ExportSettings, schema: pa.Schema, configuration: dict[str, str] | None = None) -> LakeTable:
    """A new table; `configuration`: keys of ours it records (`latest.table_configuration`), and the Protobuf field
    numbers of its columns (`schema.protobuf_numbers`)."""
    recorded = {**(configuration or {}), **protobuf_numbers(settings)} or configuration
    return settings.location.create(schema, settings.partition_by, recorded)


def check_compatible(settings: ExportSettings, schema: pa.Schema, table: LakeTable) -> bool:
    """Refuse an existing table whose columns (names, order, types, nullability) or partitioning differ from what
    this export writes — before anything is written (a table written with other types can become unreadable) —, or
    that its engine cannot append to; return whether it only lacks `ts_raw` (a table made before that column:
    `add_ts_raw` evolves it). The delta-rs commits of the continuous export are checked as the deltalake engine's."""
    spark = settings.engine == "spark" and not settings.continuous
    names = tuple(f.name for f in EVOLVABLE)
    return table.check_compatible(settings.table, schema, settings.partition_by, evolvable=names, spark=spark)


def add_ts_raw(table: LakeTable) -> None:
    """Schema evolution of a table made before `ts_raw` or `source`: add the nullable columns it lacks, in order
    (old rows read them as null)."""
    for f in EVOLVABLE:
        if f.name not in table.arrow_schema().names:
            table.add_column(f)


class ConcurrentExport(RunFailed):
    """Another run committed to the table since this run planned: re-plan and retry. Once the retries are spent it
    fails the run with its message (an expected condition, e.g. a batch export beside a continuous one on the same
    partitions: one line, no traceback)."""


def commit(
    settings: ExportSettings, schema: pa.Schema, files: list[dict[str, Any]], plans: list[PartitionPlan], run_id: str
) -> int:
    """Commit the written files with each partition's new version, against the table's latest version.

    Raises:
        ConcurrentExport: a partition's recorded version moved since planning, or delta-rs found a conflicting
            concurrent commit (nothing committed).
    """
    table = settings.location.existing()  # the latest version: a snapshot from planning cannot see other runs
    check_unmoved(table, plans)
    data = [
        DataFile(
            f["path"],
            f["size"],
            json.loads(f["partition_values"]),
            f["modification_time"],
            f["num_records"],
            f["stats"],
        )
        for f in files
    ]
    versions = {p.app_id: p.end for p in plans if p.has_work and p.app_id and p.end is not None}
    try:
        return table.commit(
            schema, data, versions, run_id, topic_config_metadata((p.base_path, p.topic) for p in plans)
        )
    except CommitConflict as err:
        raise ConcurrentExport(str(err)) from None


def check_unmoved(table: LakeTable, plans: list[PartitionPlan]) -> None:
    """The formats do not skip an already-recorded version by themselves: refuse a commit on top of another run's.

    Raises:
        ConcurrentExport: a partition's recorded version moved since planning.
    """
    for p in plans:
        now = table.recorded_version(p.topic, p.partition)
        if now != p.previous:
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: the table's recorded version moved from {p.previous} to {now} "
                f"since this run planned (a concurrent export)"
            )


def commit_staged(settings: ExportSettings, plans: list[PartitionPlan], run_id: str) -> int:
    """`commit` of the files Spark's Iceberg writer staged under the run's id (`iceberg_spark`), against the table's
    latest version.

    Raises:
        ConcurrentExport: as `commit`'s.
    """
    from tank_log.lakehouse.iceberg import IcebergTable

    table = settings.location.existing()
    assert isinstance(table, IcebergTable)  # engine spark on an Iceberg table
    check_unmoved(table, plans)
    versions = {p.app_id: p.end for p in plans if p.has_work and p.app_id and p.end is not None}
    try:
        return table.commit_staged(
            run_id, versions, run_id, topic_config_metadata((p.base_path, p.topic) for p in plans)
        )
    except CommitConflict as err:
        raise ConcurrentExport(str(err)) from None


def remove_uncommitted(settings: ExportSettings, files: list[dict[str, Any]]) -> None:
    """Delete files this run wrote but did not commit (after a concurrent export)."""
    settings.location.delete([f["path"] for f in files])


def check_delta_spark(spark: SparkSession) -> None:
    jvm = spark._jvm
    assert jvm is not None  # a started session's
    try:
        jvm.java.lang.Class.forName(
            jars.DELTA_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader()
        )
    except Exception:
        raise JobConfigError(
            "engine spark needs Delta Lake's jars on the Spark classpath: bash scripts/setup.sh fetches them into "
            f"the checkout's .jars/ (now {jars.jar_dir() or 'off'}), or spark-submit --packages {jars.DELTA_PACKAGE}; "
            "use --engine deltalake (no jars needed) otherwise"
        ) from None


def table_version(table: LakeTable | None) -> int | None:
    return None if table is None else table.version()


def write_with_delta_spark(
    frame_of: Callable[[PartitionPlan], DataFrame],
    settings: ExportSettings,
    work: list[PartitionPlan],
    run_id: str,
    done: list[PartitionPlan],
    committed: dict[tuple[str, int], tuple[int, int]] | None = None,
    refused: dict[tuple[str, int], str] | None = None,
) -> int | None:
    """engine=spark: one Delta commit per partition through delta-spark, its app transaction (`txnAppId`/`txnVersion`:
    the partition's app id and the run's last seq) in the same commit, so a partition is committed once or not at all
    (not atomic across partitions: a run that dies midway leaves the committed partitions committed, and the next
    run exports the others). Each committed partition is appended to `done`, and the files and bytes its commit
    added are put in `committed`. A partition whose rows a constraint of the table refuses (a CHECK constraint, a
    NOT NULL column, a generated column's expression) has nothing written: its one-line reason is put in `refused`
    (without it, the error is raised) and the other partitions are exported.

    delta-spark skips a write whose version is not above the recorded one, but not one that starts elsewhere: a run
    whose range began before another run's end would write the rows between them again. So each partition's
    recorded version is checked right before its write, and after it the table's history: a commit of the same app
    transaction between that check and this write is reported, never hidden.

    Raises:
        ConcurrentExport: a partition's recorded version moved since planning (nothing written for it).
        RunFailed: another run committed the same partition between the check and this run's commit.
    """
    loc = settings.location
    path, options = loc.spark_path(), loc.spark_options()
    committed = {} if committed is None else committed
    table = loc.existing()  # one snapshot, brought up to date before each partition: opening the table each time cost
    for p in work:  # ~28 ms a partition at 8,000 partitions, bringing it up to date after a commit ~8 ms
        table.refresh()  # the latest version: a snapshot from planning, or the last partition's, misses other runs
        now = table.recorded_version(p.topic, p.partition)
        if now != p.previous:
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: the table's recorded version moved from {p.previous} to {now} "
                f"since this run planned (a concurrent export)"
            )
        checked = table.version()
        frame = frame_of(p)
        for k, v in FIXED_CONF.items():  # a session the job did not start (tank_spark.context) writes the same files
            frame.sparkSession.conf.set(k, v)
        try:
            (
                frame.write.format("delta")
                .mode("append")
                .options(**options)
                .option("txnAppId", p.app_id)
                .option("txnVersion", p.end)
                .option("userMetadata", user_metadata(settings, p, run_id))
                # the table exists (delta-rs made it): a transform's partition column is generated, Delta computes
                # it, and naming it in partitionBy would ask the frame for it
                .partitionBy(*([] if delta_columns(settings.partition_by) else settings.partition_by))
                .save(path)
            )
        except Exception as err:
            violation = constraint_violation(err)
            if violation is None or refused is None:
                raise
            refused[(p.topic, p.partition)] = violation
            log.error("export: %s/%s: nothing written: %s", p.topic, p.partition, violation)
            continue
        done.append(p)
        committed[(p.topic, p.partition)] = _check_alone(settings, table, p, checked)
        crash_after_first_partition()  # test hook
    return table_version(loc.open())


def user_metadata(settings: ExportSettings, p: PartitionPlan, run_id: str) -> str:
    """The summary of one partition's delta-spark commit (`summary`), as the JSON of its commitInfo's `userMetadata`
    (delta-spark writes no other field of ours; DESCRIBE HISTORY shows this one)."""
    parsed = parse_app_id(p.app_id or "")
    source = (parsed[1] if parsed else None) or settings.location.source or default_source()
    assert p.end is not None  # a partition with work
    return summary_json(summary(run_id, source, {(p.topic, p.partition): (p.first, p.end)}))


VIOLATION = "org.apache.spark.sql.delta.schema.DeltaInvariantViolationException"


def constraint_violation(err: BaseException) -> str | None:
    """delta-spark's refusal of rows a constraint of the table forbids, in one line (its message names the
    constraint and the row's values); None for any other error."""
    java = getattr(err, "java_exception", None) or getattr(err, "_origin", None)  # py4j's, or PySpark's captured
    while java is not None:
        if java.getClass().getName() == VIOLATION:
            return " ".join(line.strip() for line in str(java.getMessage()).splitlines() if line.strip())
        java = java.getCause()
    return None


def _check_alone(settings: ExportSettings, table: LakeTable, p: PartitionPlan, checked: int) -> tuple[int, int]:
    """Raise if more than one commit after version `checked` recorded this partition's app transaction: this run's
    and another's, both written from before the other's end (delta-spark cannot check where a write starts). Return
    the files and bytes the commit that recorded it added ((0, 0): delta-spark skipped the write)."""
    loc = settings.location
    filesystem, root = loc.filesystem()
    table.refresh()
    latest = table.version()
    recorded = 0
    added = (0, 0)
    for v in range(checked + 1, latest + 1):
        with filesystem.open_input_stream(f"{root}/_delta_log/{v:020d}.json") as f:
            actions = [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
        if any(a.get("txn", {}).get("appId") == p.app_id for a in actions):
            recorded += 1
            adds = [a["add"] for a in actions if "add" in a]
            added = (len(adds), sum(int(a.get("size", 0)) for a in adds))
    if recorded > 1:
        raise RunFailed(
            f"{p.topic}/{p.partition}: another export committed this partition while this run wrote it (table "
            f"versions {checked + 1}-{latest}): rows after seq {p.previous} may be in the table twice"
        )
    return added
