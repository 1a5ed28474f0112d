"""The driver's Delta commit: create or check the table, then one transaction with every file and every partition's
app transaction (delta-rs); or delta-spark's per-partition idempotent writes (engine spark)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse import recorded_version
from tank_spark import jars
from tank_spark.export.hooks import crash_after_first_partition
from tank_spark.export.plan import ExportSettings, PartitionPlan
from tank_spark.export.run_id import COMMIT_KEY
from tank_spark.export.topic_config import topic_config_metadata
from tank_spark.schema import TS_RAW

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake import Schema as DeltaSchema
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def create_table(
    settings: ExportSettings, schema: pa.Schema, configuration: dict[str, str] | None = None
) -> DeltaTable:
    """A new table; `configuration`: keys of ours it records (`latest.table_configuration`)."""
    from deltalake import DeltaTable

    loc = settings.location
    return DeltaTable.create(
        loc.uri,
        schema=schema,
        partition_by=list(settings.partition_by),
        mode="error",
        configuration=configuration,
        storage_options=loc.options or None,
        raise_if_key_not_exists=configuration is None,  # delta-rs knows only delta.* keys
    )


def check_compatible(settings: ExportSettings, schema: pa.Schema, table: DeltaTable) -> bool:
    """Refuse an existing table whose columns (names, order, types, nullability) or partitioning differ from what
    this export writes — before anything is written (a table written with other types can become unreadable) —, or
    that delta-rs cannot append to (`check_features`; delta-spark can, and computes generated columns, which the
    delta-spark engine therefore accepts beside its own); return whether it only lacks `ts_raw` (a
    table made before that column: `add_ts_raw` evolves it)."""
    from deltalake import Schema

    if settings.engine != "spark" or settings.continuous:  # delta-rs commits (the continuous export's too)
        check_features(settings, table)
    else:
        check_plannable(settings, table)
    have = [c for c in _columns(table.schema()) if settings.engine != "spark" or c[0] not in generated_columns(table)]
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


# The table features of a table delta-rs commits this export's files to, each checked with a table delta-spark made
# (tests/spark/test_delta_spark.py): appending Parquet files with their statistics is all a writer of these must
# do. Any other feature is refused before anything is written (delta-rs itself would refuse it at the commit, after
# the files were written): rowTracking, domainMetadata (liquid clustering), inCommitTimestamp, typeWidening,
# identityColumns, icebergCompat…, and columnMapping (Parquet columns named by their physical names).
APPENDABLE_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",  # a column with an invariant is refused below
        "checkConstraints",  # a table with a constraint is refused below
        "changeDataFeed",  # an append writes no change files
        "generatedColumns",  # a generated column is refused below
        "deletionVectors",  # new files have none
        "v2Checkpoint",  # delta-rs reads the recorded versions through them (its data reader refuses the feature)
        "timestampNtz",
        "vacuumProtocolCheck",
    }
)
# Protocol versions before table features (writer 7) stand for these.
LEGACY_WRITER_FEATURES = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}


def table_features(table: DeltaTable) -> set[str]:
    """The writer features of the table's protocol (legacy versions below 7 translated)."""
    protocol = table.protocol()
    if protocol.min_writer_version >= 7:
        return set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    return {f for v, fs in LEGACY_WRITER_FEATURES.items() if protocol.min_writer_version >= v for f in fs}


def generated_columns(table: DeltaTable) -> set[str]:
    return {
        f["name"]
        for f in json.loads(table.schema().to_json())["fields"]
        if "delta.generationExpression" in (f.get("metadata") or {})
    }


def check_plannable(settings: ExportSettings, table: DeltaTable) -> None:
    """The delta-spark engine plans (each partition's recorded version) through delta-rs, which cannot read a table
    with column mapping once it holds rows: refuse it from the start.

    Raises:
        JobConfigError: one line naming the table and the feature.
    """
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise JobConfigError(
            f"table {settings.table} uses table feature columnMapping (delta.columnMapping.mode={mode}): this export "
            "plans with delta-rs, which cannot read such tables"
        )


def check_features(settings: ExportSettings, table: DeltaTable) -> None:
    """Refuse, before anything is written, a table the delta-rs engine cannot append to correctly: a table feature
    outside `APPENDABLE_FEATURES`, or what this export's files would not honour (a CHECK constraint, a generated,
    identity or invariant column: the delta-spark engine evaluates those).

    Raises:
        JobConfigError: one line naming the table and the feature.
    """
    where = f"table {settings.table}"
    hint = "; the delta-spark engine (--engine spark) writes such tables"
    unsupported = sorted(table_features(table) - APPENDABLE_FEATURES)
    if unsupported:
        raise JobConfigError(
            f"{where} uses table feature(s) {', '.join(unsupported)}, which the delta-rs engine cannot append to{hint}"
        )
    constraints = {k: v for k, v in table.metadata().configuration.items() if k.startswith("delta.constraints.")}
    if constraints:
        k, v = next(iter(sorted(constraints.items())))
        raise JobConfigError(
            f"{where} has CHECK constraint {k.removeprefix('delta.constraints.')} ({v}) (table feature "
            f"checkConstraints), which the delta-rs engine does not evaluate{hint}"
        )
    for f in json.loads(table.schema().to_json())["fields"]:
        meta = f.get("metadata") or {}
        for key, feature in (
            ("delta.generationExpression", "generatedColumns"),
            ("delta.identity.start", "identityColumns"),
            ("delta.invariants", "invariants"),
        ):
            if key in meta:
                raise JobConfigError(
                    f"{where}: column {f['name']} is a {feature} column ({key}), which the delta-rs engine does not "
                    f"compute or check{hint}"
                )


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
        jvm.java.lang.Class.forName(
            jars.DELTA_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader()
        )
    except Exception:
        raise JobConfigError(
            "engine spark needs Delta Lake's jars on the Spark classpath: bash scripts/setup.sh fetches them into "
            f"the checkout's .jars/ (now {jars.jar_dir() or 'off'}), or spark-submit --packages {jars.DELTA_PACKAGE}; "
            "use --engine deltalake (no jars needed) otherwise"
        ) from None


def table_version(table: DeltaTable | None) -> int | None:
    return None if table is None else table.version()


def write_with_delta_spark(
    frame_of: Callable[[PartitionPlan], DataFrame],
    settings: ExportSettings,
    work: list[PartitionPlan],
    run_id: str,
    done: list[PartitionPlan],
) -> int | None:
    """engine=spark: one Delta commit per partition through delta-spark, its app transaction (`txnAppId`/`txnVersion`:
    the partition's app id and the run's last seq) in the same commit, so a partition is committed once or not at all
    (not atomic across partitions: a run that dies midway leaves the committed partitions committed, and the next
    run exports the others). Each committed partition is appended to `done`.

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
    for p in work:
        table = loc.existing()
        _, now = recorded_version(table, settings.table, p.topic, p.partition)
        if now != p.previous:
            raise ConcurrentExport(
                f"{p.topic}/{p.partition}: the table's recorded version moved from {p.previous} to {now} "
                f"since this run planned (a concurrent export)"
            )
        checked = table.version()
        (
            frame_of(p)
            .write.format("delta")
            .mode("append")
            .options(**options)
            .option("txnAppId", p.app_id)
            .option("txnVersion", p.end)
            .option("userMetadata", json.dumps({COMMIT_KEY: run_id}))
            .partitionBy(*settings.partition_by)
            .save(path)
        )
        done.append(p)
        _check_alone(settings, p, checked)
        crash_after_first_partition()  # test hook
    return table_version(loc.open())


def _check_alone(settings: ExportSettings, p: PartitionPlan, checked: int) -> None:
    """Raise if more than one commit after version `checked` recorded this partition's app transaction: this run's
    and another's, both written from before the other's end (delta-spark cannot check where a write starts)."""
    loc = settings.location
    filesystem, root = loc.filesystem()
    latest = loc.existing().version()
    recorded = 0
    for v in range(checked + 1, latest + 1):
        with filesystem.open_input_stream(f"{root}/_delta_log/{v:020d}.json") as f:
            for line in f.read().decode().splitlines():
                txn = json.loads(line).get("txn") if line.strip() else None
                recorded += txn is not None and txn.get("appId") == p.app_id
    if recorded > 1:
        raise RunFailed(
            f"{p.topic}/{p.partition}: another export committed this partition while this run wrote it (table "
            f"versions {checked + 1}-{latest}): rows after seq {p.previous} may be in the table twice"
        )
