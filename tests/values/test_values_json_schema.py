"""JSON values with a JSON Schema: the Arrow type derived from the schema, values converted to it, and values that
are not JSON or fail the schema named with the validator's path and rule (tank_log.values.json_schema)."""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.errors import UsageError, ValueSchemaError
from tank_log.values import ValueSpec, decoder_for

SCHEMA = os.path.join(ROOT, "tests", "data", "values", "order.schema.json")


def test_a_json_schema_becomes_its_arrow_type():
    t = decoder_for(ValueSpec("json", schema_file=SCHEMA)).arrow_type
    address = pa.struct([pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.int64())])
    line = pa.struct([pa.field("sku", pa.string(), nullable=False), pa.field("qty", pa.int64())])
    expected = {
        "id": (pa.int64(), False),
        "total": (pa.float64(), False),
        "paid": (pa.bool_(), False),
        "at": (pa.timestamp("us", tz="UTC"), False),
        "day": (pa.date32(), True),  # not required: nullable
        "note": (pa.string(), True),
        "status": (pa.string(), True),
        "address": (address, True),
        "tags": (pa.list_(pa.field("element", pa.string(), nullable=False)), True),
        "lines": (pa.list_(pa.field("element", line, nullable=False)), True),
        "attrs": (pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)), True),
        "code": (pa.struct([("integer", pa.int64()), ("string", pa.string())]), True),
        "extra": (pa.string(), True),  # no type: the JSON text
    }
    assert [f.name for f in t] == list(expected)
    for name, (typ, nullable) in expected.items():
        assert (t.field(name).type, t.field(name).nullable) == (typ, nullable), name


@pytest.mark.parametrize("ignore_timezone", [False, True])
def test_json_values_convert_and_the_bad_ones_name_path_and_rule(ignore_timezone, monkeypatch):
    """Also where pyspark.pandas has set PYARROW_IGNORE_TIMEZONE (a Spark Python worker): pyarrow then drops an
    aware datetime's offset, which read 23:59+01:00 as 23:59 UTC."""
    if ignore_timezone:
        monkeypatch.setenv("PYARROW_IGNORE_TIMEZONE", "1")
    decoder = decoder_for(ValueSpec("json", schema_file=SCHEMA))
    full = {
        "id": 7,
        "total": 12,
        "paid": True,
        "at": "2024-02-29T23:59:59.123456+01:00",
        "day": "2024-02-29",
        "note": None,
        "status": "PAID",
        "address": {"city": "Oslo", "zip": None},
        "tags": ["a"],
        "lines": [{"sku": "s", "qty": 2}, {"sku": "t"}],
        "attrs": {"x": 1},
        "code": "A1",
        "extra": {"deep": [1, "two"]},
        "ignored": "a property the schema does not name",
    }
    minimal = {"id": 1.0, "total": 0.5, "paid": False, "at": "1969-12-31T23:59:59Z", "code": 3}
    values = [json.dumps(full), json.dumps(minimal)]
    values += [
        json.dumps({**minimal, "id": 0}),
        json.dumps({**minimal, "lines": [{"qty": 1}]}),
        '{"id": 1,',
        json.dumps({**minimal, "at": "yesterday"}),
        json.dumps({**minimal, "id": 2**70}),
        b"\xff",
    ]
    out = decoder.decode(pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary()))
    assert out.bad.tolist() == [False, False, True, True, True, True, True, True]
    first, second = out.columns.to_pylist()[:2]
    assert first == {
        "id": 7,
        "total": 12.0,
        "paid": True,
        "at": dt.datetime(2024, 2, 29, 22, 59, 59, 123456, tzinfo=dt.UTC),
        "day": dt.date(2024, 2, 29),
        "note": None,
        "status": "PAID",
        "address": {"city": "Oslo", "zip": None},
        "tags": ["a"],
        "lines": [{"sku": "s", "qty": 2}, {"sku": "t", "qty": None}],
        "attrs": [("x", 1)],
        "code": {"integer": None, "string": "A1"},
        "extra": '{"deep":[1,"two"]}',
    }
    assert second["id"] == 1 and second["code"] == {"integer": 3, "string": None} and second["address"] is None
    errors = out.errors.to_pylist()
    assert errors[2] == "json: $.id: 0 is less than the minimum of 1 (minimum)"
    assert errors[3] == "json: $.lines[0]: 'sku' is a required property (required)"
    assert errors[4] == "json: line 1 column 10: not JSON: Expecting property name enclosed in double quotes"
    assert errors[5] == "json: $.at: 'yesterday' is not a 'date-time' (format)"
    assert errors[6].startswith("json: not representable in its column: ")  # beyond int64
    assert errors[7] == "json: byte 0: not UTF-8"


def test_a_missing_or_bad_json_schema_is_a_usage_error(tmp_path):
    with pytest.raises(ValueSchemaError, match=r"nope\.json: JSON Schema file not found") as err:
        decoder_for(ValueSpec("json", schema_file=str(tmp_path / "nope.json")))
    assert isinstance(err.value, UsageError)
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": {"a": {"type": 5}}}')
    with pytest.raises(ValueSchemaError, match=r"bad\.json: not a valid JSON Schema: \$\.properties\.a\.type: 5"):
        decoder_for(ValueSpec("json", schema_file=str(tmp_path / "bad.json")))
    (tmp_path / "tree.json").write_text(
        '{"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}'
    )
    with pytest.raises(ValueSchemaError, match=r"tree\.json: \$ref # is recursive"):
        decoder_for(ValueSpec("json", schema_file=str(tmp_path / "tree.json")))
    (tmp_path / "list.json").write_text('{"type": "array"}')
    with pytest.raises(ValueSchemaError, match=r"list\.json: the top level must be an object"):
        decoder_for(ValueSpec("json", schema_file=str(tmp_path / "list.json")))


def test_a_value_spec_is_a_key():
    """Frozen and hashable (its schema ids too), so a process can keep one decoder per spec."""
    spec = ValueSpec("avro", "a.avsc", schema_ids={1: "a.avsc", 2: "b.avsc"})
    same = ValueSpec("avro", "a.avsc", schema_ids={2: "b.avsc", 1: "a.avsc"})
    assert {spec: "decoder"}[same] == "decoder"
    assert hash(spec) != hash(ValueSpec("avro", "a.avsc", schema_ids={1: "a.avsc"}))


def test_the_formats_without_a_schema():
    values = pa.array([b'{"a": 1}', b"\xff", b"plain"], pa.binary())
    assert decoder_for(ValueSpec("binary")).decode(values).columns.to_pylist() == [
        {"value": b'{"a": 1}'},
        {"value": b"\xff"},
        {"value": b"plain"},
    ]
    utf8 = decoder_for(ValueSpec("utf8")).decode(values)
    assert utf8.bad.tolist() == [False, True, False] and utf8.errors.to_pylist()[1] == "utf8: byte 0: not UTF-8"
    text = decoder_for(ValueSpec("utf8")).decode(pa.array([b"a", None, "é".encode()], pa.binary())[1:])  # a slice
    assert text.columns.to_pylist() == [None, {"value": "é"}] and text.bad.tolist() == [True, False]
    assert text.errors.to_pylist() == ["utf8: no value (null)", None] and text.schema_ids.null_count == 2
    large = decoder_for(ValueSpec("binary")).decode(values.cast(pa.large_binary()))  # large_binary batches too
    assert large.columns.to_pylist()[2] == {"value": b"plain"}
    empty = decoder_for(ValueSpec("avro", schema_file=os.path.join(os.path.dirname(SCHEMA), "small.avsc")))
    nothing = empty.decode(pa.array([], pa.binary()))
    assert (len(nothing.columns), len(nothing.bad), len(nothing.errors), len(nothing.schema_ids)) == (0, 0, 0, 0)
    assert nothing.columns.type == empty.arrow_type
    with pytest.raises(ValueSchemaError, match=r"^unknown value format 'xml' \(binary, utf8, json, avro, protobuf\)$"):
        decoder_for(ValueSpec("xml"))  # type: ignore[arg-type]
    js = decoder_for(ValueSpec("json")).decode(values)
    assert js.bad.tolist() == [False, True, True] and js.columns.to_pylist()[0] == {"value": '{"a": 1}'}
    assert js.errors.to_pylist()[2] == "json: line 1 column 1: not JSON: Expecting value"


FAST_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["n", "s"],
    "additionalProperties": False,
    "properties": {
        "n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
        "x": {"type": "number", "maximum": 1.5, "exclusiveMinimum": -1},
        "s": {"type": "string", "minLength": 2, "maxLength": 3},
        "e": {"enum": [1, "a", None, [1, 2], {"k": True}]},
        "c": {"const": False},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "m": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "r": {"$ref": "#/$defs/R"},
        "u": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
    },
    "$defs": {"R": {"type": "object", "properties": {"z": {"type": ["string", "null"]}}}},
}
FAST_VALUES = [
    {"n": 0, "s": "ab"},
    {"n": 9.0, "s": "abc"},  # 1.0-style floats are integers since draft 6
    {"n": True, "s": "ab"},  # a boolean is no integer
    {"n": 10, "s": "ab"},
    {"n": -1, "s": "ab"},
    {"n": 1, "s": "a"},
    {"n": 1, "s": "abcd"},
    {"n": 1, "s": "éé"},  # two code points
    {"n": 1},
    {"n": 1, "s": "ab", "other": 1},
    {"n": 1, "s": "ab", "x": 1.5},
    {"n": 1, "s": "ab", "x": 1.6},
    {"n": 1, "s": "ab", "x": -1},
    {"n": 1, "s": "ab", "x": False},
    {"n": 1, "s": "ab", "e": 1.0},
    {"n": 1, "s": "ab", "e": True},  # true is not 1
    {"n": 1, "s": "ab", "e": [1, 2]},
    {"n": 1, "s": "ab", "e": {"k": 1}},
    {"n": 1, "s": "ab", "e": None},
    {"n": 1, "s": "ab", "c": 0},
    {"n": 1, "s": "ab", "c": False},
    {"n": 1, "s": "ab", "at": "2024-01-01T00:00:00Z"},
    {"n": 1, "s": "ab", "at": "2024-01-01 00:00"},
    {"n": 1, "s": "ab", "tags": []},
    {"n": 1, "s": "ab", "tags": ["a", 1]},
    {"n": 1, "s": "ab", "tags": ["a", "b", "c"]},
    {"n": 1, "s": "ab", "m": {"a": True, "b": 1}},
    {"n": 1, "s": "ab", "r": {"z": None}},
    {"n": 1, "s": "ab", "r": {"z": 5}},
    {"n": 1, "s": "ab", "u": None},
    {"n": 1, "s": "ab", "u": "x"},
    [],
    "text",
]


def test_the_fast_check_accepts_only_what_jsonschema_accepts():
    """The fast check of the common keywords (json_fast) agrees with jsonschema on every tricky value; a schema
    with a keyword it does not handle gets none (jsonschema alone)."""
    import jsonschema

    from tank_log.values.json_fast import compile_check

    for schema, draft in (
        (FAST_SCHEMA, jsonschema.Draft202012Validator),
        ({"type": "integer"}, jsonschema.Draft4Validator),
    ):
        validator = draft(schema, format_checker=draft.FORMAT_CHECKER)
        check = compile_check(schema, validator.format_checker, draft.__name__)
        assert check is not None
        for value in FAST_VALUES + [1.0, 1, True]:
            assert check(value) == validator.is_valid(value), (draft.__name__, value)
    for unsupported in ({"patternProperties": {"^a": {}}}, {"oneOf": [{}]}, {"items": [{}]}, {"$ref": "#anchor"}):
        assert compile_check(unsupported, None, "Draft202012Validator") is None
