"""The Delta Lake table format through delta-rs (`deltalake`): the one module that imports it.

Each partition's recorded version is an application transaction (`app_id`, version = its last exported seq),
committed in the same transaction as the data files. Commits to S3 are safe against concurrent writers without a
locking provider: delta-rs (>= 1.0) writes each log entry with a conditional PUT (`If-None-Match`), which S3 (since
2024), MinIO, R2 and moto honour; a writer that loses the race re-reads the log and retries at the next version (see
README, Delta export on object storage), and one whose app transactions conflict fails (`CommitConflict`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from deltalake import DeltaTable

from tank_log.errors import JobConfigError
from tank_log.lakehouse.partitioning import delta_columns, delta_term, partition_names
from tank_log.lakehouse.table import (
    APP_ID_PREFIX,
    LEGACY_SOURCE_KEY,
    RUN_KEY,
    USER_METADATA,
    CommitConflict,
    DataFile,
    Recorded,
    RunCommit,
    TableUnreadable,
    UpkeepStep,
    app_id,
    candidate_ids,
    commit_summary,
    lacks_only,
    merge_match,
    owns_unsourced,
    summary_json,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake import Schema as DeltaSchema

    from tank_log.lakehouse.location import LakeTable, TableLocation

log = logging.getLogger(__name__)

DEFAULT_DELETED_FILE_RETENTION_MS = 7 * 24 * 3600 * 1000  # Delta's default delta.deletedFileRetentionDuration
LANDED_LOOKBACK = 200  # commits read back to find a run's own


def table_id(table: DeltaTable) -> str:
    """The Delta table's own id: its metaData id, a UUID string (deltalake annotates it `int`)."""
    return str(table.metadata().id)


def recorded_version(
    table: DeltaTable, table_path: str, topic: str, partition: int, source: str | None = None
) -> tuple[str, int | None]:
    """(app id, last exported seq recorded in the table for the partition of `source` — None: this host's, as the
    export's default —, None if never), as the table records it (`DeltaLakeTable.recorded` checks its history)."""
    from tank_log.lakehouse.location import TableLocation
    from tank_log.lakehouse.table import default_source

    source = source or default_source()
    owner = table.metadata().configuration.get(LEGACY_SOURCE_KEY)
    ids = candidate_ids(table_id(table), table_path, topic, partition, source, owner)
    filesystem, root = TableLocation.of(table_path).filesystem()  # a relative path too, as the table was opened
    return _first_recorded(app_transactions(table, filesystem, root), ids)


def _first_recorded(txns: dict[str, int], ids: list[str]) -> tuple[str, int | None]:
    """The first of `ids` that `txns` records, and its version; (the first id, None) if none."""
    for aid in ids:
        if aid in txns:
            return aid, txns[aid]
    return ids[0], None


TXN_RETENTION_KEY = "delta.setTransactionRetentionDuration"
_COMMIT_FILE = re.compile(r"(\d{20})\.json")
# classic (one file or parts of n), or V2 (a UUID; its sidecars hold file actions only, never a txn)
_CHECKPOINT_FILE = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.[0-9a-fA-F-]{36})?\.(parquet|json)")


def app_transactions(table: DeltaTable, filesystem: Any, root: str) -> dict[str, int]:
    """Every app transaction of the table at its version, app id → version: what `transaction_version` returns for
    each id (the id's last `txn` action in the log; one whose `lastUpdated` is older than the table's
    `delta.setTransactionRetentionDuration` has expired), from one read of the log: the latest complete checkpoint
    at or before the version (its `txn` column; each part of a multi-part one; a V2 one's top-level file), then each
    commit after it. delta-rs has no bulk call, and its `transaction_version` replays the log's transactions for
    each id: a pass over a table's partitions was O(partitions²).

    Raises:
        TableUnreadable: a log file the version needs is missing or cannot be read.
    """
    import time

    from pyarrow import fs

    version, log_dir = table.version(), f"{root}/_delta_log"
    try:
        listing = filesystem.get_file_info(fs.FileSelector(log_dir))
    except OSError as err:
        raise TableUnreadable(f"{root}: cannot list the table's log to read its recorded versions: {err}") from err
    commits: set[int] = set()
    checkpoints: dict[int, dict[str, list[str]]] = {}  # version → its checkpoints, each a list of parts
    for info in listing:
        if m := _COMMIT_FILE.fullmatch(info.base_name):
            commits.add(int(m.group(1)))
        elif (m := _CHECKPOINT_FILE.fullmatch(info.base_name)) and int(m.group(1)) <= version:
            one = f"of{m.group(3)}" if m.group(3) else info.base_name  # a multi-part one: its n parts together
            checkpoints.setdefault(int(m.group(1)), {}).setdefault(one, []).append(info.path)
    start, parts = -1, []
    for v in sorted(checkpoints, reverse=True):  # an incomplete multi-part checkpoint is skipped, as readers must
        complete = [p for key, p in checkpoints[v].items() if not key.startswith("of") or len(p) == int(key[2:])]
        if complete:
            start, parts = v, sorted(complete[0])
            break
    latest: dict[str, tuple[int, int | None]] = {}  # app id → (version, lastUpdated)
    for path in parts:
        _checkpoint_txns(filesystem, path, latest)
    for v in range(start + 1, version + 1):
        if v not in commits:
            raise TableUnreadable(
                f"{log_dir}: commit {v:020d}.json is missing and no checkpoint at or after it precedes table version "
                f"{version}: its recorded versions cannot be read"
            )
        path = f"{log_dir}/{v:020d}.json"
        try:
            with filesystem.open_input_stream(path) as f:
                _json_txns(f.read().decode(), latest)
        except (OSError, ValueError) as err:
            raise TableUnreadable(f"{path}: cannot read the commit's app transactions: {err}") from err
    retention = table.metadata().configuration.get(TXN_RETENTION_KEY)
    expired = None if retention is None else int(time.time() * 1000) - _interval_ms(retention, TXN_RETENTION_KEY)
    return {a: v for a, (v, at) in latest.items() if expired is None or at is None or at > expired}


def _json_txns(text: str, latest: dict[str, tuple[int, int | None]]) -> None:
    """The `txn` actions of a log file of JSON lines into `latest`, in order (a later one of an id supersedes)."""
    for line in text.splitlines():
        if '"txn"' in line:  # only these are parsed: a commit's add actions are most of its lines
            txn = json.loads(line).get("txn")
            if txn:
                latest[txn["appId"]] = (int(txn["version"]), txn.get("lastUpdated"))


def _checkpoint_txns(filesystem: Any, path: str, latest: dict[str, tuple[int, int | None]]) -> None:
    """The `txn` actions of one checkpoint file (Parquet: its `txn` column only; JSON: a V2 checkpoint) into
    `latest`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.endswith(".json"):
            with filesystem.open_input_stream(path) as f:
                _json_txns(f.read().decode(), latest)
            return
        with filesystem.open_input_file(path) as f:
            parquet = pq.ParquetFile(f)
            if "txn" not in parquet.schema_arrow.names:  # a writer that leaves out an action no row has
                return
            column = parquet.read(columns=["txn"]).column("txn").combine_chunks()
    except (OSError, ValueError, pa.ArrowException) as err:
        raise TableUnreadable(f"{path}: cannot read the checkpoint's app transactions: {err}") from err
    txns = column.filter(column.is_valid())
    stamps = txns.field("lastUpdated").to_pylist() if "lastUpdated" in {f.name for f in txns.type} else None
    for i, (aid, v) in enumerate(zip(txns.field("appId").to_pylist(), txns.field("version").to_pylist(), strict=True)):
        latest[aid] = (int(v), None if stamps is None else stamps[i])


UNBOUNDED = "null["  # how a guarantee from a missing statistic prints: `(topic >= null[string])`


def _sound_guarantees(table: DeltaTable, dataset: ds.Dataset) -> ds.Dataset:
    """`dataset` with guarantees that never exclude a row the file holds. delta-rs turns a column that has no min/max
    in a file's statistics (string columns of tables we wrote before we gave them bounds, columns past Spark's
    indexed ones) into `col >= null`, which prunes the file from every filter on that column: a filter on `topic`
    read no rows at all. Such fragments get guarantees made here from the same statistics: their partition values
    and each column's bounds where both are known."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    fragments = list(dataset.get_fragments())
    if not any(UNBOUNDED in str(f.partition_expression) for f in fragments):
        return dataset
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    by_path = {unquote(a["path"]): a for a in actions}
    schema = dataset.schema
    rebuilt = []
    for fragment in fragments:
        rel = unquote(fragment.path.removeprefix(table.table_uri.removeprefix("file://")).lstrip("/"))
        action = by_path.get(rel) or next((a for p, a in by_path.items() if fragment.path.endswith(p)), None)
        guarantee = pc.scalar(True)
        for field in schema if action is not None else ():
            assert action is not None
            name = field.name
            if f"partition.{name}" in action:
                value = action[f"partition.{name}"]
                term = pads.field(name).is_null() if value is None else pads.field(name) == pa.scalar(value, field.type)
                guarantee = guarantee & term
                continue
            lo, hi = action.get(f"min.{name}"), action.get(f"max.{name}")
            if lo is not None and hi is not None:
                bounds = pads.field(name) >= pa.scalar(lo, field.type)
                if pa.types.is_timestamp(field.type):  # Delta's timestamp statistics are cut to milliseconds
                    try:
                        hi += dt.timedelta(milliseconds=1)
                    except OverflowError:  # the last millisecond of year 9999: no upper bound
                        hi = None
                if hi is not None:
                    bounds = bounds & (pads.field(name) <= pa.scalar(hi, field.type))
                if action.get(f"null_count.{name}") != 0:  # bounds hold for the values; nulls may be there too
                    bounds = bounds | pads.field(name).is_null()
                guarantee = guarantee & bounds
        rebuilt.append(dataset.format.make_fragment(fragment.path, fragment.filesystem, partition_expression=guarantee))
    return pads.FileSystemDataset(rebuilt, schema, dataset.format, dataset.filesystem)


class DeltaLakeTable(DeltaTable):
    """A Delta table (a delta-rs `DeltaTable`, which Delta users may use as such) as a `LakeTable`."""

    location: TableLocation
    _lineage: _Lineage | None = None

    @property
    def table_id(self) -> str:
        return table_id(self)

    def to_pyarrow_dataset(self, *args: Any, **kwargs: Any) -> ds.Dataset:
        """The current version's rows, INT96 timestamps read as microseconds (delta-spark wrote them by default
        before the export set TIMESTAMP_MICROS): Arrow's default, nanoseconds, wraps any ts past 2262-04-11."""
        import pyarrow.dataset as pads
        from deltalake.exceptions import DeltaProtocolError

        kwargs.setdefault("parquet_read_options", pads.ParquetReadOptions(coerce_int96_timestamp_unit="us"))
        try:
            dataset = super().to_pyarrow_dataset(*args, **kwargs)
        except DeltaProtocolError as err:  # a reader feature delta-rs lacks (typeWidening): never a wrong read
            raise TableUnreadable(f"{self.location}: delta-rs cannot read the table's rows: {err}") from None
        return _sound_guarantees(self, dataset)

    def refresh(self) -> None:
        self.update_incremental()

    def app_id(self, topic: str, partition: int) -> str:
        return app_id(self.table_id, topic, partition, self.location.source)

    def recorded(self, topic: str, partition: int) -> Recorded:
        """The first of `candidate_ids` recorded, checked against the RESTOREs of the table's history
        (`_Lineage.checked`)."""
        source = self.location.source
        owner = self.metadata().configuration.get(LEGACY_SOURCE_KEY)
        ids = candidate_ids(self.table_id, self.location.uri, topic, partition, source, owner)
        if self._lineage is None or self._lineage.version != self.version():
            self._lineage = _Lineage(self)
        return self._lineage.checked(ids)

    def recorded_version(self, topic: str, partition: int) -> int | None:
        return self.recorded(topic, partition).version

    def claim_legacy_versions(self, source: str) -> None:
        self.set_properties({LEGACY_SOURCE_KEY: source})

    def set_properties(self, properties: dict[str, str]) -> None:
        self.alter.set_table_properties(properties, raise_if_not_exists=False)
        self.update_incremental()

    def owns_unsourced_rows(self) -> bool:
        """Whether this location's source owns the rows written before sources (a null `source`)."""
        return owns_unsourced(self.location.source, self.metadata().configuration.get(LEGACY_SOURCE_KEY))

    def arrow_schema(self) -> pa.Schema:
        """The columns the export writes: all but the generated partition columns of ours (`own_generated`), which
        the table derives."""
        import pyarrow as pa

        schema = pa.schema(self.schema().to_arrow())
        own = own_generated(self)
        return pa.schema([f for f in schema if f.name not in own])

    def partition_spec(self) -> tuple[str, ...]:
        """The table's partition columns as a spec's terms (`partitioning.delta_term`: `ts_hour`, generated by this
        export's expression, is `hour(ts)`)."""
        expressions = generation_expressions(self)
        return tuple(delta_term(c, expressions.get(c)) for c in self.metadata().partition_columns)

    def check_compatible(
        self, name: str, schema: pa.Schema, partition_by: tuple[str, ...], *, evolvable: tuple[str, ...], spark: bool
    ) -> bool:
        from deltalake import Schema

        if spark:
            check_plannable(name, self)
        else:
            check_features(name, self)
        want = _columns(Schema.from_arrow(schema))
        # delta-spark computes a generated column the export does not write; one it writes (`date` generated from
        # ts) it checks against the expression, row by row. The table derives the generated columns of ours
        own = own_generated(self)
        generated = generated_columns(self) - {c[0] for c in want} if spark else set()
        have = [c for c in _columns(self.schema()) if c[0] not in generated | own]
        lacks_last = lacks_only(have, want, evolvable)
        if have != want and not lacks_last:
            raise JobConfigError(
                f"existing table {name} does not match this export (value format/schema differ?): "
                + "; ".join(_schema_diff(have, want))
            )
        parts = list(self.partition_spec())
        if parts != list(partition_by):
            raise JobConfigError(f"existing table {name} is partitioned by {parts}, not {list(partition_by)}")
        return lacks_last

    def add_column(self, field: pa.Field) -> None:
        import pyarrow as pa
        from deltalake import Schema

        (delta_field,) = Schema.from_arrow(pa.schema([field.with_nullable(True)])).fields
        self.alter.add_columns([delta_field])

    def delete_rows(self, predicate: str) -> None:
        self.delete(predicate)  # delta-rs' DELETE: the files holding matches rewritten without them

    def commit(
        self, schema: pa.Schema, files: list[DataFile], versions: dict[str, int], run_id: str, metadata: dict[str, str]
    ) -> int:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, RemoveAction

        actions: list[AddAction | RemoveAction] = [  # what create_write_transaction takes
            AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in files
        ]
        try:
            self.create_write_transaction(
                actions,
                mode="append",
                schema=self.schema(),  # the table's, generated columns and all (the files' columns are its others)
                partition_by=list(self.metadata().partition_columns),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(a, v) for a, v in versions.items()],
                    custom_metadata=_commit_info(self, run_id, versions, metadata),
                ),
            )
        except CommitFailedError as err:
            self.update_incremental()
            if self.committed_by(run_id):
                log.warning("export: delta-rs reported %s, but this run's commit is in the table: committed", err)
                return self.version()
            raise CommitConflict(f"commit conflict: {err}") from None
        self.update_incremental()
        return self.version()

    def merge_latest(
        self,
        source: pa.Table,
        *,
        keys: tuple[str, ...],
        order: str,
        tombstone: str,
        versions: dict[str, int],
        run_id: str,
        metadata: dict[str, str],
    ) -> dict[str, int]:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        newer = f"s.{order} > t.{order}"
        merger = (
            self.merge(
                source,
                predicate=" AND ".join(merge_match(k, self.owns_unsourced_rows()) for k in keys),
                source_alias="s",
                target_alias="t",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(a, v) for a, v in versions.items()],
                    custom_metadata=_commit_info(self, run_id, versions, metadata),
                ),
            )
            .when_matched_delete(predicate=f"s.{tombstone} AND {newer}")
            .when_matched_update_all(predicate=f"NOT s.{tombstone} AND {newer}", except_cols=[tombstone])
            .when_not_matched_insert_all(predicate=f"NOT s.{tombstone}", except_cols=[tombstone])
        )
        try:
            metrics = merger.execute()
        except CommitFailedError as err:
            self.update_incremental()
            if not self.committed_by(run_id):
                raise CommitConflict(f"MERGE commit conflict: {err}") from None
            log.warning("export: delta-rs reported %s, but this run's MERGE is in the table: committed", err)
            metrics = {}
        self.update_incremental()
        return {k: int(v) for k, v in metrics.items() if k.startswith("num_target_rows_")}

    def properties(self) -> dict[str, str]:
        return dict(self.metadata().configuration)

    def file_stats(self) -> pa.Table:
        import pyarrow as pa

        return pa.table(self.get_add_actions(flatten=True))

    def file_writers(self, paths: set[str], lookback: int) -> dict[str, str]:
        """Read from the commit files themselves, the latest first (a file's `add` and the commit's `commitInfo` and
        `txn` actions)."""
        want = {unquote(p): p for p in paths}
        out: dict[str, str] = {}
        filesystem, root = self.location.filesystem()
        latest = self.version()
        for v in range(latest, max(-1, latest - lookback), -1):
            try:
                with filesystem.open_input_stream(f"{root}/_delta_log/{v:020d}.json") as f:
                    actions = [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
            except (FileNotFoundError, OSError):  # cleaned up past a checkpoint
                break
            added = [
                want[unquote(a["add"]["path"])] for a in actions if "add" in a and unquote(a["add"]["path"]) in want
            ]
            if added:
                info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
                txns = [
                    a["txn"]["appId"] for a in actions if "txn" in a and not a["txn"]["appId"].startswith(APP_ID_PREFIX)
                ]
                who = [f"table version {v}", info.get("operation", "a commit")]
                if txns:
                    who.append(f"app id {', '.join(txns)}")
                if info.get("engineInfo"):
                    who.append(info["engineInfo"])
                for p in added:
                    out[p] = ", ".join(who)
            if len(out) == len(want):
                break
        return out

    def committed_by(self, run_id: str) -> bool:
        """Whether this run's commit is in the table after all. An object store's response can be lost after the put
        succeeded (a timeout on a loaded server); delta-rs then retries, finds the version taken by its own commit,
        and reports a conflict with it ("Concurrent transaction failed": the same app transactions). Taking that for
        a failure would delete the files of a commit that stands: rows lost, and their versions recorded, so
        retention would delete them in TANK as well (found by the fleet soak)."""
        return any(h.get(RUN_KEY) == run_id for h in self.history(limit=LANDED_LOOKBACK))

    def run_history(self) -> list[RunCommit]:
        return [RunCommit(h["version"], h["timestamp"], h.get(RUN_KEY)) for h in self.history()]

    def referenced_files(self) -> set[str]:
        return {unquote(p) for p in self.get_add_actions(flatten=True).column("path").to_pylist()}

    def check_readable(self) -> None:
        """Refuse, before anything is written, a table delta-rs cannot read all of: column mapping, or a reader
        feature its reader refuses, e.g. deletion vectors (Spark's DELETE, UPDATE or MERGE on a table with
        `delta.enableDeletionVectors`), whose deleted rows a reader must leave out.

        Raises:
            JobConfigError: one line naming the table and the feature.
        """
        from deltalake.exceptions import DeltaProtocolError

        mode = self.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mode != "none":  # delta-rs reads the columns of such a table's files as nulls (checked with delta-spark's)
            raise JobConfigError(
                f"table {self.location} uses table feature columnMapping (delta.columnMapping.mode={mode}), which "
                "delta-rs does not read (its columns would come back null)"
            )
        try:
            DeltaTable.to_pyarrow_dataset(self)  # delta-rs's own: ours turns its refusal into TableUnreadable
        except DeltaProtocolError as err:
            raise JobConfigError(
                f"table {self.location}: delta-rs cannot read it: {err} (Spark can drop the feature: ALTER TABLE ... "
                "DROP FEATURE <feature>)"
            ) from None

    def live_files(self) -> tuple[int, int]:
        """(files, bytes) of the table's current snapshot."""
        sizes = self.get_add_actions(flatten=True).column("size_bytes").to_pylist()
        return len(sizes), sum(sizes)

    def compact_files(self, target_bytes: int, *, dry_run: bool) -> UpkeepStep:
        """delta-rs optimize: one commit; readers and app transactions are unaffected."""
        self._check_maintainable("optimize")
        files, size = self.live_files()
        if dry_run:
            return UpkeepStep("optimize", files, size, files, size, dry_run=True)
        metrics = self.optimize.compact(target_size=target_bytes)
        self.update_incremental()
        after = self.live_files()
        log.info(
            "export: optimize rewrote %s files into %s: %d files (%d bytes) → %d files (%d bytes)",
            metrics.get("numFilesRemoved"),
            metrics.get("numFilesAdded"),
            files,
            size,
            *after,
        )
        removed, written = metrics.get("numFilesRemoved"), metrics.get("numFilesAdded")
        return UpkeepStep("optimize", files, size, *after, files_removed=removed, files_written=written)

    def _check_maintainable(self, step: str) -> None:
        """Refuse, before any file is written or deleted, a table with a feature delta-rs cannot commit to."""
        unsupported = sorted(table_features(self) - APPENDABLE_FEATURES)
        if unsupported:
            raise JobConfigError(
                f"{self.location}: --{step}: the table uses table feature(s) {', '.join(unsupported)}, which delta-rs "
                f"cannot commit to; run delta-spark's {step.upper()} on it instead"
            )

    def remove_unreferenced(self, retention_ms: int, *, dry_run: bool) -> UpkeepStep:
        """delta-rs vacuum: files removed by optimize or an overwrite, once no version within the retention needs
        them; files and bytes are every data file in storage."""
        self._check_maintainable("vacuum")
        stored = {f.rel: f.size for f in self.location.data_files()}
        before = (len(stored), sum(stored.values()))
        hours = -(-retention_ms // 3_600_000)  # delta-rs takes whole hours: round up, never below what was asked
        doomed = self.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=True)
        gone = sum(stored.get(_relative(self.location, p), 0) for p in doomed)
        after = (before[0] - len(doomed), before[1] - gone)
        log.info(
            "export: vacuum (retention %d h)%s %d files (%d bytes): %d files (%d bytes) → %d files (%d bytes)",
            hours,
            " would delete" if dry_run else " deleted",
            len(doomed),
            gone,
            *before,
            *after,
        )
        return UpkeepStep("vacuum", *before, *after, dry_run=dry_run)


def _commit_info(
    table: DeltaLakeTable, run_id: str, versions: dict[str, int], metadata: dict[str, str]
) -> dict[str, str]:
    """The commit's fields of ours in its commitInfo: its summary (`commit_summary`) as fields of their own (which
    delta-rs's `history()` shows) and as the JSON of `userMetadata` (which Spark's DESCRIBE HISTORY shows, as it
    shows delta-spark's commits'), then `metadata`."""
    summary = commit_summary(table, run_id, versions)
    return {**summary, USER_METADATA: summary_json(summary), **metadata}


_RESTORES: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (table id, version) → its RESTOREs (`_Lineage`)


class _Lineage:
    """The RESTOREs of a Delta table's history, read once per table version, to check a recorded version.

    A RESTORE puts back the files of an older version but keeps the app transactions (delta-rs and delta-spark
    alike): the rows a later commit added are gone, its recorded version is not. So a version is trusted only if
    the commit that recorded it is still in the table's lineage: no RESTORE after it, or only ones to a version at or
    after it. Otherwise the table holds what it held at the RESTORE's target version, whose recorded version is
    checked the same way (a RESTORE to a RESTORE)."""

    def __init__(self, table: DeltaLakeTable):
        self.table, self.version = table, table.version()
        self._txns: dict[int, set[str]] = {}
        self._at: dict[int, DeltaTable] = {}
        self._recorded: dict[int, dict[str, int]] = {}  # table version → its app transactions (`app_transactions`)
        key = (table.table_id, self.version)
        if key not in _RESTORES:  # a run opens the table several times (plan, commit): its history is read once
            history = table.history()
            _RESTORES[key] = [
                (int(h["version"]), _restored_version(table, h, history))
                for h in sorted(history, key=lambda h: int(h["version"]))
                if h.get("operation") == "RESTORE"
            ]
            while len(_RESTORES) > 16:
                del _RESTORES[next(iter(_RESTORES))]
        # (the RESTORE's version, the version it restored), oldest first
        self.restores: list[tuple[int, int]] = _RESTORES[key]

    def checked(self, ids: list[str]) -> Recorded:
        at = self.version
        aid, version = self._recorded_at(at, ids)
        recorded, undone = version, None
        while True:
            restore = next((r for r in reversed(self.restores) if r[0] <= at), None)
            if version is None or restore is None or self._recorded_since(aid, restore[0], at):
                return Recorded(version, recorded, undone, unsourced=version is not None and aid != ids[0])
            at = restore[1]
            aid, before = self._recorded_at(at, ids)
            if before != version and undone is None:
                undone = (
                    f"the commit that recorded it was undone by the RESTORE at table version {restore[0]} (to "
                    f"version {restore[1]})"
                )
            version = before

    def _table_at(self, version: int) -> DeltaTable:
        if version == self.version:
            return self.table
        if version not in self._at:
            location = self.table.location
            try:
                self._at[version] = DeltaTable(location.uri, version=version, storage_options=location.options or None)
            except Exception as err:  # delta-rs's errors: a version whose log was cleaned up
                raise TableUnreadable(
                    f"{location}: cannot read table version {version} (restored by a RESTORE) to check what the table "
                    f"holds: {type(err).__name__}: {err}"
                ) from err
        return self._at[version]

    def _recorded_at(self, version: int, ids: list[str]) -> tuple[str, int | None]:
        if version not in self._recorded:  # the log is read once per version, not once per partition
            filesystem, root = self.table.location.filesystem()
            self._recorded[version] = app_transactions(self._table_at(version), filesystem, root)
        return _first_recorded(self._recorded[version], ids)

    def _recorded_since(self, aid: str, restore: int, at: int) -> bool:
        """Whether a commit after the RESTORE at version `restore`, up to `at`, recorded `aid`."""
        filesystem, root = self.table.location.filesystem()
        for v in range(restore + 1, at + 1):
            if v not in self._txns:
                try:
                    with filesystem.open_input_stream(f"{root}/_delta_log/{v:020d}.json") as f:
                        lines = f.read().decode().splitlines()
                except OSError as err:
                    raise TableUnreadable(
                        f"{self.table.location}: commit {v} after a RESTORE cannot be read to check what the table "
                        f"holds: {err}"
                    ) from err
                txns = (json.loads(line).get("txn") for line in lines if line.strip())
                self._txns[v] = {t["appId"] for t in txns if t}
            if aid in self._txns[v]:
                return True
        return False


def _restored_version(table: DeltaTable, info: dict[str, Any], history: list[dict[str, Any]]) -> int:
    """The version a RESTORE commit restored: its `version` parameter, or the last version at or before its
    `timestamp` parameter (RESTORE ... TO TIMESTAMP AS OF).

    Raises:
        TableUnreadable: neither is given or readable.
    """
    from datetime import UTC, datetime

    params = info.get("operationParameters") or {}
    version = params.get("version")
    if version not in (None, "", "null"):
        return int(version)
    stamp = params.get("timestamp")
    try:
        when = datetime.fromisoformat(str(stamp))
        ms = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000
        return max(int(h["version"]) for h in history if h["timestamp"] <= ms and h["version"] < info["version"])
    except (TypeError, ValueError) as err:
        raise TableUnreadable(
            f"table version {info.get('version')} is a RESTORE to neither a version nor a time this library reads "
            f"({params}): what the table holds cannot be checked"
        ) from err


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


def delta_schema_json(schema: pa.Schema) -> str:
    """An Arrow schema as Delta's JSON schema (Spark's types), as delta-rs maps the types."""
    from deltalake import Schema

    return str(Schema.from_arrow(schema).to_json())


def table_features(table: DeltaTable) -> set[str]:
    """The writer features of the table's protocol (legacy versions below 7 translated)."""
    protocol = table.protocol()
    if protocol.min_writer_version >= 7:
        return set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    return {f for v, fs in LEGACY_WRITER_FEATURES.items() if protocol.min_writer_version >= v for f in fs}


def generation_expressions(table: DeltaTable) -> dict[str, str]:
    """The table's generated columns: {name: generation expression}."""
    fields = json.loads(table.schema().to_json())["fields"]
    return {f["name"]: f["metadata"][GENERATED_KEY] for f in fields if GENERATED_KEY in (f.get("metadata") or {})}


def generated_columns(table: DeltaTable) -> set[str]:
    return set(generation_expressions(table))


def own_generated(table: DeltaTable) -> set[str]:
    """The generated columns this export's files honour: partition columns of the table generated by exactly the
    expression of a spec's term (`partitioning.delta_columns`: `ts_hour`, `ts_month`, `key_bucket`), of that type.
    Its files are written with their values as the partition values; any other generated column is refused."""
    expressions = generation_expressions(table)
    types = {c[0]: c[1] for c in _columns(table.schema())}
    out = set()
    for name in table.metadata().partition_columns:
        text = delta_term(name, expressions.get(name))
        if text != name and [types.get(name)] == [c.type for c in delta_columns((text,))]:
            out.add(name)
    return out


GENERATED_KEY = "delta.generationExpression"


def check_plannable(name: str, table: DeltaTable) -> None:
    """The delta-spark engine plans (each partition's recorded version) through delta-rs, which cannot read a table
    with column mapping once it holds rows: refuse it from the start.

    Raises:
        JobConfigError: one line naming the table and the feature.
    """
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise JobConfigError(
            f"table {name} uses table feature columnMapping (delta.columnMapping.mode={mode}): this export "
            "plans with delta-rs, which cannot read such tables"
        )


def check_features(name: str, table: DeltaTable) -> None:
    """Refuse, before anything is written, a table the delta-rs engine cannot append to correctly: a table feature
    outside `APPENDABLE_FEATURES`, or what this export's files would not honour (a CHECK constraint, a generated,
    identity or invariant column: the delta-spark engine evaluates those).

    Raises:
        JobConfigError: one line naming the table and every such feature, constraint and column.
    """
    blocks = []
    unsupported = sorted(table_features(table) - APPENDABLE_FEATURES)
    if unsupported:
        blocks.append(f"table feature(s) {', '.join(unsupported)}, which the delta-rs engine cannot append to")
    constraints = {k: v for k, v in table.metadata().configuration.items() if k.startswith("delta.constraints.")}
    if constraints:
        named = ", ".join(f"{k.removeprefix('delta.constraints.')} ({v})" for k, v in sorted(constraints.items()))
        blocks.append(f"CHECK constraint(s) {named} (table feature checkConstraints), which it does not evaluate")
    own = own_generated(table)
    for f in json.loads(table.schema().to_json())["fields"]:
        meta = f.get("metadata") or {}
        if f["name"] in own:  # generated by this export's partition spec: its files hold the values
            continue
        for key, feature in (
            ("delta.generationExpression", "generatedColumns"),
            ("delta.identity.start", "identityColumns"),
            ("delta.invariants", "invariants"),
        ):
            if key in meta:
                blocks.append(f"column {f['name']}: a {feature} column ({key}), which it does not compute or check")
    if blocks:
        raise JobConfigError(
            f"table {name} uses {'; '.join(blocks)}; the delta-spark engine (--engine spark) writes such tables"
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


def open(location: TableLocation) -> DeltaLakeTable | None:  # noqa: A001 (the format modules' one name for it)
    """The Delta table at its latest version; None if there is none.

    Raises:
        JobConfigError: delta-rs cannot read the table.
    """
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaLakeTable(location.uri, storage_options=location.options or None)
    except TableNotFoundError:
        return None
    except DeltaError as err:  # e.g. a table delta-spark made with column mapping
        raise JobConfigError(f"delta-rs cannot read the table {location}: {err}{_features_hint(location)}") from None
    table.location = location
    return table


def create(
    location: TableLocation,
    schema: pa.Schema,
    partition_by: tuple[str, ...],
    configuration: dict[str, str] | None = None,
) -> DeltaLakeTable:
    """A new, empty Delta table (an error if one exists); `configuration`: keys of ours it records. A transform of
    the spec (`hour(ts)`, `bucket(8, key)`) becomes a generated column the table is partitioned by
    (`partitioning.delta_columns`), after `schema`'s: delta-rs records the generation expression as the field's
    metadata, and the table's protocol the writer feature (writer version 4)."""
    import pyarrow as pa

    types = {"string": pa.string(), "integer": pa.int32()}
    fields = [
        pa.field(c.name, types[c.type], metadata={GENERATED_KEY: c.expression}) for c in delta_columns(partition_by)
    ]
    table = DeltaLakeTable.create(
        location.uri,
        schema=pa.schema(list(schema) + fields),
        partition_by=list(partition_names(partition_by)),
        mode="error",
        configuration=configuration,
        storage_options=location.options or None,
        raise_if_key_not_exists=configuration is None,  # delta-rs knows only delta.* keys
    )
    assert isinstance(table, DeltaLakeTable)  # `create` makes its class's instance
    table.location = location
    return table


def _features_hint(location: TableLocation) -> str:
    """The table features its log's latest protocol lists (what delta-rs may not support), read from the commit
    files themselves; "" when there are none or they cannot be read."""
    from pyarrow import fs

    try:
        filesystem, root = location.filesystem()
        log_dir = f"{root}/_delta_log"
        commits = sorted(
            i.path
            for i in filesystem.get_file_info(fs.FileSelector(log_dir))
            if i.path.endswith(".json") and i.base_name[:20].isdigit()
        )
        protocol, config = None, None
        for path in commits:
            with filesystem.open_input_stream(path) as f:
                for line in f.read().decode().splitlines():
                    action = json.loads(line) if line.strip() else {}
                    protocol = action.get("protocol", protocol)
                    config = action["metaData"].get("configuration", config) if "metaData" in action else config
    except (OSError, ValueError, KeyError):
        return ""
    if protocol is None:
        return ""
    features = sorted(set(protocol.get("readerFeatures") or ()) | set(protocol.get("writerFeatures") or ()))
    mode = (config or {}).get("delta.columnMapping.mode", "none")
    out = f" (table features: {', '.join(features) or 'none'}"
    return out + (f"; delta.columnMapping.mode={mode})" if mode != "none" else ")")


def check_vacuum_retention(table: LakeTable | None, retention_ms: int) -> None:
    """Refuse a retention below the table's `delta.deletedFileRetentionDuration` (default 7 days; a table this run
    will create has the default): readers of versions within it would lose files. A table that allows less says so
    in that property.

    Raises:
        JobConfigError: the retention is shorter than the table allows.
    """
    assert table is None or isinstance(table, DeltaTable)  # this format's table
    configured = None if table is None else table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    minimum = DEFAULT_DELETED_FILE_RETENTION_MS if configured is None else _interval_ms(configured)
    if retention_ms < minimum:
        raise JobConfigError(
            f"--vacuum {retention_ms / 3_600_000:g}h is shorter than the table's deleted-file retention "
            f"({minimum / 3_600_000:g}h, delta.deletedFileRetentionDuration): readers of older versions would lose "
            "files; raise the retention or lower that table property"
        )


_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
_UNITS_MS["week"] = 7 * _UNITS_MS["day"]


def _interval_ms(value: str, key: str = "delta.deletedFileRetentionDuration") -> int:
    """A Delta table property interval, e.g. `interval 7 days`."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*", value.lower())
    if not m or m.group(2) not in _UNITS_MS:
        raise JobConfigError(f"table property {key}={value!r}: not an interval")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def _relative(location: TableLocation, path: str) -> str:
    """delta-rs reports vacuumed files relative to the table (or as full URIs): the path relative to the table."""
    root = location.uri.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path


if TYPE_CHECKING:  # mypy checks this module and its table against the interface
    import tank_log.lakehouse.delta as _this_format
    from tank_log.lakehouse.location import TableFormat

    _FORMAT: TableFormat = _this_format

    def _as_lake_table(table: DeltaLakeTable) -> LakeTable:
        return table
