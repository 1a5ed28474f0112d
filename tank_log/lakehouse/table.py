"""What does not depend on a table's format: the ids each partition's recorded version is kept under, the storage
options, the errors, and the typed results of the interface every format implements (`location.LakeTable`).

The export commits every partition's rows together with its new version (the last seq exported) under an id naming
the table, topic and partition (`app_id`); retention reads the same versions to keep what the table has not
received. `app_id` is the one place that id is computed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from tank_log.errors import JobConfigError, RunFailed, TankLogError

REQUIRED_COLUMNS = ("topic", "partition", "seq")  # what makes a table a tank-log export
APP_ID_PREFIX = "tank-log:"  # every recorded version's id starts so (`app_id`, `legacy_app_id`)
RUN_KEY = "tank-log.run"  # the commit metadata field holding the id of the export run that made the commit


class TableUnreadable(TankLogError):
    """The table cannot be read (missing, unreachable, not a tank-log export): what it holds is unknown."""


class CommitConflict(RunFailed):
    """Another writer committed first and the format refused this commit: nothing of it is in the table."""


def app_id(table_uuid: str, topic: str, partition: int) -> str:
    """The id one partition's recorded version is kept under in one table. `table_uuid` is the table's own id
    (`LakeTable.table_id`, kept when the table is moved, copied or reached through another path or a symlink),
    so exactly-once belongs to the table, not to the path used to reach it."""
    return f"{APP_ID_PREFIX}{table_uuid}:{topic}:{partition}"


def table_key(table: str) -> str:
    return table if "://" in table else os.path.abspath(table)


def legacy_app_id(table: str, topic: str, partition: int) -> str:
    """The id of tables exported before `app_id` used the table's id (a hash of the path): read, never written."""
    digest = hashlib.sha1(table_key(table).encode()).hexdigest()[:12]
    return f"{APP_ID_PREFIX}{digest}:{topic}:{partition}"


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


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written under the table, to be committed: its path relative to the table, size, partition
    values (as strings, None for null), modification time (ms since the epoch), row count and column statistics (the
    Delta `stats` JSON the writer computed)."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    num_records: int
    stats: str


@dataclass(frozen=True)
class RunCommit:
    """One commit of the table's history: its version, time (ms since the epoch) and the `RUN_KEY` it recorded."""

    version: int
    timestamp_ms: int
    run: str | None


@dataclass(frozen=True)
class UpkeepStep:
    """One upkeep operation: files and bytes before and after (or, in a dry run, what it would leave). `files_after`
    is the table as the operation left it, with what other writers committed meanwhile (a continuous export);
    `files_removed` and `files_written` are the operation's own."""

    operation: str  # optimize | vacuum
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    dry_run: bool = False
    files_removed: int | None = None
    files_written: int | None = None
