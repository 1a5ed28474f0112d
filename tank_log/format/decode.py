"""Bulk decoding of segment bytes (docs/FORMAT.md §3).

Two stages:
1. `walk_bundles` — a sequential pass over the framing (§3.1) and bundle headers (§3.3), deriving each bundle's
   first/last sequence number (§3.6) and collecting its (decompressed, §3.4) message set into one buffer.
2. `decode_messages` — decodes the messages (§3.5) of all collected bundles at once with numpy: every bundle is
   advanced by one message per step ("lockstep"), so the Python cost is per step, not per message.

Both stages run on the compiled core (`_codec.pyx`) when it is built, else on the pure-Python code below: `WALKER`
holds the one in use (`CompiledWalker` or `PureWalker`, see `format.native`). The compiled core only detects
malformed input: the pure code then re-reads it and raises, so the errors (and their messages) are the same on both
paths.

All errors are TankFormatError with offsets relative to the walked buffer; callers add the file path/base offset.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, Protocol, TypeAlias

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.bundle import (
    CODEC_MASK,
    COUNT_MASK,
    COUNT_SHIFT,
    HAVE_KEY,
    SEQ_PREV_PLUS_ONE,
    SIMPLE_MASK,
    SPARSE,
    UNKNOWN_MESSAGE_FLAGS,
    USE_LAST_TS,
    BundleHeader,
    count_field,
    parse_header_body,
)
from tank_log.format.codecs import CODECS, BlockCodec
from tank_log.format.messages import MessageColumns
from tank_log.format.varint import U64_MAX, decode_varint

try:
    from tank_log.format import _codec
except ImportError:  # not built (no C compiler at install), or not for this Python: the pure-Python code runs
    native.failed("tank_log.format._codec")

# Reads of one message step can run at most 1+5+8+1+255+5 bytes past a message set's end before the overrun check.
_PAD = b"\0" * 512

# stop reasons of walk_bundles
COMPLETE = "complete"  # every byte consumed
INCOMPLETE = "incomplete"  # the last bundle (or its length varint) continues past the buffer
ZERO = "zero"  # a zero length varint: trailing zero bytes (torn tail) or corruption
LIMIT = "limit"  # stopped early at max_bytes / stop_seq
BUDGET = "budget"  # stopped after `max_messages` walked messages; more bundles follow
REASONS = (COMPLETE, INCOMPLETE, ZERO, LIMIT, BUDGET)  # the compiled walk's reason codes; 5 = malformed input
_NATIVE_ERROR = len(REASONS)

MIN_MESSAGE_BYTES = 2  # flags + a 1-byte content length (§3.5): bounds a bundle's count by its message set's size
DEFAULT_MAX_MESSAGES = 1 << 20  # messages per collecting walk: bounds decode_messages' arrays (~64 B each)
NO_MESSAGE_LIMIT = 1 << 62  # a walk's max_messages that never binds


def _column(dtype: type[np.generic]) -> Any:
    return field(default_factory=lambda: np.empty(0, dtype))


@dataclass
class BundleTable:
    """Headers of consecutive bundles (numpy columns, one row per bundle) plus, when collected, the bytes their
    messages are decoded from.

    `data` holds every bundle's uncompressed message set, one after another (Snappy ones decompressed; when none
    is compressed, the walked bundles whole), then padding; `set_starts`/`set_ends` locate each in `data`. `walked`
    is the buffer the offsets refer to.
    """

    offsets: np.ndarray = _column(np.int64)  # buffer offset of each length varint
    ends: np.ndarray = _column(np.int64)  # buffer offset just after each bundle
    set_offsets: np.ndarray = _column(np.int64)  # buffer offset of the (compressed) message set
    flags: np.ndarray = _column(np.uint8)
    counts: np.ndarray = _column(np.int64)
    firsts: np.ndarray = _column(np.uint64)
    lasts: np.ndarray = _column(np.uint64)
    set_starts: np.ndarray | None = None
    set_ends: np.ndarray | None = None
    data: bytes = b""
    walked: Any = b""

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, rows: np.ndarray | slice) -> BundleTable:
        """The bundles at `rows` (indices or a slice, in order), sharing this table's buffers."""
        starts, ends = self.set_starts, self.set_ends
        return replace(
            self,
            offsets=self.offsets[rows],
            ends=self.ends[rows],
            set_offsets=self.set_offsets[rows],
            flags=self.flags[rows],
            counts=self.counts[rows],
            firsts=self.firsts[rows],
            lasts=self.lasts[rows],
            set_starts=None if starts is None else starts[rows],
            set_ends=None if ends is None else ends[rows],
        )

    def framed(self, i: int) -> bytes:
        """Bundle i as stored: its length varint, header and message set."""
        return bytes(self.walked[int(self.offsets[i]) : int(self.ends[i])])

    @property
    def sizes(self) -> list[int]:
        """varint + bundle bytes of each bundle."""
        return (self.ends - self.offsets).tolist()  # type: ignore[no-any-return]

    @property
    def varint_counts(self) -> list[bool]:
        """Whether each bundle's count is a varint (4-bit field 0)."""
        return ((self.flags >> COUNT_SHIFT) & COUNT_MASK == 0).tolist()  # type: ignore[no-any-return]

    def headers(self, file_offset: int = 0) -> list[BundleHeader]:
        """One BundleHeader per bundle, with offsets shifted to file positions."""
        return [
            BundleHeader(o + file_offset, e - o, f, c, first, last, q + file_offset, count_field(f) == 0)
            for o, e, q, f, c, first, last in zip(
                self.offsets.tolist(),
                self.ends.tolist(),
                self.set_offsets.tolist(),
                self.flags.tolist(),
                self.counts.tolist(),
                self.firsts.tolist(),
                self.lasts.tolist(),
                strict=True,
            )
        ]


@dataclass
class WalkResult:
    table: BundleTable
    stop: int  # buffer position where the walk stopped: end of the last complete bundle
    next_seq: int  # running counter after the last complete bundle
    reason: str
    need: int = 0  # with INCOMPLETE: buffer position where the incomplete bundle would end (0 if unknown)


def walk_bundles(
    buf: bytes,
    start: int,
    next_seq: int,
    *,
    collect: bool = True,
    max_bytes: int | None = None,
    stop_seq: int | None = None,
    max_messages: int | None = None,
) -> WalkResult:
    """Walk framed bundles of `buf` from `start`; see module docstring.

    `collect`: decompress Snappy message sets and build `data` (for `decode_messages`); otherwise headers only.
    `max_bytes`: stop after the bundle that brings the walked bytes to this size. `stop_seq`: stop after the
    bundle whose last seq is >= stop_seq. `max_messages`: stop (reason BUDGET) after the bundle that brings the
    walked messages to this many (None: DEFAULT_MAX_MESSAGES when collecting, no limit for headers only), so what
    is decoded at once stays bounded on any input (a bundle's count is checked against its message set's size
    first).
    """
    if max_messages is None:
        max_messages = DEFAULT_MAX_MESSAGES if collect else NO_MESSAGE_LIMIT
    return _result(buf, WALKER.impl.walk(buf, start, next_seq, collect, max_bytes, stop_seq, max_messages))


Gathered: TypeAlias = tuple[bytes, np.ndarray, np.ndarray]  # collected message sets: data, set_starts, set_ends
# what both walks return: header columns, the collected message sets or None, stop, next_seq, reason, need
_RawWalk: TypeAlias = tuple[tuple[np.ndarray, ...], Gathered | None, int, int, int, int]

# the codec table as the compiled code takes it (the walk here, compaction's key pass): (decompress_into,
# max_expansion, raw_snappy) per codec id 0..3, None if unknown
NATIVE_CODECS = tuple(
    (CODECS[i].decompress_into, CODECS[i].max_expansion, CODECS[i].raw_snappy) if i in CODECS else None
    for i in range(4)
)
_COLUMN_TYPES = (np.int64, np.int64, np.int64, np.uint8, np.int64, np.uint64, np.uint64)


def _result(buf: bytes, raw: _RawWalk) -> WalkResult:
    (offsets, ends, set_offsets, flags, counts, firsts, lasts), gathered, stop, next_seq, reason, need = raw
    t = BundleTable(offsets, ends, set_offsets, flags, counts, firsts, lasts)
    t.walked = buf
    if gathered is not None:
        t.data, t.set_starts, t.set_ends = gathered
    return WalkResult(t, stop, next_seq, REASONS[reason], need)


def collect_bundles(table: BundleTable, rows: np.ndarray) -> BundleTable:
    """The bundles at `rows` (increasing indices into a headers-only `table`), collected for `decode_messages`:
    their message sets gathered into `data`, Snappy ones decompressed. Only these bundles' bytes are read.

    Raises:
        TankFormatError: a message set that does not decompress or cannot hold its count (buffer offset).
    """
    buf = table.walked
    pick = rows.astype(np.int64, copy=False)
    sub = table.take(pick)
    got = WALKER.impl.collect(buf, sub)
    if isinstance(got, int):
        _raise_first_error(table, pick, sub, got)
    sub.data, sub.set_starts, sub.set_ends = got
    return sub


def _collect_pure(buf: bytes, sub: BundleTable) -> Gathered | int:
    """The pure-Python collect: the gathered message sets, or the index of the first bundle that does not collect."""
    mv = memoryview(buf)
    sets: list[Any] = []
    codecs = CODECS
    for i, (q, end, f, c) in enumerate(
        zip(sub.set_offsets.tolist(), sub.ends.tolist(), sub.flags.tolist(), sub.counts.tolist(), strict=True)
    ):
        codec = f & CODEC_MASK
        if not codec:
            sets.append(mv[q:end])
            continue
        try:
            unpacked = codecs[codec].decompress(mv[q:end])
        except TankFormatError:
            unpacked = None
        if unpacked is None or c > len(unpacked) // MIN_MESSAGE_BYTES:  # the walk's checks, with its error
            return i
        sets.append(unpacked)
    return _gather(sets)


def _raise_first_error(table: BundleTable, rows: np.ndarray, sub: BundleTable, i: int) -> NoReturn:
    """Chosen bundle i does not collect; raise the first error in file order, as collecting bundle by bundle would:
    a chosen bundle before it whose messages are malformed, else bundle i's own error."""
    if i:
        decode_messages(collect_bundles(table, rows[:i]))
    _raise_at(table.walked, sub, i)


def _raise_at(buf: bytes, table: BundleTable, i: int) -> NoReturn:
    """Re-walk bundle i of `table`, which does not collect, so the walk raises its precise error."""
    _walk(buf, int(table.offsets[i]), int(table.firsts[i]), True, None, int(table.lasts[i]), DEFAULT_MAX_MESSAGES)
    raise AssertionError(f"the walk accepts the bundle at {int(table.offsets[i])}, collecting it does not")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The pure walk makes one tuple per bundle and no cycles: the cyclic GC would only rescan them, ~1 µs/bundle."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc_was_enabled:
            gc.enable()


def _walk(
    buf: bytes,
    start: int,
    next_seq: int,
    collect: bool,
    max_bytes: int | None,
    stop_seq: int | None,
    max_messages: int,
) -> _RawWalk:
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    append = rows.append
    sets: list[Any] = []  # with `collect`: each bundle's uncompressed message set
    mv = memoryview(buf)
    n = len(buf)
    pos = start
    limit = n if max_bytes is None else min(n, start + max_bytes)
    stop_at = U64_MAX + 1 if stop_seq is None else stop_seq
    codecs = CODECS
    collected = 0
    reason = COMPLETE
    need = 0
    while pos < n:
        b = buf[pos]
        if b < 0x80:
            blen = b
            hp = pos + 1
        else:
            try:
                blen, hp = decode_varint(buf, pos, n)
            except TankFormatError:
                _require_cut_length(buf, pos, n)
                reason = INCOMPLETE  # a length varint cut by the end of the buffer
                break
        if blen == 0:
            reason = ZERO
            break
        end = hp + blen
        if end > n:
            reason, need = INCOMPLETE, end
            break
        f = buf[hp]
        c = (f >> COUNT_SHIFT) & COUNT_MASK
        if f & SIMPLE_MASK == 0 and c:  # the common case: plain/Snappy, non-sparse, count in the flags
            first = next_seq
            q = hp + 1
            if next_seq + c > U64_MAX + 1:
                raise TankFormatError("sequence numbers of the bundle run past 2**64-1", offset=pos)
        else:
            c, first, last, q = parse_header_body(buf, hp, end, next_seq, pos)
        next_seq = first + c if not f & SPARSE else last + 1
        codec = f & CODEC_MASK
        if codec:
            spec = codecs[codec]
            if c > (spec.max_expansion * (end - q) + 64) // MIN_MESSAGE_BYTES:
                raise TankFormatError(f"message count {c} cannot fit in {end - q} bytes", offset=pos)
            if collect:
                sets.append(_decompressed_set(spec, mv[q:end], c, pos))
        elif c > (end - q) // MIN_MESSAGE_BYTES:
            raise TankFormatError(f"message count {c} cannot fit in {end - q} bytes", offset=pos)
        elif collect:
            sets.append(mv[q:end])
        append((pos, end, q, f, c, first, next_seq - 1))
        pos = end
        if next_seq > stop_at or pos >= limit:
            reason = LIMIT if pos < n else COMPLETE
            break
        collected += c
        if collected >= max_messages and pos < n:
            reason = BUDGET  # enough for one decode: the caller continues from `stop`
            break
    columns = _header_columns(rows)
    gathered = _gather_walked(mv, columns, sets) if collect else None
    return columns, gathered, pos, next_seq, REASONS.index(reason), need


def _require_cut_length(buf: bytes, pos: int, n: int) -> None:
    """Raise unless the bundle length varint at `pos` that failed to decode is only cut by the end of `buf`."""
    if not (n - pos < 5 and all(x >= 0x80 for x in buf[pos:])):
        raise TankFormatError("bad bundle length varint", offset=pos) from None


def _decompressed_set(spec: BlockCodec, block: memoryview, c: int, pos: int) -> bytes:
    """The message set of the compressed bundle at `pos` claiming `c` messages, decompressed and its count checked
    against its size before decode_messages allocates per-message arrays."""
    try:
        unpacked = spec.decompress(block)
    except TankFormatError as err:
        raise TankFormatError(err.message, offset=pos) from None
    if c > len(unpacked) // MIN_MESSAGE_BYTES:
        raise TankFormatError(
            f"message count {c} cannot fit in the {len(unpacked)} bytes of the decompressed message set",
            offset=pos,
        )
    return unpacked


def _header_columns(rows: list[tuple[int, int, int, int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """The walked bundles' header rows as the seven typed columns of `BundleTable`."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(_COLUMN_TYPES)
    return tuple(np.array(c, dtype=d) for c, d in zip(cols, _COLUMN_TYPES, strict=True))


def _gather_walked(mv: memoryview, columns: tuple[np.ndarray, ...], sets: list[Any]) -> Gathered:
    """The walked bundles' message sets in one buffer: the walked bytes as they are when no set is compressed."""
    offsets, ends, set_offsets, flags = columns[:4]
    if len(offsets) and not (flags & CODEC_MASK).any():  # plain sets only: the walked bundles in one copy
        lo = int(offsets[0])
        return (b"".join([mv[lo : int(ends[-1])], _PAD]), set_offsets - lo, ends - lo)
    return _gather(sets)


def _gather(sets: list[Any]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(data, set_starts, set_ends): the message sets one after another, then `_PAD`."""
    lens = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    ends = np.cumsum(lens)
    return b"".join([*sets, _PAD]), ends - lens, ends


# ---------------------------------------------------------------------------------------------------------------
# message sets → columns


_AR5 = np.arange(5, dtype=np.int64)
_SHIFT5 = np.array([0, 7, 14, 21, 28], dtype=np.int64)


class _VecError(Exception):
    def __init__(self, where: np.ndarray, message: str):
        self.where = where  # bool mask over the active rows
        self.message = message


def _varints(buf: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode the varints at positions q; return (values int64, positions after)."""
    b0 = buf[q]
    if not (b0 & 0x80).any():
        return b0.astype(np.int64), q + 1
    w = buf[q[:, None] + _AR5]
    cont = w >= 0x80
    if cont.all(axis=1).any():
        raise _VecError(np.asarray(cont.all(axis=1)), "varint longer than 5 bytes")
    length = np.argmin(cont, axis=1) + 1
    bad5 = (length == 5) & (w[:, 4] > 0x0F)
    if bad5.any():
        raise _VecError(bad5, "varint above 2**32-1")
    parts = (w & 0x7F).astype(np.int64) << _SHIFT5
    parts[_AR5[None, :] >= length[:, None]] = 0
    return parts.sum(axis=1), q + length


def _varints_sub(buf: np.ndarray, p: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_varints` at p[rows]; errors are reported against all rows."""
    try:
        return _varints(buf, p[rows])
    except _VecError as err:
        full = np.zeros(len(p), dtype=bool)
        full[np.flatnonzero(rows)[err.where]] = True
        raise _VecError(full, err.message) from None


def _u64_view(data: bytes) -> np.ndarray:
    """Element p = the little-endian u64 starting at byte p: an overlapping, unaligned view (data is padded)."""
    return np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, offset=0, strides=(1,))


def decode_messages(table: BundleTable) -> MessageColumns:
    """Decode every message of `table` (collected with `walk_bundles(collect=True)`).

    Raises:
        TankFormatError: a message set that contradicts its bundle header (offset of the first such bundle).
    """
    cols = WALKER.impl.decode(table)
    if cols is None:
        _raise_first_bad_bundle(table)
    return cols


def _raise_first_bad_bundle(table: BundleTable) -> NoReturn:
    """Raise the error of the first bundle, in file order, whose message set is malformed.

    The decoders check all bundles in lockstep, so the first error they meet may be a later bundle's. Bundles decode
    independently: bisect for the shortest failing prefix, then let the pure decoder name the error of its last bundle.
    """
    lo, hi = 0, len(table)  # table[:lo] decodes, table[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if WALKER.impl.decode(table.take(slice(0, mid))) is None:
            hi = mid
        else:
            lo = mid
    _decode_pure(table.take(slice(hi - 1, hi)))
    raise AssertionError("the compiled decoder rejects a message set that the pure decoder accepts")


def _decode_pure(table: BundleTable) -> MessageColumns:
    nb = len(table)
    data = table.data
    buf = np.frombuffer(data, dtype=np.uint8)
    u64_at = _u64_view(data)
    counts = np.array(table.counts, dtype=np.int64)
    total = int(counts.sum())
    out_start = np.cumsum(counts) - counts
    seq_out = np.empty(total, np.uint64)
    ts_out = np.empty(total, np.uint64)
    key_off = np.full(total, -1, np.int64)
    key_len = np.zeros(total, np.int64)
    val_off = np.empty(total, np.int64)
    val_len = np.empty(total, np.int64)
    bundle_of = np.repeat(np.arange(nb, dtype=np.int64), counts)

    ids = np.arange(nb, dtype=np.int64)
    assert table.set_starts is not None and table.set_ends is not None  # a collecting walk sets both
    p = table.set_starts.copy()
    end = table.set_ends
    remaining = counts.copy()
    flags = np.array(table.flags, dtype=np.uint8)
    sparse = (flags & SPARSE) != 0
    first = np.array(table.firsts, dtype=np.uint64)
    last = np.array(table.lasts, dtype=np.uint64)
    prev_seq = first
    prev_ts = np.zeros(nb, np.uint64)
    step = 0
    try:
        while ids.size:
            short = p >= end
            if short.any():
                raise _VecError(short, "message count exceeds the messages in the set")
            f = buf[p]
            bad = (f & UNKNOWN_MESSAGE_FLAGS) != 0
            if bad.any():
                raise _VecError(bad, "message flags with unknown bits 3-7")
            p = p + 1
            seq = first.copy() if step == 0 else _next_seqs(buf, p, f, prev_seq, sparse, last, remaining == 1)
            has_ts = (f & USE_LAST_TS) == 0
            ts = prev_ts.copy() if step else np.zeros(ids.size, np.uint64)
            if has_ts.any():
                q = p[has_ts]
                ts[has_ts] = u64_at[q]
                p[has_ts] = q + 8
            out = out_start[ids] + step
            p = _keys_and_values(buf, p, f, out, key_off, key_len, val_off, val_len)
            over = p > end
            if over.any():
                raise _VecError(over, "message runs past the end of its message set")
            seq_out[out] = seq
            ts_out[out] = ts
            remaining = remaining - 1
            done = remaining == 0
            if done.any():
                extra = done & (p != end)
                if extra.any():
                    raise _VecError(extra, "message count does not match the message set (bytes left over)")
                keep = ~done
                ids, p, end, remaining, sparse = ids[keep], p[keep], end[keep], remaining[keep], sparse[keep]
                first, last, seq, ts = first[keep], last[keep], seq[keep], ts[keep]
            prev_seq, prev_ts = seq, ts
            step += 1
    except _VecError as err:
        row = int(np.flatnonzero(err.where)[0])
        b = int(ids[row])
        raise TankFormatError(
            f"{err.message} (message {step} of bundle with {int(table.counts[b])} messages)",
            offset=int(table.offsets[b]),
        ) from None
    return MessageColumns(seq_out, ts_out, key_off, key_len, val_off, val_len, bundle_of, data)


def _next_seqs(
    buf: np.ndarray,
    p: np.ndarray,
    f: np.ndarray,
    prev_seq: np.ndarray,
    sparse: np.ndarray,
    last: np.ndarray,
    is_last: np.ndarray,
) -> np.ndarray:
    """The seq of each bundle's next message after its first: prev + 1, or in a sparse bundle a delta varint read at
    `p` (advanced in place) or the header's last for the bundle's last message."""
    seq = prev_seq + np.uint64(1)
    mid = sparse & ~is_last
    need = mid & ((f & SEQ_PREV_PLUS_ONE) == 0)
    if need.any():
        d, p_after = _varints_sub(buf, p, need)
        seq[need] += d.astype(np.uint64)
        p[need] = p_after
    tail = sparse & is_last
    seq[tail] = last[tail]
    # seq <= prev_seq: a delta that wraps around 2**64
    bad = (mid & ((seq >= last) | (seq <= prev_seq))) | (tail & (last <= prev_seq))
    if bad.any():
        raise _VecError(bad, "sparse sequence numbers not strictly increasing up to the header's last")
    return seq


def _keys_and_values(
    buf: np.ndarray,
    p: np.ndarray,
    f: np.ndarray,
    out: np.ndarray,
    key_off: np.ndarray,
    key_len: np.ndarray,
    val_off: np.ndarray,
    val_len: np.ndarray,
) -> np.ndarray:
    """Record the key and value of each bundle's message at `p` (key length, key, value length varint, value) at
    output rows `out`; return the positions after them."""
    has_key = (f & HAVE_KEY) != 0
    if has_key.any():
        q = p[has_key]
        kl = buf[q].astype(np.int64)
        present = kl > 0  # HaveKey with key_len 0 decodes as "no key" (§3.5)
        key_off[out[has_key][present]] = (q + 1)[present]
        key_len[out[has_key][present]] = kl[present]
        p[has_key] = q + 1 + kl
    vl, p = _varints(buf, p)
    val_off[out] = p
    val_len[out] = vl
    after: np.ndarray = p + vl
    return after


class Walker(Protocol):
    """The walk, collect and decode of this module, compiled or pure Python: the same columns and errors."""

    def walk(
        self,
        buf: bytes,
        start: int,
        next_seq: int,
        collect: bool,
        max_bytes: int | None,
        stop_seq: int | None,
        max_messages: int,
    ) -> _RawWalk:
        """`walk_bundles`' walk (a malformed bundle raises its TankFormatError)."""
        ...

    def collect(self, buf: bytes, sub: BundleTable) -> Gathered | int:
        """The message sets of the bundles of `sub` (rows of `buf`), or the index of the first that does not collect."""
        ...

    def decode(self, table: BundleTable) -> MessageColumns | None:
        """The messages of a collected `table`, or None for a malformed message set."""
        ...


class PureWalker:
    """The pure-Python walk, collect and decode (above)."""

    def walk(
        self,
        buf: bytes,
        start: int,
        next_seq: int,
        collect: bool,
        max_bytes: int | None,
        stop_seq: int | None,
        max_messages: int,
    ) -> _RawWalk:
        with _gc_paused():
            return _walk(buf, start, next_seq, collect, max_bytes, stop_seq, max_messages)

    def collect(self, buf: bytes, sub: BundleTable) -> Gathered | int:
        return _collect_pure(buf, sub)

    def decode(self, table: BundleTable) -> MessageColumns | None:
        try:
            return _decode_pure(table)
        except TankFormatError:
            return None


class CompiledWalker:
    """The compiled walk, collect and decode (`_codec.pyx`); malformed input is re-read by the pure walk for its
    precise error."""

    def walk(
        self,
        buf: bytes,
        start: int,
        next_seq: int,
        collect: bool,
        max_bytes: int | None,
        stop_seq: int | None,
        max_messages: int,
    ) -> _RawWalk:
        raw = _codec.walk(buf, start, next_seq, collect, max_bytes, stop_seq, max_messages, NATIVE_CODECS)
        if raw[4] == _NATIVE_ERROR:  # malformed: the pure walk raises the precise error at that bundle
            _walk(buf, raw[2], raw[3], collect, None, None, max_messages)
            raise AssertionError(f"the compiled walk rejects the bundle at {raw[2]}, the pure walk does not")
        return raw

    def collect(self, buf: bytes, sub: BundleTable) -> Gathered | int:
        return _codec.collect(buf, sub.offsets, sub.ends, sub.set_offsets, sub.flags, sub.counts, NATIVE_CODECS)

    def decode(self, table: BundleTable) -> MessageColumns | None:
        assert table.set_starts is not None and table.set_ends is not None  # a collecting walk sets both
        cols = _codec.decode(
            table.data, table.set_starts, table.set_ends, table.counts, table.flags, table.firsts, table.lasts
        )
        if cols is None:
            return None
        seq, ts, key_off, key_len, val_off, val_len, bundle = cols
        return MessageColumns(seq, ts, key_off, key_len, val_off, val_len, bundle, table.data)


WALKER: native.Choice[Walker] = native.Choice(PureWalker(), CompiledWalker)
