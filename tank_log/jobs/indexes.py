"""Partitions of an index/integrity run, shared by `jobs/rebuild_indexes.py` (Spark) and the CLI."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, Self

from tank_log.jobs.config import JobConfig
from tank_log.jobs.planning import PartitionTask, select_scanned
from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.maintenance.outcome import Status
from tank_log.storage.datadir import Partition, scan_data_dir


@dataclass(frozen=True)
class IndexTask(PartitionTask):
    options: IndexJobOptions

    def apply(self, part: Partition) -> dict[str, Any]:
        return maintain_partition(part, self.options).to_dict()

    def as_dry_run(self) -> Self:
        return replace(self, options=replace(self.options, dry_run=True))


def plan_index_run(
    data_dirs: Iterable[str], topics: Collection[str] | None, config: JobConfig, *, dry_run: bool, salvage: bool
) -> tuple[list[IndexTask], list[dict[str, Any]]]:
    """Every partition (indexes concern all topics); base-level problems are reported as extra entries."""
    options = IndexJobOptions(
        salvage=salvage, broker_stopped=config.broker_stopped, live_window_s=config.live_window_s, dry_run=dry_run
    )
    tasks, extra = [], []
    scans = [scan_data_dir(base) for base in data_dirs]  # once: for their own problems and their partitions
    for dd in scans:
        base_problems = dd.problems + [p for t in dd.topics for p in t.problems]
        errors = [p.to_dict() for p in base_problems if p.severity == "error"]
        if errors:
            extra.append(
                {
                    "topic": None,
                    "partition": None,
                    "path": dd.path,
                    "status": str(Status.NEEDS_ATTENTION),
                    "found": [p.to_dict() for p in base_problems],
                    "unfixed": errors,
                    "reason": "data-directory level problems (cannot be fixed automatically)",
                }
            )
    for sel in select_scanned(scans, topics):
        part = sel.partition
        tasks.append(IndexTask(sel.base_path, part.topic, part.id, part.path, options, data_bytes=sel.data_bytes))
    return tasks, extra
