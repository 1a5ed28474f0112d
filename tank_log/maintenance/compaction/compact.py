"""Compacting one partition: preflight, choose inputs, two passes, swap the outputs in, record the mark."""

from __future__ import annotations

import tempfile
import time

from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
from tank_log.maintenance.compaction.output import OutputSegments
from tank_log.maintenance.compaction.passes import dirty_ratio, map_keys, pass2_segment, select_inputs
from tank_log.maintenance.compaction.survivors import BundleFilter
from tank_log.maintenance.damage import DamagedInput, describe, refuse_damage
from tank_log.maintenance.outcome import Status, run_on_partition
from tank_log.maintenance.preflight import preflight, repair_summary
from tank_log.storage.cleanup_marks import update_cleanup_log
from tank_log.storage.datadir import Partition, scan_partition
from tank_log.storage.fsutil import StepHook
from tank_log.storage.segment import Segment
from tank_log.storage.swap import swap_in


def compact_partition(
    part: Partition,
    options: CompactionOptions | None = None,
    *,
    base_path: str | None = None,
    cleanup_mark: int = 0,
    on_step: StepHook | None = None,
) -> CompactionResult:
    """Compact one partition; never raises for data problems (the result says `failed` and why).

    `base_path`: the broker base path whose `.cleanup.log` gets the new record (None: not updated).
    `on_step`: called after every file operation of the protocol (crash-injection tests).
    """
    options = options or CompactionOptions()
    res = CompactionResult(part.topic, part.id, part.path)
    step = on_step or (lambda what: None)
    return run_on_partition(
        part.path,
        "compact",
        res,
        lambda r: _compact_locked(part, options, r, base_path, cleanup_mark, step),
        dry_run=options.dry_run,
    )


def _compact_locked(
    part: Partition,
    options: CompactionOptions,
    res: CompactionResult,
    base_path: str | None,
    cleanup_mark: int,
    on_step: StepHook | None,
) -> None:
    now_ms = options.now_ms if options.now_ms is not None else int(time.time() * 1000)
    try:
        part, res.repair = preflight(part, "compaction", options, now=now_ms / 1000, audit=_audit_all)
        inputs = _audited_inputs(part, options, res, cleanup_mark, now_ms)
    except DamagedInput as err:
        res.damage = describe(err.damage)
        raise
    if inputs is None:
        return
    res.segments_before = len(inputs)
    res.bytes_before = sum(s.size for s in inputs)
    res.range_first, res.range_last = inputs[0].base, inputs[-1].last
    range_last = inputs[-1].last or 0  # RO names always carry a last
    cutoff = None if options.tombstone_retention_ms is None else now_ms - options.tombstone_retention_ms
    segment_bytes = min(options.segment_bytes or part.config.segment_bytes, (1 << 32) - (1 << 26))

    # keys past the budget spill beside the data, where `repair` finds what a killed run leaves; a dry run writes
    # nothing into the data, so its spill goes to the system's temporary directory
    spill_dir = tempfile.gettempdir() if options.dry_run else part.path
    try:
        survivors = map_keys(inputs, options.key_state_budget, spill_dir, res)  # pass 1, audited
    except DamagedInput as err:
        res.damage = describe(err.damage)
        raise
    select = BundleFilter(survivors, range_last)
    out = (
        None if options.dry_run else OutputSegments(part.path, options, segment_bytes, part.config.index_interval_bytes)
    )
    dropped = _write_survivors(inputs, select, res, out, options, cutoff)  # pass 2
    res.bundles_skipped = select.skipped
    if options.dry_run:
        res.status, res.bytes_after, res.segments_after = Status.DRY_RUN, None, 0
        return
    if out is None or not dropped:
        res.status, res.reason = Status.NOTHING_TO_DO, "no message would be dropped"
        _set_mark(base_path, part, res.range_last, options)
        return
    res.outputs = swap_in(part.path, inputs, out.done, on_step)
    final = [s for s in scan_partition(part.path, part.topic, part.id, part.config).ro if s.base <= range_last]
    res.segments_after = len(final)
    res.bytes_after = sum(s.size for s in final)
    _set_mark(base_path, part, res.range_last, options)
    res.status = Status.COMPACTED


def _audit_all(part: Partition) -> None:
    """Every RO segment's headers and the names, audited (where repair refuses: the damage behind it, named)."""
    refuse_damage("compaction", part, part.ro)


def _audited_inputs(
    part: Partition, options: CompactionOptions, res: CompactionResult, cleanup_mark: int, now_ms: int
) -> list[Segment] | None:
    """`_inputs_to_compact` after the readers' completeness check (`maintenance.damage`): the partition's names
    (overlaps, an index whose segment is gone, files a reader leaves out) always; the RO segments this run does not
    read in pass 1 (a young tail, or all of them when there is nothing to do) by their first bundle and their bytes
    after their last index entry (`damage.tail_hole`: cheap, as a nothing-to-do must be). The inputs are
    audited by pass 1 itself, on the headers it walks anyway. No "nothing-to-do" over a hole.

    Raises:
        DamagedInput: what is damaged (file, offset, seqs); nothing was written.
    """
    refuse_damage("compaction", part, [])
    inputs = _inputs_to_compact(part, options, res, cleanup_mark, now_ms)
    chosen = {s.path for s in inputs or []}
    refuse_damage("compaction", part, [s for s in part.ro if s.path not in chosen], names=False, quick=True)
    return inputs


def _inputs_to_compact(
    part: Partition, options: CompactionOptions, res: CompactionResult, cleanup_mark: int, now_ms: int
) -> list[Segment] | None:
    """The RO segments this run compacts, or None with `res` saying why there is nothing to do (no segment old
    enough, or a dirty ratio under the threshold without `force`); `res.dirty_ratio` is set either way."""
    res.dirty_ratio = round(dirty_ratio(part, cleanup_mark), 4)
    threshold = (
        options.min_cleanable_ratio if options.min_cleanable_ratio is not None else (part.config.min_cleanable_ratio)
    )
    inputs = select_inputs(part, options, now_ms)
    if not inputs:
        res.status, res.reason = Status.NOTHING_TO_DO, "no RO segment old enough" if part.ro else "no RO segments"
        if res.repair:  # e.g. an RO-only partition whose last segment repair made active: it says so
            res.reason += f" (after {repair_summary(res.repair)})"
        return None
    if not options.force and res.dirty_ratio < threshold:
        res.status, res.reason = Status.NOTHING_TO_DO, f"dirty ratio {res.dirty_ratio} < {threshold}"
        return None
    return inputs


def _write_survivors(
    inputs: list[Segment],
    select: BundleFilter,
    res: CompactionResult,
    out: OutputSegments | None,
    options: CompactionOptions,
    cutoff: int | None,
) -> bool:
    """Pass 2: the survivors of every input into `out` (None: a dry run, counted only). Whether a message was
    dropped: the last output is closed if so, else every output is aborted, as on any error."""
    try:
        for sf in inputs:
            if out is not None:
                out.input_ts = sf.ts
            pass2_segment(sf, select, res, out, options, cutoff)
        dropped = res.messages_after < select.messages
        if out is not None:
            if dropped:
                out.close_current()
            else:
                out.abort()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    return dropped


def _set_mark(base_path: str | None, part: Partition, last: int | None, options: CompactionOptions) -> None:
    """§1.6 / §9 rule 10: the partition's `.cleanup.log` record = the last compacted seq."""
    if base_path is None or last is None or options.dry_run:
        return
    update_cleanup_log(base_path, {(part.topic, part.id): last})
