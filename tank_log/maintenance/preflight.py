"""What every mutating job does to a partition first: refuse it if it holds a file the broker would mis-parse
(§2.1) or if the broker may be writing to it (docs/FORMAT.md §9 rule 1), then repair leftovers of interrupted
compactions (§6.4)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tank_log.errors import NeedsAttention, PartitionLooksLive
from tank_log.storage.datadir import NOT_A_FILE, Partition, scan_partition
from tank_log.storage.repair import repair_partition


@dataclass(frozen=True)
class SafetyOptions:
    """What every mutating operation is told about the broker: whether it is known to be stopped (§9 rule 1), how
    recent a change makes a partition look live, and whether to change nothing. Operations' options extend it."""

    broker_stopped: bool = False  # skip the recent-change heuristic
    live_window_s: int = 300  # a partition changed this recently looks live
    dry_run: bool = False


def looks_live(part: Partition, window_s: int, now: float | None = None) -> float | None:
    """Seconds since the partition last changed if within `window_s` (the broker may be writing), else None."""
    now = time.time() if now is None else now
    newest = 0.0
    for s in part.segments:
        try:
            newest = max(newest, os.stat(s.path).st_mtime)
        except FileNotFoundError:
            return 0.0
    age = now - newest
    return age if part.segments and age < window_s else None


def refuse_if_live(part: Partition, job: str, window_s: int, now: float | None = None) -> None:
    """Raises:
    PartitionLooksLive: the partition changed within `window_s`.
    """
    age = looks_live(part, window_s, now)
    if age is not None:
        raise PartitionLooksLive(
            f"partition looks live (modified {age:.0f}s ago): {job} needs the broker stopped "
            f"(docs/FORMAT.md §9); stop it and pass --broker-stopped"
        )


def preflight(
    part: Partition,
    job: str,
    safety: SafetyOptions,
    *,
    now: float | None = None,
    audit: Callable[[Partition], None] | None = None,
) -> tuple[Partition, dict[str, Any] | None]:
    """Name check, liveness check (unless the broker is stopped, or a dry run) and repair; returns the partition as
    it is now and what repair did (None if nothing). Outside a dry run the partition is scanned again first (the
    caller holds its lock now): another run of ours may have changed it since it was planned.

    Raises:
        NeedsAttention: a file name the broker would mis-parse, or a non-regular file under a segment/index name.
        PartitionLooksLive: the partition changed within `live_window_s`.
        NeedsAttention: also what repair leaves and names (`RepairResult.problems`), as `tank-log repair` does.
    """
    if not safety.dry_run:
        part = scan_partition(part.path, part.topic, part.id, part.config)
    misnamed = [p for p in part.problems if p.code == "bad-name"]
    if misnamed:
        raise NeedsAttention(
            "; ".join(f"{p.path}: {p.message}" for p in misnamed)
            + " (the broker mis-parses such names, docs/FORMAT.md §2.1: rename or remove the file first)"
        )
    odd = [p for p in part.problems if p.code == NOT_A_FILE]
    if odd:  # checked before anything is touched: a plan that cannot complete must not start
        raise NeedsAttention("; ".join(f"{p.path}: {p.message}" for p in odd))
    if not safety.broker_stopped and not safety.dry_run:
        refuse_if_live(part, job, safety.live_window_s, now)
    rep = repair_partition(part.path, dry_run=safety.dry_run)
    if rep.problems:  # what `tank-log repair` refuses (and exits 1 on), no job goes past
        if audit is not None:  # the job's own check names the damage behind it, where it finds it
            audit(scan_partition(part.path, part.topic, part.id, part.config) if not safety.dry_run else part)
        done = " (after it: " + json.dumps(rep.to_dict()) + ")" if rep.has_work and not safety.dry_run else ""
        raise NeedsAttention("repair refused: " + "; ".join(rep.problems) + done)
    if not rep.has_work:
        return part, None
    if not safety.dry_run:
        part = scan_partition(part.path, part.topic, part.id, part.config)
    return part, rep.to_dict()


def repair_summary(repair: dict[str, Any]) -> str:
    """What the preflight's repair did, in one phrase for a report's reason (its dict has the details)."""
    done = []
    if repair.get("action") not in (None, "none"):
        done.append(f"an interrupted compaction rolled {repair['action'].replace('roll', '')}")
    if repair.get("active_restored"):
        done.append(f"the last RO segment made active again ({repair['active_restored']}, §9 rule 4)")
    if repair.get("overlaps_resolved"):
        done.append(f"{len(repair['overlaps_resolved'])} group(s) of overlapping segments resolved")
    for key, what in (("salvages_finished", "salvage(s) finished"), ("indexes_trimmed", "index(es) trimmed")):
        if repair.get(key):
            done.append(f"{len(repair[key])} {what}")
    if repair.get("imports_finished"):
        done.append(f"{len(repair['imports_finished'])} import(s) finished")
    return "repair: " + ("; ".join(done) if done else "leftovers removed")
