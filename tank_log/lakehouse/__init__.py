"""The lakehouse tables the export writes and retention, stats and the import read, whatever their format.

`location.py` is where a table lives and the interface every format implements (`LakeTable`, `TableFormat`; `FORMATS`
names each format's module), `table.py` its typed results, errors and the recorded versions' ids, one module per
format (`delta.py`: delta-rs; `iceberg.py`: pyiceberg), and
`exported.py` what a table has received (`ExportedSeqs`). Only a format's own module imports its library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tank_log.lakehouse.exported import ExportedSeqs
from tank_log.lakehouse.location import (
    FORMATS,
    LakeTable,
    StoredFile,
    TableFormat,
    TableLocation,
    implementation,
    table_mode,
)
from tank_log.lakehouse.table import (
    LEGACY_SOURCE_KEY,
    MODE_KEY,
    REQUIRED_COLUMNS,
    RUN_KEY,
    SOURCE_COLUMN,
    CommitConflict,
    DataFile,
    Recorded,
    RunCommit,
    TableUnreadable,
    UpkeepStep,
    app_id,
    check_source,
    default_source,
    legacy_app_id,
    owns_unsourced,
    storage_options,
    table_key,
    text_column,
)

if TYPE_CHECKING:
    from tank_log.lakehouse.delta import recorded_version, table_id

__all__ = [
    "FORMATS",
    "LEGACY_SOURCE_KEY",
    "MODE_KEY",
    "REQUIRED_COLUMNS",
    "RUN_KEY",
    "SOURCE_COLUMN",
    "CommitConflict",
    "DataFile",
    "ExportedSeqs",
    "LakeTable",
    "Recorded",
    "RunCommit",
    "StoredFile",
    "TableFormat",
    "TableLocation",
    "TableUnreadable",
    "UpkeepStep",
    "app_id",
    "check_source",
    "owns_unsourced",
    "default_source",
    "implementation",
    "legacy_app_id",
    "recorded_version",
    "storage_options",
    "table_id",
    "table_key",
    "table_mode",
    "text_column",
]


def __getattr__(name: str) -> Any:
    """`recorded_version` and `table_id` of a delta-rs `DeltaTable` (`delta.py`), loaded on first use."""
    if name in ("recorded_version", "table_id"):
        from tank_log.lakehouse import delta

        return getattr(delta, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
