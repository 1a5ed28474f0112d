"""Which partitions a compaction run takes, with which options, and the `.cleanup.log` bookkeeping afterwards.

Shared by the Spark job (`jobs/compact.py`: the driver plans, executors run `run_compaction_task`) and by
`tank-log compact` (the same, sequentially, without Spark).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tank_log.format.bundle import SnappyPolicy
from tank_log.jobs.config import CompactionSettings, JobConfig, parse_duration_ms
from tank_log.maintenance.compaction import CompactionOptions, compact_partition, dirty_ratio
from tank_log.storage.cleanup_marks import update_cleanup_log
from tank_log.storage.datadir import partitions_at, scan_data_dir
from tank_log.storage.writer import BundlePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionTask:
    base_path: str
    topic: str
    partition: int
    path: str
    cleanup_mark: int
    options: CompactionOptions
    why: str


def options_for(topic: str, settings: CompactionSettings, config: JobConfig, *, dry_run: bool) -> CompactionOptions:
    o = settings.topics.get(topic)
    pick = lambda override, default: default if override is None else override  # noqa: E731
    return CompactionOptions(
        force=settings.force,
        min_cleanable_ratio=pick(o and o.min_cleanable_ratio, settings.min_cleanable_ratio),
        segment_bytes=settings.segment_bytes,
        min_compaction_lag_ms=pick(o and o.min_compaction_lag_ms, settings.min_compaction_lag_ms),
        tombstone_retention_ms=pick(o and o.tombstone_retention_ms, settings.tombstone_retention_ms),
        drop_keyless=pick(o and o.drop_keyless, settings.drop_keyless),
        policy=BundlePolicy(settings.bundle_messages, settings.bundle_bytes, SnappyPolicy(settings.snappy)),
        broker_stopped=config.broker_stopped,
        live_window_s=config.live_window_s,
        dry_run=dry_run,
    )


def apply_flags(
    config: JobConfig,
    *,
    force: bool = False,
    tombstone_retention: str | None = None,
    drop_keyless: bool = False,
    broker_stopped: bool = False,
) -> JobConfig:
    """Command-line flags over the config file (shared by jobs/compact.py and `tank-log compact`)."""
    settings = config.compaction
    if force:
        settings = replace(settings, force=True)
    if tombstone_retention:
        settings = replace(
            settings, tombstone_retention_ms=parse_duration_ms(tombstone_retention, "--tombstone-retention")
        )
    if drop_keyless:
        settings = replace(settings, drop_keyless=True)
    return replace(config, compaction=settings, broker_stopped=broker_stopped or config.broker_stopped)


def plan_compaction(data_dirs, topics, config: JobConfig, *, dry_run: bool) -> tuple[list[CompactionTask], list[dict]]:
    """Tasks for partitions to compact, and report entries for those left out (with the reason)."""
    settings = config.compaction
    tasks: list[CompactionTask] = []
    skipped: list[dict] = []
    for base in data_dirs:
        dd = scan_data_dir(base)
        for topic in dd.topics:
            if topics is not None and topic.name not in topics:
                continue
            override = settings.topics.get(topic.name)
            for part in topic.partitions:
                policy = override.policy if override and override.policy else part.config.cleanup_policy
                if policy != "cleanup":
                    skipped.append(
                        {
                            "topic": part.topic,
                            "partition": part.id,
                            "path": part.path,
                            "status": "skipped",
                            "reason": f"log.cleanup.policy={policy}",
                        }
                    )
                    continue
                mark = dd.cleanup_marks.get(part.key, 0)
                why = (
                    f"policy cleanup{' (job override)' if override and override.policy else ''}, "
                    f"dirty ratio {dirty_ratio(part, mark):.3f}, {len(part.ro)} RO segments"
                )
                log.info("plan %s/%d: %s", part.topic, part.id, why)
                tasks.append(
                    CompactionTask(
                        base,
                        part.topic,
                        part.id,
                        part.path,
                        mark,
                        options_for(part.topic, settings, config, dry_run=dry_run),
                        why,
                    )
                )
    return tasks, skipped


def run_compaction_task(task: CompactionTask) -> dict:
    """Executor side: compact one partition (marks are written by the caller, once per base path)."""
    (part,) = partitions_at(task.path)  # with its topic's and its own config
    result = compact_partition(part, task.options, cleanup_mark=task.cleanup_mark).to_dict()
    result["base_path"] = task.base_path
    result["plan"] = task.why
    return result


def record_cleanup_marks(results: list[dict]) -> None:
    """§1.6/§9 rule 10: set each compacted partition's `.cleanup.log` record to the last compacted seq — one
    atomic rewrite per base path, from the driver (executors never race on the file)."""
    by_base: dict[str, dict[tuple[str, int], int]] = {}
    for r in results:
        done = r.get("status") == "compacted" or r.get("reason") == "no message would be dropped"
        if done and r.get("range_last") and not r.get("dry_run"):
            by_base.setdefault(r["base_path"], {})[(r["topic"], r["partition"])] = r["range_last"]
    for base, marks in by_base.items():
        update_cleanup_log(base, marks)
