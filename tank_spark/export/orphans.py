"""Orphaned Parquet files: what a run that died before its commit left under the table, removed by the next run
(the table's at the start of each export, `job.py`; the dead-letter table's when a run first opens it,
`dead_letters.py`).

A file is an orphan — and removed — only when all of these hold:
- its name carries a run id (`run_id.py`: files of other writers, e.g. delta-rs's optimize, are never touched);
- that run never committed: its id is in no commit of the table's history (`tank-log.run`) and the file is not
  in the current snapshot;
- the run started after the oldest commit whose history is still readable and after the last commit made before
  commits recorded the files' run id, so "never committed" is known, not guessed (older ones are left to vacuum);
- the run started, and the file was last written, more than the safety horizon ago. A run never commits once it
  is older than the horizon (`check_run_age`), so a concurrent writer's in-flight files are never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import unquote

from tank_log.errors import TankLogError
from tank_log.lakehouse import LakeTable, RunCommit, StoredFile, TableLocation
from tank_spark.export.run_id import is_run_id, run_of, started_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrphanSweep:
    """What a sweep removed (or, in a dry run, would remove), and the uncommitted files it left as too recent."""

    files: int
    bytes: int
    runs: tuple[str, ...]
    recent_files: int
    dry_run: bool


class RunTooOld(TankLogError):
    """This run has been going longer than the orphan horizon: another run may already treat its files as
    orphans, so it must not commit them."""


def check_run_age(run_id: str, horizon_ms: int, now_ms: int | None = None) -> None:
    """Raises:
    RunTooOld: the run started more than `horizon_ms` ago.
    """
    age = (now_ms if now_ms is not None else _now_ms()) - started_ms(run_id)
    if age >= horizon_ms:
        raise RunTooOld(
            f"run {run_id} has been going {age / 1000:.0f} s, longer than the orphan horizon "
            f"({horizon_ms / 1000:.0f} s): its files may be swept as orphans, so it does not commit them "
            "(raise export.orphan_horizon above the longest export run)"
        )


def sweep_orphans(
    location: TableLocation,
    table: LakeTable,
    horizon_ms: int,
    *,
    dry_run: bool = False,
    now_ms: int | None = None,
    where: str = "",
) -> OrphanSweep:
    """Remove the files of runs that never committed and are older than `horizon_ms` (see the module doc); `where`
    names the table in the log (the dead-letter table's sweep: `dead_letters.py`)."""
    now = now_ms if now_ms is not None else _now_ms()
    history = table.run_history()
    committed = {h.run for h in history}
    floor = _known_since(history)
    referenced = table.referenced_files()
    orphans: list[StoredFile] = []
    recent = 0
    for f in location.data_files():
        run = run_of(f.rel)
        if run is None or run in committed or unquote(f.rel) in referenced:
            continue
        started = started_ms(run)
        if started <= floor:
            continue
        if now - started < horizon_ms or now - f.mtime_ms < horizon_ms:
            recent += 1
            continue
        orphans.append(f)
    runs = tuple(sorted({run_of(f.rel) or "" for f in orphans}))
    if orphans:
        verb = "would remove" if dry_run else "removing"
        log.info(
            "export: %s%s %d orphaned files (%d bytes) of %d runs that never committed: %s",
            where,
            verb,
            len(orphans),
            sum(f.size for f in orphans),
            len(runs),
            ", ".join(runs),
        )
        if not dry_run:
            location.delete([f.rel for f in orphans])
    if recent:
        log.info("export: %s%d uncommitted files are younger than the orphan horizon: left alone", where, recent)
    return OrphanSweep(len(orphans), sum(f.size for f in orphans), runs, recent, dry_run)


def _known_since(history: list[RunCommit]) -> int:
    """The time after which every run's commit is visible in `history` with its run id: the oldest readable commit
    once older log entries were cleaned up (none when version 0 is readable), and the last commit made before
    commits recorded the files' run id (tables exported by earlier versions)."""
    floors = [-1]
    if history and min(h.version for h in history) > 0:
        floors.append(min(h.timestamp_ms for h in history))
    floors += [h.timestamp_ms for h in history if h.run is not None and not is_run_id(h.run)]
    return max(floors)


def _now_ms() -> int:
    return int(time.time() * 1000)
