"""Avro values: every Avro type and logical type into Arrow, the Confluent wire format, schema resolution by id, and
bad values named row by row (tank_log.values.avro). The values are written by fastavro's own writer."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
import shutil

import fastavro
import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.errors import UsageError, ValueSchemaError
from tank_log.values import ValueSpec, decoder_for

DATA = os.path.join(ROOT, "tests", "data", "values")
ALL_TYPES = os.path.join(DATA, "all_types.avsc")
SMALL = os.path.join(DATA, "small.avsc")
SMALL_V2 = os.path.join(DATA, "small_v2.avsc")
UTC = dt.UTC


def encode(schema_path: str, record: dict) -> bytes:
    with open(schema_path, encoding="utf-8") as fh:
        schema = fastavro.parse_schema(json.load(fh))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


ADDRESS = {"city": "Oslo", "zip": 150}
ORDER = {
    "flag": True,
    "i32": -(2**31),
    "i64": 2**62,
    "f32": 1.5,
    "f64": -2.25,
    "raw": b"\x00\xff",
    "text": "héllo",
    "nothing": None,
    "status": "PAID",
    "digest": b"abcd",
    "tags": ["a", "b"],
    "attrs": {"x": 1, "y": -2},
    "address": ADDRESS,
    "previous": {"city": "Bergen", "zip": None},
    "note": None,
    "choice": 7,
    "price": decimal.Decimal("12.34"),
    "big": decimal.Decimal("1234567890123456789012345678901234567.891"),
    "id": "0b5d3f3e-7c1a-4e5b-9d2f-2a6b8c9d0e1f",
    "day": dt.date(2024, 2, 29),
    "tod_ms": dt.time(23, 59, 58, 999000),
    "tod_us": dt.time(0, 0, 1, 123456),
    "at_ms": dt.datetime(2024, 3, 1, 12, 0, 0, 5000, tzinfo=UTC),
    "at_us": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "local_ms": dt.datetime(2024, 3, 1, 12, 0, 0, 5000),
    "local_us": dt.datetime(2024, 3, 1, 12, 0, 0, 7),
    "maybe_at": dt.datetime(2030, 1, 1, tzinfo=UTC),
    "lines": [{"sku": "s-1", "qty": 2}, {"sku": "s-2", "qty": 0}],
}


def test_every_avro_type_and_logical_type_becomes_its_arrow_type():
    decoder = decoder_for(ValueSpec("avro", schema_file=ALL_TYPES))
    t = decoder.arrow_type
    address = pa.struct([pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.int32())])
    expected = {
        "flag": (pa.bool_(), False),
        "i32": (pa.int32(), False),
        "i64": (pa.int64(), False),
        "f32": (pa.float32(), False),
        "f64": (pa.float64(), False),
        "raw": (pa.binary(), False),
        "text": (pa.string(), False),
        "nothing": (pa.null(), True),
        "status": (pa.string(), False),
        "digest": (pa.binary(), False),
        "tags": (pa.list_(pa.field("element", pa.string(), nullable=False)), False),
        "attrs": (pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)), False),
        "address": (address, False),
        "previous": (address, True),
        "note": (pa.string(), True),
        "choice": (pa.struct([("long", pa.int64()), ("string", pa.string()), ("Address", address)]), True),
        "price": (pa.decimal128(10, 2), False),
        "big": (pa.decimal256(40, 3), False),
        "id": (pa.string(), False),
        "day": (pa.date32(), False),
        "tod_ms": (pa.time32("ms"), False),
        "tod_us": (pa.time64("us"), False),
        "at_ms": (pa.timestamp("us", tz="UTC"), False),
        "at_us": (pa.timestamp("us", tz="UTC"), False),
        "local_ms": (pa.timestamp("us"), False),
        "local_us": (pa.timestamp("us"), False),
        "maybe_at": (pa.timestamp("us", tz="UTC"), True),
    }
    assert [f.name for f in t] == [*expected, "lines"]  # the schema's field order
    for name, (typ, nullable) in expected.items():
        assert (t.field(name).type, t.field(name).nullable) == (typ, nullable), name
    line = pa.struct([pa.field("sku", pa.string(), nullable=False), pa.field("qty", pa.int32(), nullable=False)])
    assert t.field("lines").type == pa.list_(pa.field("element", line, nullable=False))


def test_every_avro_value_decodes_to_the_value_written():
    decoder = decoder_for(ValueSpec("avro", schema_file=ALL_TYPES))
    second = {**ORDER, "choice": "seven", "note": "n", "previous": None, "maybe_at": None, "attrs": {}, "tags": []}
    third = {**ORDER, "choice": {"city": "Tromsø", "zip": 9000}}
    fourth = {**ORDER, "choice": None}
    values = pa.array([encode(ALL_TYPES, r) for r in (ORDER, second, third, fourth)], pa.binary())
    out = decoder.decode(values)
    assert out.bad.tolist() == [False] * 4 and out.errors.null_count == 4 and out.schema_ids.null_count == 4
    assert out.columns.type == decoder.arrow_type
    rows = out.columns.to_pylist()
    first = rows[0]
    for name in ("flag", "i32", "i64", "f32", "f64", "raw", "text", "status", "digest", "tags", "address"):
        assert first[name] == ORDER[name], name
    assert sorted(first["attrs"]) == [("x", 1), ("y", -2)]
    assert first["price"] == ORDER["price"] and first["big"] == ORDER["big"] and first["id"] == ORDER["id"]
    assert (first["day"], first["tod_ms"], first["tod_us"]) == (ORDER["day"], ORDER["tod_ms"], ORDER["tod_us"])
    assert first["at_ms"] == ORDER["at_ms"] and first["at_us"] == ORDER["at_us"]  # a pre-1970 instant too
    assert first["local_ms"] == ORDER["local_ms"] and first["local_us"] == ORDER["local_us"]
    assert first["maybe_at"] == ORDER["maybe_at"] and first["note"] is None
    assert first["lines"] == ORDER["lines"] and first["previous"] == {"city": "Bergen", "zip": None}
    # a union of several types: exactly the branch written is set
    assert [r["choice"] for r in rows] == [
        {"long": 7, "string": None, "Address": None},
        {"long": None, "string": "seven", "Address": None},
        {"long": None, "string": None, "Address": {"city": "Tromsø", "zip": 9000}},
        None,
    ]
    assert (rows[1]["previous"], rows[1]["maybe_at"], rows[1]["attrs"], rows[1]["tags"]) == (None, None, [], [])


def test_bad_avro_values_are_named_row_by_row_and_the_rest_decode():
    decoder = decoder_for(ValueSpec("avro", schema_file=SMALL))
    good = encode(SMALL, {"user": 1, "page": "/a", "ms": 5})
    values = pa.array([good, good[:-2], good + b"\x00\x01", None, b"", good], pa.binary())
    out = decoder.decode(values)
    assert out.bad.tolist() == [False, True, True, True, True, False]
    errors = out.errors.to_pylist()
    assert errors[0] is None and errors[5] is None
    assert errors[1] == f"avro: byte {len(good) - 2}: truncated: the value ends inside a field"
    assert errors[2] == f"avro: byte {len(good)}: 2 bytes left after the record"
    assert errors[3] == "avro: no value (null)"
    assert errors[4].startswith("avro: byte 0: truncated")
    rows = out.columns.to_pylist()
    assert rows[1] is None and rows[0] == rows[5] == {"user": 1, "page": "/a", "ms": 5}


def test_the_confluent_wire_format_and_schema_resolution_by_id():
    """Id 1 is the old writer schema, id 2 the reader's (a renamed field through its alias, a widened int, an added
    optional field): both decode into the reader's columns."""
    spec = ValueSpec("avro", schema_file=SMALL_V2, schema_ids={1: SMALL, 2: SMALL_V2})
    decoder = decoder_for(spec)
    assert [f.name for f in decoder.arrow_type] == ["user_id", "page", "ms", "referrer"]
    old = encode(SMALL, {"user": 7, "page": "/old", "ms": 3})
    new = encode(SMALL_V2, {"user_id": 8, "page": "/new", "ms": 2**40, "referrer": "r"})
    values = pa.array(
        [framed(1, old), framed(2, new), framed(3, old), b"\x01" + framed(1, old)[1:], b"\x00\x00", old], pa.binary()
    )
    out = decoder.decode(values)
    assert out.columns.to_pylist()[:2] == [
        {"user_id": 7, "page": "/old", "ms": 3, "referrer": None},
        {"user_id": 8, "page": "/new", "ms": 2**40, "referrer": "r"},
    ]
    assert out.schema_ids.to_pylist()[:3] == [1, 2, 3]
    assert out.bad.tolist() == [False, False, True, True, True, True]
    errors = out.errors.to_pylist()
    assert errors[2] == "avro: bytes 1-4: schema id 3 is not in the configured schema ids or registry"
    assert errors[3] == "avro: byte 0: magic byte 0x01, the Confluent wire format has 0x00"  # wire auto + ids
    assert errors[4] == "avro: 2 bytes: shorter than the 5-byte Confluent header (magic byte, schema id)"
    assert out.schema_ids.to_pylist()[3:] == [None, None, None]
    # wire "plain": the same framed bytes are a plain value (here: bytes left over, bad); "confluent" with no ids:
    # every id decodes with the schema file
    plain = decoder_for(ValueSpec("avro", schema_file=SMALL, wire="plain")).decode(pa.array([framed(1, old), old]))
    assert plain.bad.tolist() == [True, False]
    confluent = decoder_for(ValueSpec("avro", schema_file=SMALL, wire="confluent"))
    out = confluent.decode(pa.array([framed(9, old), old], pa.binary()))
    assert out.bad.tolist() == [False, True] and out.schema_ids.to_pylist() == [9, None]
    assert out.errors.to_pylist()[1].startswith("avro: byte 0: magic byte 0x0e")


def test_a_writer_value_the_reader_cannot_take_is_bad_and_the_rest_resolve(tmp_path):
    """The writer's enum has a symbol the reader's lacks (no default): that value alone is bad."""

    def schema(symbols: list[str]) -> dict:
        kind = {"type": "enum", "name": "Kind", "symbols": symbols}
        return {"type": "record", "name": "R", "fields": [{"name": "k", "type": kind}, {"name": "n", "type": "int"}]}

    (tmp_path / "reader.avsc").write_text(json.dumps(schema(["A", "B"])))
    (tmp_path / "writer.avsc").write_text(json.dumps(schema(["A", "B", "C"])))
    spec = ValueSpec("avro", schema_file=str(tmp_path / "reader.avsc"), schema_ids={5: str(tmp_path / "writer.avsc")})
    decoder = decoder_for(spec)
    values = []
    for k, n in (("A", 1), ("C", 2), ("B", 3)):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema(["A", "B", "C"])), {"k": k, "n": n})
        values.append(framed(5, out.getvalue()))
    values.append(framed(5, out.getvalue()[:-1]))  # truncated
    out = decoder.decode(pa.array(values, pa.binary()))
    assert out.bad.tolist() == [False, True, False, True]
    assert out.columns.to_pylist() == [{"k": "A", "n": 1}, None, {"k": "B", "n": 3}, None]
    errors = out.errors.to_pylist()
    assert errors[1] == "avro: byte 1: C not found in reader symbol list Kind, known symbols: ['A', 'B']"
    assert errors[3] == "avro: byte 1: truncated: the value ends inside a field"


def test_a_value_arrow_cannot_hold_is_bad_not_the_batch(tmp_path):
    """A decimal with more digits than its precision: fastavro reads it, its column cannot hold it."""

    def schema(precision: int) -> dict:
        logical = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}
        return {"type": "record", "name": "R", "fields": [{"name": "d", "type": logical}]}

    (tmp_path / "d.avsc").write_text(json.dumps(schema(4)))
    decoder = decoder_for(ValueSpec("avro", schema_file=str(tmp_path / "d.avsc")))
    values = []
    for amount in ("12.34", "123456.78"):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema(20)), {"d": decimal.Decimal(amount)})
        values.append(out.getvalue())
    out = decoder.decode(pa.array(values, pa.binary()))
    assert out.bad.tolist() == [False, True]
    assert out.columns.to_pylist() == [{"d": decimal.Decimal("12.34")}, None]
    assert out.errors.to_pylist()[1].startswith("avro: not representable in its column: ")


def test_a_missing_or_bad_avro_schema_file_is_a_usage_error(tmp_path):
    with pytest.raises(ValueSchemaError, match=r"nope\.avsc: Avro schema file not found") as err:
        decoder_for(ValueSpec("avro", schema_file=str(tmp_path / "nope.avsc")))
    assert isinstance(err.value, UsageError)  # exit 2
    (tmp_path / "bad.avsc").write_text("{not json")
    with pytest.raises(ValueSchemaError, match=r"bad\.avsc: not an Avro schema \(JSON\)"):
        decoder_for(ValueSpec("avro", schema_file=str(tmp_path / "bad.avsc")))
    (tmp_path / "wrong.avsc").write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}')
    with pytest.raises(ValueSchemaError, match=r"wrong\.avsc: .*nope"):
        decoder_for(ValueSpec("avro", schema_file=str(tmp_path / "wrong.avsc")))
    (tmp_path / "loop.avsc").write_text(
        '{"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}'
    )
    with pytest.raises(ValueSchemaError, match=r"loop\.avsc: .*record Node is recursive"):
        decoder_for(ValueSpec("avro", schema_file=str(tmp_path / "loop.avsc")))
    shutil.copy(SMALL, tmp_path / "ok.avsc")
    with pytest.raises(ValueSchemaError, match=r"gone\.avsc: Avro schema file not found"):  # a writer's file too
        decoder_for(
            ValueSpec("avro", schema_file=str(tmp_path / "ok.avsc"), schema_ids={4: str(tmp_path / "gone.avsc")})
        )
    with pytest.raises(ValueSchemaError, match="a schema file"):
        decoder_for(ValueSpec("avro"))


TOP_LEVEL = [  # (a top level that is not a record, values of it)
    ("string", ["héllo", ""]),
    ("long", [-(2**63), 7]),
    ({"type": "array", "items": "int"}, [[1, 2], []]),
    ({"type": "map", "values": ["null", "double"]}, [{"a": 1.5, "b": None}, {}]),
    ({"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}, ["BLUE", "RED"]),
    (["null", "string"], [None, "x"]),
    (["long", "string"], [5, "five"]),
    ({"type": "fixed", "name": "F2", "size": 2}, [b"\x00\xff", b"ab"]),
]


def test_a_top_level_that_is_not_a_record_is_one_value_column(tmp_path):
    """A bare "string", an array, a map, an enum, unions and a fixed: one `value` column of the type (nullable when
    the type is), decoded alike on the compiled path (where it takes the type) and fastavro's, a bad value named;
    with writers' schemas by id, resolved as Avro resolves them (an int writer for a long reader)."""
    from tank_log.format import native

    for schema, data in TOP_LEVEL:
        path = tmp_path / "top.avsc"
        path.write_text(json.dumps(schema))
        decoders = [decoder_for(ValueSpec("avro", schema_file=str(path)))]
        with native.use_pure():
            decoders.append(decoder_for(ValueSpec("avro", schema_file=str(path))))
        nullable = isinstance(schema, list) and "null" in schema
        values = pa.array([_encode(schema, v) for v in data] + [b"\x80"])  # the last: a varint that does not end
        outs = [d.decode(values) for d in decoders]
        for d, out in zip(decoders, outs, strict=True):
            assert d.arrow_type.names == ["value"] and d.arrow_type.field("value").nullable == nullable, schema
            rows = out.columns.to_pylist()
            want = [{"value": v if not isinstance(v, dict) else sorted(v.items())} for v in data]
            if schema == ["long", "string"]:  # a union of several types: a struct of its branches
                want = [{"value": {"long": 5, "string": None}}, {"value": {"long": None, "string": "five"}}]
            assert rows[:2] == want and out.bad.tolist() == [False, False, True], schema
        errors = [out.errors.to_pylist()[2] for out in outs]  # at the same byte (fastavro's words may differ)
        assert errors[0].startswith("avro: byte 1: ") and errors[1].startswith("avro: byte 1: "), errors
    assert decoders[0].arrow_type == pa.struct([pa.field("value", pa.binary(), nullable=False)])
    fast_string = decoder_for(ValueSpec("avro", schema_file=_write(tmp_path, "s.avsc", "string")))
    assert getattr(fast_string, "fast") == native.compiled()  # noqa: B009 - the compiled path takes a bare string
    old, new = _write(tmp_path, "old.avsc", "int"), _write(tmp_path, "new.avsc", "long")
    decoder = decoder_for(ValueSpec("avro", schema_file=new, schema_ids={1: old, 2: new}))
    values = [b"\x00\x00\x00\x00\x01" + _encode("int", 3), b"\x00\x00\x00\x00\x02" + _encode("long", 2**40)]
    out = decoder.decode(pa.array(values, pa.binary()))
    assert out.columns.to_pylist() == [{"value": 3}, {"value": 2**40}] and not out.bad.any()


def _write(tmp_path, name: str, schema: object) -> str:
    (tmp_path / name).write_text(json.dumps(schema))
    return str(tmp_path / name)


def _encode(schema: object, value: object) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def test_only_unions_of_several_types_cost_a_conversion_per_value():
    """fastavro's output goes to Arrow as is unless a union of several types needs its branch named."""
    from tank_log.values.avro import converter

    with open(SMALL_V2, encoding="utf-8") as fh:
        assert converter(json.load(fh)) is None  # ["null", "string"]: a nullable column, no conversion
    with open(ALL_TYPES, encoding="utf-8") as fh:
        assert converter(json.load(fh)) is not None  # ["null", "long", "string", "Address"]
