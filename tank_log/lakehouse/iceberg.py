"""The Apache Iceberg table format through pyiceberg and a SQL or REST catalog: the one module that imports pyiceberg.

A table given by its path is registered in a SQL catalog (`TableLocation.catalog`: any SQLAlchemy URI; by default a
SQLite file beside a local table) as `tank_log.<the table directory's name>`. A table given by its name
(`namespace.table`) is in a REST catalog (`RestCatalog`), which says where its files are (`located`); the catalog
checks each commit's requirements itself, so exactly once holds through it as through a SQL catalog. A REST catalog
that cannot be reached, or fails a request, stops the run (`RunFailed`); nothing is recorded past what it committed.

Each partition's recorded version is a table property (`app_id` → its last exported seq), set in the same commit
as the snapshot that adds the data files: properties survive snapshot expiry, snapshot summaries do not. The table
is created with pyiceberg's commit retries off (`commit.retry.num-retries` 0): a retry rebuilds a stale writer's
append on top of the winner's snapshot (with retries on, two writers committing the same rows from the same snapshot
left them in the table twice), so a conflict is reported (`CommitConflict`) and the export re-plans instead.
The spark engine's files are written by Iceberg's Spark writer into a staged snapshot (write-audit-publish) and
committed here with the versions all the same (`commit_staged`; tank_spark/export/iceberg_spark.py says why).

Upkeep is snapshot expiry and the removal of data files no kept snapshot references (`remove_unreferenced`);
pyiceberg has no file compaction (`compact_files` refuses) and no MERGE: a current-state table's merge is computed
here and written back as one overwrite of the partitions it touches (`merge_latest`).
The import reads the current snapshot's data files as a Parquet dataset (`to_pyarrow_dataset`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tank_log.errors import JobConfigError, RunFailed
from tank_log.lakehouse.partitioning import check_rewritable, spec_terms, terms
from tank_log.lakehouse.table import (
    APP_ID_PREFIX,
    LEGACY_SOURCE_KEY,
    RUN_KEY,
    SOURCE_COLUMN,
    CommitConflict,
    DataFile,
    HistoryUntold,
    Recorded,
    RunCommit,
    UpkeepStep,
    app_id,
    candidate_ids,
    commit_summary,
    lacks_only,
    owns_unsourced,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction
    from pyiceberg.types import IcebergType

    from tank_log.lakehouse.location import LakeTable, RestCatalog, TableLocation

log = logging.getLogger(__name__)

NAMESPACE = "tank_log"
NO_RETRIES = {"commit.retry.num-retries": "0"}
WAP_ENABLED = "write.wap.enabled"  # Iceberg's table property letting Spark stage a snapshot (`commit_staged`)
WAP_ID = "wap.id"  # the summary key naming a staged snapshot's id (Spark's `spark.wap.id`)
RECORDED_AT = "#sequence-number"  # `<app id>` + this: the sequence number of the snapshot that recorded the version
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"  # Iceberg's table property: the vacuum's least retention
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000  # Iceberg's default for it
CATALOG_SUFFIX = ".iceberg-catalog.db"  # the default SQLite catalog of a local table: beside its directory
# storage options (as delta-rs names them) → pyiceberg's FileIO properties
S3_PROPERTIES = {
    "AWS_ENDPOINT_URL": "s3.endpoint",
    "AWS_ENDPOINT": "s3.endpoint",
    "AWS_ACCESS_KEY_ID": "s3.access-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
    "AWS_SESSION_TOKEN": "s3.session-token",
    "AWS_REGION": "s3.region",
    "AWS_DEFAULT_REGION": "s3.region",
}


def catalog_uri(location: TableLocation) -> str:
    """The URI of the table's catalog: a SQL catalog's SQLAlchemy URI, or a REST catalog's endpoint.

    Raises:
        JobConfigError: a table on object storage without one.
    """
    if location.catalog:
        return str(location.catalog)
    if not location.is_local:
        raise JobConfigError(
            f"table {location}: an Iceberg table on object storage needs --catalog URI or export.catalog"
        )
    return f"sqlite:///{location.uri.rstrip('/')}{CATALOG_SUFFIX}"


def identifier(location: TableLocation) -> tuple[str, ...]:
    """(namespace..., name) of the table in its catalog: its name in a REST catalog, else the last component of its
    path, as a name SQL takes, in namespace `tank_log`."""
    if location.name:
        return tuple(location.name.split("."))
    name = re.sub(r"[^A-Za-z0-9_]", "_", location.uri.rstrip("/").rpartition("/")[2]) or "table"
    return NAMESPACE, name


@contextmanager
def _reaching(catalog: object) -> Iterator[None]:
    """Turn a REST catalog's failures (unreachable, an error status) into `RunFailed` naming it."""
    import requests
    from pyiceberg.exceptions import CommitStateUnknownException, RESTError

    try:
        yield
    except CommitStateUnknownException as err:
        raise RunFailed(
            f"catalog {catalog}: the commit's outcome is unknown ({err}); a rerun reads what the table recorded"
        ) from None
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
        raise RunFailed(
            f"catalog {catalog}: unreachable ({type(err).__name__}); a rerun finds what the table recorded"
        ) from None
    except (RESTError, requests.exceptions.RequestException) as err:
        raise RunFailed(f"catalog {catalog}: {type(err).__name__}: {err}"[:500]) from None


def _rest_catalog(catalog: RestCatalog, properties: dict[str, str] | None = None) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog as PyIcebergRestCatalog

    props = {"uri": catalog.uri, **(properties or {})}
    for key in ("warehouse", "token", "credential"):
        value = getattr(catalog, key)
        if value:
            props[key] = value
    with _reaching(catalog):
        return PyIcebergRestCatalog("tank_log", **props)


def located(name: str, catalog: RestCatalog) -> str:
    """Where the table `name` of the REST `catalog` keeps its files: where it is, or where the catalog would create it
    (asked with a staged create, which records nothing; its namespace is created if missing).

    Raises:
        RunFailed: the catalog cannot be reached or fails the request.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    rest = _rest_catalog(catalog)
    ident = tuple(name.split("."))
    with _reaching(catalog):
        try:
            location: str = rest.load_table(ident).metadata.location
            return location
        except (NoSuchTableError, NoSuchNamespaceError):
            pass
        rest.create_namespace_if_not_exists(ident[:-1])
        staged = rest.create_table_transaction(ident, Schema(NestedField(1, "seq", LongType(), required=False)))
        location = staged.table_metadata.location
        return location


def _catalog(location: TableLocation) -> Catalog:
    from pyiceberg.catalog.sql import SqlCatalog

    from tank_log.lakehouse.location import RestCatalog

    rest = location.catalog if isinstance(location.catalog, RestCatalog) else None
    props = {} if rest else {"uri": catalog_uri(location), "warehouse": _uri(location)}
    for option, prop in S3_PROPERTIES.items():
        value = location._option(option)
        if value and prop not in props:
            props[prop] = value
    if rest:  # the FileIO's storage options; the catalog's own settings say where the table is
        return _rest_catalog(rest, props)
    if location.is_local and props["uri"].startswith("sqlite:///"):
        os.makedirs(os.path.dirname(props["uri"].removeprefix("sqlite:///")) or ".", exist_ok=True)
    return SqlCatalog("tank_log", **props)


def _place(uri: str) -> str:
    """A table location as compared: a local one without `file://` (REST catalogs record either)."""
    return (uri.removeprefix("file://") if uri.startswith("file:///") else uri).rstrip("/")


def _uri(location: TableLocation) -> str:
    """The table's location as Iceberg records it (`file://` for a local table, `s3a://` as `s3://`)."""
    return f"file://{location.uri}" if location.is_local else location.uri.replace("s3a://", "s3://", 1)


class IcebergTable:
    """An Iceberg table (pyiceberg's `Table`, as `table`) as a `LakeTable`."""

    def __init__(self, location: TableLocation, table: Table):
        self.location, self.table = location, table

    @property
    def table_id(self) -> str:
        return str(self.table.metadata.table_uuid)

    def version(self) -> int:
        """The last snapshot's sequence number (0: no snapshot yet)."""
        snapshot = self.table.current_snapshot()
        return 0 if snapshot is None else snapshot.sequence_number or 0

    def refresh(self) -> None:
        with _reaching(self.location.catalog):
            self.table.refresh()

    def app_id(self, topic: str, partition: int) -> str:
        return app_id(self.table_id, topic, partition, self.location.source)

    def recorded(self, topic: str, partition: int) -> Recorded:
        """The first of `candidate_ids` recorded (a table property), checked against the current snapshot's
        ancestors. A rollback (`rollback_to_snapshot`, `set_current_snapshot`) keeps the table's properties but not
        the rows of the snapshots it leaves: so the version is trusted only if the nearest ancestor whose summary
        records it (every commit of ours records its versions in its snapshots' summaries too) gives the same;
        otherwise that ancestor's is what the table holds.

        Snapshot expiry (any writer's) removes ancestors, and pyiceberg's clears the parent of the oldest snapshot
        it keeps: an ancestry that ends is not the table's whole history. So the sequence numbers decide (they fall
        along an ancestry): an ancestor older than the snapshot that recorded the version (`RECORDED_AT`), with none
        between recording it, is proof of a rollback; then the table holds none if that ancestry reaches the
        table's first snapshot, and what it holds cannot be told if it ends at an expired one. An ancestry that ends
        before reaching an older snapshot is expiry: trusted. A version recorded before sequence numbers were kept
        with it, or in a format-1 table (none), cannot be checked and is trusted.

        Raises:
            HistoryUntold: a rollback undid the version and the snapshots that would say what it left expired.
        """
        props = self.table.metadata.properties
        ids = candidate_ids(self.table_id, None, topic, partition, self.location.source, props.get(LEGACY_SOURCE_KEY))
        aid = next((i for i in ids if i in props), None)
        if aid is None:
            return Recorded(None, None)
        recorded = int(props[aid])
        at = props.get(aid + RECORDED_AT)
        sequenced = at is not None and self.table.metadata.format_version >= 2
        snapshots = {s.snapshot_id: s for s in self.table.snapshots()}
        snapshot, older, first = self.table.current_snapshot(), False, False
        while snapshot is not None:
            extra = snapshot.summary.additional_properties if snapshot.summary else {}
            if aid in extra:
                found = int(extra[aid])
                if found == recorded:
                    return Recorded(recorded, recorded, unsourced=aid != ids[0])
                return Recorded(found, recorded, self._undone(at, snapshot.snapshot_id), unsourced=aid != ids[0])
            sequence = snapshot.sequence_number or 0
            older = older or (sequenced and at is not None and sequence < int(at))
            parent = snapshot.parent_snapshot_id
            first = parent is None and sequence <= 1  # the table's first snapshot: its ancestry is whole
            snapshot = snapshots.get(parent) if parent is not None else None
        if not older:
            return Recorded(recorded, recorded, unsourced=aid != ids[0])
        if first:
            return Recorded(None, recorded, self._undone(at, None))
        raise HistoryUntold(
            f"table {self.location}: {topic}/{partition}: the table records seq {recorded}, but "
            f"{self._undone(at, None)}, and the snapshots before it expired: what the table holds of this partition "
            "cannot be told (compare it with the log: tank-log audit)"
        )

    def _undone(self, at: str | None, restored: int | None) -> str:
        current = self.table.current_snapshot()
        now = "no snapshot" if current is None else f"snapshot {current.snapshot_id}"
        by = "" if at is None else f" (sequence number {at})"
        back = "" if restored is None else f"; the nearest that did is snapshot {restored}"
        return f"the snapshot that recorded it{by} is not an ancestor of the current one ({now}: a rollback){back}"

    def recorded_version(self, topic: str, partition: int) -> int | None:
        return self.recorded(topic, partition).version

    def claim_legacy_versions(self, source: str) -> None:
        self.set_properties({LEGACY_SOURCE_KEY: source})

    def set_properties(self, properties: dict[str, str]) -> None:
        with self.table.transaction() as tx:
            tx.set_properties(properties)
        self.refresh()

    def _recording(self, tx: Any, versions: dict[str, int]) -> dict[str, str]:
        """Set the new versions in `tx` (table properties, with the sequence number of the snapshot it commits) and
        return them as that snapshot's summary records them (`recorded`)."""
        if not versions:
            return {}
        at = str((getattr(self.table.metadata, "last_sequence_number", 0) or 0) + 1)  # v1 tables: none
        tx.set_properties({**{k: str(v) for k, v in versions.items()}, **{k + RECORDED_AT: at for k in versions}})
        return {k: str(v) for k, v in versions.items()}

    def arrow_schema(self) -> pa.Schema:
        return self.table.schema().as_arrow()

    def check_compatible(
        self, name: str, schema: pa.Schema, partition_by: tuple[str, ...], *, evolvable: tuple[str, ...], spark: bool
    ) -> bool:
        have = [(f.name, _shape(f.field_type), f.required) for f in self.table.schema().fields]
        want = [(f.name, _shape(f.field_type), f.required) for f in _iceberg_schema(schema).fields]
        lacks_last = lacks_only(have, want, evolvable)
        if have != want and not lacks_last:
            diff = [
                f"{w[0]}: table has {h}, this export writes {w}" for h, w in zip(have, want, strict=False) if h != w
            ]
            raise JobConfigError(
                f"existing table {name} does not match this export (value format/schema differ?): "
                + "; ".join(diff or [f"table has {len(have)} columns, this export writes {len(want)}"])
            )
        parts = spec_terms(self.table.spec(), self.table.schema())
        if parts != partition_by:
            raise JobConfigError(
                f"existing table {name} is partitioned by {list(parts)}, not {list(partition_by)} (set "
                "export.partition_by to the table's)"
            )
        return lacks_last

    def add_column(self, field: pa.Field) -> None:
        import pyarrow as pa

        (column,) = _iceberg_schema(pa.schema([field.with_nullable(True)])).fields
        with self.table.update_schema() as update:
            update.add_column(column.name, column.field_type, required=False)
        self.refresh()

    def widen_column(self, name: str, t: pa.DataType) -> None:
        """Schema evolution: promote a top-level column to the wider type `t` in place (Iceberg's promotions: int to
        long, float to double, a decimal's precision; pyiceberg refuses any other), its field id kept."""
        import pyarrow as pa

        (column,) = _iceberg_schema(pa.schema([pa.field(name, t)])).fields
        with self.table.update_schema() as update:
            update.update_column(name, field_type=column.field_type)
        self.refresh()

    def delete_rows(self, predicate: str) -> None:
        self.table.delete(predicate)  # pyiceberg parses the predicate; a copy-on-write of the files holding matches
        self.refresh()

    def commit(
        self, schema: pa.Schema, files: list[DataFile], versions: dict[str, int], run_id: str, metadata: dict[str, str]
    ) -> int:
        """One Iceberg commit: a snapshot appending `files` and the properties of the new versions. Its requirements
        (the branch's snapshot as this table read it) fail it if another writer committed since."""

        root = _uri(self.location).rstrip("/")
        summary = commit_summary(self, run_id, versions)
        tx = self.table.transaction()
        recording = self._recording(tx, versions)
        _add_files(  # a bucket's partition is the writer's, not inferred from the files
            tx,
            [f"{root}/{f.path}" for f in files],
            [f.partition_values for f in files],
            snapshot_properties={**summary, **metadata, **recording},
            check_duplicate_files=False,  # the names carry this run's id; checking would read every manifest
        )
        self._commit_transaction(tx)
        return self.version()

    def _commit_transaction(self, tx: Any) -> None:
        """Commit `tx` through the catalog and read the table again; a concurrent commit is a `CommitConflict`."""
        from pyiceberg.exceptions import CommitFailedException

        try:
            with _reaching(self.location.catalog):
                tx.commit_transaction()
        except CommitFailedException as err:
            raise CommitConflict(f"commit conflict: {err}") from None
        self.refresh()

    def enable_staging(self) -> None:
        """Let Spark's Iceberg writer stage snapshots in this table (`WAP_ENABLED`: write-audit-publish), in a commit
        of its own, once."""
        if self.table.metadata.properties.get(WAP_ENABLED) != "true":
            with _reaching(self.location.catalog), self.table.transaction() as tx:
                tx.set_properties({WAP_ENABLED: "true"})
            self.refresh()

    def commit_staged(self, wap_id: str, versions: dict[str, int], run_id: str, metadata: dict[str, str]) -> int:
        """One Iceberg commit, as `commit`'s, of the data files Spark's Iceberg writer staged under `wap_id` (a
        snapshot that is not the table's current one): they are appended as they are, with the properties of the new
        versions, by a snapshot that names the staged one (`source-snapshot-id`, `published-wap-id`, as Iceberg's
        own cherry-pick does: Iceberg's snapshot expiry then knows its files were published). The staged snapshot
        is then removed (its files are this commit's). A staged copy-on-write MERGE also removed files: the commit
        is then an overwrite removing them too, published only onto the snapshot the MERGE staged from.

        Raises:
            RunFailed: no snapshot staged under `wap_id`, or one with delete files (merge-on-read).
            CommitConflict: another writer committed first (nothing of this commit is in the table).
        """
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        staged = next(
            (s for s in self.table.snapshots() if s.summary and s.summary.additional_properties.get(WAP_ID) == wap_id),
            None,
        )
        if staged is None:
            raise RunFailed(f"table {self.location}: no snapshot staged by Spark under wap.id {wap_id}")
        files: list[Any] = []
        removed: list[Any] = []  # pyiceberg's DataFile
        for manifest in staged.manifests(self.table.io):
            if manifest.added_snapshot_id != staged.snapshot_id:
                continue
            if manifest.content != ManifestContent.DATA:
                raise RunFailed(
                    f"table {self.location}: Spark staged delete files under wap.id {wap_id} (merge-on-read): "
                    "only data files are published"
                )
            for entry in manifest.fetch_manifest_entry(self.table.io, discard_deleted=False):
                if entry.snapshot_id == staged.snapshot_id:
                    deleted = entry.status == ManifestEntryStatus.DELETED
                    (removed if deleted else files).append(entry.data_file)
        current = self.table.current_snapshot()
        if removed and staged.parent_snapshot_id != (current.snapshot_id if current else None):
            raise CommitConflict(
                f"commit conflict: Spark staged its MERGE on snapshot {staged.parent_snapshot_id}, the table is at "
                f"{current.snapshot_id if current else 'none'} (another writer committed since)"
            )
        for data_file in files:  # Hadoop's spelling of a local path (`file:/x`) as this table's files have it
            path = data_file.file_path
            if path.startswith("file:/") and not path.startswith("file:///"):
                data_file[1] = "file:///" + path.removeprefix("file:").lstrip("/")  # its `file_path` (no setter)
        summary = commit_summary(self, run_id, versions)
        published = {"source-snapshot-id": str(staged.snapshot_id), "published-wap-id": wap_id}
        tx = self.table.transaction()
        recording = self._recording(tx, versions)
        properties = {**summary, **metadata, **recording, **published}
        update = tx.update_snapshot(snapshot_properties=properties)
        with update.overwrite() if removed else update.fast_append() as append:
            for data_file in removed:
                append.delete_data_file(data_file)
            for data_file in files:
                append.append_data_file(data_file)
        self._commit_transaction(tx)
        version = self.version()
        try:  # the files are this commit's now; a staged snapshot left behind names no file of another
            with _reaching(self.location.catalog):
                self.table.maintenance.expire_snapshots().by_ids([staged.snapshot_id]).commit()
            self.refresh()
        except (CommitFailedException, RunFailed) as err:
            log.warning("export: staged snapshot %s left in the table: %s", staged.snapshot_id, err)
        return version

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
        """pyiceberg has no MERGE: the rows of the (topic, partition)s of `source` are read, merged here (a source row
        whose `order` is above its key's row replaces it, or deletes it when a tombstone; a new key's row is inserted
        unless a tombstone) and written back with one overwrite of those partitions' rows (copy-on-write), in one
        commit with the new versions.

        Raises:
            CommitConflict: another writer committed first (nothing of this commit is in the table).
        """
        from pyiceberg.expressions import AlwaysFalse, And, EqualTo, Or, Reference
        from pyiceberg.expressions.literals import literal

        def equal(column: str, value: Any) -> BooleanExpression:
            return EqualTo(term=Reference(column), value=literal(value))

        scopes = sorted(set(zip(source["topic"].to_pylist(), source["partition"].to_pylist(), strict=True)))
        scope: BooleanExpression = AlwaysFalse()
        for t, p in scopes:
            scope = Or(scope, And(equal("topic", t), equal("partition", p)))
        schema = self.arrow_schema()
        target = self.table.scan(row_filter=scope).to_arrow() if scopes else schema.empty_table()
        mine = self.location.source
        if (
            SOURCE_COLUMN in keys
            and mine is not None
            and owns_unsourced(mine, self.properties().get(LEGACY_SOURCE_KEY))
        ):
            import pyarrow.compute as pc

            at = target.schema.get_field_index(SOURCE_COLUMN)  # rows written before sources are the owner's
            target = target.set_column(at, target.field(at), pc.fill_null(target[SOURCE_COLUMN], mine))
        merged, counts = _merged(target, source, schema, keys, order, tombstone)
        summary = commit_summary(self, run_id, versions)
        tx = self.table.transaction()
        recording = self._recording(tx, versions)
        rewrite = scope if target.num_rows else AlwaysFalse()  # nothing to delete: an append
        tx.overwrite(merged, overwrite_filter=rewrite, snapshot_properties={**summary, **metadata, **recording})
        self._commit_transaction(tx)
        return {f"num_target_rows_{k}": v for k, v in counts.items()}

    def properties(self) -> dict[str, str]:
        return dict(self.table.metadata.properties)

    def _has_files(self) -> bool:
        """Whether the current snapshot lists any manifest: pyiceberg's `inspect` tables fail on a snapshot with none
        (a latest-mode commit that only advanced versions, or a merge that deleted every row) rather than give no
        rows; such a snapshot is a table with no files."""
        snapshot = self.table.current_snapshot()
        return snapshot is not None and bool(snapshot.manifests(self.table.io))

    def file_stats(self) -> pa.Table:
        """From the current snapshot's manifests: each data file's path, size, partition values and its columns'
        lower and upper bounds."""
        import pyarrow as pa

        files = self.table.inspect.data_files().to_pylist() if self._has_files() else []
        root = _uri(self.location).rstrip("/") + "/"
        rows = []
        for f in files:
            row: dict[str, Any] = {"path": f["file_path"].removeprefix(root), "size_bytes": f["file_size_in_bytes"]}
            row.update({f"partition.{k}": v for k, v in (f["partition"] or {}).items()})
            for column, metrics in (f["readable_metrics"] or {}).items():
                if metrics:
                    row[f"min.{column}"], row[f"max.{column}"] = metrics["lower_bound"], metrics["upper_bound"]
            rows.append(row)
        if not rows:
            return pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64())})
        return pa.Table.from_pylist(rows)

    def file_writers(self, paths: set[str], lookback: int) -> dict[str, str]:
        """The snapshot that added each file (its manifest entry's snapshot id), as `snapshot N (sequence number
        S), operation …, app id …` (properties other than this library's that the snapshot's summary names)."""
        if not self._has_files():
            return {}
        root = _uri(self.location).rstrip("/") + "/"
        snapshots = {s.snapshot_id: s for s in self.table.snapshots()}
        out: dict[str, str] = {}
        for entry in self.table.inspect.entries().to_pylist():
            rel = entry["data_file"]["file_path"].removeprefix(root)
            if rel not in paths:
                continue
            snapshot = snapshots.get(entry["snapshot_id"])
            if snapshot is None:
                out[rel] = f"snapshot {entry['snapshot_id']} (expired)"
                continue
            summary = snapshot.summary
            who = [f"snapshot {snapshot.snapshot_id} (sequence number {snapshot.sequence_number})"]
            if summary is not None:
                who.append(f"operation {summary.operation.value}")
                extra = summary.additional_properties
                apps = [k for k in extra if k.startswith("app") and not extra[k].startswith(APP_ID_PREFIX)]
                who += [f"{k} {extra[k]}" for k in apps]
                if "engine-name" in extra:
                    who.append(f"{extra['engine-name']} {extra.get('engine-version', '')}".strip())
            out[rel] = ", ".join(who)
        return out

    def run_history(self) -> list[RunCommit]:
        """Every snapshot still kept, and version 0 (the table's creation) while its first snapshot is."""
        snapshots = self.table.snapshots()
        out = [
            RunCommit(
                s.sequence_number or 0,
                s.timestamp_ms,
                s.summary.additional_properties.get(RUN_KEY) if s.summary else None,
            )
            for s in snapshots
        ]
        if not snapshots or any(s.parent_snapshot_id is None for s in snapshots):
            out.append(RunCommit(0, 0, None))
        return out

    def referenced_files(self) -> set[str]:
        root = _uri(self.location).rstrip("/") + "/"
        return {
            t.file.file_path.removeprefix(root)
            for t in self.table.scan().plan_files()
            if t.file.file_path.startswith(root)
        }

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        snapshots = sorted(self.table.snapshots(), key=lambda s: s.timestamp_ms, reverse=True)[:limit]
        return [
            {
                **(s.summary.additional_properties if s.summary else {}),
                "version": s.sequence_number,
                "timestamp": s.timestamp_ms,
            }
            for s in snapshots
        ]

    def to_pyarrow_dataset(self) -> ds.Dataset:
        """The current snapshot's data files as a Parquet dataset in the table's columns (a file written before a
        column was added reads it as null); `check_readable` refuses what this would not read as it is."""
        import pyarrow.dataset as ds

        filesystem, root = self.location.filesystem()
        paths = [f"{root}/{rel}" for rel in sorted(self.referenced_files())]
        return ds.dataset(paths, schema=self.arrow_schema(), format="parquet", filesystem=filesystem)

    def check_readable(self) -> None:
        """Refuse a table whose current snapshot has delete files (another engine's DELETE, UPDATE or MERGE: the
        rows they delete would be read) or data files outside the table's directory.

        Raises:
            JobConfigError: one line naming the table and what it has.
        """
        if not self._has_files():
            return
        root = _uri(self.location).rstrip("/") + "/"
        files = self.table.inspect.files().select(["content", "file_path"]).to_pylist()
        deletes = sum(f["content"] != 0 for f in files)
        if deletes:
            raise JobConfigError(
                f"table {self.location} has {deletes} delete file(s) (rows deleted by another engine), which this "
                "library's reader does not apply"
            )
        outside = [f["file_path"] for f in files if not f["file_path"].startswith(root)]
        if outside:
            raise JobConfigError(f"table {self.location} has data files outside its directory, e.g. {outside[0]}")

    def compact_files(self, target_bytes: int, *, dry_run: bool) -> UpkeepStep:
        """A rewrite of our own (pyiceberg has no file compaction): every table partition with two or more data
        files smaller than `target_bytes` is read and written back in files of up to `target_bytes` (recorded as
        the table's `write.target-file-size-bytes`), sorted by partition and seq, all in ONE commit that overwrites
        those partitions. Rows, recorded versions and the schema are unchanged; a concurrent commit fails it with
        nothing rewritten (`CommitConflict`: run it again)."""
        from pyiceberg.exceptions import CommitFailedException

        check_rewritable(spec_terms(self.table.spec(), self.table.schema()), f"optimize {self.location}")
        files = self._data_files()
        before = (len(files), sum(size for _, size in files))
        groups: dict[tuple[tuple[str, Any], ...], list[int]] = {}
        for values, size in files:
            groups.setdefault(values, []).append(size)
        chosen = [v for v, sizes in groups.items() if sum(size < target_bytes for size in sizes) >= 2]
        removed = sum(len(groups[v]) for v in chosen)
        if dry_run or not chosen:
            return UpkeepStep("optimize", *before, *before, dry_run=dry_run, files_removed=0, files_written=0)
        scope = _partitions_filter(chosen)
        rows = self.table.scan(row_filter=scope).to_arrow()
        order = [(c, "ascending") for c in ("topic", "partition", "seq") if c in rows.column_names]
        schema = self.arrow_schema()
        rows = rows.sort_by(order).select(schema.names).cast(schema)
        tx = self.table.transaction()
        tx.set_properties({"write.target-file-size-bytes": str(target_bytes)})
        tx.overwrite(rows, overwrite_filter=scope, snapshot_properties={"operation.tank-log": "optimize"})
        try:
            with _reaching(self.location.catalog):
                tx.commit_transaction()
        except CommitFailedException as err:
            raise CommitConflict(
                f"table {self.location}: optimize: commit conflict, nothing rewritten ({err})"
            ) from None
        self.refresh()
        after_files = self._data_files()
        after = (len(after_files), sum(size for _, size in after_files))
        written = after[0] - (before[0] - removed)
        log.info(
            "export: optimize rewrote %d files of %d partitions into %d: %d files (%d bytes) → %d files (%d bytes)",
            removed,
            len(chosen),
            written,
            *before,
            *after,
        )
        return UpkeepStep("optimize", *before, *after, files_removed=removed, files_written=written)

    def _data_files(self) -> list[tuple[tuple[tuple[str, Any], ...], int]]:
        """The current snapshot's data files: (their partition values as (column, value) pairs, their size)."""
        if not self._has_files():
            return []
        out = []
        for f in self.table.inspect.data_files().select(["partition", "file_size_in_bytes"]).to_pylist():
            out.append((tuple(sorted((f["partition"] or {}).items())), int(f["file_size_in_bytes"])))
        return out

    def remove_unreferenced(self, retention_ms: int, *, dry_run: bool) -> UpkeepStep:
        """Snapshot expiry, then the files nothing references: snapshots older than `retention_ms` go, except the
        current one (the recorded versions are table properties: they stay); then every data file under the table
        that no kept snapshot references and that was last written more than `retention_ms` ago is deleted (files
        another writer's or a crashed run left, or that expired snapshots alone referenced). Files and bytes are
        every data file in storage."""
        stored = self.location.data_files()
        before = (len(stored), sum(f.size for f in stored))
        now_ms = datetime.now(UTC).timestamp() * 1000
        cutoff = now_ms - retention_ms
        current = self.table.current_snapshot()
        old = [
            s.snapshot_id
            for s in self.table.snapshots()
            if s.timestamp_ms < cutoff and (current is None or s.snapshot_id != current.snapshot_id)
        ]
        if old and not dry_run:
            self.table.maintenance.expire_snapshots().by_ids(old).commit()
            self.refresh()
        kept = self._files_of_kept_snapshots(set() if dry_run else set(old))
        doomed = [f for f in stored if f.rel not in kept and f.mtime_ms < cutoff]
        if doomed and not dry_run:
            self.location.delete([f.rel for f in doomed])
        gone = sum(f.size for f in doomed)
        after = (before[0] - len(doomed), before[1] - gone)
        log.info(
            "export: snapshot expiry%s %d snapshots older than %d h; %s %d unreferenced files (%d bytes): "
            "%d files (%d bytes) → %d files (%d bytes)",
            " would remove" if dry_run else " removed",
            len(old),
            retention_ms // 3_600_000,
            "would delete" if dry_run else "deleted",
            len(doomed),
            gone,
            *before,
            *after,
        )
        return UpkeepStep("vacuum", *before, *after, dry_run=dry_run, files_removed=len(doomed))

    def _files_of_kept_snapshots(self, expired: set[int]) -> set[str]:
        """The data files (relative to the table) any snapshot but `expired` references (outside the table: left
        out)."""
        root = _uri(self.location).rstrip("/") + "/"
        out: set[str] = set()
        for snapshot in self.table.snapshots():
            if snapshot.snapshot_id in expired:
                continue
            for manifest in snapshot.manifests(self.table.io):
                for entry in manifest.fetch_manifest_entry(self.table.io, discard_deleted=True):
                    out.add(entry.data_file.file_path.removeprefix(root))
        return out


def _merged(
    target: pa.Table, source: pa.Table, schema: pa.Schema, keys: tuple[str, ...], order: str, tombstone: str
) -> tuple[pa.Table, dict[str, int]]:
    """The rows of `target` merged with `source` as a MERGE would leave them (a source row whose `order` is above its
    key's target row replaces it, or deletes it when a tombstone; a new key's row is inserted unless a tombstone), in
    `schema`; and the counts of rows inserted, updated, deleted and copied."""
    import pyarrow as pa
    import pyarrow.compute as pc

    index = {k: i for i, k in enumerate(zip(*(target[c].to_pylist() for c in keys), strict=True))}
    target_order, source_order = target[order].to_pylist(), source[order].to_pylist()
    dead, taken = set(), []
    counts = dict.fromkeys(("inserted", "updated", "deleted"), 0)
    source_keys = zip(*(source[c].to_pylist() for c in keys), strict=True)
    for j, (k, gone) in enumerate(zip(source_keys, source[tombstone].to_pylist(), strict=True)):
        i = index.get(k)
        if i is not None:
            if source_order[j] <= target_order[i]:
                continue
            dead.add(i)
            counts["deleted" if gone else "updated"] += 1
        elif gone:
            continue
        else:
            counts["inserted"] += 1
        if not gone:
            taken.append(j)
    keep = pa.array([i not in dead for i in range(target.num_rows)], pa.bool_())
    merged = pa.concat_tables(
        [
            target.filter(keep).select(schema.names).cast(schema),
            source.take(pa.array(taken, pa.int64())).select(schema.names).cast(schema),
        ]
    )
    counts["copied"] = int(pc.sum(keep).as_py() or 0)
    return merged, counts


def _partitions_filter(partitions: list[tuple[tuple[str, Any], ...]]) -> BooleanExpression:
    """The rows of these table partitions (identity-partitioned: each a tuple of (column, value); none: every row)."""
    from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, EqualTo, IsNull, Or, Reference
    from pyiceberg.expressions.literals import literal

    out: BooleanExpression = AlwaysFalse()
    for values in partitions:
        one: BooleanExpression = AlwaysTrue()
        for column, value in values:
            term = Reference(column)
            one = And(one, IsNull(term=term) if value is None else EqualTo(term=term, value=literal(value)))
        out = Or(out, one)
    return out


def _shape(t: IcebergType) -> str:
    """A type as `str` writes it, without the ids of the fields inside it: a table's follow the columns it had when
    the struct was added, `_iceberg_schema`'s fresh ones all of this export's (an added column shifts them)."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(t, StructType):
        fields = (f"{f.name}: {'required' if f.required else 'optional'} {_shape(f.field_type)}" for f in t.fields)
        return f"struct<{', '.join(fields)}>"
    if isinstance(t, ListType):
        return f"list<{_shape(t.element_type)}>"
    if isinstance(t, MapType):
        return f"map<{_shape(t.key_type)}, {_shape(t.value_type)}>"
    return str(t)


def _iceberg_schema(schema: pa.Schema) -> Schema:
    """An Arrow schema as Iceberg's, with field ids assigned in order (as `create_table` assigns them)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))


def open(location: TableLocation) -> IcebergTable | None:  # noqa: A001 (the format modules' one name for it)
    """The Iceberg table at its latest snapshot; None if its catalog has none.

    Raises:
        JobConfigError: the catalog holds this name for a table elsewhere.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    if location.is_local and not location.catalog and not os.path.exists(catalog_uri(location)[10:]):
        return None
    try:
        with _reaching(location.catalog):
            table = _catalog(location).load_table(identifier(location))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    if _place(table.metadata.location) != _place(_uri(location)):
        raise JobConfigError(
            f"table {location}: catalog {_shown(catalog_uri(location))} names {'.'.join(identifier(location))} "
            f"a table at {table.metadata.location}"
        )
    return IcebergTable(location, table)


def _partition_spec(partition_by: tuple[str, ...], schema: Schema) -> PartitionSpec:
    """The partition spec of `partition_by` (`partitioning.terms`) over the table's `schema`, field ids from 1000."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform, MonthTransform

    made = {"identity": IdentityTransform, "hour": HourTransform, "day": DayTransform, "month": MonthTransform}
    return PartitionSpec(
        *(
            PartitionField(
                source_id=schema.find_field(t.source).field_id,
                field_id=1000 + i,
                transform=BucketTransform(t.width or 1) if t.transform == "bucket" else made[t.transform](),
                name=t.name,
            )
            for i, t in enumerate(terms(partition_by))
        )
    )


def _add_files(
    tx: Transaction,
    paths: list[str],
    values: list[dict[str, str | None]],
    snapshot_properties: dict[str, str],
    check_duplicate_files: bool = False,
) -> None:
    """`Transaction.add_files` whatever the table's spec: pyiceberg infers each file's partition from its columns'
    bounds, which a bucket's cannot give; there the file's bucket is the writer's (`values`: each file's partition
    values by field name, as `partitioning.partition_keys` made them)."""
    meta = tx.table_metadata
    spec, schema = meta.spec(), meta.schema()
    if all(f.transform.preserves_order for f in spec.fields):
        tx.add_files(paths, snapshot_properties=snapshot_properties, check_duplicate_files=check_duplicate_files)
        return
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import TableProperties
    from pyiceberg.typedef import Record

    if check_duplicate_files and tx._find_referenced_data_files(paths):
        raise ValueError(f"files already referenced by the table: {', '.join(tx._find_referenced_data_files(paths))}")
    if meta.name_mapping() is None:  # as add_files: readers map the files' columns by name
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: schema.name_mapping.model_dump_json()})
    io = tx._table.io
    with tx.update_snapshot(snapshot_properties=snapshot_properties).fast_append() as append:
        for path, by_name in zip(paths, values, strict=True):
            file = io.new_input(path)
            with file.open() as stream:
                parquet = pq.read_metadata(stream)
            stats = data_file_statistics_from_parquet_metadata(
                parquet_metadata=parquet,
                stats_columns=compute_statistics_plan(schema, meta.properties),
                parquet_column_mapping=parquet_path_to_id_mapping(schema),
            )
            partition = [
                stats._partition_value(f, schema)
                if f.transform.preserves_order
                else (None if by_name.get(f.name) is None else int(str(by_name[f.name])))
                for f in spec.fields
            ]
            append.append_data_file(
                DataFile.from_args(
                    content=DataFileContent.DATA,
                    file_path=path,
                    file_format=FileFormat.PARQUET,
                    partition=Record(*partition),
                    file_size_in_bytes=len(file),
                    sort_order_id=None,
                    spec_id=meta.default_spec_id,
                    equality_ids=None,
                    key_metadata=None,
                    **stats.to_serialized_dict(),
                )
            )


def create(
    location: TableLocation,
    schema: pa.Schema,
    partition_by: tuple[str, ...],
    configuration: dict[str, str] | None = None,
) -> IcebergTable:
    """A new, empty Iceberg table partitioned by `partition_by` (`partitioning.iceberg_spec`), commit retries off;
    `configuration`: keys of ours it records as table properties.

    Raises:
        JobConfigError: the catalog already has a table of that name.
    """
    from pyiceberg.exceptions import TableAlreadyExistsError

    catalog = _catalog(location)
    with _reaching(location.catalog):
        catalog.create_namespace_if_not_exists(identifier(location)[:-1])
    iceberg_schema = _iceberg_schema(schema)
    spec = _partition_spec(partition_by, iceberg_schema)
    try:
        with _reaching(location.catalog):
            table = catalog.create_table(
                identifier(location),
                schema=iceberg_schema,
                location=_uri(location),
                partition_spec=spec,
                properties={**(configuration or {}), **NO_RETRIES},
            )
    except TableAlreadyExistsError:
        raise JobConfigError(
            f"table {location}: catalog {_shown(catalog_uri(location))} already has a table "
            f"{'.'.join(identifier(location))}" + ("" if location.name else " (another table of that directory name?)")
        ) from None
    return IcebergTable(location, table)


def check_vacuum_retention(table: LakeTable | None, retention_ms: int) -> None:
    """Refuse a retention below the table's `history.expire.max-snapshot-age-ms` (Iceberg's default 5 days; a table
    this run will create has the default): readers of snapshots within it would lose them, and the unreferenced files
    it deletes include those of an export in flight. A table that allows less says so in that property.

    Raises:
        JobConfigError: the retention is shorter than the table allows.
    """
    configured = None if table is None else table.properties().get(MAX_SNAPSHOT_AGE)
    try:
        minimum = DEFAULT_MAX_SNAPSHOT_AGE_MS if configured is None else int(configured)
    except ValueError:
        raise JobConfigError(f"table property {MAX_SNAPSHOT_AGE}={configured!r}: not a number of ms") from None
    if retention_ms < minimum:
        raise JobConfigError(
            f"--vacuum {retention_ms / 3_600_000:g}h is shorter than the table's snapshot retention "
            f"({minimum / 3_600_000:g}h, {MAX_SNAPSHOT_AGE}): readers of older snapshots would lose them, and an "
            "export in flight its files; raise the retention or lower that table property"
        )


def _shown(uri: str) -> str:
    """A catalog URI without its password."""
    return re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", uri)


if TYPE_CHECKING:  # mypy checks this module and its table against the interface
    import tank_log.lakehouse.iceberg as _this_format
    from tank_log.lakehouse.location import TableFormat

    _FORMAT: TableFormat = _this_format

    def _as_lake_table(table: IcebergTable) -> LakeTable:
        return table
