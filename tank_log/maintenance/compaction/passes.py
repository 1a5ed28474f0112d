"""Choosing the inputs and the two passes over them: pass 1 finds each key's last seq, pass 2 decides per message
what survives (docs/FORMAT.md §6.2) and streams survivors to the output."""

from __future__ import annotations

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.bundle import SPARSE
from tank_log.format.decode import BundleTable
from tank_log.format.messages import MessageColumns
from tank_log.maintenance.compaction.key_state import KeyMap
from tank_log.maintenance.compaction.options import CompactionOptions, CompactionResult
from tank_log.maintenance.compaction.output import OutputSegments
from tank_log.maintenance.compaction.survivors import BundleFilter, MarkedStretches
from tank_log.storage.datadir import Partition
from tank_log.storage.segment import Segment, Tail


def pass_chunk_bytes() -> int:
    """What one pass decodes at once: 1 MiB on the compiled core (small: a pass holds little besides the key map);
    16 MiB on the pure-Python one, whose vectorised decoder pays per step and needs big chunks to be fast."""
    return 1 << 20 if native.core() is not None else 16 << 20


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


def map_keys(
    inputs: list[Segment], start_seq: int, key_map: KeyMap, marked: MarkedStretches, res: CompactionResult
) -> int | None:
    """Pass 1 of a round: from `start_seq` on, map every key to its latest seq until the map is full, counting the
    messages mapped into `res` and marking where keyless messages and tombstones are. Returns the round's last seq
    (None when the round reaches the end of the inputs); the next round starts after it, so the rounds' first passes
    read every input message once.

    Raises:
        TankFormatError: a malformed or torn input segment (salvage it first).
    """
    covered = start_seq - 1
    for seg in inputs:
        if seg.last is not None and seg.last < start_seq:
            continue
        offset, next_seq = seg.seek(start_seq) if start_seq > seg.base else (0, None)
        walk = seg.chunks(start=offset, next_seq=next_seq, chunk_bytes=pass_chunk_bytes())
        for chunk in walk:
            c = chunk.cols
            seq, key_off, key_len, val_len = c.seq, c.key_off, c.key_len, c.val_len
            if len(seq) and seq[0] < start_seq:  # the chunk read from an index entry before start_seq
                sel = seq >= start_seq
                seq, key_off, key_len, val_len = seq[sel], key_off[sel], key_len[sel], val_len[sel]
            taken = key_map.add(c.data, key_off, key_len, seq)
            marked.mark(seq[:taken], (key_off[:taken] < 0) | (val_len[:taken] == 0))
            res.messages_before += taken
            if taken < len(seq):
                return int(seq[taken - 1]) if taken else covered
            if len(seq):
                covered = int(seq[-1])
        _check_complete(seg, walk.tail)
    return None


def _check_complete(seg: Segment, tail: Tail | None) -> None:
    if tail is not None and tail.torn_bytes:
        raise TankFormatError(
            f"torn tail of {tail.torn_bytes} bytes in an RO segment; salvage it first (rebuild_indexes --salvage)",
            seg.path,
            tail.valid_end,
        )


def pass2_segment(
    sf: Segment,
    key_map: KeyMap,
    select: BundleFilter,
    res: CompactionResult,
    out: OutputSegments | None,
    options: CompactionOptions,
    cutoff: int | None,
) -> None:
    """Pass 2 over one input: decide per message of the bundles `select` reads (the others hold no survivor) and
    write the survivors to `out`."""
    min_copy = max(1, options.policy.max_messages // 2)
    round_end, range_last = select.round_end, select.range_last
    walk = sf.chunks(chunk_bytes=pass_chunk_bytes(), select=select)
    for chunk in walk:
        c, t = chunk.cols, chunk.table
        keyed = c.key_off >= 0
        empty = c.val_len == 0
        superseded = key_map.superseded(c.data, c.key_off, c.key_len, c.seq)
        keep = np.where(keyed, ~superseded, ~empty & (not options.drop_keyless))
        tomb = keyed & empty
        if cutoff is not None:
            expired = keep & tomb & (c.ts < np.uint64(max(cutoff, 0)))
            keep &= ~expired
        if round_end is not None:
            keep |= c.seq > np.uint64(round_end)  # beyond this round's keys: a later round decides
        keep |= c.seq == np.uint64(range_last)  # never drop the range's last message (§4.4)
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
