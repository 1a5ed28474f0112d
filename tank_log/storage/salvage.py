"""Salvaging a torn tail (docs/FORMAT.md §3.11) and finishing a salvage a crash interrupted — both directions of
the protocol in one place, as `swap.py` holds compaction's.

A tail is torn only when nothing valid follows the break (`data_beyond_break`): an index entry pointing past it,
or a resynchronisation scan that finds complete bundles after it, means mid-file corruption, which is never cut.

Forward (`salvage_tail`), each step durable (fsync) before the next, so every intermediate state is one the
broker accepts no worse than the torn original (§9 rule 5):
  1. index: replace `<base>.index` atomically by the rebuild-rule entries (§4.5) of the bundles before the cut
     (valid for the log both before and after the cut: no entry at or past the new end, ever), or delete it when
     no bundle is left;
  2. side file: the cut bytes → `.<log name>.torn-at-<cut>` (temporary, fsync, rename, fsync dir). It keeps the
     bytes and is the journal record of this salvage;
  3. cut: truncate the log at the cut and fsync (an RO segment left with no bundle is unlinked with its index
     instead: its seqs become a gap between RO segments, which the broker skips, §4.4 step 2);
  4. name: an RO segment is renamed to its true last seq (§9 rule 6); an active segment cut to nothing while RO
     segments exist is removed and the last RO segment becomes the active one (§9 rule 4: RO segments need a
     non-empty active segment).
Crash states and what `finish_salvages` (run by every repair) does with them:
  after 1       torn log, valid index, no side file: nothing to finish; the torn tail is reported as before.
  during 2      our `.tank-log-*.tmp` temporary: repair deletes it (the state after 1).
  after 2       side file == log[cut:]: truncate (3), then 4.
  after 3       RO under its old name: rename to the true last; RO cut to nothing: unlink what is left of it;
                no active log after an active cut to nothing: reactivate the last RO segment.
A side file whose segment has moved on (renamed, appended to by the broker after a finished salvage) is left alone.

Salvage refuses (NeedsAttention, nothing touched) what would break a layout rule: cutting messages of the last RO
segment (the gap before the active segment aborts the broker, §4.4), or an active segment cut to nothing when the
last RO segment cannot become active (a gap before it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tank_log.errors import NeedsAttention, TankFormatError
from tank_log.format.bundle import BundleHeader
from tank_log.format.codecs import CODECS
from tank_log.format.decode import INCOMPLETE, MIN_MESSAGE_BYTES, decode_messages, walk_bundles
from tank_log.format.index import build_rebuild_rule, encode_index, read_index
from tank_log.format.names import (
    SIDE_FILE,
    FileName,
    Kind,
    format_active_name,
    format_ro_name,
    parse_log_name,
    segment_logs,
    side_file_name,
)
from tank_log.format.varint import U64_MAX, decode_varint
from tank_log.storage.fsutil import StepHook, atomic_write, fsync_dir, write_temp_then_rename
from tank_log.storage.segment import Segment, Tail

log = logging.getLogger(__name__)

RESYNC_SCAN_BYTES = 16 << 20  # how far past a break the resynchronisation scan looks for complete bundles


# ---- torn tail or mid-file corruption? ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DataBeyond:
    """Evidence that valid data follows a break: it is mid-file corruption, not a torn tail."""

    offset: int  # file offset of the data found
    how: str

    def __str__(self) -> str:
        return f"{self.how} at offset {self.offset}"


def data_beyond_break(seg: Segment, tail: Tail) -> DataBeyond | None:
    """Whether anything valid follows the break at `tail.valid_end`: an index entry pointing past it (the broker
    indexes only bundles it wrote whole), or a chain of complete, decodable bundles starting after it (seqs
    continuing the partition) that reaches the end of the file or holds at least two bundles."""
    if not tail.torn_bytes:
        return None
    try:
        entries = read_index(seg.index_path)
    except (OSError, TankFormatError):
        entries = []
    for rel, off in entries:
        if tail.valid_end < off < tail.file_size:
            return DataBeyond(off, f"index entry ({rel}, {off}) points past the break")
    with open(seg.path, "rb") as fh:
        fh.seek(tail.valid_end)
        buf = fh.read(min(tail.torn_bytes, RESYNC_SCAN_BYTES))
    p = resync_offset(buf, tail.next_seq, reaches_eof=tail.valid_end + len(buf) == tail.file_size)
    return None if p is None else DataBeyond(tail.valid_end + p, "complete bundles resume")


def resync_offset(buf: bytes, next_seq: int, *, reaches_eof: bool) -> int | None:
    """The first offset p in 1..len(buf)-3 where a chain of bundles resumes (`_chain_at`), or None.

    `_chain_at` runs only at the offsets `_resync_candidates` keeps: a bulk filter that rejects an offset only by a
    rule the walk from it is certain to break, so the answer is the one of trying every offset. Offsets are
    filtered in growing windows: data found right after the break costs little."""
    lo, size = 1, _FIRST_WINDOW
    while lo < len(buf) - 2:
        hi = min(lo + size, len(buf) - 2)
        for p in _resync_candidates(buf, lo, hi, next_seq, reaches_eof=reaches_eof).tolist():
            if _first_bundle_decodes(buf, p, next_seq) and _chain_at(buf, p, next_seq, reaches_eof=reaches_eof):
                return int(p)
        lo, size = hi, min(size * 4, _CHUNK)
    return None


def _first_bundle_decodes(buf: bytes, p: int, next_seq: int) -> bool:
    """Whether the walk from p accepts its first bundle and its messages decode: bundles decode independently, so
    a chain from p cannot hold otherwise. One bundle's work, where `_chain_at` walks and decodes the whole chain
    (up to the walk's message budget) before it fails."""
    try:
        res = walk_bundles(buf, p, next_seq, collect=True, max_bytes=1)
        if not len(res.table):
            return False
        decode_messages(res.table)
    except TankFormatError:
        return False
    return True


def _chain_at(buf: bytes, p: int, next_seq: int, *, reaches_eof: bool) -> bool:
    b = buf[p]
    if b == 0 or (b < 0x80 and p + 1 + b > len(buf)):
        return False  # fast reject: no bundle, or one longer than what is left
    try:
        res = walk_bundles(buf, p, next_seq, collect=True)
        if not len(res.table):
            return False
        decode_messages(res.table)
    except TankFormatError:
        return False
    ends_at_eof = res.stop == len(buf) and res.reason != INCOMPLETE
    return len(res.table) >= 2 or (ends_at_eof and reaches_eof)


# what a bundle header at an offset is to the walk (§3.1, §3.3), judged on its own bytes, whatever the seqs before it
_PASS = 0  # a complete bundle whose header may be valid: the walk may go on past it
_STOP = 1  # the walk stops there without an error: zero length, a bundle or length varint cut by the buffer's end
_BAD = 2  # the walk raises there: a malformed length varint, flags bit 7, an unknown codec, an impossible count...
_HOPS = 4  # bundles of a chain the filter follows (the walk must not raise on any of them before its budget)
_FIRST_WINDOW = 1 << 12  # offsets filtered first; each next window 4 times larger up to _CHUNK
_CHUNK = 1 << 20  # offsets filtered at once at most: bounds the filter's temporaries (~60 bytes an offset)
_KNOWN_CODEC = np.array([i == 0 or i in CODECS for i in range(4)])
_SHIFT5 = np.array([0, 7, 14, 21, 28], dtype=np.int64)


def _resync_candidates(buf: bytes, lo: int, hi: int, next_seq: int, *, reaches_eof: bool) -> np.ndarray:
    """The offsets in lo..hi-1 (within 1..len(buf)-3), increasing, where `_chain_at` may hold. An offset is
    dropped only when
    - its bundle is not complete and header-valid (§3.1 length ≥ 1 within the buffer, §3.3 flags bit 7 clear, a
      known codec, a 4-bit count that fits a plain message set, a sparse header within the bundle whose first seq
      is non-zero and not below `next_seq`), or
    - that bundle is the buffer's last without `reaches_eof`, or the one after it is not complete and
      header-valid (a chain needs two bundles otherwise), or
    - the walk raises on a later bundle of the chain while every bundle before it has a 4-bit count (so the walk's
      message budget cannot have stopped it first)."""
    n = len(buf)
    a = np.frombuffer(buf, dtype=np.uint8)
    p = np.arange(lo, hi, dtype=np.int64)
    cls, end, small, sparse = _classify(buf, a, p)
    ok = cls == _PASS
    chk = np.flatnonzero(ok & sparse)
    ok[chk] = _first_bundle_ok(a, p[chk], next_seq)
    p, x, live = p[ok], end[ok], small[ok]
    if not reaches_eof:
        keep = x < n
        p, x, live = p[keep], x[keep], live[keep]
    cls, end, small, _ = _classify(buf, a, x)  # the second bundle (x == n: _STOP)
    keep = (x == n) | (cls == _PASS)
    p, x, live = p[keep], end[keep], live[keep] & small[keep] & (x[keep] < n)
    for _ in range(_HOPS - 2):  # live: every bundle so far has a 4-bit count, and x, the next, is in the buffer
        idx = np.flatnonzero(live & (x < n))
        if not len(idx):
            break
        cls, end, small, _ = _classify(buf, a, x[idx])
        p[idx[cls == _BAD]] = -1
        live[:] = False
        live[idx] = (cls == _PASS) & small
        x[idx] = end
    kept: np.ndarray = p[p >= 0]
    return kept


def _classify(buf: bytes, a: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For offsets x (0..len(buf)) of `buf`: the class of each, the end of its bundle if _PASS (else len(buf)),
    whether it is _PASS with a 4-bit count, and whether that header is also sparse. Offsets whose length varint
    could reach the buffer's end are classified one by one, by the walk's own varint decoder."""
    n = len(buf)
    near = np.flatnonzero(x >= n - 5)
    if not len(near):
        return _classify_bulk(a, x)
    far = np.flatnonzero(x < n - 5)
    cls = np.empty(len(x), dtype=np.uint8)
    end = np.empty(len(x), dtype=np.int64)
    small = np.empty(len(x), dtype=bool)
    sparse = np.empty(len(x), dtype=bool)
    cls[far], end[far], small[far], sparse[far] = _classify_bulk(a, x[far])
    for i in near.tolist():
        cls[i], end[i], small[i], sparse[i] = _classify_one(buf, int(x[i]))
    return cls, end, small, sparse


def _classify_bulk(a: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_classify` of offsets at least 6 bytes before the end of `a`."""
    n = len(a)
    blen = a[x].astype(np.int64)
    length = np.ones(len(x), dtype=np.int64)
    bad = np.zeros(len(x), dtype=bool)
    multi = np.flatnonzero(blen >= 0x80)  # length varints of 2..5 bytes (§3.2): decoded apart, they are rare
    if len(multi):
        w = a[x[multi, None] + np.arange(5)]
        cont = w >= 0x80
        lm = np.where(cont[:, :4].all(axis=1), 5, np.argmin(cont, axis=1) + 1)
        parts = (w & 0x7F).astype(np.int64) << _SHIFT5
        parts[np.arange(5)[None, :] >= lm[:, None]] = 0
        blen[multi] = parts.sum(axis=1)
        length[multi] = lm
        bad[multi] = (lm == 5) & (w[:, 4] > 0x0F)
    hp = x + length
    end = hp + blen
    complete = ~bad & (blen > 0) & (end <= n)
    f = a[hp]
    c4 = (f >> 2) & 0x0F
    sparse = (f & 0x40) != 0
    bad |= complete & (((f & 0x80) != 0) | ~_KNOWN_CODEC[f & 0x03])
    bad |= complete & (c4 != 0) & ((f & 0x43) == 0) & (c4 > (blen - 1) // MIN_MESSAGE_BYTES)  # plain, §3.3
    bad |= complete & (c4 != 0) & sparse & (blen < 9)  # the sparse first seq runs past the bundle
    bad |= complete & (c4 != 0) & sparse & ((f & 0x03) == 0) & (c4 > (blen - 9) // MIN_MESSAGE_BYTES)
    _first_message_flags(a, hp, end, f, c4, sparse, complete & ~bad, bad)
    cls = np.where(bad, _BAD, np.where(complete, _PASS, _STOP)).astype(np.uint8)
    ok = complete & ~bad
    return cls, np.where(ok, end, n), ok & (c4 != 0), ok & (c4 != 0) & sparse


def _varints4(a: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The varints at `pos` (§3.2) as (value, length, judged): only those of 1..4 bytes are judged."""
    w = a[np.minimum(pos[:, None] + np.arange(4), len(a) - 1)]
    cont = w >= 0x80
    length = np.argmin(cont, axis=1) + 1
    parts = (w & 0x7F).astype(np.int64) << _SHIFT5[:4]
    parts[np.arange(4)[None, :] >= length[:, None]] = 0
    judged: np.ndarray = ~np.all(cont, axis=1)
    return parts.sum(axis=1), length, judged


def _first_message_flags(
    a: np.ndarray,
    hp: np.ndarray,
    end: np.ndarray,
    f: np.ndarray,
    c4: np.ndarray,
    sparse: np.ndarray,
    rows: np.ndarray,
    bad: np.ndarray,
) -> None:
    """Set `bad` where a bundle of `rows` (complete, headers valid so far) cannot be walked or decoded for what the
    start of its message set shows (§3.3–3.5): a count varint of 0, a count the plain set cannot hold, a first
    message whose flags have unknown bits 3-7; Snappy: a block claiming fewer bytes than the count needs, not
    starting with a literal (a copy has nothing to copy from), or whose literal starts with such flags. Headers
    with a count varint and a sparse header, and varints of 5 bytes, are left alone."""
    n = len(a)
    count = c4.astype(np.int64)
    s0 = hp + 1
    judged = rows & ~((c4 == 0) & sparse)
    v = np.flatnonzero(judged & (c4 == 0))  # the count in a varint (§3.3)
    if len(v):
        cnt, ln, ok = _varints4(a, s0[v])
        count[v], s0[v] = cnt, s0[v] + ln
        bad[v] |= ok & (cnt == 0) & (s0[v] <= end[v])
        judged[v] &= ok & (cnt > 0)
    s0 = s0 + np.where(sparse, 8, 0)
    sp = np.flatnonzero(judged & sparse & (c4 > 1) & (s0 < end))  # last - first - 1 follows the first seq
    if len(sp):
        _, ln, ok = _varints4(a, s0[sp])
        s0[sp] += ln
        judged[sp] &= ok
    judged &= s0 <= end
    pl = np.flatnonzero(judged & ((f & 0x03) == 0))
    pe, ps = end[pl], s0[pl]
    bad[pl] |= (count[pl] > (pe - ps) // MIN_MESSAGE_BYTES) | ((ps < pe) & ((a[np.minimum(ps, n - 1)] & 0xF8) != 0))
    sn = np.flatnonzero(judged & ((f & 0x03) == 1) & (s0 < end))
    if not len(sn):
        return
    s, e = s0[sn], end[sn]
    ulen, lv, ok = _varints4(a, s)
    t = s + lv
    tag = a[np.minimum(t, n - 1)].astype(np.int64)
    m0 = t + 1 + np.where(tag >> 2 >= 60, (tag >> 2) - 59, 0)
    first_flags = a[np.minimum(m0, n - 1)]
    no = (count[sn] > ulen // MIN_MESSAGE_BYTES) | ((tag & 0x03) != 0) | ((m0 < e) & ((first_flags & 0xF8) != 0))
    bad[sn] |= ok & (t < e) & no


def _classify_one(buf: bytes, x: int) -> tuple[int, int, bool, bool]:
    """`_classify_bulk` for one offset near the buffer's end, by the walk's own varint decoder."""
    n = len(buf)
    try:
        blen, hp = decode_varint(buf, x, n)
    except TankFormatError:
        return (_STOP if all(b >= 0x80 for b in buf[x:]) else _BAD), n, False, False
    if not blen or hp + blen > n:
        return _STOP, n, False, False
    end = hp + blen
    f = buf[hp]
    c4 = (f >> 2) & 0x0F
    q = hp + 1
    if f & 0x80 or (f & 0x03 and f & 0x03 not in CODECS):
        return _BAD, n, False, False
    if c4 and f & 0x40 and q + 8 > end:
        return _BAD, n, False, False
    if c4 and not f & 0x43 and c4 > (end - q) // MIN_MESSAGE_BYTES:
        return _BAD, n, False, False
    return _PASS, end, bool(c4), bool(c4 and f & 0x40)


def _first_bundle_ok(a: np.ndarray, p: np.ndarray, next_seq: int) -> np.ndarray:
    """Of _PASS offsets p whose headers are sparse with a 4-bit count: False where the first seq is 0 or below
    `next_seq` (§3.3, §3.6), which the walk from p rejects."""
    last = len(a) - 1  # a _PASS length varint ends before the buffer does: clamping only stops a run
    length = np.ones(len(p), dtype=np.int64)
    for i in range(1, 5):
        length += np.all(a[np.minimum(p[:, None] + np.arange(i), last)] >= 0x80, axis=1)
    q = p + length + 1
    le = a[q[:, None] + np.arange(8)].astype(np.uint64) << (np.arange(8, dtype=np.uint64) * np.uint64(8))
    first = np.bitwise_or.reduce(le, axis=1)
    ok: np.ndarray = (first != 0) & (first >= np.uint64(min(next_seq, U64_MAX)))
    return ok


# ---- forward -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SalvagePlan:
    """What `salvage_tail` will do to one segment."""

    segment: Segment
    tail: Tail
    headers: Sequence[BundleHeader]  # the complete bundles before the cut (none: an RO segment is removed)
    reactivate: Segment | None = None  # active cut to nothing: the RO segment to make active instead

    @property
    def cut(self) -> int:
        return self.tail.valid_end

    @property
    def true_last(self) -> int:
        """The last seq before the cut (an RO segment is renamed to it)."""
        return self.tail.next_seq - 1

    @property
    def cut_seqs(self) -> tuple[int, int | None, int | None]:
        """The seqs the cut loses: (first, last, how many). An RO segment's name says where they end (the count
        is the name's range, exact unless the lost bundles were sparse); a torn active tail is a bundle whose end
        and count nobody knows (None)."""
        first = self.true_last + 1
        last = self.segment.last
        if self.segment.is_active or last is None:
            return first, None, None
        if last < first:
            return first, None, 0  # the bytes after the name's last seq: no seq the partition claims
        return first, last, last - first + 1


def plan_salvage(seg: Segment, ro: Sequence[Segment], active: Segment | None) -> SalvagePlan:
    """Plan the salvage of `seg`'s torn tail in a partition with RO segments `ro` (sorted) and `active`.

    Raises:
        NeedsAttention: no torn tail, mid-file corruption, or a cut that would break a layout rule (§9 rules 3–4).
        TankFormatError: the segment does not decode before the break.
    """
    from tank_log.storage.completeness import SegmentAudit  # here: the completeness check reads this module's

    audit = SegmentAudit(seg)
    walk = seg.tables()
    headers: list[BundleHeader] = []
    for base, table in walk:
        audit.observe(base, table, None)
        headers += table.headers(base)
    tail = walk.tail
    assert tail is not None
    if not tail.torn_bytes:
        raise NeedsAttention(f"{seg.path}: no torn tail to salvage")
    beyond = data_beyond_break(seg, tail)
    if beyond is not None:
        raise NeedsAttention(
            f"{seg.path} @{tail.valid_end}: not a torn tail, {beyond}: mid-file corruption, nothing cut"
        )
    hole = audit.finish(tail)
    if hole is not None and hole.code != "torn-tail":  # what precedes the cut is not what the names say: kept whole
        raise NeedsAttention(f"{hole}; salvage would keep it as good data: nothing cut")
    true_last = tail.next_seq - 1
    if seg.is_active:
        if headers or not ro:
            return SalvagePlan(seg, tail, headers)
        last_ro = ro[-1]
        before = ro[-2].last if len(ro) > 1 else None
        if before is not None and before + 1 != last_ro.base:
            raise NeedsAttention(
                f"{seg.path}: the torn tail is its only data; cutting it leaves no non-empty active segment "
                f"(§9 rule 4) and {last_ro.file_name} cannot take its place (seq gap {before + 1}..{last_ro.base - 1} "
                f"before it, §4.4)"
            )
        return SalvagePlan(seg, tail, headers, reactivate=last_ro)
    if seg.last is not None and true_last < seg.last and ro and ro[-1].path == seg.path and active is not None:
        raise NeedsAttention(
            f"{seg.path}: salvage would cut seqs {true_last + 1}..{seg.last} of the last RO segment and leave a seq "
            f"gap before the active segment, which the broker aborts on (§4.4); nothing cut"
        )
    return SalvagePlan(seg, tail, headers)


def salvage_tail(plan: SalvagePlan, on_step: StepHook | None = None) -> dict[str, Any]:
    """Apply a salvage plan (see module docstring); return the report action. `on_step` is called after every
    file operation (crash-injection tests)."""
    step = on_step or (lambda what: None)
    seg = plan.segment
    d = os.path.dirname(seg.path)
    entries = build_rebuild_rule(plan.headers, seg.base)
    if entries:  # 1
        atomic_write(seg.index_path, encode_index(entries))
        step("index replaced")
    elif os.path.exists(seg.index_path):
        os.unlink(seg.index_path)
        fsync_dir(d)
        step("index removed")
    side = os.path.join(d, side_file_name(seg.file_name, plan.cut))  # 2
    with open(seg.path, "rb") as fh:
        fh.seek(plan.cut)
        cut_bytes = fh.read()
    write_temp_then_rename(side, cut_bytes)
    step("side file written")
    fsync_dir(d)
    step("side file in place")
    first, last, count = plan.cut_seqs
    action: dict[str, Any] = {
        "action": "salvaged",
        "segment": seg.file_name,
        "cut_at": plan.cut,
        "bytes_cut": len(cut_bytes),
        "seqs_cut": None if count == 0 else [first, last],  # last None: the torn bundle's end is unknown
        "messages_cut": count,
        "side_file": os.path.basename(side),
    }
    action.update(_finish(seg, plan.cut, plan.true_last, step, reactivate=plan.reactivate))
    log.warning(
        "%s @%d: salvage cut %d bytes, %s (%s); kept in %s",
        seg.path,
        plan.cut,
        len(cut_bytes),
        "no seq" if count == 0 else f"seqs {first}..{last}" if last is not None else f"seqs from {first}",
        f"{count} message(s) lost" if count is not None else "the torn bundle's messages, count unknown",
        os.path.basename(side),
    )
    return action


def _finish(
    seg: Segment, cut: int, true_last: int, step: StepHook, *, reactivate: Segment | None = None
) -> dict[str, str]:
    """Steps 3 and 4 for a segment whose side file is in place."""
    d = os.path.dirname(seg.path)
    done: dict[str, str] = {}
    if not seg.is_active and cut == 0:
        os.unlink(seg.path)
        fsync_dir(d)
        step("segment removed")
        _unlink_if_exists(seg.index_path)
        step("index removed")
        done["removed"] = seg.file_name
        return done
    if os.path.getsize(seg.path) != cut:
        with open(seg.path, "r+b") as fh:
            fh.truncate(cut)
            os.fsync(fh.fileno())
        step("log cut")
    if seg.is_active:
        if reactivate is not None:
            _unlink_if_exists(seg.index_path)
            os.unlink(seg.path)
            fsync_dir(d)
            step("empty active removed")
            done.update(reactivate_last_ro(reactivate, seg.ts))
            step("last RO segment reactivated")
        return done
    if seg.last != true_last:
        new_name = format_ro_name(seg.base, true_last, seg.ts)
        os.rename(seg.path, os.path.join(d, new_name))
        fsync_dir(d)
        step("renamed")
        done["renamed_to"] = new_name
    return done


def reactivate_last_ro(ro: Segment, ts: int | None) -> dict[str, str]:
    """Make the last RO segment the active one: `<base>-<last>_<ts>.ilog` → `<base>_<ts>.log` (its index is valid
    for an active segment: every entry is a bundle start before the end, §2.6). Also what repair does after a
    broker killed inside its roll (`repair._restore_active`)."""
    name = format_active_name(ro.base, ts if ts is not None else ro.ts)
    os.rename(ro.path, os.path.join(os.path.dirname(ro.path), name))
    fsync_dir(os.path.dirname(ro.path))
    return {"reactivated": ro.file_name, "as": name}


def _unlink_if_exists(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
        fsync_dir(os.path.dirname(path))


# ---- recovery ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SalvageRecovery:
    """A salvage a crash interrupted, and the step that finishes it."""

    side_file: str
    log_path: str
    cut: int
    what: str  # "cut" | "rename" | "remove" | "remove-index" | "reactivate"

    def describe(self) -> str:
        return f"finish salvage of {os.path.basename(self.log_path)} at {self.cut}: {self.what}"


def plan_salvage_recovery(partition_dir: str) -> list[SalvageRecovery]:
    """The interrupted salvages of a partition (see module docstring); touches nothing."""
    names = sorted(os.listdir(partition_dir))
    logs = segment_logs(names)
    out: list[SalvageRecovery] = []
    for n in names:
        m = SIDE_FILE.match(n)
        if not m or (name := parse_log_name(m["log"])) is None:
            continue
        log_name, cut = m["log"], int(m["cut"])
        log_path = os.path.join(partition_dir, log_name)
        what = None
        if log_name not in logs:  # cut to nothing and removed (or renamed/rolled since: done)
            if cut == 0 and name.kind is Kind.RO:
                if f"{name.base}.index" in names and all(f.base != name.base for f in logs.values()):
                    what = "remove-index"
            elif cut == 0 and all(f.kind is not Kind.ACTIVE for f in logs.values()):
                what = "reactivate" if _last_ro_before(name.base, logs) else None
        else:
            size = os.path.getsize(log_path)
            if size > cut:
                what = "cut" if _tail_matches(log_path, cut, os.path.join(partition_dir, n)) else None
            elif size == cut and name.kind is Kind.RO:
                what = "remove" if cut == 0 else ("rename" if true_last_or(log_path, name) != name.last else None)
            elif size == cut == 0 and _last_ro_before(name.base, logs):
                what = "reactivate"
        if what:
            out.append(SalvageRecovery(os.path.join(partition_dir, n), log_path, cut, what))
    return out


def finish_salvage(rec: SalvageRecovery) -> dict[str, str]:
    """Finish one interrupted salvage. Idempotent: a crash in here leaves a state planned again the same way."""
    d = os.path.dirname(rec.log_path)
    name = parse_log_name(os.path.basename(rec.log_path))
    assert name is not None
    if rec.what == "remove-index":
        index = os.path.join(d, f"{name.base}.index")
        _unlink_if_exists(index)
        return {"removed": os.path.basename(index)}
    if rec.what == "cut":
        with open(rec.log_path, "r+b") as fh:
            fh.truncate(rec.cut)
            os.fsync(fh.fileno())
    reactivate = None
    if name.kind is Kind.ACTIVE and rec.cut == 0:
        last = _last_ro_before(name.base, segment_logs(os.listdir(d)))
        reactivate = Segment(os.path.join(d, last)) if last else None
    if not os.path.exists(rec.log_path):  # "reactivate" after the empty active was removed
        assert reactivate is not None
        return reactivate_last_ro(reactivate, name.ts)
    seg = Segment(rec.log_path, name=name)
    true_last = _true_last(rec.log_path, name) if rec.cut else 0
    return _finish(seg, rec.cut, true_last, lambda what: None, reactivate=reactivate)


def _last_ro_before(active_base: int, logs: dict[str, FileName]) -> str | None:
    """The file name of the last RO segment if it ends right before `active_base` (the active it would replace)."""
    ro = sorted(((f.base, n, f) for n, f in logs.items() if f.kind is Kind.RO))
    if ro and ro[-1][2].last is not None and ro[-1][2].last + 1 == active_base:
        return ro[-1][1]
    return None


def _tail_matches(log_path: str, cut: int, side: str) -> bool:
    with open(log_path, "rb") as fh, open(side, "rb") as sf:
        fh.seek(cut)
        return fh.read() == sf.read()


def true_last_or(log_path: str, name: FileName) -> int | None:
    """`_true_last`, or the name's own last when the log does not decode (verify reports it; not ours to fix)."""
    try:
        return _true_last(log_path, name)
    except TankFormatError:
        return name.last


def _true_last(log_path: str, name: FileName) -> int:
    walk = Segment(log_path, name=name).bundles()
    for _ in walk:
        pass
    assert walk.tail is not None
    return walk.tail.next_seq - 1
