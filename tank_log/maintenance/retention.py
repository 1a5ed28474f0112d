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
  without an active one (the broker then hides them, §9 rule 4) or an empty partition whose seqs restart at 1;
- with a lakehouse guard (`ExportGuard`), a segment goes only once the Delta table has received its last seq: the
  prefix stops at the first segment the table lacks, and what that keeps back is reported. Past the guard's bound
  (bytes held back, or how far past its retention the oldest held segment is) retention deletes as usual and reports
  `data-loss` with the seq ranges the table never received; a table that cannot be read deletes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tank_log.errors import NeedsAttention
from tank_log.format.broker_config import PartitionConfig, broker_deletes
from tank_log.maintenance.damage import DamagedInput, HeaderAudit
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
        limits = {p.name: getattr(cfg, p.broker_field) if p.broker_field else 0 for p in POLICIES}
        return cls(**limits, time_basis=time_basis)

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

    `name`: its field in RetentionRules (and TopicRetention's); `config_key`: its key in the job config
    (`retention.topics.<topic>.<config_key>`); `broker_field`: the PartitionConfig field holding the broker's value,
    None for a policy the broker lacks (off unless the job config sets it); `unit`: how the job config parses it;
    `exceeded(limit, segment, remaining, rules, now_s)`: why the front segment goes, or None. A test holds
    RetentionRules, TopicRetention and PartitionConfig to this table.
    """

    name: str
    config_key: str
    broker_field: str | None
    unit: Literal["count", "size", "duration"]
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


# Adding a policy: a row here, a field in RetentionRules, its key in the job config's TopicRetention
# (jobs/config/models.py), and the broker's key in format/broker_config.py if the broker has one (else
# broker_field None). The planner and the config's overrides read this table; a test holds the three to it.
POLICIES: tuple[RetentionPolicy, ...] = (
    RetentionPolicy("segments_count", "segments_count", "retention_segments_count", "count", _count_exceeded),
    RetentionPolicy("max_bytes", "max_bytes", "retention_bytes", "size", _bytes_exceeded),
    RetentionPolicy("max_age_s", "max_age", "retention_secs", "duration", _age_exceeded),
)


@dataclass(frozen=True)
class RetentionOptions(SafetyOptions):
    """How `apply_retention` runs: the safety options (and, for tests, the time it takes as now)."""

    now_s: float | None = None  # for tests


@dataclass(frozen=True)
class ExportGuard:
    """What the lakehouse has received of one partition, read before the run (a version read earlier is never
    higher than the table's now: the guard errs on keeping)."""

    table: str  # the Delta table's URI (for messages)
    exported_last: int | None = None  # the last seq the table holds (None: none)
    error: str | None = None  # the table could not be read: nothing is deleted
    max_holdback_bytes: int = 0  # 0: no bound
    max_holdback_s: int = 0  # 0: no bound


@dataclass
class RetentionResult(PartitionOutcome):
    """What `apply_retention` did to one partition: the rules, and the segments and bytes before and deleted."""

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
    exported_last: int | None = None  # with a lakehouse guard: the last seq its table holds
    kept_unexported: dict[str, Any] | None = None  # segments past the limits kept for the table
    deleted_unexported: list[list[int]] = field(default_factory=list)  # [first, last] seqs lost (past the bound)


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


def _planned_entry(sf: Segment, why: str) -> dict[str, Any]:
    """A segment retention deletes, as its report entry: the messages its bundles hold, counted through the
    readers' completeness check (`maintenance.damage`): a damaged segment's count is not what its name claims, and
    the entry says so (`damage`: file, offset, seqs)."""
    audit = HeaderAudit(sf, "retention")
    hole = None
    try:
        for _ in audit.walk():
            pass
    except DamagedInput as err:
        hole = err.damage[0]
    entry: dict[str, Any] = {
        "name": os.path.basename(sf.path),
        "base": sf.base,
        "last": sf.last,
        "bytes": sf.size,
        "messages": audit.audit.messages,
        "reason": why,
    }
    if hole is not None:
        entry["damage"] = hole.to_dict()
        log.warning("%s: deleting a damaged segment: %s", sf.path, hole)
    return entry


def _count_deleted(res: RetentionResult, remaining: list[Segment]) -> None:
    res.segments_deleted = len(res.deleted)
    res.bytes_deleted = sum(d["bytes"] for d in res.deleted)
    res.messages_deleted = sum(d["messages"] for d in res.deleted)
    res.first_seq_after = remaining[0].base if remaining else None


def apply_retention(
    part: Partition,
    rules: RetentionRules,
    options: RetentionOptions | None = None,
    guard: ExportGuard | None = None,
) -> RetentionResult:
    """Enforce `rules` on one partition, keeping what `guard`'s table lacks; never raises for data problems (the
    result says `failed` and why)."""
    opts = options or RetentionOptions()
    res = RetentionResult(part.topic, part.id, part.path, rules=asdict(rules))
    return run_on_partition(
        part.path, "retention", res, lambda r: _retain(part, rules, opts, r, guard), dry_run=opts.dry_run
    )


def held_for_the_table(
    plan: list[tuple[Segment, str]], guard: ExportGuard, rules: RetentionRules, now_s: float
) -> tuple[int, bool]:
    """How many segments of the deletable prefix the table has received (a prefix: it stops at the first segment
    whose last seq the table lacks), and whether what the rest holds back is past the guard's bound."""
    exported = guard.exported_last if guard.exported_last is not None else 0
    received = 0
    for sf, _ in plan:
        if sf.last is None or sf.last > exported:
            break
        received += 1
    held = [sf for sf, _ in plan[received:]]
    if not held:
        return received, False
    too_large = bool(guard.max_holdback_bytes) and sum(s.size for s in held) > guard.max_holdback_bytes
    t, _ = segment_time_s(held[0], rules.time_basis)
    past_s = 0.0 if t is None else now_s - t - rules.max_age_s  # past its retention (its age, without an age limit)
    too_old = bool(guard.max_holdback_s) and past_s > guard.max_holdback_s
    return received, too_large or too_old


def broker_retention_problem(topic: str, config: PartitionConfig) -> str | None:
    """Why the lakehouse guard cannot protect `topic`: its `config` lets the broker delete segments by age, size or
    count at its next roll (§5), whether the table has them or not. None when the broker deletes nothing itself."""
    keys = broker_deletes(config)
    if not keys:
        return None
    return (
        f"topic {topic}: keep_unexported guards it, but its config lets the broker delete segments itself at its next "
        f"roll, exported or not ({', '.join(keys)}; §5): set them to 0 in the topic's config (and any partition's) "
        "and let tank-log's retention apply the limits (docs/guides/retention.md)"
    )


def _retain(
    part: Partition, rules: RetentionRules, options: RetentionOptions, res: RetentionResult, guard: ExportGuard | None
) -> None:
    if guard is not None:
        problem = broker_retention_problem(part.topic, part.config)
        if problem:
            raise NeedsAttention(problem)
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
    past_bound = False
    if guard is not None:
        guarded = _guarded_plan(part, plan, guard, rules, now_s, res)
        if guarded is None:
            return
        plan, past_bound = guarded
    if part.active is None or part.active.size == 0:
        res.status = Status.KEPT
        res.reason = (
            f"{len(plan)} segment(s) are past the limits but the partition has no non-empty active "
            f"segment: deleting would leave RO data without one (hidden by the broker, §9 rule 4) or an "
            f"empty partition whose seqs restart at 1; nothing deleted"
        )
        return
    planned = [_planned_entry(sf, why) for sf, why in plan]
    damaged = [e for e in planned if "damage" in e]
    if damaged and guard is not None:  # what the table holds of a damaged segment is unknown: nothing deleted
        res.status = Status.NEEDS_ATTENTION
        res.reason = (
            f"{len(damaged)} segment(s) past the limits are damaged ({damaged[0]['damage']['path']}: "
            f"{damaged[0]['damage']['reason']}); the guard cannot tell what the table received of them: "
            "nothing deleted"
        )
        return
    remaining = part.segments[len(plan) :]
    if options.dry_run:
        res.deleted = planned
        _count_deleted(res, remaining)
        res.status = Status.DRY_RUN
        if past_bound:
            res.reason = "would delete data the lakehouse has not received (past max_holdback)"
        return
    _delete(part, plan, planned, remaining, res)
    res.status = Status.DELETED
    if damaged:
        res.reason = "deleted damaged segment(s): " + "; ".join(
            f"{e['name']} ({e['damage']['code']}: seqs {e['base']}..{e['last']} as named, {e['messages']} read)"
            for e in damaged
        )
    if past_bound:
        res.status = Status.DATA_LOSS
        res.reason = f"deleted seqs {res.deleted_unexported} the lakehouse had not received (past max_holdback)"


def _guarded_plan(
    part: Partition,
    plan: list[tuple[Segment, str]],
    guard: ExportGuard,
    rules: RetentionRules,
    now_s: float,
    res: RetentionResult,
) -> tuple[list[tuple[Segment, str]], bool] | None:
    """Retention's lakehouse guard over the deletable prefix: the part the table has received (all of it past
    max_holdback) and whether that bound was passed; None when nothing may be deleted (`res` says why)."""
    if guard.error is not None:
        res.status = Status.NEEDS_ATTENTION
        res.reason = (
            f"{len(plan)} segment(s) are past the limits, but what the lakehouse holds is unknown "
            f"({guard.error}): nothing deleted"
        )
        log.error("%s/%d: %s", part.topic, part.id, res.reason)
        return None
    res.exported_last = guard.exported_last
    received, past_bound = held_for_the_table(plan, guard, rules, now_s)
    held = [sf for sf, _ in plan[received:]]
    if held:
        res.kept_unexported = {
            "table": guard.table,
            "segments": len(held),
            "bytes": sum(s.size for s in held),
            "first_seq": max(held[0].base, (guard.exported_last or 0) + 1),
            "last_seq": held[-1].last,
            "max_bytes": guard.max_holdback_bytes,  # the bound (0: none)
        }
        if past_bound:
            res.deleted_unexported = [[max(s.base, (guard.exported_last or 0) + 1), s.last or s.base] for s in held]
            log.error(
                "%s/%d: %d segments (%d bytes, seqs %d..%d) not yet in %s are past max_holdback: deleting them "
                "(data-loss)",
                part.topic,
                part.id,
                len(held),
                res.kept_unexported["bytes"],
                res.kept_unexported["first_seq"],
                res.kept_unexported["last_seq"],
                guard.table,
            )
            res.kept_unexported = None
        else:
            log.warning(
                "%s/%d: kept %d segments (%s, seqs %d..%d) not yet in %s",
                part.topic,
                part.id,
                len(held),
                _mb(res.kept_unexported["bytes"]),
                res.kept_unexported["first_seq"],
                res.kept_unexported["last_seq"],
                guard.table,
            )
            plan = plan[:received]
    if not plan:
        res.status = Status.KEPT
        res.reason = f"past the limits but not yet in {guard.table}: kept for the export"
        return None
    return plan, past_bound


def _delete(
    part: Partition,
    plan: list[tuple[Segment, str]],
    planned: list[dict[str, Any]],
    remaining: list[Segment],
    res: RetentionResult,
) -> None:
    """Delete the planned segments oldest first, then the indexes an earlier interrupted deletion left below the
    first remaining segment; `res` counts what was deleted, also when a step fails."""
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


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n} bytes"
