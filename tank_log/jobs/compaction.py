"""Which partitions a compaction run takes, with which options, and the `.cleanup.log` bookkeeping afterwards.

Shared by the Spark job (`jobs/compact.py`: the driver plans, executors run `CompactionTask.run`) and by
`tank-log compact` (the same in local processes, without Spark: `processes.run_in_processes`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, Self

from tank_log.format.bundle import SnappyPolicy
from tank_log.jobs.config import CompactionSettings, JobConfig, parse_duration_ms
from tank_log.jobs.planning import PartitionTask, Selected, left_out, select_partitions, split_plan
from tank_log.maintenance.compaction import CompactionOptions, compact_partition, dirty_ratio
from tank_log.maintenance.outcome import Status
from tank_log.storage.cleanup_marks import update_cleanup_log
from tank_log.storage.datadir import Partition
from tank_log.storage.writer import BundlePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionTask(PartitionTask):
    cleanup_mark: int
    options: CompactionOptions
    why: str

    def apply(self, part: Partition) -> dict[str, Any]:
        """Compact the partition (marks are written by the driver, once per base path)."""
        result = compact_partition(part, self.options, cleanup_mark=self.cleanup_mark).to_dict()
        result["plan"] = self.why
        return result

    def as_dry_run(self) -> Self:
        return replace(self, options=replace(self.options, dry_run=True))


def pick(override: Any, default: Any) -> Any:
    """A per-topic override when set, else the default."""
    return default if override is None else override


def options_for(topic: str, settings: CompactionSettings, config: JobConfig, *, dry_run: bool) -> CompactionOptions:
    o = settings.topics.get(topic)
    return CompactionOptions(
        force=settings.force,
        min_cleanable_ratio=pick(o and o.min_cleanable_ratio, settings.min_cleanable_ratio),
        segment_bytes=settings.segment_bytes,
        min_compaction_lag_ms=pick(o and o.min_compaction_lag_ms, settings.min_compaction_lag_ms),
        tombstone_retention_ms=pick(o and o.tombstone_retention_ms, settings.tombstone_retention_ms),
        drop_keyless=pick(o and o.drop_keyless, settings.drop_keyless),
        policy=BundlePolicy(settings.bundle_messages, settings.bundle_bytes, SnappyPolicy(settings.snappy)),
        key_state_budget=settings.key_state_budget,
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
        settings = settings.model_copy(update={"force": True})
    if tombstone_retention:
        ms = parse_duration_ms(tombstone_retention, "--tombstone-retention")
        settings = settings.model_copy(update={"tombstone_retention_ms": ms})
    if drop_keyless:
        settings = settings.model_copy(update={"drop_keyless": True})
    return config.model_copy(update={"compaction": settings, "broker_stopped": broker_stopped or config.broker_stopped})


def compaction_task_for(sel: Selected, config: JobConfig, *, dry_run: bool) -> CompactionTask | dict[str, Any]:
    """The compaction task of one selected partition, or its left-out entry (not a cleanup-policy topic)."""
    settings = config.compaction
    part = sel.partition
    override = settings.topics.get(part.topic)
    policy = override.policy if override and override.policy else part.config.cleanup_policy
    if policy != "cleanup":
        return left_out(part, f"log.cleanup.policy={policy}")
    mark = sel.data_dir.cleanup_marks.get(part.key, 0)
    why = (
        f"policy cleanup{' (job override)' if override and override.policy else ''}, "
        f"dirty ratio {dirty_ratio(part, mark):.3f}, {len(part.ro)} RO segments"
    )
    log.info("plan %s/%d: %s", part.topic, part.id, why)
    options = options_for(part.topic, settings, config, dry_run=dry_run)
    return CompactionTask(sel.base_path, part.topic, part.id, part.path, mark, options, why, data_bytes=sel.data_bytes)


def plan_compaction(
    data_dirs: Iterable[str], topics: Collection[str] | None, config: JobConfig, *, dry_run: bool
) -> tuple[list[CompactionTask], list[dict[str, Any]]]:
    """Tasks for partitions to compact, and report entries for those left out (with the reason)."""
    selected = select_partitions(data_dirs, topics, named_in_config=config.compaction.topics)
    tasks, skipped = split_plan((compaction_task_for(sel, config, dry_run=dry_run) for sel in selected), CompactionTask)
    if not tasks:
        log.warning("no selected topic has log.cleanup.policy=cleanup (nor a job override): nothing to compact")
    return tasks, skipped


def cleanup_mark_of(result: dict[str, Any]) -> int | None:
    """The `.cleanup.log` record a compaction result calls for: the last seq of the compacted range, when the range
    was compacted or found to have nothing to drop (its `range_last` is set only once the range was read)."""
    if result.get("dry_run") or result.get("status") not in (Status.COMPACTED, Status.NOTHING_TO_DO):
        return None
    return result.get("range_last") or None


def record_cleanup_marks(results: list[dict[str, Any]]) -> None:
    """§1.6/§9 rule 10: set each compacted partition's `.cleanup.log` record to the last compacted seq — one
    atomic rewrite per base path, from the driver (executors never race on the file)."""
    by_base: dict[str, dict[tuple[str, int], int]] = {}
    for r in results:
        mark = cleanup_mark_of(r)
        if mark is not None:
            by_base.setdefault(r["base_path"], {})[(r["topic"], r["partition"])] = mark
    for base, marks in by_base.items():
        update_cleanup_log(base, marks)
