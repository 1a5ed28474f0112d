"""Which partitions a retention run takes and with which rules (broker config + job overrides), shared by
`jobs/retention.py` (Spark) and `tank-log retention` (no Spark)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tank_log.jobs.config import JobConfig
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention
from tank_log.storage.cleanup_marks import read_cleanup_log, update_cleanup_log
from tank_log.storage.datadir import partitions_at, scan_data_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionTask:
    base_path: str
    topic: str
    partition: int
    path: str
    rules: RetentionRules
    options: RetentionOptions


def plan_retention_run(
    data_dirs, topics, config: JobConfig, *, dry_run: bool, time_basis: str | None = None
) -> tuple[list[RetentionTask], list[dict]]:
    settings = config.retention
    tasks: list[RetentionTask] = []
    skipped: list[dict] = []
    options = RetentionOptions(
        broker_stopped=config.broker_stopped, live_window_s=config.live_window_s, dry_run=dry_run
    )
    for base in data_dirs:
        for topic in scan_data_dir(base).topics:
            if topics is not None and topic.name not in topics:
                continue
            o = settings.topics.get(topic.name)
            for part in topic.partitions:
                cfg = part.config
                enabled = (
                    o.enabled
                    if o and o.enabled is not None
                    else (cfg.cleanup_policy == "delete" or settings.include_cleanup_topics)
                )
                if not enabled:
                    why = (
                        "disabled by the job config"
                        if o and o.enabled is False
                        else (f"log.cleanup.policy={cfg.cleanup_policy} (the broker applies no retention)")
                    )
                    skipped.append(
                        {
                            "topic": part.topic,
                            "partition": part.id,
                            "path": part.path,
                            "status": "skipped",
                            "reason": why,
                        }
                    )
                    continue
                pick = lambda override, default: default if override is None else override  # noqa: E731
                rules = RetentionRules(
                    segments_count=pick(o and o.segments_count, cfg.retention_segments_count),
                    max_bytes=pick(o and o.max_bytes, cfg.retention_bytes),
                    max_age_s=pick(o and o.max_age_s, cfg.retention_secs),
                    time_basis=time_basis or pick(o and o.time_basis, settings.time_basis),
                )
                tasks.append(RetentionTask(base, part.topic, part.id, part.path, rules, options))
    return tasks, skipped


def run_retention_task(task: RetentionTask) -> dict:
    (part,) = partitions_at(task.path)  # with its topic's and its own config
    result = apply_retention(part, task.rules, task.options).to_dict()
    result["base_path"] = task.base_path
    return result


def clamp_cleanup_marks(results: list[dict]) -> None:
    """Keep `.cleanup.log` consistent: a mark below the new first seq - 1 is raised to it (what the broker does
    in memory when it loads the file, §1.6)."""
    by_base: dict[str, dict[tuple[str, int], int]] = {}
    for r in results:
        if r.get("status") == "deleted" and r.get("first_seq_after"):
            by_base.setdefault(r["base_path"], {})[(r["topic"], r["partition"])] = r["first_seq_after"] - 1
    for base, floors in by_base.items():
        marks = read_cleanup_log(base)
        updates = {k: floor for k, floor in floors.items() if k in marks and marks[k] < floor}
        if updates:
            update_cleanup_log(base, updates)
