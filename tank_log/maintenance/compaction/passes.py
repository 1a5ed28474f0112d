"""Choosing the inputs and the two passes over them: pass 1 finds each key's latest message, pass 2 decides per
message what survives (docs/FORMAT.md §6.2) and streams survivors to the output."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

from tank_log.errors import NeedsAttention, TankFormatError
from tank_log.format import native
from tank_log.format.bundle import SPARSE
from tank_log.format.decode import DEFAULT_MAX_MESSAGES, BundleTable, collect_bundles, decode_messages
from tank_log.format.messages import MessageColumns, tombstones
from tank_log.maintenance.compaction.key_state import KeyMap, add_walked, new_key_map
from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
from tank_log.maintenance.compaction.output import OutputSegments
from tank_log.maintenance.compaction.spill import KeySpill, bucket_count, mark_latest
from tank_log.maintenance.compaction.survivors import BundleFilter, Survivors
from tank_log.maintenance.damage import HeaderAudit
from tank_log.storage.datadir import Partition
from tank_log.storage.segment import Segment, Tail

log = logging.getLogger(__name__)


def pass_chunk_bytes() -> int:
    """What one pass decodes at once: 1 MiB on the compiled core (small: a pass holds little besides the key map);
    16 MiB on the pure-Python one, whose vectorised decoder pays per step and needs big chunks to be fast."""
    return 1 << 20 if native.compiled() else 16 << 20


def dirty_ratio(part: Partition, mark: int) -> float:
    """§6.1 with real file sizes (the broker counts unopened segments as 0 bytes)."""
    total = sum(s.size for s in part.ro)
    dirty = sum(s.size for s in part.ro if s.base >= mark + 1)
    return dirty / total if total else 0.0


def select_inputs(part: Partition, options: CompactionOptions, now_ms: int) -> list[Segment]:
    """The RO segments of this round: all of them, minus a young tail (min_compaction_lag_ms, by newest message ts;
    checked from the newest segment backwards, assuming timestamps grow with seqs as Kafka does)."""
    inputs = list(part.ro)
    if options.min_compaction_lag_ms > 0:
        cutoff = now_ms - options.min_compaction_lag_ms
        while inputs and inputs[-1].max_ts() > cutoff:
            inputs.pop()
    return inputs


def map_keys(inputs: list[Segment], budget: int, spill_dir: str, res: CompactionResult) -> Survivors:
    """Pass 1: every keyed message's ordinal mapped to whether it is its key's latest, exactly, within `budget`
    bytes of key state (the map, and the survivors' two bits per message). Keys that do not fit the map go to a key
    spill in `spill_dir`, decided bucket by bucket (`spill.py`): one more read of the keys, not of the input.

    Raises:
        DamagedInput: an input the readers' completeness check refuses (a malformed, torn, cut or duplicated bundle;
            names or index against content): file, offset and seqs; nothing was written.
        OSError: the spill could not be written (a full disk: nothing was changed).
    """
    survivors = Survivors()
    key_map: KeyMap | None = new_key_map(budget)
    spill: KeySpill | None = None
    total = sum(s.size for s in inputs) or 1
    read_before = 0
    try:
        for seg in inputs:
            audit = HeaderAudit(
                seg, "compaction"
            )  # the readers' completeness check, on the headers this pass walks anyway
            for base, table in (
                (base, piece) for base, chunk in audit.walk(pass_chunk_bytes()) for piece in _pieces(chunk)
            ):
                n = int(table.counts.sum())
                ordinal = survivors.messages
                survivors.messages += n
                taken = 0
                if key_map is not None:
                    # the map's share if these messages hold a mark (their bits); where it binds, add_walked stops and
                    # the columns below decide with the exact share
                    key_map.budget = budget - survivors.nbytes - survivors.marked.growth(ordinal + n)
                    marked = np.zeros(n, dtype=bool)
                    taken = add_walked(key_map, table, ordinal, marked)
                    if taken == n:  # every set parsed and every key taken: no columns needed
                        survivors.marked.set_run(ordinal, marked)
                        res.key_state_bytes = max(res.key_state_bytes, key_map.nbytes + survivors.nbytes)
                        continue
                c = _decoded(seg, base, table)
                ords = np.arange(ordinal, ordinal + n, dtype=np.uint64)
                survivors.marked.set_run(ordinal, (c.key_off < 0) | (c.val_len == 0))
                if key_map is not None:
                    key_map.budget = budget - survivors.nbytes
                    taken += key_map.add(c.data, c.key_off[taken:], c.key_len[taken:], ords[taken:])
                    res.key_state_bytes = max(res.key_state_bytes, key_map.nbytes + survivors.nbytes)
                    if taken < n:
                        if not len(key_map):
                            raise NeedsAttention(f"compaction.key_state_budget ({budget} bytes) cannot hold one key")
                        read = read_before + base + int(table.offsets[c.bundle[taken]])
                        spill = _start_spill(key_map, spill_dir, read / total)
                        key_map = None
                if spill is not None and taken < n:
                    spill.add(c.data, c.key_off[taken:], c.key_len[taken:], ords[taken:])
            read_before += seg.size
        res.messages_before = survivors.messages
        survivors.latest.reserve(survivors.messages)
        if key_map is not None:
            key_map.mark(survivors.latest.bytes)
            res.distinct_keys = len(key_map)
            return survivors
        assert spill is not None
        spill.finish()
        res.spill_buckets, res.spill_bytes = len(spill), spill.bytes
        log.info(
            "%s: keys past compaction.key_state_budget: %.1f MB of key records in %d buckets",
            spill.directory,
            spill.bytes / 1e6,
            len(spill),
        )
        res.distinct_keys, largest = mark_latest(spill, budget - survivors.nbytes, survivors.latest, survivors.messages)
        res.key_state_bytes = max(res.key_state_bytes, largest + survivors.nbytes)
        return survivors
    finally:
        if spill is not None:
            spill.remove()


def _pieces(table: BundleTable) -> Iterator[BundleTable]:
    """A headers-only chunk's table in runs of whole bundles of at most DEFAULT_MAX_MESSAGES messages (a bundle
    may hold more on its own): what one decode holds, as the collecting walk bounds it."""
    ends = np.cumsum(table.counts)
    start = 0
    while start < len(table):
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + DEFAULT_MAX_MESSAGES, side="right")))
        yield table if start == 0 and stop == len(table) else table.take(slice(start, stop))
        start = stop


def _decoded(seg: Segment, base: int, table: BundleTable) -> MessageColumns:
    """The messages of a headers-only chunk's table as columns.

    Raises:
        TankFormatError: a malformed message set (file and offset).
    """
    try:
        return decode_messages(collect_bundles(table, np.arange(len(table))))
    except TankFormatError as err:
        raise err.located(seg.path, base) from None


def _start_spill(key_map: KeyMap, directory: str, fraction_read: float) -> KeySpill:
    """The key map is full: its keys and every later keyed message's go to bucket files instead."""
    spill = KeySpill(directory, bucket_count(fraction_read))
    try:
        for records in key_map.records():
            spill.add_records(records)
    except BaseException:
        spill.remove()
        raise
    return spill


def _check_complete(seg: Segment, tail: Tail | None) -> None:
    if tail is not None and tail.torn_bytes:
        raise TankFormatError(
            f"torn tail of {tail.torn_bytes} bytes in an RO segment; salvage it first (rebuild_indexes --salvage)",
            seg.path,
            tail.valid_end,
        )


def pass2_segment(
    sf: Segment,
    select: BundleFilter,
    res: CompactionResult,
    out: OutputSegments | None,
    options: CompactionOptions,
    cutoff: int | None,
) -> None:
    """Pass 2 over one input: decide per message of the bundles `select` reads (the others hold no survivor) and
    write the survivors to `out`."""
    min_copy = max(1, options.policy.max_messages // 2)
    latest, range_last = select.survivors.latest, np.uint64(select.range_last)
    walk = sf.chunks(chunk_bytes=pass_chunk_bytes(), select=select)
    for chunk in walk:
        c, t = chunk.cols, chunk.table
        keyed = c.key_off >= 0
        empty = c.val_len == 0
        keep = np.where(keyed, latest.get(select.ordinals(c.bundle)), ~empty & (not options.drop_keyless))
        tomb = tombstones(keyed, c.val_len)
        if cutoff is not None:
            expired = keep & tomb & (c.ts < np.uint64(max(cutoff, 0)))
            keep &= ~expired
        keep |= c.seq == range_last  # never drop the range's last message (§4.4)
        res.messages_after += int(keep.sum())
        res.tombstones_kept += int((keep & tomb).sum())
        res.tombstones_dropped += int((~keep & tomb).sum())
        res.keyless_kept += int((keep & ~keyed).sum())
        res.keyless_dropped += int((~keep & ~keyed).sum())
        if out is not None:
            _write_survivors(c, t, keep, out, min_copy)
    _check_complete(sf, walk.tail)


def _write_survivors(c: MessageColumns, t: BundleTable, keep: np.ndarray, out: OutputSegments, min_copy: int) -> None:
    """Copy whole surviving bundles verbatim (when large enough and valid at this position); encode the other
    survivors from the columns."""
    kept = c.take(keep)
    per_bundle = np.bincount(kept.bundle, minlength=len(t))
    whole = np.flatnonzero((per_bundle == t.counts) & (t.counts >= min_copy))
    rows_before = np.concatenate(([0], np.cumsum(per_bundle)))  # kept rows before each bundle
    done = 0
    for b in whole.tolist():
        start, stop = int(rows_before[b]), int(rows_before[b + 1])
        out.add_columns(kept.slice(done, start))
        first, w = int(t.firsts[b]), out.writer
        contiguous = w is None or w.expected_next is None or first == w.expected_next
        sparse = bool(t.flags[b] & SPARSE)
        if sparse or contiguous:
            out.add_bundle(t.framed(b), first, int(t.lasts[b]), stop - start, sparse, int(kept.ts[start:stop].max()))
        else:
            out.add_columns(kept.slice(start, stop))
        done = stop
    out.add_columns(kept.slice(done, len(kept)))
