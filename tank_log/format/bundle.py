"""Bundle header and message encoding (docs/FORMAT.md §3.3–§3.7).

Decoding of whole files lives in `decode.py` (vectorised); this module holds the scalar header parser and the
encoder used by writers. Encoders follow the broker's conventions exactly so that re-encoding decoded bundles with
the same choices (codec, sparse, count form) reproduces the original bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.codecs import CODECS, Codec, block_codec
from tank_log.format.messages import Message as Message  # re-exported: the format's message
from tank_log.format.messages import MessageColumns
from tank_log.format.varint import U32_MAX, U64_MAX, decode_varint, encode_varint

try:
    from tank_log.format import _codec
except ImportError:  # not built (no C compiler at install), or not for this Python: the pure-Python code runs
    native.failed("tank_log.format._codec")

# bundle flags (§3.3): codec in bits 0-1, 4-bit count in bits 2-5 (0 = a varint count follows), sparse bit 6
CODEC_MASK = 0x03
COUNT_SHIFT = 2
COUNT_MASK = 0x0F
SPARSE = 0x40
RESERVED = 0x80
# the walker's fast path: plain or Snappy (codec bit 1 clear), not sparse, bit 7 clear (count checked separately)
SIMPLE_MASK = RESERVED | SPARSE | 0x02
# message flags (§3.5)
HAVE_KEY = 0x01
USE_LAST_TS = 0x02
SEQ_PREV_PLUS_ONE = 0x04
UNKNOWN_MESSAGE_FLAGS = 0xFF & ~(HAVE_KEY | USE_LAST_TS | SEQ_PREV_PLUS_ONE)

MAX_KEY_LEN = 255
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class BundleHeader:
    """A parsed bundle header. `offset` is where the length varint starts; `size` covers varint + bundle."""

    offset: int
    size: int
    flags: int
    count: int
    first_seq: int
    last_seq: int
    set_offset: int  # where the (possibly compressed) message set starts
    varint_count: bool

    @property
    def codec(self) -> int:
        return self.flags & CODEC_MASK

    @property
    def sparse(self) -> bool:
        return bool(self.flags & SPARSE)

    @property
    def end(self) -> int:
        return self.offset + self.size


def count_field(flags: int) -> int:
    """The 4-bit count of the flags (0: the count is a varint after the flags)."""
    return (flags >> COUNT_SHIFT) & COUNT_MASK


def parse_header_body(buf: Any, hp: int, bend: int, next_seq: int, pos: int) -> tuple[int, int, int, int]:
    """Parse the bundle header at `hp` (just after the length varint at `pos`; the bundle ends at `bend`).

    Returns (count, first seq, last seq, message-set offset); `next_seq` is the running counter of §3.6.

    Raises:
        TankFormatError: (offset `pos`) anything the broker's writers never produce: bit 7, codec 2/3, count 0,
            sparse first 0 or going backwards, seqs past 2**64-1.
    """
    flags = buf[hp]
    if flags & RESERVED:
        raise TankFormatError("bundle flags bit 7 set (extra flags are not implemented, §3.9)", offset=pos)
    codec = flags & CODEC_MASK
    if codec and codec not in CODECS:
        raise TankFormatError(f"unsupported codec {codec} (bundle flags 0x{flags:02x})", offset=pos)
    count = count_field(flags)
    q = hp + 1
    if not count:
        count, q = _header_varint(buf, q, bend, pos, "message count")
        if count == 0:
            raise TankFormatError("bundle message count 0", offset=pos)
    if flags & SPARSE:
        if q + 8 > bend:
            raise TankFormatError("sparse bundle header runs past the end of the bundle", offset=pos)
        first = _U64.unpack_from(buf, q)[0]
        q += 8
        if first == 0:
            raise TankFormatError("sparse bundle with first sequence number 0", offset=pos)
        if first < next_seq:
            raise TankFormatError(
                f"sparse bundle first seq {first} goes backwards (expected >= {next_seq})", offset=pos
            )
        if count != 1:
            span, q = _header_varint(buf, q, bend, pos, "sparse last-first-1")
            last = first + span + 1
        else:
            last = first
    else:
        first = next_seq
        last = next_seq + count - 1
    if last > U64_MAX:
        raise TankFormatError(f"sequence numbers of the bundle run past 2**64-1 (last {last})", offset=pos)
    return count, first, last, q


def parse_bundle_header(buf: Any, pos: int, end: int, next_seq: int) -> BundleHeader:
    """Parse the framed bundle at `pos` (its length varint); `next_seq` is the running counter of §3.6.

    Raises:
        TankFormatError: (offset relative to `buf`) zero length, a bundle past `end`, or a bad header
            (see `parse_header_body`).
    """
    blen, hp = decode_varint(buf, pos, end)
    if blen == 0:
        raise TankFormatError("zero-length bundle", offset=pos)
    bend = hp + blen
    if bend > end:
        raise TankFormatError(f"bundle of {blen} bytes runs past the end of the data", offset=pos)
    count, first, last, q = parse_header_body(buf, hp, bend, next_seq, pos)
    flags = buf[hp]
    return BundleHeader(pos, bend - pos, flags, count, first, last, q, count_field(flags) == 0)


def _header_varint(buf: Any, q: int, bend: int, pos: int, what: str) -> tuple[int, int]:
    try:
        return decode_varint(buf, q, bend)
    except TankFormatError as err:
        raise TankFormatError(f"bad {what} varint in bundle header: {err.message}", offset=pos) from None


# ---------------------------------------------------------------------------------------------------------------
# encoding


class SnappyPolicy(Enum):
    """When to Snappy-compress a message set (§3.4)."""

    CLIENT = "client"  # TANK client: > 512 messages or Σ(key+value) > 1024 bytes, even if it grows
    WHEN_SMALLER = "when_smaller"  # compaction: uncompressed set > 1024 bytes and the result strictly smaller
    ALWAYS = "always"
    NEVER = "never"


def is_contiguous(messages: Sequence[Message], expected_next: int) -> bool:
    """True if the messages carry exactly expected_next, expected_next+1, ... (Appendix B: may be non-sparse)."""
    return all(m.seq == expected_next + i for i, m in enumerate(messages))


_SMALL_VARINTS = [bytes([i]) for i in range(128)]


def encode_message_set(messages: Sequence[Message], sparse: bool) -> bytes:
    """Encode messages per §3.5 with the writers' conventions (§3.6, §3.7): HaveKey only for non-empty keys,
    UseLastSpecifiedTS when the ts repeats (never on the first message), and for sparse bundles bit 2 or a delta
    on middle messages only (never on the first/last). Runs on the compiled core when it is built (same bytes).

    Raises:
        ValueError: a key over 255 bytes, or seqs not increasing / a gap of 2**32 or more (§3.5, §3.6).
    """
    return ENCODER.impl.message_set(messages, sparse)


def _encode_message_set_pure(messages: Sequence[Message], sparse: bool) -> bytes:
    out = bytearray()
    last_index = len(messages) - 1
    prev_seq = prev_ts = -1
    pack_ts = _U64.pack
    small = _SMALL_VARINTS
    for i, (seq, ts, key, value) in enumerate(messages):
        flags = 0
        if key:
            if len(key) > MAX_KEY_LEN:
                raise ValueError(f"key of {len(key)} bytes exceeds {MAX_KEY_LEN}")
            flags = HAVE_KEY
        if ts == prev_ts and i:
            flags |= USE_LAST_TS
        delta = b""
        if sparse and 0 < i < last_index:
            gap = seq - prev_seq - 1
            if gap == 0:
                flags |= SEQ_PREV_PLUS_ONE
            elif 0 < gap <= U32_MAX:
                delta = small[gap] if gap < 128 else encode_varint(gap)
            else:
                raise ValueError(f"sequence numbers not strictly increasing or gap >= 2**32 at seq {seq}")
        out.append(flags)
        if delta:
            out += delta
        if not flags & USE_LAST_TS:
            out += pack_ts(ts)
        if key:
            out.append(len(key))
            out += key
        n = len(value)
        out += small[n] if n < 128 else encode_varint(n)
        out += value
        prev_seq, prev_ts = seq, ts
    return bytes(out)


def encode_message_set_columns(cols: MessageColumns, sparse: bool) -> bytes:
    """`encode_message_set` of messages given as columns over `cols.data`: the same bytes (compiled core, or the
    pure encoder over Message tuples)."""
    return ENCODER.impl.columns(cols, sparse)


def messages_of(cols: MessageColumns) -> list[Message]:
    """Message tuples of columns (for the paths that need one Python object per message)."""
    data = cols.data
    return [
        Message(seq, ts, None if ko < 0 else data[ko : ko + kl], data[vo : vo + vl])
        for seq, ts, ko, kl, vo, vl in zip(
            cols.seq.tolist(),
            cols.ts.tolist(),
            cols.key_off.tolist(),
            cols.key_len.tolist(),
            cols.val_off.tolist(),
            cols.val_len.tolist(),
            strict=True,
        )
    ]


def choose_codec(policy: SnappyPolicy, count: int, payload: int, message_set: bytes) -> tuple[Codec, bytes]:
    """Apply a compression policy to the message set of `count` messages with Σ(key + value) = `payload` bytes;
    return the codec and the bytes to store."""
    if policy is SnappyPolicy.NEVER:
        return Codec.NONE, message_set
    if policy is SnappyPolicy.CLIENT:
        if count > 512 or payload > 1024:
            return Codec.SNAPPY, block_codec(Codec.SNAPPY).compress(message_set)
        return Codec.NONE, message_set
    if policy is SnappyPolicy.ALWAYS:
        return Codec.SNAPPY, block_codec(Codec.SNAPPY).compress(message_set)
    if len(message_set) > 1024:
        packed = block_codec(Codec.SNAPPY).compress(message_set)
        if len(packed) < len(message_set):
            return Codec.SNAPPY, packed
    return Codec.NONE, message_set


def encode_bundle(
    messages: Sequence[Message],
    *,
    sparse: bool,
    codec: Codec | SnappyPolicy = Codec.NONE,
    varint_count: bool | None = None,
) -> bytes:
    """Encode one bundle (without its length prefix; see `frame`).

    `sparse`: write the sparse header (absolute first, last-first-1, §3.3). A non-sparse bundle is only valid when
    its messages continue the running counter (§3.6) — the caller checks that (see `is_contiguous`).
    `codec`: a fixed codec or a SnappyPolicy. `varint_count`: force the count into a varint even when < 16
    (None = the writers' rule: 4-bit field iff count < 16).

    Raises:
        ValueError: no message, an invalid seq range, or a sparse span beyond the u32 varint (§3.3).
    """
    count = len(messages)
    if count == 0:
        raise ValueError("a bundle needs at least one message")
    first, last = messages[0].seq, messages[-1].seq
    _check_range(first, last, count, sparse)
    payload = sum(len(m.key or b"") + len(m.value) for m in messages) if codec is SnappyPolicy.CLIENT else 0
    return _bundle(encode_message_set(messages, sparse), count, first, last, sparse, codec, payload, varint_count)


def encode_bundle_columns(cols: MessageColumns, *, sparse: bool, codec: Codec | SnappyPolicy = Codec.NONE) -> bytes:
    """`encode_bundle` of messages given as columns (messages.MessageColumns): the same bytes, without a Python object
    per message.

    Raises:
        ValueError: as `encode_bundle`.
    """
    count = len(cols)
    if count == 0:
        raise ValueError("a bundle needs at least one message")
    first, last = int(cols.seq[0]), int(cols.seq[-1])
    _check_range(first, last, count, sparse)
    payload = 0
    if codec is SnappyPolicy.CLIENT:
        payload = int(cols.key_len[cols.key_off >= 0].sum() + cols.val_len.sum())
    return _bundle(encode_message_set_columns(cols, sparse), count, first, last, sparse, codec, payload, None)


_POLICY_CODES = {SnappyPolicy.NEVER: 0, SnappyPolicy.CLIENT: 1, SnappyPolicy.ALWAYS: 2, SnappyPolicy.WHEN_SMALLER: 3}


def frame_bundles(
    cols: MessageColumns, bounds: np.ndarray, expected: int | None, policy: SnappyPolicy
) -> tuple[bytes, np.ndarray]:
    """The framed bundles of rows [bounds[k], bounds[k + 1]) for each k, one after another, and each one's end in
    them: `frame(encode_bundle_columns(...))` of each, in one call on the compiled core. A bundle is non-sparse when
    it continues the running counter (§3.6) from `expected` (None: the first bundle starts it) or from the previous
    bundle.

    Raises:
        ValueError: as `encode_bundle`.
    """
    return ENCODER.impl.bundles(cols, bounds, expected, policy)


def _frame_bundles_pure(
    cols: MessageColumns, bounds: np.ndarray, expected: int | None, policy: SnappyPolicy
) -> tuple[bytes, np.ndarray]:
    """`frame_bundles` one bundle at a time."""
    parts = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        rows = cols.slice(lo, hi)
        first, last = int(rows.seq[0]), int(rows.seq[-1])
        expected = first if expected is None else expected
        sparse = not (first == expected and last - first == hi - lo - 1)
        parts.append(frame(encode_bundle_columns(rows, sparse=sparse, codec=policy)))
        expected = last + 1
    return b"".join(parts), np.cumsum([len(p) for p in parts], dtype=np.int64)


def _check_range(first: int, last: int, count: int, sparse: bool) -> None:
    if first < 1 or last < first:
        raise ValueError(f"invalid bundle sequence range {first}..{last}")
    if sparse and count > 1 and last - first - 1 > U32_MAX:
        raise ValueError("sparse bundle span exceeds the u32 varint")


def _bundle(
    message_set: bytes,
    count: int,
    first: int,
    last: int,
    sparse: bool,
    codec: Codec | SnappyPolicy,
    payload_bytes: int,
    varint_count: bool | None,
) -> bytes:
    """The header (§3.3) + the message set, compressed per `codec` (a policy looks at `payload_bytes`)."""
    if isinstance(codec, SnappyPolicy):
        codec, payload = choose_codec(codec, count, payload_bytes, message_set)
    else:
        payload = block_codec(codec).compress(message_set) if codec != Codec.NONE else message_set
    use_varint = count >= 16 if varint_count is None else (varint_count or count >= 16)
    flags = int(codec) | (0 if use_varint else count << COUNT_SHIFT) | (SPARSE if sparse else 0)
    header = bytearray([flags])
    if use_varint:
        header += encode_varint(count)
    if sparse:
        header += _U64.pack(first)
        if count != 1:
            header += encode_varint(last - first - 1)
    return bytes(header) + payload


def frame(bundle: bytes) -> bytes:
    """Prefix a bundle with its length varint (§3.1)."""
    return encode_varint(len(bundle)) + bundle


class Encoder(Protocol):
    """The message and bundle encoders of this module, compiled or pure Python: the same bytes and errors."""

    def message_set(self, messages: Sequence[Message], sparse: bool) -> bytes:
        """`encode_message_set`."""
        ...

    def columns(self, cols: MessageColumns, sparse: bool) -> bytes:
        """`encode_message_set_columns`."""
        ...

    def bundles(
        self, cols: MessageColumns, bounds: np.ndarray, expected: int | None, policy: SnappyPolicy
    ) -> tuple[bytes, np.ndarray]:
        """`frame_bundles`."""
        ...


class PureEncoder:
    """The pure-Python encoders (above)."""

    def message_set(self, messages: Sequence[Message], sparse: bool) -> bytes:
        return _encode_message_set_pure(messages, sparse)

    def columns(self, cols: MessageColumns, sparse: bool) -> bytes:
        return _encode_message_set_pure(messages_of(cols), sparse)

    def bundles(
        self, cols: MessageColumns, bounds: np.ndarray, expected: int | None, policy: SnappyPolicy
    ) -> tuple[bytes, np.ndarray]:
        return _frame_bundles_pure(cols, bounds, expected, policy)


class CompiledEncoder:
    """The compiled encoders (`_codec.pyx`); what they decline (a value out of range, a field of another type) goes
    to the pure ones, which raise the precise error."""

    def message_set(self, messages: Sequence[Message], sparse: bool) -> bytes:
        try:
            encoded = _codec.encode_message_set(messages, sparse)
        except (OverflowError, TypeError):  # a ts outside u64 or a non-bytes field: the pure encoder says which
            encoded = None
        return _encode_message_set_pure(messages, sparse) if encoded is None else encoded

    def columns(self, cols: MessageColumns, sparse: bool) -> bytes:
        encoded = _codec.encode_columns(
            cols.data, cols.seq, cols.ts, cols.key_off, cols.key_len, cols.val_off, cols.val_len, sparse
        )
        return _encode_message_set_pure(messages_of(cols), sparse) if encoded is None else encoded

    def bundles(
        self, cols: MessageColumns, bounds: np.ndarray, expected: int | None, policy: SnappyPolicy
    ) -> tuple[bytes, np.ndarray]:
        got = _codec.encode_bundles(
            cols.data,
            cols.seq,
            cols.ts,
            cols.key_off,
            cols.key_len,
            cols.val_off,
            cols.val_len,
            bounds,
            expected or 0,
            _POLICY_CODES[policy],
            block_codec(Codec.SNAPPY).compress,
        )
        return _frame_bundles_pure(cols, bounds, expected, policy) if got is None else got


ENCODER: native.Choice[Encoder] = native.Choice(PureEncoder(), CompiledEncoder)
