"""Table upkeep after an export: `optimize` (delta-rs compaction of small files into files of the target size) and
`vacuum` (delete files no version within the retention references). Each reports files and bytes before and after:
optimize the table's live files, vacuum every data file in storage."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tank_log.errors import JobConfigError
from tank_spark.export.location import TableLocation

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

DEFAULT_DELETED_FILE_RETENTION_MS = 7 * 24 * 3600 * 1000  # Delta's default delta.deletedFileRetentionDuration


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


def live_files(table: DeltaTable) -> tuple[int, int]:
    """(files, bytes) of the table's current snapshot."""
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    return len(sizes), sum(sizes)


def optimize(table: DeltaTable, target_bytes: int, *, dry_run: bool = False) -> UpkeepStep:
    """Rewrite small live files into files of about `target_bytes` (one commit; readers and app transactions are
    unaffected)."""
    files, size = live_files(table)
    if dry_run:
        return UpkeepStep("optimize", files, size, files, size, dry_run=True)
    metrics = table.optimize.compact(target_size=target_bytes)
    table.update_incremental()
    after = live_files(table)
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


def vacuum(location: TableLocation, table: DeltaTable, retention_ms: int, *, dry_run: bool = False) -> UpkeepStep:
    """Delete data files no version within `retention_ms` references (removed by optimize or an overwrite)."""
    stored = {f.rel: f.size for f in location.data_files()}
    before = (len(stored), sum(stored.values()))
    hours = -(-retention_ms // 3_600_000)  # delta-rs takes whole hours: round up, never below what was asked
    doomed = table.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=True)
    gone = sum(stored.get(_relative(location, p), 0) for p in doomed)
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


def check_vacuum_retention(table: DeltaTable | None, retention_ms: int) -> None:
    """Refuse a retention below the table's `delta.deletedFileRetentionDuration` (default 7 days; a table this run
    will create has the default): readers of versions within it would lose files. A table that allows less says so
    in that property.

    Raises:
        JobConfigError: the retention is shorter than the table allows.
    """
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


def _interval_ms(value: str) -> int:
    """A Delta table property interval, e.g. `interval 7 days`."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*", value.lower())
    if not m or m.group(2) not in _UNITS_MS:
        raise JobConfigError(f"table property delta.deletedFileRetentionDuration={value!r}: not an interval")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def _relative(location: TableLocation, path: str) -> str:
    """delta-rs reports vacuumed files relative to the table (or as full URIs): the path relative to the table."""
    root = location.uri.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path
