"""Partitions of an index/integrity run, shared by `jobs/rebuild_indexes.py` (Spark) and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from tank_log.jobs.config import JobConfig
from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.storage.datadir import partitions_at, scan_data_dir


@dataclass(frozen=True)
class IndexTask:
    base_path: str
    topic: str
    partition: int
    path: str
    options: IndexJobOptions


def plan_index_run(
    data_dirs, topics, config: JobConfig, *, dry_run: bool, salvage: bool
) -> tuple[list[IndexTask], list[dict]]:
    """Every partition (indexes concern all topics); base-level problems are reported as extra entries."""
    options = IndexJobOptions(
        salvage=salvage, broker_stopped=config.broker_stopped, live_window_s=config.live_window_s, dry_run=dry_run
    )
    tasks, extra = [], []
    for base in data_dirs:
        dd = scan_data_dir(base)
        base_problems = dd.problems + [p for t in dd.topics for p in t.problems]
        errors = [p.to_dict() for p in base_problems if p.severity == "error"]
        if errors:
            extra.append(
                {
                    "topic": None,
                    "partition": None,
                    "path": base,
                    "status": "needs-attention",
                    "found": [p.to_dict() for p in base_problems],
                    "unfixed": errors,
                    "reason": "data-directory level problems (cannot be fixed automatically)",
                }
            )
        for topic in dd.topics:
            if topics is not None and topic.name not in topics:
                continue
            for part in topic.partitions:
                tasks.append(IndexTask(base, part.topic, part.id, part.path, options))
    return tasks, extra


def run_index_task(task: IndexTask) -> dict:
    (part,) = partitions_at(task.path)  # with its topic's and its own config
    result = maintain_partition(part, task.options).to_dict()
    result["base_path"] = task.base_path
    return result
