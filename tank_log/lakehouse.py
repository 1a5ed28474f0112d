"""What a Delta table has received of each TANK partition: the export's application transactions (delta-rs).

The export commits every partition's rows with an app transaction whose id names the table, topic and partition and
whose version is the last seq exported; retention reads the same transactions to keep what the table has not
received. `app_id` is the one place that id is computed.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from tank_log.errors import JobConfigError, TankLogError

if TYPE_CHECKING:
    from deltalake import DeltaTable

REQUIRED_COLUMNS = ("topic", "partition", "seq")  # what makes a table a tank-log export


class TableUnreadable(TankLogError):
    """The Delta table cannot be read (missing, unreachable, not a tank-log export): what it holds is unknown."""


def table_id(table: DeltaTable) -> str:
    """The Delta table's own id: its metaData id, a UUID string (deltalake annotates it `int`)."""
    return str(table.metadata().id)


def app_id(table_uuid: str, topic: str, partition: int) -> str:
    """Application transaction id of one partition in one table. `table_uuid` is the Delta table's own id (`table_id`,
    kept when the table is moved, copied or reached through another path or a symlink), so exactly-once
    belongs to the table, not to the path used to reach it."""
    return f"tank-log:{table_uuid}:{topic}:{partition}"


def table_key(table: str) -> str:
    return table if "://" in table else os.path.abspath(table)


def legacy_app_id(table: str, topic: str, partition: int) -> str:
    """The id of tables exported before `app_id` used the table's id (a hash of the path): read, never written."""
    digest = hashlib.sha1(table_key(table).encode()).hexdigest()[:12]
    return f"tank-log:{digest}:{topic}:{partition}"


def recorded_version(table: DeltaTable, table_path: str, topic: str, partition: int) -> tuple[str, int | None]:
    """(app id, last exported seq recorded in the table for the partition, None if never)."""
    aid = app_id(table_id(table), topic, partition)
    version = table.transaction_version(aid)
    if version is None:
        version = table.transaction_version(legacy_app_id(table_path, topic, partition))
    return aid, version


def storage_options(configured: dict[str, str], flags: list[str]) -> dict[str, str]:
    """`export.storage_options` with `--storage-option KEY=VALUE` flags over them.

    Raises:
        JobConfigError: a flag without `=`.
    """
    options = dict(configured)
    for item in flags:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobConfigError(f"--storage-option {item!r}: expected KEY=VALUE")
        options[key] = value
    return options


class ExportedSeqs:
    """The last seq one Delta table has received of each partition, for a run that must not outrun it. The table
    is opened once, at the first question; a table that cannot be read raises `TableUnreadable` for every one."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = table_key(uri)
        self._options = dict(storage_options or {})
        self._table: DeltaTable | None = None
        self._error: str | None = None

    def __str__(self) -> str:  # never the options: they may hold credentials
        return self.uri

    def last_seq(self, topic: str, partition: int) -> int | None:
        """The last seq of `topic`/`partition` the table holds (None: none yet).

        Raises:
            TableUnreadable: the table is missing, unreachable or not a tank-log export.
        """
        table = self._open()
        try:
            return recorded_version(table, self.uri, topic, partition)[1]
        except Exception as err:  # delta-rs raises its own types (and OSError) for I/O and protocol errors
            raise TableUnreadable(f"{self.uri}: {type(err).__name__}: {err}") from err

    def _open(self) -> DeltaTable:
        if self._table is not None:
            return self._table
        if self._error is None:
            try:
                from deltalake import DeltaTable

                table = DeltaTable(self.uri, storage_options=self._options or None)
                names = set(table.schema().to_arrow().names)
                missing = [c for c in REQUIRED_COLUMNS if c not in names]
                if missing:
                    self._error = f"{self.uri}: not a tank-log export (no column {', '.join(missing)})"
                else:
                    self._table = table
                    return table
            except Exception as err:  # missing table, unreachable store, bad credentials: say which
                self._error = f"{self.uri}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise TableUnreadable(self._error)
