"""Protobuf values: every field kind into Arrow, from a descriptor set or a .proto compiled at load, the Confluent
Protobuf framing, and bad values named row by row (tank_log.values.protobuf). The values are serialized by
protobuf's own message classes."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import tempfile

import pyarrow as pa
import pytest
from conftest import ROOT

from tank_log.errors import UsageError, ValueSchemaError
from tank_log.values import ValueSpec, decoder_for
from tank_log.values.protobuf import message_indexes
from tank_log.values.spec import NUMBER_KEY

DATA = os.path.join(ROOT, "tests", "data", "values")
DESC = os.path.join(DATA, "shop.desc")
PROTO = os.path.join(DATA, "shop.proto")
CLICK_V2 = os.path.join(DATA, "click_v2.proto")
UTC = dt.UTC


def order_decoder():
    return decoder_for(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Order"))


def test_every_protobuf_field_kind_becomes_its_arrow_type():
    t = order_decoder().arrow_type
    address = pa.struct([pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.int32(), nullable=False)])
    u64 = pa.decimal128(20, 0)
    expected = {
        "f64": (pa.float64(), False),
        "f32": (pa.float32(), False),
        "i32": (pa.int32(), False),
        "i64": (pa.int64(), False),
        "u32": (pa.int64(), False),
        "u64": (u64, False),
        "s32": (pa.int32(), False),
        "s64": (pa.int64(), False),
        "x32": (pa.int64(), False),
        "x64": (u64, False),
        "sx32": (pa.int32(), False),
        "sx64": (pa.int64(), False),
        "flag": (pa.bool_(), False),
        "text": (pa.string(), False),
        "raw": (pa.binary(), False),
        "status": (pa.string(), False),
        "address": (address, True),
        "tags": (pa.list_(pa.field("element", pa.string(), nullable=False)), False),
        "previous": (pa.list_(pa.field("element", address, nullable=False)), False),
        "attrs": (pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)), False),
        "by_zip": (pa.map_(pa.int32(), pa.field("value", address, nullable=False)), False),
        "card": (pa.string(), True),  # oneof members: each nullable
        "voucher": (pa.int64(), True),
        "note": (pa.string(), True),  # proto3 optional
        "at": (pa.timestamp("us", tz="UTC"), True),
        "took": (pa.duration("us"), True),
        "maybe_count": (pa.int64(), True),
        "maybe_text": (pa.string(), True),
        "maybe_flag": (pa.bool_(), True),
        "maybe_ratio": (pa.float64(), True),
        "history": (pa.list_(pa.field("element", pa.string(), nullable=False)), False),
        "kind": (pa.string(), False),
    }
    assert [f.name for f in t] == [*expected, "lines"]
    for name, (typ, nullable) in expected.items():
        assert (t.field(name).type, t.field(name).nullable) == (typ, nullable), name
    assert [t.field(i).metadata[NUMBER_KEY] for i in (0, 20, 32)] == [b"1", b"21", b"33"]
    # the .proto compiled at load gives the same columns as the descriptor set protoc built
    compiled = decoder_for(ValueSpec("protobuf", schema_file=PROTO, message="shop.v1.Order")).arrow_type
    assert compiled == t and [f.metadata for f in compiled] == [f.metadata for f in t]


def full_order(cls):
    m = cls(f64=1.5, f32=-0.25, i32=-(2**31), i64=-(2**63), u32=2**32 - 1, u64=2**64 - 1, s32=-7, s64=-(2**40))
    m.x32, m.x64, m.sx32, m.sx64 = 2**32 - 1, 2**63, -1, -(2**62)
    m.flag, m.text, m.raw, m.status = True, "héllo", b"\x00\xff", 2
    m.address.city, m.address.zip = "Oslo", 150
    m.tags.extend(["a", "b"])
    m.previous.add(city="Bergen", zip=5000)
    m.attrs["x"] = 1
    m.by_zip[9000].city = "Tromsø"
    m.voucher = 0  # a oneof member set to its default is set
    m.note = ""
    m.at.seconds, m.at.nanos = 1_700_000_000, 123_456_789
    m.took.seconds, m.took.nanos = 90, 500_000
    m.maybe_count.value = 0
    m.maybe_text.value = "t"
    m.history.extend([1, 2, 7])  # 7: a number the enum does not name (proto3 enums are open)
    m.kind = 1
    m.lines.add(sku="s-1", qty=3)
    return m


def test_every_protobuf_value_decodes_to_the_value_written():
    decoder = order_decoder()
    cls = decoder._cls
    empty = cls()
    out = decoder.decode(pa.array([full_order(cls).SerializeToString(), empty.SerializeToString()], pa.binary()))
    assert out.bad.tolist() == [False, False] and out.columns.type == decoder.arrow_type
    first, second = out.columns.to_pylist()
    assert first == {
        "f64": 1.5,
        "f32": -0.25,
        "i32": -(2**31),
        "i64": -(2**63),
        "u32": 2**32 - 1,
        "u64": decimal.Decimal(2**64 - 1),
        "s32": -7,
        "s64": -(2**40),
        "x32": 2**32 - 1,
        "x64": decimal.Decimal(2**63),
        "sx32": -1,
        "sx64": -(2**62),
        "flag": True,
        "text": "héllo",
        "raw": b"\x00\xff",
        "status": "PAID",
        "address": {"city": "Oslo", "zip": 150},
        "tags": ["a", "b"],
        "previous": [{"city": "Bergen", "zip": 5000}],
        "attrs": [("x", 1)],
        "by_zip": [(9000, {"city": "Tromsø", "zip": 0})],
        "card": None,
        "voucher": 0,
        "note": "",
        "at": dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC),
        "took": dt.timedelta(seconds=90, microseconds=500),
        "maybe_count": 0,
        "maybe_text": "t",
        "maybe_flag": None,
        "maybe_ratio": None,
        "history": ["NEW", "PAID", "7"],
        "kind": "ITEM",
        "lines": [{"sku": "s-1", "qty": 3}],
    }
    # nothing set: scalars are their defaults, what has presence is null
    assert second["address"] is None and second["at"] is None and second["note"] is None and second["card"] is None
    assert (second["i64"], second["text"], second["status"], second["tags"]) == (0, "", "STATUS_UNSPECIFIED", [])


def test_the_confluent_protobuf_framing():
    assert message_indexes(b"\x00rest") == ([0], 1)  # a single 0 byte: the first message
    assert message_indexes(b"\x04\x02\x00") == ([1, 0], 3)  # two indexes (zig-zag): [1, 0]
    spec = ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click", schema_ids={3: DESC})
    decoder = decoder_for(spec)
    click = decoder._cls(user=5, page="/p", ms=7).SerializeToString()
    header = b"\x00" + (3).to_bytes(4, "big")
    values = [
        header + b"\x02\x04" + click,  # message indexes [2]: Click, the file's third message
        b"\x00" + (4).to_bytes(4, "big") + b"\x02\x04" + click,
        header + b"\x02\x04" + click[:-1],
        click,
        header + b"\x80",
        header + b"\x00" + click,  # [0]: the file's first message, Address
        header + b"\x04\x04\x00" + click,  # [2, 0]: Click has no nested message
    ]
    out = decoder.decode(pa.array(values, pa.binary()))
    assert out.bad.tolist() == [False, True, True, True, True, True, True]
    assert out.columns.to_pylist()[0] == {"user": 5, "page": "/p", "ms": 7}
    assert out.schema_ids.to_pylist() == [3, 4, 3, None, 3, 3, 3]
    assert out.errors.to_pylist()[1:] == [
        "protobuf: bytes 1-4: schema id 4 is not in the configured schema ids or registry",
        "protobuf: the message at byte 7: Error parsing message with type 'shop.v1.Click': Wire format was corrupt",
        "protobuf: byte 0: magic byte 0x08, the Confluent wire format has 0x00",
        "protobuf: byte 0: varint runs past the end of the data",
        "protobuf: bytes 5-5: message indexes [0] name shop.v1.Address, not shop.v1.Click",
        "protobuf: bytes 5-7: message indexes [2, 0]: no message at position 1",
    ]
    # a file of one message: the single 0 byte names it (wire "confluent" with no ids: the schema file's indexes)
    single = decoder_for(ValueSpec("protobuf", schema_file=CLICK_V2, wire="confluent"))
    out = single.decode(pa.array([header + b"\x00" + click, header + b"\x02\x02" + click], pa.binary()))
    assert out.columns.to_pylist()[0] == {"user_id": 5, "page": "/p", "ms": 7, "referrer": None}
    assert out.errors.to_pylist()[1] == "protobuf: bytes 5-6: message indexes [1]: no message at position 0"


def test_a_renamed_protobuf_field_keeps_its_number():
    """Bytes of Click v1 decode with v2's class: field 1 renamed (same number), field 3 widened, 4 added."""
    old = order_decoder()  # shop.desc's Click is v1
    v1 = decoder_for(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click"))
    v2 = decoder_for(ValueSpec("protobuf", schema_file=CLICK_V2))  # the file's only message
    assert old.arrow_type != v1.arrow_type
    payload = v1._cls(user=2**40, page="/x", ms=-3).SerializeToString()
    out = v2.decode(pa.array([payload], pa.binary()))
    assert out.columns.to_pylist() == [{"user_id": 2**40, "page": "/x", "ms": -3, "referrer": None}]
    assert [f.metadata[NUMBER_KEY] for f in v2.arrow_type] == [b"1", b"2", b"3", b"4"]


def test_a_bad_protobuf_value_is_named_and_the_rest_decode():
    decoder = decoder_for(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click"))
    good = decoder._cls(user=1, page="/a", ms=2).SerializeToString()
    out = decoder.decode(pa.array([good, good[:-1], b"\xff\xff\xff", None, good], pa.binary()))
    assert out.bad.tolist() == [False, True, True, True, False]
    errors = out.errors.to_pylist()
    assert errors[1].startswith("protobuf: the message: Error parsing message with type 'shop.v1.Click'")
    assert (
        errors[2].startswith("protobuf: the message: Error parsing message")
        and errors[3] == "protobuf: no value (null)"
    )
    assert out.columns.to_pylist()[4] == {"user": 1, "page": "/a", "ms": 2}


def _protoc_dirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(".tank-log-protoc-")}


def test_a_missing_or_bad_protobuf_schema_is_a_usage_error(tmp_path):
    before = _protoc_dirs()
    with pytest.raises(ValueSchemaError, match=r"nope\.desc: Protobuf schema file not found") as err:
        decoder_for(ValueSpec("protobuf", schema_file=str(tmp_path / "nope.desc"), message="a.B"))
    assert isinstance(err.value, UsageError)
    with pytest.raises(ValueSchemaError, match=r"shop\.desc: no message 'shop\.v1\.Nope' \(its file's messages: "):
        decoder_for(ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Nope"))
    with pytest.raises(ValueSchemaError, match=r"shop\.desc: name the message .*shop\.v1\.Address, shop\.v1\.Order"):
        decoder_for(ValueSpec("protobuf", schema_file=DESC))
    (tmp_path / "broken.proto").write_text('syntax = "proto3";\nmessage A { int32 a = 1 }\n')
    with pytest.raises(ValueSchemaError, match=r"broken\.proto: protoc cannot compile it: .*broken\.proto:2"):
        decoder_for(ValueSpec("protobuf", schema_file=str(tmp_path / "broken.proto")))
    (tmp_path / "junk.desc").write_bytes(b"\xff\xff\xff")
    with pytest.raises(ValueSchemaError, match=r"junk\.desc: not a FileDescriptorSet"):
        decoder_for(ValueSpec("protobuf", schema_file=str(tmp_path / "junk.desc")))
    (tmp_path / "tree.proto").write_text('syntax = "proto3";\nmessage Node { repeated Node children = 1; }\n')
    with pytest.raises(ValueSchemaError, match=r"tree\.proto: message Node is recursive"):
        decoder_for(ValueSpec("protobuf", schema_file=str(tmp_path / "tree.proto")))
    assert _protoc_dirs() == before  # protoc's temporary directories are gone
