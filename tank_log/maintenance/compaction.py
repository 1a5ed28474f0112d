"""Compaction of keyed partitions (TANK_FORMAT.md §6), crash-safe and with memory bounded by distinct keys.

Semantics are the broker's (§6.2), so a partition compacted here reads as if the broker had compacted it:
- only RO segments; the active segment is never read or modified;
- keyed messages: only the highest seq per key survives; a tombstone (key + empty value) survives as its key's latest
  value — unless `tombstone_retention_ms` is set: then tombstones older than that (by message ts) are dropped too,
  which goes beyond the broker (like Kafka's delete.retention.ms);
- keyless non-empty messages survive (unless `drop_keyless`, Kafka's behaviour); keyless empty ones are dropped;
- the message with the highest seq of the compacted range always survives: dropping it would open a seq gap before
  the active segment, on which the broker aborts (§4.4, §11.23 — the broker's own compaction has this bug);
- survivors keep seq, ts, key, value and order (never the broker's key-order bug, §11.24); gaps are encoded as
  sparse bundles (§3.6).

Two passes: pass 1 collects key → last seq exactly (Arrow group-by in windows; no digests, so no collisions) and
keeps only the sorted survivor seqs (8 bytes per key); pass 2 streams the inputs again and writes survivors —
bundles that survive whole are copied verbatim when large enough, the rest are re-bundled (default 100 messages /
64 KiB, Snappy when it pays).

File protocol (compatible with the broker's, §6.4): outputs are written under `.`-prefixed temporary names and
fsynced, then `storage.swap.swap_in` puts them in place of the inputs (`.cleaned` → `.swap`, inputs → `.old`, strip
`.swap`, unlink `.old`); `storage.swap.repair_partition` recovers from a crash at any point. Finally
the partition's `.cleanup.log` record is set to the last compacted seq, atomically.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tank_log.errors import NeedsAttention, TankFormatError
from tank_log.format.arrow import binary_column
from tank_log.format.bundle import SPARSE, Message, SnappyPolicy
from tank_log.format.cleanup_log import update_cleanup_log
from tank_log.maintenance.outcome import PartitionOutcome, Status, run_on_partition
from tank_log.maintenance.preflight import preflight
from tank_log.storage.datadir import Partition
from tank_log.storage.segment import Segment, Tail
from tank_log.storage.swap import StepHook, swap_in
from tank_log.storage.writer import BundlePolicy, SegmentWriter, WrittenSegment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionOptions:
    force: bool = False  # compact even when the dirty ratio is below the threshold
    min_cleanable_ratio: float | None = None  # None: the partition's log.cleaner.min.cleanable.ratio
    segment_bytes: int | None = None  # output size; None: the partition's log.segment.bytes
    min_compaction_lag_ms: int = 0  # segments whose newest message is younger stay out of this round
    tombstone_retention_ms: int | None = None  # None: keep tombstones forever (the broker's rule)
    drop_keyless: bool = False
    policy: BundlePolicy = BundlePolicy(max_messages=100, max_bytes=64 << 10, snappy=SnappyPolicy.WHEN_SMALLER)
    broker_stopped: bool = False  # skip the liveness check
    live_window_s: int = 300  # a partition whose active segment changed this recently looks live
    dry_run: bool = False
    pass1_window_rows: int = 1_000_000
    now_ms: int | None = None  # for tests


@dataclass
class CompactionResult(PartitionOutcome):
    """One partition's outcome; `to_dict` is its entry in the JSON run report."""

    dirty_ratio: float | None = None
    range_first: int | None = None
    range_last: int | None = None
    segments_before: int = 0
    bytes_before: int = 0
    messages_before: int = 0
    segments_after: int = 0
    bytes_after: int | None = 0
    messages_after: int = 0
    distinct_keys: int = 0
    tombstones_kept: int = 0
    tombstones_dropped: int = 0
    keyless_kept: int = 0
    keyless_dropped: int = 0
    key_state_bytes: int = 0
    outputs: list[str] = field(default_factory=list)


# ---- planning ---------------------------------------------------------------------------------------------------


def dirty_ratio(part: Partition, mark: int) -> float:
    """§6.1 with real file sizes (the broker counts unopened segments as 0 bytes)."""
    total = sum(s.size for s in part.ro)
    dirty = sum(s.size for s in part.ro if s.base >= mark + 1)
    return dirty / total if total else 0.0


def segment_max_ts(sf: Segment) -> int:
    return max((int(c.cols.ts.max()) for c in sf.chunks() if len(c.cols)), default=0)


def select_inputs(part: Partition, options: CompactionOptions, now_ms: int) -> list[Segment]:
    """The RO segments of this round: all of them, minus a young tail (min_compaction_lag_ms, by newest message ts;
    checked from the newest segment backwards, assuming timestamps grow with seqs as Kafka does)."""
    inputs = list(part.ro)
    if options.min_compaction_lag_ms > 0:
        cutoff = now_ms - options.min_compaction_lag_ms
        while inputs and segment_max_ts(inputs[-1]) > cutoff:
            inputs.pop()
    return inputs


# ---- pass 1 -----------------------------------------------------------------------------------------------------


class KeyState:
    """Exact key → last seq, reduced with Arrow group-by every `window` rows; memory ∝ distinct keys."""

    def __init__(self, window: int):
        self.window = window
        self.table: pa.Table | None = None
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add(self, keys: pa.Array, seqs: np.ndarray) -> None:
        if len(seqs):
            self.pending.append(pa.table({"key": keys, "seq": pa.array(seqs)}))
            self.pending_rows += len(seqs)
            if self.pending_rows >= self.window:
                self.reduce()

    def reduce(self) -> None:
        parts = ([self.table] if self.table is not None else []) + self.pending
        if not parts:
            return
        merged = pa.concat_tables(parts).group_by("key").aggregate([("seq", "max")])
        self.table = merged.rename_columns(["key", "seq"]).combine_chunks()
        self.pending, self.pending_rows = [], 0

    def survivor_seqs(self) -> np.ndarray:
        self.reduce()
        if self.table is None:
            return np.zeros(0, dtype=np.uint64)
        return np.sort(self.table.column("seq").to_numpy())

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else self.table.nbytes


def _in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    idx = np.searchsorted(sorted_set, values)
    idx[idx == len(sorted_set)] = 0
    return sorted_set[idx] == values


# ---- the job ----------------------------------------------------------------------------------------------------


class _Outputs:
    """Streams survivors into output segments (rolled past `segment_bytes`), tracking name timestamps."""

    def __init__(self, directory: str, options: CompactionOptions, segment_bytes: int, index_interval: int):
        self.directory = directory
        self.options = options
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.done: list[WrittenSegment] = []
        self.writer: SegmentWriter | None = None
        self.input_ts: int | None = None
        self.newest_ts = 0

    def _ensure(self) -> SegmentWriter:
        if self.writer is None:
            self.writer = SegmentWriter(self.directory, policy=self.options.policy, index_interval=self.index_interval)
            self.newest_ts = 0
        return self.writer

    def add(self, m: Message) -> None:
        self._ensure().add(m)
        self.newest_ts = max(self.newest_ts, m.ts)
        self._maybe_roll()

    def add_bundle(self, framed: bytes, first: int, last: int, count: int, sparse: bool, max_ts: int) -> None:
        w = self._ensure()
        w.add_bundle(framed, first, last, count, sparse=sparse)
        self.newest_ts = max(self.newest_ts, max_ts)
        self._maybe_roll()

    def _maybe_roll(self) -> None:
        if self.writer is not None and self.writer.size > self.segment_bytes:
            self.close_current()

    def close_current(self) -> None:
        if self.writer is None:
            return
        # name ts: the newest input absorbed (§6.3); legacy inputs without ts: the newest message's, in seconds
        self.writer.ts = self.input_ts if self.input_ts is not None else self.newest_ts // 1000
        written = self.writer.finish()
        if written is not None:
            self.done.append(written)
        self.writer = None

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        for w in self.done:
            for p in (w.log_path, w.index_path):
                if os.path.exists(p):
                    os.unlink(p)


def compact_partition(
    part: Partition,
    options: CompactionOptions = CompactionOptions(),
    *,
    base_path: str | None = None,
    cleanup_mark: int = 0,
    on_step: StepHook | None = None,
) -> CompactionResult:
    """Compact one partition; never raises for data problems (the result says `failed` and why).

    `base_path`: the broker base path whose `.cleanup.log` gets the new record (None: not updated).
    `on_step`: called after every file operation of the protocol (crash-injection tests).
    """
    res = CompactionResult(part.topic, part.id, part.path)
    step = on_step or (lambda what: None)
    return run_on_partition(
        part.path,
        "compact",
        res,
        lambda r: _compact_locked(part, options, r, base_path, cleanup_mark, step),
        dry_run=options.dry_run,
    )


def _compact_locked(part, options, res, base_path, cleanup_mark, on_step) -> None:
    now_ms = options.now_ms if options.now_ms is not None else int(time.time() * 1000)
    part, res.repair = preflight(
        part,
        "compaction",
        broker_stopped=options.broker_stopped,
        live_window_s=options.live_window_s,
        dry_run=options.dry_run,
        now=now_ms / 1000,
    )
    for a, b in zip(part.ro, part.ro[1:], strict=False):
        if b.base <= a.last:
            raise NeedsAttention(f"overlapping RO segments {a.name.name} and {b.name.name}; run verify/repair first")
    if part.ro and part.active is not None and part.active.base <= part.ro[-1].last:
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

    # pass 1: key → last seq
    state = KeyState(options.pass1_window_rows)
    for seg in inputs:
        walk = seg.chunks(chunk_bytes=PASS_CHUNK_BYTES)
        for chunk in walk:
            c = chunk.cols
            res.messages_before += len(c)
            keyed = c.key_off >= 0
            if keyed.any():
                state.add(binary_column(c, keyed, "key"), c.seq[keyed])
        _check_complete(seg, walk.tail)
    survivors = state.survivor_seqs()
    res.distinct_keys = len(survivors)
    res.key_state_bytes = state.nbytes
    del state

    # pass 2: survivors → outputs
    segment_bytes = min(options.segment_bytes or part.config.segment_bytes, (1 << 32) - (1 << 26))
    out = None if options.dry_run else _Outputs(part.path, options, segment_bytes, part.config.index_interval_bytes)
    cutoff = None if options.tombstone_retention_ms is None else now_ms - options.tombstone_retention_ms
    try:
        for sf in inputs:
            if out is not None:
                out.input_ts = sf.name.ts
            _pass2_segment(sf, survivors, res, out, options, cutoff, res.range_last)
        if res.messages_after == res.messages_before:
            if out is not None:
                out.abort()
            res.status, res.reason = Status.NOTHING_TO_DO, "no message would be dropped"
            _set_mark(base_path, part, res.range_last, options)
            return
        if out is None:
            res.status, res.bytes_after = Status.DRY_RUN, None
            res.segments_after = 0
            return
        out.close_current()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    res.outputs = swap_in(part.path, inputs, out.done, on_step)
    res.segments_after = len(out.done)
    res.bytes_after = sum(w.size for w in out.done)
    _set_mark(base_path, part, res.range_last, options)
    res.status = Status.COMPACTED


def _check_complete(seg: Segment, tail: Tail | None) -> None:
    if tail is not None and tail.torn_bytes:
        raise TankFormatError(
            f"torn tail of {tail.torn_bytes} bytes in an RO segment; salvage it first (rebuild_indexes --salvage)",
            seg.path,
            tail.valid_end,
        )


PASS_CHUNK_BYTES = 16 << 20  # bigger chunks amortise the per-step cost of the vectorised decoder


def _pass2_segment(sf, survivors, res, out, options, cutoff, range_last) -> None:
    min_copy = max(1, options.policy.max_messages // 2)
    for chunk in sf.chunks(chunk_bytes=PASS_CHUNK_BYTES):
        c, t = chunk.cols, chunk.table
        keyed = c.key_off >= 0
        empty = c.val_len == 0
        keep = np.where(keyed, _in_sorted(c.seq, survivors), ~empty & (not options.drop_keyless))
        tomb = keyed & empty
        if cutoff is not None:
            expired = keep & tomb & (c.ts < np.uint64(max(cutoff, 0)))
            keep &= ~expired
        keep |= c.seq == np.uint64(range_last)  # never drop the range's last message (§4.4)
        res.messages_after += int(keep.sum())
        res.tombstones_kept += int((keep & tomb).sum())
        res.tombstones_dropped += int((~keep & tomb).sum())
        res.keyless_kept += int((keep & ~keyed).sum())
        res.keyless_dropped += int((~keep & ~keyed).sum())
        if out is None:
            continue
        _write_survivors(c, t, keep, out, min_copy)


def _write_survivors(c, t, keep, out, min_copy: int) -> None:
    """Copy whole surviving bundles verbatim (when large enough and valid at this position); re-encode the rest."""
    per_bundle = np.bincount(c.bundle[keep], minlength=len(t)).tolist()
    idx = np.flatnonzero(keep)
    seqs, tss = c.seq[idx].tolist(), c.ts[idx].tolist()
    koffs, klens = c.key_off[idx].tolist(), c.key_len[idx].tolist()
    voffs, vlens = c.val_off[idx].tolist(), c.val_len[idx].tolist()
    data = t.data
    k = 0  # position in the survivor lists
    for b, n_keep in enumerate(per_bundle):
        if not n_keep:
            continue
        n = t.counts[b]
        sparse = bool(t.flags[b] & SPARSE)
        w = out.writer
        contiguous = w is None or w.expected_next is None or t.firsts[b] == w.expected_next
        if n_keep == n and n >= min_copy and (sparse or contiguous):
            out.add_bundle(data[t.offsets[b] : t.ends[b]], t.firsts[b], t.lasts[b], n, sparse, max(tss[k : k + n]))
            k += n
            continue
        for j in range(k, k + n_keep):
            ko = koffs[j]
            key = None if ko < 0 else data[ko : ko + klens[j]]
            vo = voffs[j]
            out.add(Message(seqs[j], tss[j], key, data[vo : vo + vlens[j]]))
        k += n_keep


def _set_mark(base_path: str | None, part: Partition, last: int | None, options: CompactionOptions) -> None:
    """§1.6 / §9 rule 10: the partition's `.cleanup.log` record = the last compacted seq."""
    if base_path is None or last is None or options.dry_run:
        return
    update_cleanup_log(base_path, {(part.topic, part.id): last})
