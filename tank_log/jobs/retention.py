"""Which partitions a retention run takes and with which rules (broker config + job overrides), shared by
`jobs/retention.py` (Spark) and `tank-log retention` (no Spark)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, Self

from tank_log.errors import JobConfigError
from tank_log.jobs.config import (
    EXPORT_TABLE,
    JobConfig,
    KeepUnexported,
    RetentionSettings,
)
from tank_log.jobs.planning import PartitionTask, Selected, left_out, select_partitions, split_plan
from tank_log.lakehouse import ExportedSeqs, TableUnreadable
from tank_log.maintenance.outcome import Status
from tank_log.maintenance.retention import ExportGuard, RetentionOptions, RetentionRules, apply_retention
from tank_log.storage.cleanup_marks import read_cleanup_log, update_cleanup_log
from tank_log.storage.datadir import Partition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionTask(PartitionTask):
    rules: RetentionRules
    options: RetentionOptions
    guard: ExportGuard | None = None  # the lakehouse guard, read by the driver when it planned

    def apply(self, part: Partition) -> dict[str, Any]:
        return apply_retention(part, self.rules, self.options, self.guard).to_dict()

    def as_dry_run(self) -> Self:
        return replace(self, options=replace(self.options, dry_run=True))


def rules_for(part: Partition, settings: RetentionSettings, time_basis: str | None) -> RetentionRules:
    """The partition's broker limits, overridden per topic by the job config, for every retention policy."""
    o = settings.topics.get(part.topic)
    basis = time_basis or (o.time_basis if o and o.time_basis else settings.time_basis)
    rules = RetentionRules.from_config(part.config, basis)
    return replace(rules, **o.limits) if o is not None else rules


class ExportGuards:
    """The lakehouse guard of each partition of a run (`retention.keep_unexported`): every table is opened once, by
    the driver, and each partition's recorded version read from it."""

    def __init__(self, config: JobConfig):
        self._config = config
        self._tables: dict[tuple[str, tuple[tuple[str, str], ...], str, object], ExportedSeqs] = {}

    def of(self, part: Partition) -> ExportGuard | None:
        """Raises:
        JobConfigError: `table: export` without an export.table.
        """
        keep = self._config.retention.guard_of(part.topic)
        if keep is None:
            return None
        seqs = self._table(keep)
        try:
            recorded = seqs.recorded(part.topic, part.id)
        except TableUnreadable as err:
            return ExportGuard(seqs.uri, error=str(err))
        last = recorded.version
        if recorded.undone:  # a RESTORE or a rollback: keep what the table no longer holds
            log.warning(
                "retention: %s/%s: table %s records seq %s for source %s, but %s: it holds seqs up to %s, and "
                "retention keeps what follows",
                part.topic,
                part.id,
                seqs.uri,
                recorded.recorded,
                seqs.source,
                recorded.undone,
                "none" if last is None else last,
            )
        return ExportGuard(seqs.uri, last, None, keep.max_holdback_bytes, keep.max_holdback_s)

    def _table(self, keep: KeepUnexported) -> ExportedSeqs:
        uri, options, fmt, catalog = keep.table, keep.storage_options, keep.format or "delta", keep.catalog
        if uri == EXPORT_TABLE:  # the export's table, in the export's format
            export = self._config.export
            if not export.table:
                raise JobConfigError("retention.keep_unexported.table is `export`, but export.table is not set")
            uri, options = export.table, {**export.storage_options, **options}
            fmt, catalog = export.format, export.catalog
        key = (uri, tuple(sorted(options.items())), fmt, catalog)
        if key not in self._tables:
            # the versions of this broker's partitions (export.source, `--source`; None: this host's name)
            self._tables[key] = ExportedSeqs(uri, options, fmt, catalog, self._config.export.source)
        return self._tables[key]


def retention_task_for(
    sel: Selected,
    config: JobConfig,
    *,
    dry_run: bool,
    time_basis: str | None = None,
    guards: ExportGuards | None = None,
) -> RetentionTask | dict[str, Any]:
    """The retention task of one selected partition, or its left-out entry (retention off for its topic)."""
    settings = config.retention
    part = sel.partition
    o = settings.topics.get(part.topic)
    if o and o.enabled is not None:
        enabled = o.enabled
    else:
        enabled = part.config.cleanup_policy == "delete" or settings.include_cleanup_topics
    if not enabled:
        why = (
            "disabled by the job config"
            if o and o.enabled is False
            else f"log.cleanup.policy={part.config.cleanup_policy} (the broker applies no retention)"
        )
        return left_out(part, why)
    options = RetentionOptions(
        broker_stopped=config.broker_stopped, live_window_s=config.live_window_s, dry_run=dry_run
    )
    rules = rules_for(part, settings, time_basis)
    guard = (guards or ExportGuards(config)).of(part)
    return RetentionTask(
        sel.base_path, part.topic, part.id, part.path, rules, options, guard, data_bytes=sel.data_bytes
    )


def plan_retention_run(
    data_dirs: Iterable[str],
    topics: Collection[str] | None,
    config: JobConfig,
    *,
    dry_run: bool,
    time_basis: str | None = None,
) -> tuple[list[RetentionTask], list[dict[str, Any]]]:
    selected = select_partitions(data_dirs, topics, named_in_config=config.retention.topics)
    guards = ExportGuards(config)
    decisions = (
        retention_task_for(sel, config, dry_run=dry_run, time_basis=time_basis, guards=guards) for sel in selected
    )
    tasks, skipped = split_plan(decisions, RetentionTask)
    if not tasks:
        log.warning("no selected topic has log.cleanup.policy=delete (nor a job override): nothing to retain")
    return tasks, skipped


def clamp_cleanup_marks(results: list[dict[str, Any]]) -> None:
    """Keep `.cleanup.log` consistent: a mark below the new first seq - 1 is raised to it (what the broker does
    in memory when it loads the file, §1.6)."""
    by_base: dict[str, dict[tuple[str, int], int]] = {}
    for r in results:
        if r.get("status") in (Status.DELETED, Status.DATA_LOSS) and r.get("first_seq_after"):
            by_base.setdefault(r["base_path"], {})[(r["topic"], r["partition"])] = r["first_seq_after"] - 1
    for base, floors in by_base.items():
        marks = read_cleanup_log(base)
        updates = {k: floor for k, floor in floors.items() if k in marks and marks[k] < floor}
        if updates:
            update_cleanup_log(base, updates)
