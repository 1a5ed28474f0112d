"""Schema evolution of typed tables: the changes a table follows (evolve) and a batch decoded with the newer schema
put into the table's columns (conform), on schemas of all three formats (tank_log.values.evolve)."""

from __future__ import annotations

import io
import json
import os

import fastavro
import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.errors import IncompatibleSchema, RunFailed
from tank_log.values import ValueSpec, decoder_for, evolve
from tank_log.values.evolve import conform

DATA = os.path.join(ROOT, "tests", "data", "values")


def test_an_avro_schema_with_an_alias_a_widened_and_an_added_field_evolves_the_table():
    v1 = decoder_for(ValueSpec("avro", schema_file=os.path.join(DATA, "small.avsc")))
    v2 = decoder_for(ValueSpec("avro", schema_file=os.path.join(DATA, "small_v2.avsc")))
    merged = evolve(v1.arrow_type, v2.arrow_type)
    assert [(f.name, f.type, f.nullable) for f in merged] == [
        ("user", pa.int64(), False),  # renamed to user_id with alias "user": the same column, its name kept
        ("page", pa.string(), False),
        ("ms", pa.int64(), False),  # int → long
        ("referrer", pa.string(), True),  # added
    ]
    assert evolve(merged, v2.arrow_type) == merged  # evolving again changes nothing
    with open(os.path.join(DATA, "small_v2.avsc"), encoding="utf-8") as fh:
        schema = fastavro.parse_schema(json.load(fh))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, {"user_id": 5, "page": "/p", "ms": 2**40, "referrer": None})
    decoded = v2.decode(pa.array([out.getvalue(), b"\x01"], pa.binary()))
    rows = conform(decoded.columns, merged)
    assert rows.type == merged
    assert rows.to_pylist() == [{"user": 5, "page": "/p", "ms": 2**40, "referrer": None}, None]
    # the table's older batches (v1's type) conform too: the added column is null
    old = v1.decode(pa.array([b"\x02\x04/a\x04"], pa.binary()))  # user 1, page "/a", ms 2
    assert conform(old.columns, merged).to_pylist() == [{"user": 1, "page": "/a", "ms": 2, "referrer": None}]


def test_a_renamed_protobuf_field_is_the_same_column_by_number():
    v1 = decoder_for(ValueSpec("protobuf", schema_file=os.path.join(DATA, "shop.desc"), message="shop.v1.Click"))
    v2 = decoder_for(ValueSpec("protobuf", schema_file=os.path.join(DATA, "click_v2.proto")))
    merged = evolve(v1.arrow_type, v2.arrow_type)
    assert [(f.name, f.type) for f in merged] == [
        ("user", pa.int64()),
        ("page", pa.string()),
        ("ms", pa.int64()),
        ("referrer", pa.string()),
    ]
    decoded = v2.decode(pa.array([v1._cls(user=9, page="/q", ms=4).SerializeToString()], pa.binary()))
    assert conform(decoded.columns, merged).to_pylist() == [{"user": 9, "page": "/q", "ms": 4, "referrer": None}]


def test_nested_widening_removal_and_nullability():
    old = pa.struct(
        [
            pa.field("a", pa.int32(), nullable=False),
            pa.field("gone", pa.string(), nullable=False),
            pa.field("f", pa.float32()),
            pa.field("n", pa.int64()),
            pa.field("d", pa.decimal128(10, 2)),
            pa.field("s", pa.struct([pa.field("x", pa.int16())])),
            pa.field("l", pa.list_(pa.struct([pa.field("q", pa.int32())]))),
            pa.field("m", pa.map_(pa.string(), pa.int32())),
        ]
    )
    new = pa.struct(
        [
            pa.field("a", pa.int64()),
            pa.field("f", pa.float64()),
            pa.field("n", pa.int32()),  # narrowed: the column keeps int64
            pa.field("d", pa.decimal256(40, 2)),
            pa.field("s", pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.string(), nullable=False)])),
            pa.field("l", pa.list_(pa.struct([pa.field("q", pa.float64())]))),
            pa.field("m", pa.map_(pa.string(), pa.int64())),
        ]
    )
    merged = evolve(old, new)
    assert merged == pa.struct(
        [
            pa.field("a", pa.int64()),
            pa.field("gone", pa.string()),
            pa.field("f", pa.float64()),
            pa.field("n", pa.int64()),
            pa.field("d", pa.decimal256(40, 2)),
            pa.field("s", pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.string())])),
            pa.field("l", pa.list_(pa.struct([pa.field("q", pa.float64())]))),
            pa.field("m", pa.map_(pa.string(), pa.int64())),
        ]
    )
    batch = pa.array(
        [{"a": 1, "f": 0.5, "n": 3, "d": None, "s": {"x": 2, "y": "y"}, "l": [{"q": 1.5}], "m": [("k", 2**40)]}],
        type=new,
    )
    assert conform(batch, merged).to_pylist() == [
        {
            "a": 1,
            "gone": None,
            "f": 0.5,
            "n": 3,
            "d": None,
            "s": {"x": 2, "y": "y"},
            "l": [{"q": 1.5}],
            "m": [("k", 2**40)],
        }
    ]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            pa.struct([("address", pa.struct([("zip", pa.int32())]))]),
            pa.struct([("address", pa.struct([("zip", pa.string())]))]),
            "field address.zip: int32 cannot become string (not a compatible schema change)",
        ),
        (
            pa.struct([("lines", pa.list_(pa.struct([("qty", pa.int64())])))]),
            pa.struct([("lines", pa.list_(pa.struct([("qty", pa.bool_())])))]),
            "field lines[].qty: int64 cannot become bool (not a compatible schema change)",
        ),
        (
            pa.struct([("at", pa.timestamp("us", tz="UTC"))]),
            pa.struct([("at", pa.int64())]),
            "field at: timestamp[us, tz=UTC] cannot become int64 (not a compatible schema change)",
        ),
        (
            pa.struct([("d", pa.decimal128(10, 2))]),
            pa.struct([("d", pa.decimal128(10, 3))]),
            "field d: decimal128(10, 2) cannot become decimal128(10, 3) (not a compatible schema change)",
        ),
        (
            pa.struct([("tags", pa.list_(pa.string()))]),
            pa.struct([("tags", pa.string())]),
            "field tags: list<item: string> cannot become string (not a compatible schema change)",
        ),
    ],
)
def test_an_incompatible_change_names_the_field_and_both_types(old, new, message):
    with pytest.raises(IncompatibleSchema) as err:
        evolve(old, new)
    assert str(err.value) == message and isinstance(err.value, RunFailed)  # that topic's export stops: exit 1
    assert (err.value.old_type, err.value.new_type) != (None, None) and err.value.field == message.split()[1][:-1]
