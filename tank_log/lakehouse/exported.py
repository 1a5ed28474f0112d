"""What a table has received of each TANK partition of one broker, for a run that must not outrun it (retention's
guard, stats)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tank_log.lakehouse.location import RestCatalog, TableLocation
from tank_log.lakehouse.table import REQUIRED_COLUMNS, Recorded, TableUnreadable, default_source, table_key

if TYPE_CHECKING:
    from tank_log.lakehouse.location import Catalog, LakeTable


class ExportedSeqs:
    """The last seq one table has received of each partition of one broker (`source`; None: this host's name, as
    the export's default). A recorded version is checked against the table's history (`LakeTable.recorded`): after
    a RESTORE or a rollback, what the table still holds. The table is opened once, at the first question; a table
    that cannot be read raises `TableUnreadable` for every one."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        fmt: str = "delta",
        catalog: Catalog | None = None,
        source: str | None = None,
    ):
        self.uri = uri if isinstance(catalog, RestCatalog) else table_key(uri)  # a REST catalog's: a name
        self.source = source or default_source()
        self._options = dict(storage_options or {})
        self._format, self._catalog = fmt, catalog
        self._table: LakeTable | None = None
        self._error: str | None = None

    def __str__(self) -> str:  # never the options: they may hold credentials
        return self.uri

    def last_seq(self, topic: str, partition: int) -> int | None:
        """The last seq of `topic`/`partition` the table holds (None: none yet).

        Raises:
            TableUnreadable: the table is missing, unreachable or not a tank-log export.
        """
        return self.recorded(topic, partition).version

    def recorded(self, topic: str, partition: int) -> Recorded:
        """`last_seq`, with what the table's recorded version says and, when they differ, what undid it.

        Raises:
            TableUnreadable: the table is missing, unreachable or not a tank-log export, or its history cannot be
                read.
        """
        table = self._open()
        try:
            return table.recorded(topic, partition)
        except TableUnreadable:
            raise
        except Exception as err:  # the formats' libraries raise their own types (and OSError) for I/O errors
            raise TableUnreadable(f"{self.uri}: {type(err).__name__}: {err}") from err

    def _open(self) -> LakeTable:
        if self._table is not None:
            return self._table
        if self._error is None:
            try:
                table = TableLocation.of(self.uri, self._options, self._format, self._catalog, self.source).open()
                if table is None:
                    raise FileNotFoundError(f"no {self._format} table")
                names = set(table.arrow_schema().names)
                missing = [c for c in REQUIRED_COLUMNS if c not in names]
                if missing:
                    self._error = f"{self.uri}: not a tank-log export (no column {', '.join(missing)})"
                else:
                    self._table = table
                    return table
            except Exception as err:  # missing table, unreachable store, bad credentials: say which
                self._error = f"{self.uri}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise TableUnreadable(self._error)
