"""The compiled Protobuf path (`_protobuf_fast.pyx`) against protobuf's parser (upb, protobuf.py's path): the same
values, written by protobuf's own message classes or broken by hand and at random, give the same columns, the same
bad rows and the same errors on both paths."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from conftest import ROOT
from test_values_protobuf import full_order

from tank_log.format import native
from tank_log.values import ValueSpec, decoder_for
from tank_log.values.protobuf import ProtobufDecoder

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled core is not built")

DATA = os.path.join(ROOT, "tests", "data", "values")
DESC = os.path.join(DATA, "shop.desc")
KINDS = os.path.join(DATA, "kinds.proto")


def both(spec: ValueSpec) -> tuple[ProtobufDecoder, ProtobufDecoder]:
    """The compiled path's decoder and protobuf's, on the same spec."""
    fast = decoder_for(spec)
    with native.use_pure():
        slow = decoder_for(spec)
    assert isinstance(fast, ProtobufDecoder) and isinstance(slow, ProtobufDecoder)
    assert fast.fast and not slow.fast
    return fast, slow


def same(fast: ProtobufDecoder, slow: ProtobufDecoder, values: pa.Array, nan: bool = False) -> list[str | None]:
    """Decode with both paths and check they agree: the same columns (Arrow-equal, unless `nan`: a damaged float
    may be a NaN, which is not equal to itself), bad rows, errors and ids."""
    a, b = fast.decode(values), slow.decode(values)
    assert a.columns.type == b.columns.type == fast.arrow_type
    mine, theirs = a.columns.to_pylist(), b.columns.to_pylist()
    for i, (x, y) in enumerate(zip(mine, theirs, strict=True)):
        assert repr(x) == repr(y), (i, values[i].as_py())  # repr: a damaged float may be a NaN
    assert nan or a.columns.equals(b.columns)
    assert a.bad.tolist() == b.bad.tolist()
    assert a.errors.to_pylist() == b.errors.to_pylist()
    assert a.schema_ids.to_pylist() == b.schema_ids.to_pylist()
    return a.errors.to_pylist()


def kinds_rows(cls):
    """Rows of kinds.proto: every repeated kind, maps by every key kind, a oneof, well-known types at their edges."""
    r = cls(i64s=[1, -1, 2**40], s32s=[-5, 7], f64s=[2**64 - 1], fl=[1.5, -0.0], bs=[True, False], colors=[0, 2, 9])
    r.blobs.extend([b"a", b""])
    r.by_flag[True], r.by_flag[False] = "t", "f"
    r.by_u64[2**63].s = "big"
    r.by_u64[1].xs.extend([1, 2])
    r.when["b"].seconds = 5
    r.when["a"].nanos = -1  # before the epoch: floored to the microsecond before
    r.shades[-3], r.shades[4] = 1, 7
    r.inner.s, r.inner.o = "in", 0
    s = cls(name="n", maybe=False, u32=2**32 - 1)
    s.stamps.add(seconds=-62135596800)  # 0001-01-01
    s.stamps.add(seconds=253402300799, nanos=999999999)  # the last microsecond of 9999
    s.big.value, s.blob.value, s.ratio.value, s.small.value, s.i32w.value = 2**64 - 1, b"\x00", 0.1, 2**32 - 1, -1
    s.nested.c = 5  # a number the enum does not name
    s.inners.add(s="a", xs=[3])
    s.inners.add()
    w = cls()
    w.wait.seconds, w.wait.nanos = -5, -999999  # truncated toward zero, as protobuf.py's _duration
    late, huge = cls(), cls()
    late.stamps.add(seconds=253402300800)  # past 9999: protobuf.py's error (handed back to its path)
    huge.wait.seconds = 10**13  # past Arrow's duration[us]: not representable (handed back)
    return [m.SerializeToString() for m in (r, s, w, cls(), late, huge)]


WIRE_CASES = [
    b"\x08\x01\x08\x02\x0a\x02\x03\x04",  # i64s unpacked, then packed: [1, 2, 3, 4]
    b"\x0a\x02\x03\x80",  # packed, its last varint runs past the packed length
    b"\x1a\x07" + b"\x00" * 7,  # packed fixed64 of 7 bytes
    b"\x62\x02\x0a\x00\x6a\x01n\x62\x00",  # oneof: inner, name, inner again (upb starts inner afresh)
    b"\x6a\x01n\x62\x03\x0a\x01x",  # oneof: name, then inner
    b"\xaa\x01\x03\x0a\x01x\xaa\x01\x02\x10\x05",  # `nested` twice: merged
    b"\x42\x04\x08\x01\x12\x00\x42\x07\x08\x01\x12\x01z\x18\x00",  # a map key twice, the second entry has an unknown
    b"\x42\x02\x08\x01\x42\x03\x08\x00\x10",  # a map entry that ends inside its value
    b"\x4a\x02\x12\x00",  # a map entry with no key: key 0, value a default Inner
    b"\x6a\x05ab\xff\x00\x00",  # a string that is not UTF-8
    b"\xaa\x01\x02\x0a\x03a\xff\x00",  # a string that runs past its message, not UTF-8: upb reads it first
    b"\x0b" * 100 + b"\x0c" * 100,  # unknown groups nested 100 deep: upb's limit
    b"\x0b" * 101 + b"\x0c" * 101,  # 101 deep
    b"\x0b\x14",  # an end-group tag of another number
    b"\x0c",  # an end-group tag outside a group
    b"\xf8\xff\xff\xff\x0f\x05",  # field 536870911: unknown, skipped
    b"\xf8\xff\xff\xff\x1f\x05",  # a tag past 32 bits
    b"\x80\x80\x80\x80\x80\x00",  # a tag of 6 bytes
    b"\x00",  # field number 0
    b"\x0e",  # wire type 6
    b"\x08" + b"\xff" * 9 + b"\x01",  # a 10-byte varint (bits past 64 dropped)
    b"\x08" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
    b"\x82\x7d\x01\x07",  # field 4000 (u32) as a length: another wire type, skipped
    b"\x85\x7d\x01\x02\x03\x04",  # field 4000 as fixed32: skipped
    b"\xa8\x01\x01",  # `big` as a varint: skipped
    b"\x7a\x0b\x08" + b"\x80" * 9 + b"\x01",  # a Timestamp of -2**63 seconds: protobuf.py's error (handed back)
    b"\x0b\x00\x01\x03\x04\x0c",  # field number 0 inside an unknown group: upb skips it
    b"\x03\x04",  # a group of field number 0 in a message
    b"\x4a\x05\x08\x01\x12\x09\x0a\x07Troms\x89",  # a map value past its entry's end: upb stops there, not at UTF-8
]


def test_every_field_kind_and_wire_form_decodes_as_protobufs_parser_does():
    """Every scalar, repeated, map and well-known type, rows at their edges and hand-made wire forms (packed and
    not, a oneof switching, a message merged, a map key twice, nesting depth, tags at their limits); in a sliced
    array and as large_binary too."""
    fast, slow = both(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Order"))
    order = fast._cls
    values = pa.array([full_order(order).SerializeToString(), order().SerializeToString(), None], pa.binary())
    assert same(fast, slow, values)[2] == "protobuf: no value (null)"
    fast, slow = both(ValueSpec("protobuf", schema_file=KINDS, message="kinds.v1.Row"))
    values = pa.array(kinds_rows(fast._cls) + WIRE_CASES, pa.binary())
    errors = same(fast, slow, values)
    good = {0, 1, 2, 3, 6, 9, 10, 11, 12, 14, 17, 21, 26, 28, 29, 30, 32}  # and 31: protobuf.py's conversion error
    assert {i for i, e in enumerate(errors) if e is None} == good
    assert errors[4] == "protobuf: date value out of range"  # protobuf.py's conversion, on its path
    assert errors[31] == "protobuf: Python int too large to convert to C int"
    assert errors[5] == "protobuf: not representable in its column: Timedelta too large to fit in 64-bit integer"
    utf8 = "protobuf: the message: Error parsing message with type 'kinds.v1.Row': String field had bad UTF-8"
    assert errors[15] == errors[16] == utf8 and errors[34] != utf8
    rows = fast.decode(values).columns.to_pylist()
    assert rows[6]["i64s"] == [1, 2, 3, 4] and rows[11]["nested"] == {"s": "x", "xs": [5], "o": None, "c": "RED"}
    assert rows[12]["by_flag"] == [(True, "")]  # the entry with an unknown field is left out, as upb does
    assert rows[9]["inner"] == {"s": "", "xs": [], "o": None, "c": "RED"} and rows[26]["i64s"] == [-1]
    for part in (values.slice(3), values.cast(pa.large_binary()), pa.array([], pa.binary())):
        same(fast, slow, part)


def damaged(rng: random.Random, bases: list[bytes], count: int) -> pa.Array:
    """`count` values: each base cut short (one in four), with a byte put in or 1-3 taken out (a few), or with 1-3
    bytes set at random."""
    out = []
    for trial in range(count):
        b = bytearray(bases[trial % len(bases)])
        i = rng.randrange(len(b))
        if trial % 4 == 0:
            b = b[: rng.randrange(len(b) + 1)]
        elif trial % 7 == 0:
            b[i:i] = bytes([rng.randrange(256)])
        elif trial % 11 == 0:
            del b[i : i + rng.randrange(1, 4)]
        else:
            for _ in range(1 + trial % 3):
                b[rng.randrange(len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return pa.array(out, pa.binary())


def test_random_damage_gives_the_same_rows_verdicts_and_errors():
    """3,000 damaged values of each of two messages, in one batch each (bad rows between good ones roll their slots
    back): the same verdict, the same error text, the same row."""
    rng = random.Random(3)
    for spec, rows in (
        (ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Order"), lambda c: [full_order(c)]),
        (ValueSpec("protobuf", schema_file=KINDS, message="kinds.v1.Row"), None),
    ):
        fast, slow = both(spec)
        bases = [m.SerializeToString() for m in rows(fast._cls)] if rows else kinds_rows(fast._cls)[:3]
        values = damaged(rng, bases, 3000)
        errors = same(fast, slow, values, nan=True)
        bad = sum(e is not None for e in errors)
        assert 0 < bad < len(values)
        assert any("bad UTF-8" in e for e in errors if e) and any("corrupt" in e for e in errors if e)


def test_the_confluent_framing_on_the_compiled_path():
    """Message indexes [2] and [0] (one byte) on the compiled path; other forms, unknown ids, a bad magic byte, short
    headers and indexes naming another message on protobuf's path: every row in its place, the same errors."""
    spec = ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click", schema_ids={3: DESC})
    fast, slow = both(spec)
    click = fast._cls(user=5, page="/p", ms=7).SerializeToString()
    header = b"\x00" + (3).to_bytes(4, "big")
    values = [
        header + b"\x02\x04" + click,
        b"\x00" + (4).to_bytes(4, "big") + b"\x02\x04" + click,
        header + b"\x02\x04" + click[:-1],
        click,
        header + b"\x80",
        header,
        header + b"\x00" + click,  # [0]: Address
        header + b"\x04\x04\x00" + click,  # [2, 0]
        header + b"\x02\x04" + b"\x12\x02\xff\xfe",
        None,
        header + b"\x02\x04" + click,
    ]
    errors = same(fast, slow, pa.array(values, pa.binary()))
    assert errors[2] == (
        "protobuf: the message at byte 7: Error parsing message with type 'shop.v1.Click': Wire format was corrupt"
    )
    assert errors[0] is None and errors[-1] is None and all(e is not None for e in errors[1:-1])
    single = ValueSpec("protobuf", schema_file=os.path.join(DATA, "click_v2.proto"), wire="confluent")
    fast, slow = both(single)
    same(fast, slow, pa.array([header + b"\x00" + click, header + b"\x02\x02" + click], pa.binary()))


def test_messages_the_compiled_path_does_not_take_stay_on_protobufs(tmp_path):
    """proto2 (closed enums, defaults, unchecked strings), Struct (JSON text) and field numbers past 4096: protobuf's
    parser, chosen once per decoder; and every message when the compiled core is off."""
    cases = {
        "p2.proto": 'syntax = "proto2";\nmessage A { optional int32 a = 1 [default = 5]; }\n',
        "js.proto": 'syntax = "proto3";\nimport "google/protobuf/struct.proto";\n'
        "message A { google.protobuf.Struct s = 1; }\n",
        "far.proto": 'syntax = "proto3";\nmessage A { int32 a = 5000; }\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        decoder = decoder_for(ValueSpec("protobuf", schema_file=str(tmp_path / name)))
        assert isinstance(decoder, ProtobufDecoder) and not decoder.fast, name
        assert decoder.decode(pa.array([b""], pa.binary())).bad.tolist() == [False]
    with native.use_pure():
        assert not decoder_for(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click")).fast
