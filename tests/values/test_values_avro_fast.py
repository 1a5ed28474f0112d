"""The compiled Avro path (`_avro_fast.pyx`) against fastavro's: the same values, written by fastavro's own writer or
broken by hand, decoded by both paths, give the same columns, the same bad rows and errors at the same bytes."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import os
import random

import fastavro
import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.format import native
from tank_log.values import ValueSpec, decoder_for
from tank_log.values.avro import AvroDecoder

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled core is not built")

DATA = os.path.join(ROOT, "tests", "data", "values")
UTC = dt.UTC
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
INNER = {
    "type": "record",
    "name": "Inner",
    "fields": [{"name": "a", "type": ["null", "string"]}, {"name": "z", "type": ["int", "null"]}],
}
ROW = {
    "type": "record",
    "name": "Row",
    "namespace": "t",
    "fields": [
        {"name": "n", "type": "null"},
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "y", "type": "bytes"},
        {"name": "x", "type": {"type": "fixed", "name": "F3", "size": 3}},
        {"name": "e", "type": COLOR},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "lus", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "inner", "type": INNER},
        {"name": "maybe", "type": ["null", "Inner"]},
        {"name": "oi", "type": ["null", "long"]},
        {"name": "oe", "type": ["null", "Color"]},
        {"name": "ots", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    ],
}
FIRST = {
    "n": None,
    "b": True,
    "i": -(2**31),
    "l": 2**63 - 1,
    "f": 1.5,
    "d": -math.inf,
    "s": "héllo ✓ 𝄞",
    "y": b"\x00\xff",
    "x": b"abc",
    "e": "BLUE",
    "day": dt.date(1, 1, 1),
    "ms": dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    "us": dt.datetime(1, 1, 1, tzinfo=UTC),
    "lms": dt.datetime(1969, 12, 31, 23, 59, 59, 999000),
    "lus": dt.datetime(2024, 3, 1, 12, 0, 0, 7),
    "id": "0b5d3f3e-7c1a-4e5b-9d2f-2a6b8c9d0e1f",
    "inner": {"a": "x", "z": None},
    "maybe": {"a": None, "z": 2**31 - 1},
    "oi": -(2**63),
    "oe": "RED",
    "ots": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
}
SECOND = {
    **FIRST,
    "b": False,
    "i": 0,
    "l": -1,
    "f": -0.0,
    "d": 1e300,
    "s": "",
    "y": b"",
    "e": "RED",
    "day": dt.date(9999, 12, 31),
    "inner": {"a": None, "z": -5},
    "maybe": None,
    "oi": None,
    "oe": None,
    "ots": None,
}


def both(tmp_path, schema: dict, **spec: object) -> tuple[AvroDecoder, AvroDecoder]:
    """The compiled path's decoder and fastavro's, on the same spec."""
    path = tmp_path / "reader.avsc"
    path.write_text(json.dumps(schema))
    value_spec = ValueSpec("avro", schema_file=str(path), **spec)
    fast = decoder_for(value_spec)
    with native.use_pure():
        slow = decoder_for(value_spec)
    assert isinstance(fast, AvroDecoder) and isinstance(slow, AvroDecoder)
    assert fast.fast and not slow.fast
    return fast, slow


def encode(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def same(fast: AvroDecoder, slow: AvroDecoder, values: pa.Array) -> list[str | None]:
    """Decode with both paths, check they agree (a bad value: the same byte; the same words where fastavro's path
    has words for the rule); the errors."""
    a, b = fast.decode(values), slow.decode(values)
    assert a.columns.type == b.columns.type == fast.arrow_type
    assert a.columns.to_pylist() == b.columns.to_pylist()
    assert a.bad.tolist() == b.bad.tolist()
    assert a.schema_ids.to_pylist() == b.schema_ids.to_pylist()
    for mine, theirs in zip(a.errors.to_pylist(), b.errors.to_pylist(), strict=True):
        assert (mine is None) == (theirs is None)
        if mine is None or theirs is None:
            continue
        if "truncated" in theirs or "left after" in theirs or not theirs.startswith("avro: byte "):
            assert mine == theirs or mine.startswith("avro: not representable in its column")
        else:
            assert mine.split(":")[:2] == theirs.split(":")[:2], (mine, theirs)
    return a.errors.to_pylist()


def test_every_type_the_compiled_path_takes_decodes_as_fastavro_does(tmp_path):
    """Extremes of every type (int and long bounds, the first and last day and microsecond Python can hold), nulls
    at every level, a named type used twice; in a sliced array and as large_binary too."""
    fast, slow = both(tmp_path, ROW)
    values = pa.array([encode(ROW, FIRST), encode(ROW, SECOND), None, encode(ROW, FIRST)], pa.binary())
    errors = same(fast, slow, values)
    assert errors[2] == "avro: no value (null)"
    rows = fast.decode(values).columns.to_pylist()
    assert rows[0] == rows[3] and rows[0]["s"] == FIRST["s"] and rows[1]["maybe"] is None
    same(fast, slow, values.slice(1))
    same(fast, slow, values.cast(pa.large_binary()))
    same(fast, slow, pa.array([], pa.binary()))


BAD = {
    "type": "record",
    "name": "Bad",
    "fields": [
        {"name": "e", "type": COLOR},
        {"name": "o", "type": ["null", "long"]},
        {"name": "s", "type": "string"},
        {"name": "i", "type": "int"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def zigzag(v: int) -> bytes:
    raw, out = (v << 1) ^ (v >> 63), bytearray()
    while raw > 0x7F:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def test_bad_values_are_bad_in_both_paths_at_the_same_byte(tmp_path):
    """Truncated, bytes left over, a varint that does not end, a union branch and an enum index out of range, bad
    UTF-8, a negative length, an int, a date and a timestamp out of range: each value alone is bad."""
    fast, slow = both(tmp_path, BAD)
    good = encode(BAD, {"e": "GREEN", "o": 5, "s": "ab", "i": 1, "day": dt.date(1970, 1, 1), "ms": 0})
    assert good == b"\x02\x02\x0a\x04ab\x02\x00\x00"
    tail = b"\x04ab\x02\x00\x00"
    values = [
        good,
        good[:-1],  # truncated
        b"",
        good + b"\x00",  # one byte left over
        b"\x02\x02" + b"\x80" * 5,  # a varint that runs to the end
        b"\x02\x04\x0a" + tail,  # union branch 2
        b"\x06\x02\x0a" + tail,  # enum index 3
        b"\x02\x00\x04\xff\xfe\x02\x00\x00",  # not UTF-8
        b"\x02\x00\x06\xed\xa0\x80\x02\x00\x00",  # a surrogate: not UTF-8
        b"\x02\x00\x14ab\x02\x00\x00",  # length 10, 2 bytes there
        b"\x02\x00\x04ab" + zigzag(2**31) + b"\x00\x00",  # int out of range
        b"\x02\x00\x04ab\x02" + zigzag(2932897) + b"\x00",  # the day after 9999-12-31
        b"\x02\x00\x04ab\x02\x00" + zigzag(253402300800000),  # the millisecond after 9999-12-31
        b"\x02\x00\x04ab\x02\x00" + zigzag(-62135596800001),  # the millisecond before 0001-01-01
        good,
    ]
    errors = same(fast, slow, pa.array(values, pa.binary()))
    assert errors[0] is None and errors[-1] is None and all(e is not None for e in errors[1:-1])
    assert errors[1] == f"avro: byte {len(good) - 1}: truncated: the value ends inside a field"
    assert errors[3] == f"avro: byte {len(good)}: 1 bytes left after the record"
    assert errors[5] == "avro: byte 2: Bad.o: union branch 2: the union has 2 branches"
    assert errors[6] == "avro: byte 1: Bad.e: enum index 3: the enum has 3 symbols"
    assert errors[7].startswith("avro: byte 5: Bad.s: 'utf-8' codec can't decode byte 0xff in position 0")
    assert errors[10] == "avro: not representable in its column: Bad.i: 2147483648 is out of the int range"


def test_a_varint_of_more_than_64_bits_and_a_negative_length_are_named(tmp_path):
    """fastavro's path reads an 11-byte varint as some number (a wrapped one), and a negative length as the rest
    of the value (then truncated); the compiled path names both where they are."""
    fast, slow = both(tmp_path, BAD)
    values = pa.array([b"\x02\x02" + b"\xff" * 10 + b"\x01" + b"\x04ab\x02\x00\x00", b"\x02\x00\x03\x02\x00\x00"])
    out = fast.decode(values)
    assert out.bad.tolist() == [True, True] and slow.decode(values).bad.tolist() == [False, True]
    assert out.errors.to_pylist() == [
        "avro: byte 12: Bad.o: a varint of more than 64 bits",
        "avro: byte 3: Bad.s: a negative length -2",
    ]


def test_values_by_schema_id_mix_both_paths_in_their_places(tmp_path):
    """Id 2 is the reader's schema (compiled path), id 1 an older writer's (fastavro resolves it); with null
    values, a bad magic byte, a short header and an unknown id between them: every row in its place."""
    small, small_v2 = os.path.join(DATA, "small.avsc"), os.path.join(DATA, "small_v2.avsc")
    with open(small_v2, encoding="utf-8") as fh:
        reader = json.load(fh)
    fast, slow = both(tmp_path, reader, schema_ids={1: small, 2: small_v2})
    with open(small, encoding="utf-8") as fh:
        writer = json.load(fh)
    old = encode(writer, {"user": 7, "page": "/old", "ms": 3})
    new = encode(reader, {"user_id": 8, "page": "/new", "ms": 2**40, "referrer": "r"})

    def framed(schema_id: int, payload: bytes) -> bytes:
        return b"\x00" + schema_id.to_bytes(4, "big", signed=True) + payload

    values = [framed(2, new), framed(1, old), None, framed(3, old), b"\x01" + framed(2, new)[1:], b"\x00\x00"]
    values += [framed(2, new[:-1]), framed(1, old), framed(-1, new), framed(2, new)]
    errors = same(fast, slow, pa.array(values, pa.binary()))
    assert errors[3] == "avro: bytes 1-4: schema id 3 is not in the configured schema ids or registry"
    rows = fast.decode(pa.array(values, pa.binary())).columns.to_pylist()
    assert rows[0] == rows[9] == {"user_id": 8, "page": "/new", "ms": 2**40, "referrer": "r"}
    assert rows[1] == rows[7] == {"user_id": 7, "page": "/old", "ms": 3, "referrer": None}


def test_schemas_the_compiled_path_does_not_take_stay_on_fastavros(tmp_path):
    """Arrays, maps, decimals, times and unions of several types: fastavro's path, chosen once per decoder."""
    assert not decoder_for(ValueSpec("avro", schema_file=os.path.join(DATA, "all_types.avsc"))).fast
    for field in (
        {"type": "array", "items": "long"},
        {"type": "map", "values": "long"},
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        {"type": "int", "logicalType": "time-millis"},
        ["null", "long", "string"],
        ["long", "string"],
    ):
        path = tmp_path / "r.avsc"
        path.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "f", "type": field}]}))
        assert not decoder_for(ValueSpec("avro", schema_file=str(path))).fast
    assert decoder_for(ValueSpec("avro", schema_file=os.path.join(DATA, "small.avsc"))).fast


def test_random_damage_gives_the_same_rows_in_one_batch(tmp_path):
    """2,000 values with 1-3 random bytes changed, in one batch (bad rows between good ones roll their columns
    back): every value is bad on both paths or good on both with the same row; the one difference allowed is a
    varint past 64 bits, which fastavro wraps and the compiled path names."""
    fast, slow = both(tmp_path, ROW)
    rng = random.Random(2)
    values = []
    for trial in range(2000):
        b = bytearray(encode(ROW, SECOND if trial % 2 else FIRST))
        for _ in range(1 + trial % 3):
            b[rng.randrange(len(b))] = rng.randrange(256)
        values.append(bytes(b))
    a, b_ = fast.decode(pa.array(values, pa.binary())), slow.decode(pa.array(values, pa.binary()))
    mine, theirs = a.columns.to_pylist(), b_.columns.to_pylist()
    errors = a.errors.to_pylist()
    for i in range(len(values)):
        if a.bad[i] and not b_.bad[i]:
            assert "a varint of more than 64 bits" in errors[i], errors[i]
            continue
        assert a.bad[i] == b_.bad[i], (i, errors[i], b_.errors[i])
        assert repr(mine[i]) == repr(theirs[i])  # repr: a damaged double may be a NaN
    assert 0 < int(a.bad.sum()) < len(values)
