"""Bundle encode/decode round trips (docs/FORMAT.md §3.3–§3.7), property-based."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.bundle import (
    SPARSE,
    Codec,
    Message,
    SnappyPolicy,
    encode_bundle,
    frame,
    is_contiguous,
    parse_bundle_header,
)
from tank_log.format.decode import collect_bundles, decode_messages, walk_bundles

keys = st.one_of(st.none(), st.binary(min_size=1, max_size=255))
values = st.binary(max_size=300)


@st.composite
def message_runs(draw, max_len=40):
    """Messages with strictly increasing seqs (gaps up to 2**32-1) and often repeated timestamps."""
    n = draw(st.integers(1, max_len))
    seq = draw(st.integers(1, 2**40))
    ts = draw(st.integers(0, 2**64 - 1))
    out = []
    first = seq
    for i in range(n):
        if i:
            budget = first + 2**32 - seq - (n - i)  # keep last - first - 1 within the u32 header varint
            seq += 1 + min(budget, draw(st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 2**32 - 2))))
            if draw(st.booleans()):
                ts = draw(st.integers(0, 2**64 - 1))
        out.append(Message(seq, ts, draw(keys), draw(values)))
    return out


def decode_one(framed: bytes, next_seq: int) -> list[Message]:
    """Decode on both codec cores; they must agree."""
    out = []
    for pure in (False, True):
        with native.use_pure(pure):
            res = walk_bundles(framed, 0, next_seq)
            assert res.stop == len(framed)
            cols = decode_messages(res.table)
            seqs, tss = cols.seq.tolist(), cols.ts.tolist()
            out.append([Message(seqs[i], tss[i], cols.key(i), cols.value(i)) for i in range(len(cols))])
    assert out[0] == out[1]
    return out[0]


@settings(max_examples=300, deadline=None)
@given(message_runs(), st.sampled_from([Codec.NONE, Codec.SNAPPY]), st.booleans())
def test_sparse_round_trip(msgs, codec, varint_count):
    framed = frame(encode_bundle(msgs, sparse=True, codec=codec, varint_count=varint_count))
    assert decode_one(framed, 1) == msgs


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(keys, values, st.integers(0, 3)), min_size=1, max_size=60),
    st.integers(1, 2**50),
    st.sampled_from(list(SnappyPolicy)),
)
def test_contiguous_round_trip(rows, first, policy):
    msgs = []
    ts = 1_700_000_000_000
    for i, (k, v, dt) in enumerate(rows):
        ts += dt  # dt 0 → UseLastSpecifiedTS
        msgs.append(Message(first + i, ts, k, v))
    assert is_contiguous(msgs, first)
    framed = frame(encode_bundle(msgs, sparse=False, codec=policy))
    assert decode_one(framed, first) == msgs


@settings(max_examples=100, deadline=None)
@given(st.lists(message_runs(max_len=8), min_size=1, max_size=8))
def test_sequence_derivation_across_bundles(groups):
    """Several bundles in one buffer: sparse ones reset the counter, non-sparse continue it (§3.6)."""
    framed = b""
    expected = []
    next_seq = 1
    for g in groups:
        g = [Message(m.seq + next_seq, m.ts, m.key, m.value) for m in g]  # keep increasing across groups
        sparse = not is_contiguous(g, next_seq)
        framed += frame(encode_bundle(g, sparse=sparse))
        expected += g
        next_seq = g[-1].seq + 1
    res = walk_bundles(framed, 0, 1)
    cols = decode_messages(res.table)
    assert [int(s) for s in cols.seq] == [m.seq for m in expected]
    assert res.next_seq == next_seq


def test_header_fields_and_conventions():
    msgs = [
        Message(10, 5, b"k", b"a"),
        Message(11, 5, None, b"b"),
        Message(15, 6, b"k2", b""),
        Message(16, 6, None, b""),
    ]
    b = encode_bundle(msgs, sparse=True)
    assert b[0] == SPARSE | (4 << 2)
    assert struct.unpack_from("<Q", b, 1)[0] == 10
    assert b[9] == 16 - 10 - 1  # last - first - 1
    h = parse_bundle_header(frame(b), 0, len(b) + 1, 1)
    assert (h.first_seq, h.last_seq, h.count, h.sparse) == (10, 16, 4, True)
    # first message: HaveKey + ts; second: bit2 (prev+1) + UseLastSpecifiedTS; third: delta 3
    set_ = b[10:]
    assert set_[0] == 0x01
    assert set_[1 + 8 + 1 + 1 + 1 + 1] == 0x06
    single = encode_bundle([Message(7, 1, None, b"x")], sparse=True)
    assert len(single) == 1 + 8 + 1 + 8 + 1 + 1  # no last-first-1 for count 1


def test_count_forms():
    msgs = [Message(i, 0, None, b"") for i in range(1, 16)]
    assert encode_bundle(msgs, sparse=False)[0] == 15 << 2
    assert encode_bundle(msgs, sparse=False, varint_count=True)[0:2] == bytes([0, 15])
    msgs16 = [Message(i, 0, None, b"") for i in range(1, 17)]
    assert encode_bundle(msgs16, sparse=False)[0:2] == bytes([0, 16])


def test_snappy_policies():
    small = [Message(1, 0, None, b"x" * 100)]
    big = [Message(1, 0, b"k", b"y" * 2000)]
    assert encode_bundle(small, sparse=False, codec=SnappyPolicy.CLIENT)[0] & 3 == 0
    assert encode_bundle(big, sparse=False, codec=SnappyPolicy.CLIENT)[0] & 3 == 1
    assert encode_bundle(big, sparse=False, codec=SnappyPolicy.WHEN_SMALLER)[0] & 3 == 1
    import os

    noise = [Message(1, 0, None, os.urandom(3000))]
    assert encode_bundle(noise, sparse=False, codec=SnappyPolicy.WHEN_SMALLER)[0] & 3 == 0  # would grow
    assert encode_bundle(noise, sparse=False, codec=SnappyPolicy.CLIENT)[0] & 3 == 1  # client compresses anyway


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda b: bytes([b[0], b[1] | 0x80]) + b[2:], "bit 7"),
        (lambda b: bytes([b[0], (b[1] & ~3) | 2]) + b[2:], "codec"),
        (lambda b: bytes([b[0], (b[1] & 0xC3) | (3 << 2)]) + b[2:], "count"),  # 3 instead of 2 messages
        (lambda b: bytes([b[0], (b[1] & 0xC3) | (1 << 2)]) + b[2:], "count"),  # 1 instead of 2
        (lambda b: bytes([b[0] + 1]) + b[1:] + b"\x00", "count"),  # an extra byte in the set
    ],
)
def test_strict_errors(mutate, needle, codec_core):
    good = frame(encode_bundle([Message(1, 0, b"k", b"v"), Message(2, 0, None, b"w")], sparse=False))
    bad = mutate(good)
    with pytest.raises(TankFormatError) as e:
        res = walk_bundles(bad, 0, 1)
        decode_messages(res.table)
    assert needle in str(e.value)
    assert e.value.offset == 0


def _left_over_byte() -> bytes:
    """A two-message bundle with a byte after its last message: the decoder notices at its second message."""
    good = frame(encode_bundle([Message(1, 0, b"k", b"v"), Message(2, 0, None, b"w")], sparse=False))
    return bytes([good[0] + 1]) + good[1:] + b"\x00"


def test_the_error_names_the_first_bad_bundle_in_file_order(codec_core):
    """The decoders check bundles in lockstep: a later bundle's bad first message is met before an earlier bundle's
    bad second one, yet the error is the earlier bundle's (an operator looks there first)."""
    a = _left_over_byte()
    b = bytearray(frame(encode_bundle([Message(3, 0, None, b"x")], sparse=False)))
    b[int(walk_bundles(bytes(b), 0, 3, collect=False).table.set_offsets[0])] |= 0x80  # message flags bit 7
    with pytest.raises(TankFormatError) as e:
        decode_messages(walk_bundles(a + bytes(b), 0, 1).table)
    assert "bytes left over" in e.value.message and e.value.offset == 0


def test_collecting_chosen_bundles_names_the_first_bad_bundle(codec_core):
    """A bundle whose messages are malformed before one that does not decompress: the error is the first one's."""
    a = _left_over_byte()
    good = frame(encode_bundle([Message(3, 0, None, b"z" * 3000)], sparse=False, codec=Codec.SNAPPY))
    b = good[:7] + bytes([good[7] ^ 0xFF]) + good[8:]  # a copy with a bad offset
    headers = walk_bundles(a + b, 0, 1, collect=False).table
    with pytest.raises(TankFormatError) as e:
        decode_messages(collect_bundles(headers, np.array([0, 1])))
    assert "bytes left over" in e.value.message and e.value.offset == 0
    with pytest.raises(TankFormatError) as e:
        collect_bundles(headers, np.array([1]))
    assert "Snappy" in e.value.message and e.value.offset == len(a)


def test_bad_snappy_is_a_format_error(codec_core):
    good = frame(encode_bundle([Message(1, 0, None, b"z" * 3000)], sparse=False, codec=Codec.SNAPPY))
    bad = good[:6] + bytes([good[6] ^ 0xFF]) + good[7:]
    with pytest.raises(TankFormatError):
        decode_messages(walk_bundles(bad, 0, 1).table)


def test_sparse_going_backwards_rejected(codec_core):
    a = frame(encode_bundle([Message(10, 0, None, b"a")], sparse=True))
    b = frame(encode_bundle([Message(5, 0, None, b"b")], sparse=True))
    with pytest.raises(TankFormatError) as e:
        walk_bundles(a + b, 0, 1)
    assert e.value.offset == len(a)
