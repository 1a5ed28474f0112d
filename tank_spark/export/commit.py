"""The driver's Delta commit: create or check the table, then one transaction with every file and every partition's
app transaction (delta-rs); or delta-spark's per-partition idempotent writes (engine spark)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse import recorded_version
from tank_spark.export.plan import ExportSettings, PartitionPlan
from tank_spark.export.run_id import COMMIT_KEY
from tank_spark.export.topic_config import topic_config_metadata
from tank_spark.schema import TS_RAW

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake import Schema as DeltaSchema
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def create_table(settings: ExportSettings, schema: pa.Schema) -> DeltaTable:
    from deltalake import DeltaTable

    loc = settings.location
    return DeltaTable.create(
        loc.uri,
        schema=schema,
        partition_by=list(settings.partition_by),
        mode="error",
        storage_options=loc.options or None,
    )


def check_compatible(settings: ExportSettings, schema: pa.Schema, table: DeltaTable) -> bool:
    """Refuse an existing table whose columns (names, order, types, nullability) or partitioning differ from what
    this export writes — before anything is written (a table written with other types can become unreadable);
    return whether it only lacks `ts_raw` (a table made before that column: `add_ts_raw` evolves it)."""
    from deltalake import Schema

    have = _columns(table.schema())
    want = _columns(Schema.from_arrow(schema))
    lacks_ts_raw = have == want[:-1] and want[-1][0] == TS_RAW.name
    if have != want and not lacks_ts_raw:
        raise JobConfigError(
            f"existing table {settings.table} does not match this export (value format/schema differ?): "
            + "; ".join(_schema_diff(have, want))
        )
    parts = list(table.metadata().partition_columns)
    if parts != list(settings.partition_by):
        raise JobConfigError(
            f"existing table {settings.table} is partitioned by {parts}, not {list(settings.partition_by)}"
        )
    return lacks_ts_raw


Column = tuple[str, str, bool]  # name, Delta type (JSON), nullable


def _columns(delta_schema: DeltaSchema) -> list[Column]:
    return [
        (f["name"], f["type"] if isinstance(f["type"], str) else json.dumps(f["type"], sort_keys=True), f["nullable"])
        for f in json.loads(delta_schema.to_json())["fields"]
    ]


def _schema_diff(have: list[Column], want: list[Column]) -> list[str]:
    """Human-readable differences: `column: table has X, this export writes Y`."""

    def show(c: Column) -> str:
        return f"{c[1]}{'' if c[2] else ' not null'}"

    by_name = {c[0]: c for c in have}
    out = []
    for c in want:
        h = by_name.get(c[0])
        if h is None:
            out.append(f"{c[0]}: missing in the table (this export writes {show(c)})")
        elif h != c:
            out.append(f"{c[0]}: table has {show(h)}, this export writes {show(c)}")
    extra = [c[0] for c in have if c[0] not in {w[0] for w in want}]
    if extra:
        out.append(f"table has columns this export does not write: {', '.join(extra)}")
    if not out:
        out.append(f"column order: table has {[c[0] for c in have]}, this export writes {[c[0] for c in want]}")
    return out


def add_ts_raw(table: DeltaTable) -> None:
    """Schema evolution of a table made before `ts_raw`: add the nullable column (old rows read it as null)."""
    from deltalake import Field
    from deltalake.schema import PrimitiveType

    table.alter.add_columns([Field(TS_RAW.name, PrimitiveType("decimal(20,0)"), nullable=True)])


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
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    table = settings.location.existing()  # the latest version: a snapshot from planning cannot see other runs
    for p in plans:  # delta-rs does not skip an already-recorded version by itself
        _, now = recorded_version(table, settings.table, p.topic, p.partition)
        if now != p.previous:
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: the table's recorded version moved from {p.previous} to {now} "
                f"since this run planned (a concurrent export)"
            )
    actions: list[AddAction | RemoveAction] = [  # what create_write_transaction takes
        AddAction(f["path"], f["size"], json.loads(f["partition_values"]), f["modification_time"], True, f["stats"])
        for f in files
    ]
    txns = [Transaction(p.app_id, p.end) for p in plans if p.has_work and p.app_id and p.end is not None]
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=list(settings.partition_by),
            commit_properties=CommitProperties(
                app_transactions=txns,
                custom_metadata={COMMIT_KEY: run_id, **topic_config_metadata((p.base_path, p.topic) for p in plans)},
            ),
        )
    except CommitFailedError as err:
        if landed(settings, run_id):
            log.warning("export: delta-rs reported %s, but this run's commit is in the table: committed", err)
            return settings.location.existing().version()
        raise ConcurrentExport(f"commit conflict: {err}") from None
    return settings.location.existing().version()


LANDED_LOOKBACK = 200  # commits read back to find this run's own


def landed(settings: ExportSettings, run_id: str) -> bool:
    """Whether this run's commit is in the table after all. An object store's response can be lost after the put
    succeeded (a timeout on a loaded server); delta-rs then retries, finds the version taken by its own commit, and
    reports a conflict with it ("Concurrent transaction failed": the same app transactions). Taking that for a
    failure would delete the files of a commit that stands: rows lost, and their app transactions recorded, so
    retention would delete them in TANK as well (found by the fleet soak)."""
    table = settings.location.existing()
    return any(h.get(COMMIT_KEY) == run_id for h in table.history(limit=LANDED_LOOKBACK))


def remove_uncommitted(settings: ExportSettings, files: list[dict[str, Any]]) -> None:
    """Delete files this run wrote but did not commit (after a concurrent export)."""
    settings.location.delete([f["path"] for f in files])


def check_delta_spark(spark: SparkSession) -> None:
    jvm = spark._jvm
    assert jvm is not None  # a started session's
    try:
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:
        raise JobConfigError(
            "engine spark needs Delta Lake's jars on the Spark classpath (e.g. spark-submit --packages "
            "io.delta:delta-spark_2.13:4.0.0 --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
            "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog); "
            "use --engine deltalake (no jars needed) otherwise"
        ) from None


def table_version(table: DeltaTable | None) -> int | None:
    return None if table is None else table.version()


def write_with_delta_spark(df: DataFrame, settings: ExportSettings, work: list[PartitionPlan]) -> int | None:
    """engine=spark: one idempotent Delta commit per partition (txnAppId/txnVersion)."""
    from pyspark.sql import functions as F

    for p in work:
        (
            df.filter((F.col("topic") == p.topic) & (F.col("partition") == p.partition))
            .write.format("delta")
            .mode("append")
            .option("txnAppId", p.app_id)
            .option("txnVersion", p.end)
            .option("mergeSchema", "true")  # a table made before ts_raw gains it
            .partitionBy(*settings.partition_by)
            .save(settings.table)
        )
    return table_version(settings.location.open())
