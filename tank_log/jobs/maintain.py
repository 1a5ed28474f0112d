"""The nightly maintenance of a partition in one task, in this order: repair → retention (topics with retention) →
compaction (cleanup-policy topics) → index verify/rebuild (salvage only when asked) → a final verify. One report
entry per partition with each step's result. Shared by `jobs/maintain.py` (Spark: one start-up for everything) and
`tank-log maintain` (no Spark); the single-purpose jobs stay for ad hoc use."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, Self

from tank_log.errors import PartitionLocked
from tank_log.jobs.compaction import CompactionTask, compaction_task_for, record_cleanup_marks
from tank_log.jobs.config import JobConfig
from tank_log.jobs.planning import PartitionTask, select_partitions
from tank_log.jobs.retention import ExportGuards, RetentionTask, clamp_cleanup_marks, retention_task_for
from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.maintenance.outcome import FAILING, PartitionOutcome, Status, run_on_partition
from tank_log.maintenance.verify import check_partition
from tank_log.problems import Problem
from tank_log.storage.datadir import Partition, scan_topic
from tank_log.storage.holders import foreign, partition_holders
from tank_log.storage.locking import holding
from tank_log.storage.repair import repair_partition

log = logging.getLogger(__name__)

STEPS = ("repair", "retention", "compaction", "indexes", "verify")


@dataclass(frozen=True)
class MaintainTask(PartitionTask):
    """Every step of one partition; a step that does not apply carries its left-out entry instead of a task."""

    retention: RetentionTask | dict[str, Any]
    compaction: CompactionTask | dict[str, Any]
    indexes: IndexJobOptions

    def apply(self, part: Partition) -> dict[str, Any]:
        """Every step under one hold of the partition's lock (not in a dry run, which takes none): no other run comes
        between them, and the final verify never reads a partition another run is rewriting. A partition the broker
        holds gets no lock file: its repair step reports it skipped."""
        lock_it = not self.indexes.dry_run and not foreign(partition_holders(part.path))
        try:
            with holding(part.path, "maintain") if lock_it else contextlib.nullcontext():
                steps = self._steps(part)
        except PartitionLocked as err:
            log.info("maintain of %s skipped: %s", part.path, err)
            locked = PartitionOutcome(part.topic, part.id, part.path, status=Status.SKIPPED, reason=f"locked: {err}")
            steps = _not_run_after({"repair": locked.to_dict()})
        return {
            "topic": part.topic,
            "partition": part.id,
            "path": part.path,
            "status": str(overall(steps, dry_run=self.indexes.dry_run)),
            "steps": steps,
        }

    def _steps(self, part: Partition) -> dict[str, dict[str, Any]]:
        steps: dict[str, dict[str, Any]] = {"repair": _repair(part, self.indexes).to_dict()}
        if steps["repair"]["status"] in (Status.SKIPPED, *FAILING):  # held, locked or unrepairable: stop here
            return _not_run_after(steps)
        for name, step in (("retention", self.retention), ("compaction", self.compaction)):
            steps[name] = step.apply(self.load()) if isinstance(step, PartitionTask) else step
        steps["indexes"] = maintain_partition(self.load(), self.indexes).to_dict()
        steps["verify"] = _verify(self.load())
        return steps

    def as_dry_run(self) -> Self:
        retention, compaction = self.retention, self.compaction
        return replace(
            self,
            retention=retention.as_dry_run() if isinstance(retention, RetentionTask) else retention,
            compaction=compaction.as_dry_run() if isinstance(compaction, CompactionTask) else compaction,
            indexes=replace(self.indexes, dry_run=True),
        )


def overall(steps: dict[str, dict[str, Any]], *, dry_run: bool) -> Status:
    """A partition's status from its steps: the worst failing one, else skipped when repair did not run (held,
    locked), else maintained (or dry-run)."""
    statuses = [Status(s["status"]) for s in steps.values()]
    for bad in (Status.FAILED, Status.DATA_LOSS, Status.NEEDS_ATTENTION):
        if bad in statuses:
            return bad
    if statuses[0] is Status.SKIPPED:
        return Status.SKIPPED
    return Status.DRY_RUN if dry_run else Status.MAINTAINED


def _not_run_after(steps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`steps` (the repair's) with every later step skipped for the repair's status."""
    reason = f"not run: repair {steps['repair']['status']}"
    return {**steps, **{s: {"status": str(Status.SKIPPED), "reason": reason} for s in STEPS[1:]}}


def _repair(part: Partition, safety: IndexJobOptions) -> PartitionOutcome:
    """The repair step: leftovers of killed runs, interrupted compactions and salvages (`storage/repair.py`); what
    repair leaves and names makes the partition need attention, as `tank-log repair` exits 1 on it."""
    res = PartitionOutcome(part.topic, part.id, part.path)

    def body(r: PartitionOutcome) -> None:
        rep = repair_partition(part.path, dry_run=safety.dry_run)
        r.repair = rep.to_dict() if rep.has_work or rep.problems else None
        r.status = (Status.DRY_RUN if safety.dry_run else Status.FIXED) if rep.has_work else Status.CLEAN
        if rep.problems:  # what `tank-log repair` refuses and exits 1 on: never "clean"
            r.status, r.reason = Status.NEEDS_ATTENTION, "repair refused: " + "; ".join(rep.problems)

    return run_on_partition(part.path, "repair", res, body, dry_run=safety.dry_run)


def _verify(part: Partition) -> dict[str, Any]:
    """The final verify: what is still wrong after every step (errors make the partition need attention), with what
    `tank-log verify` finds wrong with the partition's topic (its `config`, its partition directories: §1.3-§1.5),
    so that maintain never calls clean what verify does not."""
    problems = [*_topic_problems(os.path.dirname(part.path), part.topic), *check_partition(part)]
    errors = [p.to_dict() for p in problems if p.severity == "error"]
    status = Status.NEEDS_ATTENTION if errors else Status.CLEAN
    return {"status": str(status), "errors": errors, "warnings": len(problems) - len(errors)}


def _topic_problems(topic_dir: str, topic: str) -> tuple[Problem, ...]:
    """What `scan_topic` finds wrong with a topic directory, once per topic as long as neither it nor its `config`
    changes: every partition's final verify asks, and scanning the topic each time made a run quadratic in its
    partitions (a topic of 2,000 partitions: ~300 s of CPU)."""
    stamps: list[tuple[int, int, int] | None] = []
    for path in (topic_dir, os.path.join(topic_dir, "config")):
        try:
            st = os.stat(path)
            stamps.append((st.st_mtime_ns, st.st_ino, st.st_size))
        except OSError:
            stamps.append(None)
    return _scanned_topic_problems(topic_dir, topic, tuple(stamps))


@functools.lru_cache(maxsize=64)
def _scanned_topic_problems(topic_dir: str, topic: str, stamps: tuple[object, ...]) -> tuple[Problem, ...]:
    return tuple(scan_topic(topic_dir, topic).problems)


def plan_maintenance(
    data_dirs: Iterable[str],
    topics: Collection[str] | None,
    config: JobConfig,
    *,
    dry_run: bool,
    salvage: bool = False,
    time_basis: str | None = None,
) -> tuple[list[MaintainTask], list[dict[str, Any]]]:
    """One task per selected partition (every step decided as the single-purpose jobs decide it)."""
    named = {**config.compaction.topics, **config.retention.topics}
    indexes = IndexJobOptions(
        salvage=salvage, broker_stopped=config.broker_stopped, live_window_s=config.live_window_s, dry_run=dry_run
    )
    guards = ExportGuards(config)
    tasks = [
        MaintainTask(
            sel.base_path,
            sel.partition.topic,
            sel.partition.id,
            sel.partition.path,
            retention_task_for(sel, config, dry_run=dry_run, time_basis=time_basis, guards=guards),
            compaction_task_for(sel, config, dry_run=dry_run),
            indexes,
            data_bytes=sel.data_bytes,
        )
        for sel in select_partitions(data_dirs, topics, named_in_config=named)
    ]
    return tasks, []


def step_results(results: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    """One step's entries of maintenance results, with their base path (for the driver's bookkeeping)."""
    return [{**r["steps"][step], "base_path": r["base_path"]} for r in results if step in r.get("steps", {})]


def record_maintenance_marks(results: list[dict[str, Any]]) -> None:
    """`.cleanup.log` after maintenance: marks raised past what retention deleted, then set by compaction (§1.6)."""
    clamp_cleanup_marks(step_results(results, "retention"))
    record_cleanup_marks(step_results(results, "compaction"))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step, the count of each status; and the figures an operator looks at first."""
    by_step: dict[str, dict[str, int]] = {}
    for r in results:
        for name, step in r.get("steps", {}).items():
            counts = by_step.setdefault(name, {})
            counts[step["status"]] = counts.get(step["status"], 0) + 1
    deleted = step_results(results, "retention")
    compacted = [c for c in step_results(results, "compaction") if c["status"] == Status.COMPACTED]
    return {
        "steps": by_step,
        "segments_deleted": sum(d.get("segments_deleted") or 0 for d in deleted if d["status"] == Status.DELETED),
        "bytes_deleted": sum(d.get("bytes_deleted") or 0 for d in deleted if d["status"] == Status.DELETED),
        "compacted_bytes_before": sum(c.get("bytes_before") or 0 for c in compacted),
        "compacted_bytes_after": sum(c.get("bytes_after") or 0 for c in compacted),
        "indexes_rebuilt": sum(
            1 for i in step_results(results, "indexes") for a in i.get("actions", []) if a["action"] == "rebuilt-index"
        ),
    }
