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
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError
from tank_log.lakehouse.iceberg import IcebergTable
from tank_log.lakehouse.location import RestCatalog
from tank_spark import jars
from tank_spark.export.commit import ConcurrentExport, commit_staged
from tank_spark.export.hooks import HOLD_BEFORE_COMMIT, crash_before_commit, hold
from tank_spark.export.run_id import new_run_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tank_log.lakehouse.location import TableLocation
    from tank_spark.context import JobContext
    from tank_spark.export.plan import ExportSettings, PartitionPlan
    from tank_spark.tasks import Workers

log = logging.getLogger(__name__)

ICEBERG_CLASS = "org.apache.iceberg.spark.SparkCatalog"


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
