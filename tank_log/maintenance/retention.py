"""Retention: deleting the oldest RO segments by count, size and age (docs/FORMAT.md §5), without the broker's
weaknesses.

Like the broker: only a prefix of RO segments (oldest first) is deleted, never the active segment; policies
`retention.segments.count`, `log.retention.bytes`, `log.retention.secs`; per segment unlink the log, then its index,
then fsync the directory.

Better than the broker:
- sizes are the real file sizes (the broker counts segments it has not opened since start as 0 bytes);
- age by the name's ts (`time_basis="name"`, the broker's rule) or by the newest message timestamp in the segment
  (`time_basis="message"`, Kafka's rule); legacy names without a ts are aged by their newest message instead of
  blocking everything behind them, and they are really deleted (the broker rebuilds their name with `_0` and
  leaves the file orphaned);
- the age of every segment of the deletable prefix is checked, not only the front one;
- a partition without a non-empty active segment keeps everything: deleting RO data would leave either RO segments
  without an active one (the broker then hides them, §9 rule 4) or an empty partition whose seqs restart at 1.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tank_log.format.broker_config import PartitionConfig
from tank_log.maintenance.outcome import PartitionOutcome, Status, run_on_partition
from tank_log.maintenance.preflight import SafetyOptions, preflight
from tank_log.storage.datadir import Partition
from tank_log.storage.fsutil import fsync_dir
from tank_log.storage.segment import Segment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionRules:
    """The limits of one partition (0 = off, one field per entry of POLICIES) and how ages are measured."""

    segments_count: int = 0  # keep at most this many RO segments
    max_bytes: int = 0  # keep at most this many bytes of RO segments
    max_age_s: int = 0  # delete RO segments older than this
    time_basis: str = "name"  # name | message

    @classmethod
    def from_config(cls, cfg: PartitionConfig, time_basis: str = "name") -> RetentionRules:
        """The broker's own limits of a partition (its `config` files, docs/FORMAT.md §1.5)."""
        return cls(**{p.name: getattr(cfg, p.broker_field) for p in POLICIES}, time_basis=time_basis)

    @property
    def active(self) -> bool:
        return any(getattr(self, p.name) for p in POLICIES)


@dataclass
class RemainingRO:
    """What is left of the RO segments while the prefix is planned: count and bytes."""

    count: int
    total_bytes: int


@dataclass(frozen=True)
class RetentionPolicy:
    """One retention limit (docs/FORMAT.md §5).

    `name`: its field in RetentionRules and its key in the job config (`retention.topics.<topic>.<config_key>`);
    `broker_field`: the PartitionConfig field holding the broker's value; `unit`: how the job config parses it
    (count | size | duration); `exceeded(limit, segment, remaining, rules, now_s)`: why the front segment goes, or
    None.
    """

    name: str
    config_key: str
    broker_field: str
    unit: str
    exceeded: Callable[[int, Segment, RemainingRO, RetentionRules, float], str | None]


def _count_exceeded(limit: int, seg: Segment, left: RemainingRO, rules: RetentionRules, now_s: float) -> str | None:
    return f"{left.count} RO segments > retention.segments.count {limit}" if left.count > limit else None


def _bytes_exceeded(limit: int, seg: Segment, left: RemainingRO, rules: RetentionRules, now_s: float) -> str | None:
    return (
        f"{left.total_bytes} bytes of RO segments > log.retention.bytes {limit}" if left.total_bytes > limit else None
    )


def _age_exceeded(limit: int, seg: Segment, left: RemainingRO, rules: RetentionRules, now_s: float) -> str | None:
    t, source = segment_time_s(seg, rules.time_basis)
    return f"{source} {t} older than log.retention.secs {limit}s" if t is not None and t + limit < now_s else None


# Adding a policy: a field in RetentionRules, a row here (and the broker's key in format/broker_config.py if the
# broker has one). The job config and the planner read this table.
POLICIES: tuple[RetentionPolicy, ...] = (
    RetentionPolicy("segments_count", "segments_count", "retention_segments_count", "count", _count_exceeded),
    RetentionPolicy("max_bytes", "max_bytes", "retention_bytes", "size", _bytes_exceeded),
    RetentionPolicy("max_age_s", "max_age", "retention_secs", "duration", _age_exceeded),
)


@dataclass(frozen=True)
class RetentionOptions(SafetyOptions):
    now_s: float | None = None  # for tests


@dataclass
class RetentionResult(PartitionOutcome):
    rules: dict[str, Any] = field(default_factory=dict)
    segments_before: int = 0
    bytes_before: int = 0
    segments_deleted: int = 0
    bytes_deleted: int = 0
    messages_deleted: int = 0
    first_seq_before: int | None = None
    first_seq_after: int | None = None
    deleted: list[dict[str, Any]] = field(default_factory=list)  # name, bytes, messages, reason
    stale_indexes_removed: list[str] = field(default_factory=list)


def newest_message_ts_s(sf: Segment) -> int | None:
    """Newest message timestamp of a segment, in seconds (message ts are ms by convention, §3.7)."""
    newest = None
    for chunk in sf.chunks():
        if len(chunk.cols):
            m = int(chunk.cols.ts.max())
            newest = m if newest is None else max(newest, m)
    return None if newest is None else newest // 1000


def segment_time_s(sf: Segment, basis: str) -> tuple[int | None, str]:
    """The time a segment's age is measured from, and where it came from."""
    if basis == "name" and sf.ts:
        return sf.ts, "name ts"
    ts = newest_message_ts_s(sf)
    return ts, "newest message ts" if basis == "message" else "newest message ts (legacy name without ts)"


def plan_retention(part: Partition, rules: RetentionRules, now_s: float) -> list[tuple[Segment, str]]:
    """The deletable prefix of RO segments, each with the reason (docs/FORMAT.md §5 loop, real sizes, every age)."""
    ro = list(part.ro)
    left = RemainingRO(len(ro), sum(s.size for s in ro))
    out: list[tuple[Segment, str]] = []
    for s in ro:
        reasons = [
            why
            for policy in POLICIES
            if (limit := getattr(rules, policy.name)) and (why := policy.exceeded(limit, s, left, rules, now_s))
        ]
        if not reasons:
            break
        out.append((s, "; ".join(reasons)))
        left.count -= 1
        left.total_bytes -= s.size
    return out


def _messages_in(sf: Segment) -> int:
    return sum(h.count for h in sf.bundles())


def _count_deleted(res: RetentionResult, remaining: list[Segment]) -> None:
    res.segments_deleted = len(res.deleted)
    res.bytes_deleted = sum(d["bytes"] for d in res.deleted)
    res.messages_deleted = sum(d["messages"] for d in res.deleted)
    res.first_seq_after = remaining[0].base if remaining else None


def apply_retention(part: Partition, rules: RetentionRules, options: RetentionOptions | None = None) -> RetentionResult:
    """Enforce `rules` on one partition; never raises for data problems (the result says `failed` and why)."""
    opts = options or RetentionOptions()
    res = RetentionResult(part.topic, part.id, part.path, rules=asdict(rules))
    return run_on_partition(part.path, "retention", res, lambda r: _retain(part, rules, opts, r), dry_run=opts.dry_run)


def _retain(part: Partition, rules: RetentionRules, options: RetentionOptions, res: RetentionResult) -> None:
    now_s = time.time() if options.now_s is None else options.now_s
    part, res.repair = preflight(part, "retention", options, now=now_s)
    res.segments_before = len(part.ro)
    res.bytes_before = sum(s.size for s in part.ro)
    res.first_seq_before = part.segments[0].base if part.segments else None
    res.first_seq_after = res.first_seq_before
    if not rules.active:
        res.status, res.reason = Status.NOTHING_TO_DO, "no retention policy"
        return
    plan = plan_retention(part, rules, now_s)
    if not plan:
        res.status, res.reason = Status.NOTHING_TO_DO, "within every limit"
        return
    if part.active is None or part.active.size == 0:
        res.status = Status.KEPT
        res.reason = (
            f"{len(plan)} segment(s) are past the limits but the partition has no non-empty active "
            f"segment: deleting would leave RO data without one (hidden by the broker, §9 rule 4) or an "
            f"empty partition whose seqs restart at 1; nothing deleted"
        )
        return
    planned = [
        {
            "name": os.path.basename(sf.path),
            "base": sf.base,
            "last": sf.last,
            "bytes": sf.size,
            "messages": _messages_in(sf),
            "reason": why,
        }
        for sf, why in plan
    ]
    remaining = part.segments[len(plan) :]
    if options.dry_run:
        res.deleted = planned
        _count_deleted(res, remaining)
        res.status = Status.DRY_RUN
        return
    try:
        for (sf, _), entry in zip(plan, planned, strict=True):  # oldest first: a crash leaves a valid prefix deleted
            os.unlink(sf.path)
            res.deleted.append(entry)  # the report states what happened, also when a later step fails
            if os.path.exists(sf.index_path):
                os.unlink(sf.index_path)
            fsync_dir(part.path)
    finally:
        _count_deleted(res, part.segments[len(res.deleted) :])
    # indexes left behind by an earlier interrupted deletion (log gone, index kept) below the first segment
    first = remaining[0].base if remaining else None
    for base, path in sorted(part.index_files.items()):
        if first is not None and base < first and os.path.exists(path):
            os.unlink(path)
            res.stale_indexes_removed.append(os.path.basename(path))
    if res.stale_indexes_removed:
        fsync_dir(part.path)
    res.status = Status.DELETED
