"""Compacting one partition: preflight, choose inputs, two passes, swap the outputs in, record the mark."""

from __future__ import annotations

import os
import time

from tank_log.errors import NeedsAttention
from tank_log.maintenance.compaction.key_state import new_key_map
from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
from tank_log.maintenance.compaction.output import OutputSegments
from tank_log.maintenance.compaction.passes import dirty_ratio, map_keys, pass2_segment, select_inputs
from tank_log.maintenance.compaction.survivors import BundleFilter, MarkedStretches
from tank_log.maintenance.outcome import Status, run_on_partition
from tank_log.maintenance.preflight import preflight
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
    part, res.repair = preflight(part, "compaction", options, now=now_ms / 1000)
    for a, b in zip(part.ro, part.ro[1:], strict=False):
        if b.base <= (a.last or 0):
            raise NeedsAttention(f"overlapping RO segments {a.file_name} and {b.file_name}; run verify/repair first")
    if part.ro and part.active is not None and part.active.base <= (part.ro[-1].last or 0):
        raise NeedsAttention("active segment base <= last RO seq; run verify first")

    res.dirty_ratio = round(dirty_ratio(part, cleanup_mark), 4)
    threshold = (
        options.min_cleanable_ratio if options.min_cleanable_ratio is not None else (part.config.min_cleanable_ratio)
    )
    inputs = select_inputs(part, options, now_ms)
    if not inputs:
        res.status, res.reason = Status.NOTHING_TO_DO, "no RO segment old enough" if part.ro else "no RO segments"
        return
    if not options.force and res.dirty_ratio < threshold:
        res.status, res.reason = Status.NOTHING_TO_DO, f"dirty ratio {res.dirty_ratio} < {threshold}"
        return
    res.segments_before = len(inputs)
    res.bytes_before = sum(s.size for s in inputs)
    res.range_first, res.range_last = inputs[0].base, inputs[-1].last
    range_last = inputs[-1].last or 0  # RO names always carry a last
    cutoff = None if options.tombstone_retention_ms is None else now_ms - options.tombstone_retention_ms
    segment_bytes = min(options.segment_bytes or part.config.segment_bytes, (1 << 32) - (1 << 26))

    # Rounds, as Kafka's cleaner does: a round maps the keys from `start` on until its map is full (pass 1), then
    # rewrites the inputs up to there, dropping every message whose key it maps to a later seq (pass 2). Earlier
    # rounds left each key at most once before `start`, so the last round leaves what one unlimited round would.
    start = inputs[0].base
    compacted = False
    while True:
        round_end, swapped = _round(part, inputs, start, range_last, options, cutoff, segment_bytes, res, on_step)
        compacted |= swapped
        if options.dry_run or round_end is None:
            break
        _set_mark(base_path, part, round_end, options)
        start = round_end + 1
        part = scan_partition(part.path, part.topic, part.id, part.config)
        inputs = [s for s in part.ro if s.base <= range_last]
    if options.dry_run:
        res.status, res.bytes_after, res.segments_after = Status.DRY_RUN, None, 0
        if res.rounds == 1 and round_end is not None:
            res.reason = "the first of several rounds (the keys exceed compaction.key_state_budget)"
        return
    if not compacted:
        res.status, res.reason = Status.NOTHING_TO_DO, "no message would be dropped"
        _set_mark(base_path, part, res.range_last, options)
        return
    final = [s for s in scan_partition(part.path, part.topic, part.id, part.config).ro if s.base <= range_last]
    res.outputs = [n for n in res.outputs if os.path.exists(os.path.join(part.path, n))]  # later rounds replace
    res.segments_after = len(final)
    res.bytes_after = sum(s.size for s in final)
    _set_mark(base_path, part, res.range_last, options)
    res.status = Status.COMPACTED


def _round(
    part: Partition,
    inputs: list[Segment],
    start: int,
    range_last: int,
    options: CompactionOptions,
    cutoff: int | None,
    segment_bytes: int,
    res: CompactionResult,
    on_step: StepHook | None,
) -> tuple[int | None, bool]:
    """One round from seq `start`: pass 1 maps keys until the budget is full, pass 2 rewrites the inputs up to
    there and swaps the outputs in. Returns the round's last seq (None: it reached the end of the inputs) and
    whether anything was swapped in."""
    share = MarkedStretches.share(options.key_state_budget)
    key_map, marked = new_key_map(options.key_state_budget - share), MarkedStretches(share)
    round_end = map_keys(inputs, start, key_map, marked, res)  # pass 1: key → latest seq
    if round_end is not None and round_end < start:
        raise NeedsAttention(
            f"compaction.key_state_budget ({options.key_state_budget} bytes) cannot hold one key at seq {start}"
        )
    res.rounds += 1
    res.distinct_keys += len(key_map)
    res.key_state_bytes = max(res.key_state_bytes, key_map.nbytes + marked.nbytes)
    select = BundleFilter(key_map.latest_seqs(), marked, start, round_end, range_last)
    touched = inputs if round_end is None else [s for s in inputs if s.base <= round_end]
    one = CompactionResult(part.topic, part.id, part.path)
    out = (
        None if options.dry_run else OutputSegments(part.path, options, segment_bytes, part.config.index_interval_bytes)
    )
    try:
        for sf in touched:  # pass 2: survivors → outputs
            if out is not None:
                out.input_ts = sf.ts
            pass2_segment(sf, key_map, select, one, out, options, cutoff)
        dropped = one.messages_after < select.messages
        if out is not None:
            if dropped:
                out.close_current()
            else:
                out.abort()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    res.bundles_skipped += select.skipped
    res.messages_after = one.messages_after  # the last round's survivors are the result
    res.tombstones_dropped += one.tombstones_dropped
    res.keyless_dropped += one.keyless_dropped
    res.tombstones_kept, res.keyless_kept = one.tombstones_kept, one.keyless_kept
    del key_map, select  # before the next round's map is made: never two maps at once
    if out is None or not dropped:
        return round_end, False
    res.outputs += swap_in(part.path, touched, out.done, on_step)
    return round_end, True


def _set_mark(base_path: str | None, part: Partition, last: int | None, options: CompactionOptions) -> None:
    """§1.6 / §9 rule 10: the partition's `.cleanup.log` record = the last compacted seq."""
    if base_path is None or last is None or options.dry_run:
        return
    update_cleanup_log(base_path, {(part.topic, part.id): last})
