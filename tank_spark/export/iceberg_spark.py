"""engine=spark for Iceberg tables: Iceberg's Spark writer writes the data files, pyiceberg commits them together with
every partition's new recorded version, in one commit.

Iceberg's Spark writer (`DataFrameWriterV2`) honours what the table asks of its files (its partition spec and
transforms, sort order, file format and write properties) — what users running Spark expect of it. But a Spark
append commits by itself, and cannot set the table properties that hold the recorded versions in the same commit;
recording them in a second commit would leave rows committed without their version after a kill between the two
(the rerun would write them again), and a Spark append retried after a conflict re-applies the same rows on top of
the winner's (duplicates, `iceberg.py`). So the write is staged (Iceberg's write-audit-publish: `spark.wap.id` set to
the run's id, the table's `write.wap.enabled`): Spark's commit adds a snapshot that is not the table's current one,
which no reader sees. The driver then commits exactly as the deltalake engine does (`commit.commit_staged`): the
partitions' recorded versions re-checked against the latest table, then ONE pyiceberg commit, with commit retries
off and the table's current snapshot as its requirement, appending the staged files and setting the versions.

- A kill before that commit leaves a staged snapshot and its files, which nothing reads and no recorded version
  names: the rerun plans from the same versions and writes again (the leftovers go with the table's snapshot
  expiry: `--vacuum`).
- A concurrent writer's commit fails this one (`CommitConflict`): the run re-plans, as the deltalake engine's.
- The commit names the staged snapshot (`source-snapshot-id`, `published-wap-id`, as Iceberg's cherry-pick does), and
  the staged snapshot is then removed: Iceberg's snapshot expiry knows the files as published either way.

`--mode latest` (`merge_with_iceberg_spark`) stages Spark SQL's MERGE the same way: a copy-on-write MERGE's staged
snapshot removes the files holding the keys it changes and adds their rewrites, and the one commit publishes both,
with the versions, only onto the snapshot the MERGE read (any other commit since is a conflict: re-plan). Iceberg's
Spark runtime can name snapshot properties of a MERGE's own commit (`spark.sql.iceberg.snapshot-property.*`, or
`CommitMetadata.withCommitProperties` around it), but not the table properties that hold the recorded versions, in
the same commit: staging keeps one commit for both, as the append does, and needs no JVM callback (Spark Connect).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse.iceberg import IcebergTable
from tank_log.lakehouse.location import RestCatalog
from tank_spark import jars
from tank_spark.export.commit import ConcurrentExport, check_unmoved, commit, commit_staged
from tank_spark.export.hooks import HOLD_BEFORE_COMMIT, crash_before_commit, hold
from tank_spark.export.run_id import new_run_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tank_log.lakehouse import LakeTable
    from tank_log.lakehouse.location import TableLocation
    from tank_spark.context import JobContext
    from tank_spark.export.plan import ExportSettings, PartitionPlan
    from tank_spark.tasks import Workers

log = logging.getLogger(__name__)

ICEBERG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
MERGE_MODE = "write.merge.mode"  # Iceberg's table property: copy-on-write (the default) or merge-on-read


def check_iceberg_spark(spark: SparkSession) -> None:
    """Raises:
    JobConfigError: Iceberg's Spark runtime is not on the session's classpath.
    """
    jvm = spark._jvm
    assert jvm is not None  # a started session's
    try:
        jvm.java.lang.Class.forName(ICEBERG_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
    except Exception:
        raise JobConfigError(
            "engine spark on an Iceberg table needs Iceberg's Spark runtime on the Spark classpath: bash "
            f"scripts/setup.sh fetches it into the checkout's .jars/ (now {jars.jar_dir() or 'off'}), or "
            f"spark-submit --packages {jars.ICEBERG_PACKAGE}; use --engine deltalake (pyiceberg writes) otherwise"
        ) from None


def spark_table(spark: SparkSession, location: TableLocation) -> str:
    """Register the table's catalog in the session (`tank_spark.iceberg_catalog`) and return the table's name there.
    A REST catalog gets a Spark catalog of its own endpoint's (a session keeps the first settings of a catalog it
    used: two exports in one session may reach two REST catalogs); a SQL catalog is `tank_log`, as pyiceberg files it.

    Raises:
        JobConfigError: a catalog Spark's Iceberg runtime cannot open here.
    """
    from tank_spark.iceberg_catalog import SQL_CATALOG_NAME
    from tank_spark.iceberg_catalog import spark_table as spark_catalog_table

    name = SQL_CATALOG_NAME
    if isinstance(location.catalog, RestCatalog):
        endpoint = f"{location.catalog.uri}|{location.catalog.warehouse or ''}"
        name = f"{SQL_CATALOG_NAME}_{hashlib.sha1(endpoint.encode()).hexdigest()[:12]}"
    try:
        table = spark_catalog_table(location, name)
    except ValueError as err:
        raise JobConfigError(f"engine spark: {err}") from None
    for key, value in table.conf.items():
        spark.conf.set(key, value)
    return table.name


def append_with_iceberg_spark(
    ctx: JobContext,
    spark: SparkSession,
    workers: Workers,
    settings: ExportSettings,
    schema: pa.Schema,
    plans: list[PartitionPlan],
) -> Any:
    """engine=spark, Iceberg table: every partition's rows in one staged Spark write, then ONE commit of its files
    with every partition's new version (module docstring), typed values' dead letters committed (by pyiceberg:
    `dead_letters.py`) right before it; a concurrent commit re-plans. Returns the job's `_Appended`."""
    from tank_spark.export import job
    from tank_spark.export.plan import plan_export
    from tank_spark.export.rows import decoded_frame

    table = settings.location.existing()
    assert isinstance(table, IcebergTable)  # the job checked the format
    table.enable_staging()
    name = spark_table(spark, settings.location)
    for attempt in range(1, job.COMMIT_ATTEMPTS + 1):
        run_id = new_run_id()
        outcomes, cut, bad = job.decode_pre_pass(workers, ctx, settings, schema, plans, run_id)
        work = [p for p in cut.plans if p.has_work]
        t0 = time.monotonic()
        spark.conf.set("spark.wap.id", run_id)
        try:
            if work:  # else every partition failed (on_bad_record fail): its dead letters alone
                frame = decoded_frame(spark, ctx, settings, work, schema)
                frame.writeTo(name).option("fanout-enabled", "true").append()
        finally:
            spark.conf.unset("spark.wap.id")
        log.info("export: Spark's Iceberg writer staged the rows in %.2fs (wap.id %s)", time.monotonic() - t0, run_id)
        hold(HOLD_BEFORE_COMMIT)  # test hook
        crash_before_commit(len(work))  # test hook
        try:
            if bad is not None:
                bad.commit(settings, cut.plans, run_id)  # first: dead_letters.py
            version = commit_staged(settings, work, run_id) if work else settings.location.existing().version()
        except ConcurrentExport as conflict:
            if attempt == job.COMMIT_ATTEMPTS:
                spent = f"nothing committed after {job.COMMIT_ATTEMPTS} attempts"
                raise job._out_of_attempts(conflict, spent) from None
            log.warning("export: %s; nothing committed, re-planning (attempt %d)", conflict, attempt + 1)
            plans, _ = plan_export(ctx, settings)
            if not any(p.has_work for p in plans):
                return job._Appended(job._results(plans), [], None, settings.location.existing().version())
            continue
        results = job._results(plans)
        for o in outcomes:
            if o.index in cut.kept:
                job._count(results[o.key], o.rows, o.min_seq, o.max_seq)
        for p in work:
            results[(p.topic, p.partition)]["status"] = "exported"
            if bad is not None and (p.topic, p.partition) in bad.counts:  # read, not decoded: not in the table
                results[(p.topic, p.partition)]["rows"] -= bad.counts[(p.topic, p.partition)].bad
        return job._Appended(results, [], cut, version, bad)
    raise AssertionError("unreachable: the last attempt returns or raises")


def check_merge_mode(name: str, table: LakeTable) -> None:
    """Raises:
    JobConfigError: a merge-on-read Iceberg table (Spark's MERGE writes delete files, which the commit of
        `merge_with_iceberg_spark` does not publish).
    """
    mode = table.properties().get(MERGE_MODE, "copy-on-write")
    if mode != "copy-on-write":
        raise JobConfigError(
            f"table {name}: {MERGE_MODE} is {mode}: --mode latest --engine spark merges copy-on-write Iceberg tables "
            "(its commit publishes data files, not delete files); use --engine deltalake"
        )


def merge_with_iceberg_spark(
    spark: SparkSession,
    settings: ExportSettings,
    schema: pa.Schema,
    source: pa.Table,
    work: list[PartitionPlan],
    run_id: str,
    *,
    keys: tuple[str, ...],
    tombstone: str,
) -> tuple[int, dict[str, int]]:
    """--mode latest, engine=spark, Iceberg table: Spark SQL's MERGE of `source` (one row per key with its
    `tombstone` flag, matched on `keys` and conditioned as delta-spark's: `latest._merge_with_delta_spark`), staged
    under the run's id as the append's write is (module docstring), then ONE commit publishing it with every
    partition's new version (`commit.commit_staged`): the files the MERGE removed and added, in one overwrite onto
    the snapshot the MERGE read. A kill before that commit leaves the table as it was, and the rerun plans from the
    same versions and merges once. The rows inserted, updated and deleted are counted by joining `source` with that
    snapshot. A source with no row, or a MERGE that changed nothing, records the versions alone (pyiceberg).

    Raises:
        JobConfigError: a merge-on-read table (its MERGE writes delete files, which the commit does not publish).
        ConcurrentExport: a partition's recorded version moved, or another writer committed after the MERGE read.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from tank_log.lakehouse.table import LEGACY_SOURCE_KEY, merge_match, owns_unsourced

    table = settings.location.existing()
    assert isinstance(table, IcebergTable)  # the job checked the format
    check_merge_mode(settings.table, table)
    check_unmoved(table, work)
    if not source.num_rows:  # nothing keyed: the versions alone
        return commit(settings, schema, [], work, run_id), {}
    table.enable_staging()
    name = spark_table(spark, settings.location)
    view = "tank_log_latest_" + re.sub(r"\W", "_", run_id)
    frame = spark.createDataFrame(source, from_arrow_schema(source.schema, prefer_timestamp_ntz=True))
    frame.createOrReplaceTempView(view)
    unsourced = owns_unsourced(settings.location.source, table.properties().get(LEGACY_SOURCE_KEY))
    match = " AND ".join(merge_match(k, unsourced) for k in keys)
    columns = [f"`{c}`" for c in source.column_names if c != tombstone]
    gone = f"s.`{tombstone}`"
    t0 = time.monotonic()
    spark.conf.set("spark.wap.id", run_id)
    try:
        _run_merge(
            spark,
            f"MERGE INTO {name} t USING {view} s ON {match} "
            f"WHEN MATCHED AND {gone} AND s.seq > t.seq THEN DELETE "
            f"WHEN MATCHED AND NOT {gone} AND s.seq > t.seq THEN UPDATE SET "
            + ", ".join(f"t.{c} = s.{c}" for c in columns)
            + f" WHEN NOT MATCHED AND NOT {gone} THEN INSERT ({', '.join(columns)}) "
            + f"VALUES ({', '.join(f's.{c}' for c in columns)})",
        )
        staged = spark.sql(
            f"SELECT snapshot_id, parent_id FROM {name}.snapshots WHERE summary['wap.id'] = '{run_id}'"
        ).collect()
        if staged:
            read = None if staged[0].parent_id is None else f"{name} VERSION AS OF {staged[0].parent_id}"
        else:
            read = None if table.version() == 0 else name
        t1 = time.monotonic()
        metrics = _merge_counts(spark, view, read, match, gone)
    finally:
        spark.conf.unset("spark.wap.id")
        spark.catalog.dropTempView(view)
    took, counted = t1 - t0, time.monotonic() - t1
    log.info(
        "export: Spark's Iceberg MERGE of %d keys staged in %.2fs, counted in %.2fs (wap.id %s)",
        source.num_rows, took, counted, run_id,
    )  # fmt: skip
    crash_before_commit(source.num_rows)  # test hook
    if not staged:  # nothing to publish: the versions alone, if the MERGE had nothing to change
        if any(metrics.values()):
            raise RunFailed(
                f"table {settings.table}: Spark's MERGE staged no snapshot under wap.id {run_id} though it changes "
                f"rows ({metrics}): nothing recorded"
            )
        return commit(settings, schema, [], work, run_id), metrics
    return commit_staged(settings, work, run_id), metrics


ICEBERG_CONFLICTS = ("org.apache.iceberg.exceptions.CommitFailedException", "org.apache.iceberg.exceptions.Validation")


def _run_merge(spark: SparkSession, sql: str) -> None:
    """Run the MERGE; Iceberg's refusal of its staged commit after another writer's (a conflict: the table's commit
    retries are off, `tank_log.lakehouse.iceberg`) is a `ConcurrentExport`, read from the error's text (Spark
    Connect's errors hold no JVM exception).

    Raises:
        ConcurrentExport: another writer committed while the MERGE ran (nothing staged is published).
    """
    try:
        spark.sql(sql)
    except Exception as err:
        text = str(err)
        found = next((c for c in ICEBERG_CONFLICTS if c in text), None)
        if found is None:
            raise
        raise ConcurrentExport(f"Spark's Iceberg MERGE met another commit: {found.rsplit('.', 1)[-1]}") from None


def _merge_counts(spark: SparkSession, view: str, target: str | None, match: str, gone: str) -> dict[str, int]:
    """The MERGE's rows inserted, updated and deleted, under delta-rs's names: `view` (the source) joined with
    `target` (the snapshot the MERGE read; None: the table had none)."""
    if target is None:
        (row,) = spark.sql(f"SELECT count_if(NOT {gone}) AS inserted FROM {view} s").collect()
        counts = {"inserted": row.inserted, "updated": 0, "deleted": 0}
    else:
        (row,) = spark.sql(
            "SELECT count_if(t.seq IS NULL AND NOT {g}) AS inserted, "
            "count_if(s.seq > t.seq AND NOT {g}) AS updated, count_if(s.seq > t.seq AND {g}) AS deleted "
            f"FROM {view} s LEFT JOIN {target} t ON {match}".format(g=gone)
        ).collect()
        counts = row.asDict()
    return {f"num_target_rows_{k}": int(v or 0) for k, v in counts.items()}
