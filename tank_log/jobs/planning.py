"""The one planning loop of every job and of the data source: data dirs → selected partitions → tasks.

A task is a small picklable dataclass naming one partition; the driver (Spark or the CLI) plans them, executors or
the CLI `run()` them. Each job module (`jobs/compaction.py`, `jobs/retention.py`, `jobs/indexes.py`) only says what
its task does and which partitions it leaves out, and why.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeAlias, TypeVar

from tank_log.errors import NothingMatched, TankFormatError, UsageError, describe_error
from tank_log.jobs.allocator import reuse_freed_buffers
from tank_log.jobs.exits import held_by
from tank_log.jobs.progress import task_entry
from tank_log.maintenance.outcome import FAILING, Status
from tank_log.storage.datadir import DataDir, Partition, partitions_at, scan_data_dir

log = logging.getLogger(__name__)

T = TypeVar("T", bound="PartitionTask")


@dataclass(frozen=True)
class Selected:
    """One partition a run looks at, with the data dir it was found in."""

    base_path: str
    data_dir: DataDir
    partition: Partition

    @property
    def data_bytes(self) -> int:
        """The partition's segment data (RO and active logs), as the scan listed it."""
        return sum(s.size for s in self.partition.segments)


def select_partitions(
    data_dirs: Iterable[str],
    topics: Collection[str] | None = None,
    *,
    named_in_config: Collection[str] = (),
    require_match: bool = True,
) -> list[Selected]:
    """Every partition of the data dirs (only `topics` when given), in directory order.

    Raises:
        NothingMatched: a data dir holds no partition at all (empty, or not a TANK base path), or a topic asked for
            (`topics`, or named by the job config's per-topic sections) exists in none of the data dirs — so a
            misconfigured nightly run fails (exit 2) instead of succeeding with nothing done. Not raised with
            `require_match=False` (the data source: an empty read is a valid answer).
    """
    return select_scanned([scan_data_dir(base) for base in data_dirs], topics, named_in_config, require_match)


def select_scanned(
    scans: list[DataDir],
    topics: Collection[str] | None = None,
    named_in_config: Collection[str] = (),
    require_match: bool = True,
) -> list[Selected]:
    """`select_partitions` over data dirs already scanned (a planner that also looks at the data dir itself).

    Raises:
        NothingMatched: see `select_partitions`.
    """
    if require_match:
        _check_selection(scans, topics, named_in_config)
    return [
        Selected(dd.path, dd, part)
        for dd in scans
        for topic in dd.topics
        if topics is None or topic.name in topics
        for part in topic.partitions
    ]


def _check_selection(scans: list[DataDir], topics: Collection[str] | None, named_in_config: Collection[str]) -> None:
    """The checks of `select_partitions` on data dirs already scanned.

    Raises:
        NothingMatched: see `select_partitions`.
    """
    for dd in scans:
        if not any(t.partitions for t in dd.topics):
            found = sorted(t.name for t in dd.topics)
            what = f"directories {_listing(found)} hold no partition directories 0..N-1" if found else "it is empty"
            raise NothingMatched(f"{dd.path}: not a TANK base path: {what} (docs/FORMAT.md §1.2)")
    existing = sorted({t.name for dd in scans for t in dd.topics if t.partitions})
    where = ", ".join(dd.path for dd in scans)
    missing = sorted(set(topics or ()) - set(existing))
    if missing:
        raise NothingMatched(f"unknown topic(s) {', '.join(missing)}: {where} hold(s) {_listing(existing)}")
    missing = sorted(set(named_in_config) - set(existing))
    if missing:
        raise NothingMatched(
            f"topic(s) {', '.join(missing)} named in the job config do not exist: {where} hold(s) {_listing(existing)}"
        )


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def split_plan(decisions: Iterable[T | dict[str, Any]], task_type: type[T]) -> tuple[list[T], list[dict[str, Any]]]:
    """(tasks, left-out entries) of per-partition decisions (each a task or the entry saying why not)."""
    tasks: list[T] = []
    left: list[dict[str, Any]] = []
    for d in decisions:
        if isinstance(d, task_type):
            tasks.append(d)
        else:
            left.append(d)  # type: ignore[arg-type]
    return tasks, left


def left_out(part: Partition, reason: str) -> dict[str, Any]:
    """The report entry of a partition a run does not touch."""
    return {
        "topic": part.topic,
        "partition": part.id,
        "path": part.path,
        "status": str(Status.SKIPPED),
        "reason": reason,
    }


@dataclass(frozen=True)
class PartitionTask:
    """One partition's work; subclasses implement `apply`."""

    base_path: str
    topic: str
    partition: int
    path: str
    data_bytes: int = field(default=0, kw_only=True)  # its segment data when planned (`Selected.data_bytes`)

    def load(self) -> Partition:
        """The partition as it is now, with its topic's and its own config (executor side)."""
        (part,) = partitions_at(self.path)
        return part

    def apply(self, part: Partition) -> dict[str, Any]:
        raise NotImplementedError

    def as_dry_run(self) -> Self | None:
        """The same task as a dry run (read-only), or None when it has none."""
        return None

    def needs_work(self, part: Partition) -> bool:
        """Whether the partition would be changed: its dry run does something (True when the task has no dry run).
        Asked of a partition skipped because a live process holds it: a run that missed work is not a success."""
        dry = self.as_dry_run()
        if dry is None:
            return True
        r = dry.apply(part)
        statuses = [r.get("status")] + [s.get("status") for s in (r.get("steps") or {}).values()]
        if "steps" in r:
            statuses = statuses[1:]  # maintenance: its overall status is dry-run whatever its steps do
        return Status.DRY_RUN in statuses or any(s in FAILING for s in statuses)

    def run(self) -> dict[str, Any]:
        """The report entry of this partition. One that is gone since the plan (deleted, e.g. with its topic) is
        skipped; one that cannot be listed any more (permissions, no longer a partition) failed; neither stops the
        run's other partitions."""
        reuse_freed_buffers()  # in the CLI's process or a Spark worker: either way a maintenance process
        try:
            part = self.load()
        except FileNotFoundError:
            log.warning("%s/%d: gone since the run was planned", self.topic, self.partition)
            result = task_entry(self, Status.SKIPPED, reason="gone since the run was planned (deleted)")
        except (OSError, TankFormatError, UsageError) as err:
            result = task_entry(self, Status.FAILED, error=describe_error(err), reason="cannot be listed any more")
            log.error("%s/%d: %s", self.topic, self.partition, result["error"])
        else:
            result = self.apply(part)
            result["base_path"] = self.base_path
            if held_by(result):
                result["needs_work"] = self.needs_work(part)
        return result


Plan: TypeAlias = tuple[Sequence[PartitionTask], list[dict[str, Any]]]
"""A job's plan: the partitions' tasks, and the report entries of the partitions it leaves out."""


def run_task(task: PartitionTask) -> dict[str, Any]:
    """What executors call (a module-level function pickles by reference)."""
    return task.run()
