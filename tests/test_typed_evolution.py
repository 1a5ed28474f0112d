"""Schema evolution of typed tables (tank_spark/export/schema.py `evolved_schema`, tank_log.values.evolve): a new
version of the values' schema that adds an optional field evolves the table (Delta and Iceberg: a new nullable
column, the older rows null, Iceberg's field ids kept); an incompatible one stops the export in one line naming the
field and both types, nothing committed, exit 1. In the driver, no JVM."""

from __future__ import annotations

import json
import os
from decimal import Decimal as D

import pyarrow as pa
import pytest
from conftest import duckdb_with
from test_typed_export import SMALL, TS, avro, export, rows, write_topic

from tank_log.format.bundle import Message
from tank_log.lakehouse import TableLocation, default_source
from tank_log.storage.datadir import partitions_at
from tank_log.storage.writer import write_segment


def schema_file(tmp_path, name: str, extra: list[dict], drop: str | None = None) -> str:
    schema = json.load(open(SMALL))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != drop] + extra
    path = os.path.join(tmp_path, name)
    json.dump(schema, open(path, "w"))
    return path


def proto(tmp_path, name: str, fields: str) -> str:
    path = os.path.join(tmp_path, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f'syntax = "proto3";\npackage shop.v1;\nmessage Click {{ int64 n = 1; {fields} }}\n')
    return path


def click_pb(n: int, three: bytes) -> bytes:
    """Click n (field 1, a varint) and its field 3 (`three`: the field's key and value, encoded)."""
    return bytes([0x08, n]) + three


def text3(s: str) -> bytes:
    return bytes([0x1A, len(s)]) + s.encode()  # field 3, length-delimited


def duckdb_rows(table: str, fmt: str, sql: str) -> list[tuple]:
    """`sql` (FROM t) over the table, read by DuckDB."""
    if fmt == "delta":
        con, scan = duckdb_with("delta"), f"delta_scan('{table}')"
    else:
        metadata = TableLocation.of(table, {}, fmt).existing().table.metadata_location.removeprefix("file://")
        con, scan = duckdb_with("avro", "iceberg"), f"iceberg_scan('{metadata}')"  # the manifests are Avro
    return con.execute(sql.replace("FROM t", f"FROM {scan}")).fetchall()


def roll_and_append(base: str, topic: str, values: list[bytes]) -> None:
    """The broker's roll: the active segment becomes RO, `values` go to a new active one."""
    for part in partitions_at(base, [topic]):
        a = part.active
        last = max(m.seq for m in a.messages())
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{a.name.ts}.ilog"))
        msgs = [Message(last + 1 + i, TS + 100 + i, b"n", v) for i, v in enumerate(values)]
        write_segment(part.path, msgs, active=True, ts=TS // 1000 + 1)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_an_added_optional_field_evolves_the_table(tmp_path, fmt):
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    v1 = [avro(SMALL, {"user": i, "page": f"/p{i}", "ms": i}) for i in range(3)]
    write_topic(base, "clicks", {0: v1})
    common = ["--data-dir", base, "--table", table, "--format", fmt, "--value-format", "avro"]
    assert export(*common, "--value-schema-file", SMALL) == 0
    ids_before = None
    if fmt == "iceberg":
        ids_before = {f.name: f.field_id for f in TableLocation.of(table, {}, fmt).existing().table.schema().fields}
    referrer = {"name": "referrer", "type": ["null", "string"], "default": None}
    v2 = schema_file(tmp_path, "v2.avsc", [referrer])
    roll_and_append(base, "clicks", [avro(v2, {"user": 9, "page": "/x", "ms": 9, "referrer": "ref"})])
    assert export(*common, "--value-schema-file", v2) == 0
    got = rows(table, "seq,user,page,referrer", fmt)
    assert got == [(1, 0, "/p0", None), (2, 1, "/p1", None), (3, 2, "/p2", None), (4, 9, "/x", "ref")]
    if fmt == "iceberg":
        ids_after = {f.name: f.field_id for f in TableLocation.of(table, {}, fmt).existing().table.schema().fields}
        assert {k: ids_after[k] for k in ids_before} == ids_before and "referrer" in ids_after
    # the older schema still writes into the evolved table: its rows hold null in the new column
    roll_and_append(base, "clicks", [avro(SMALL, {"user": 10, "page": "/y", "ms": 10})])
    assert export(*common, "--value-schema-file", SMALL) == 0
    assert rows(table, "seq,referrer", fmt)[-1] == (5, None)
    # a field renamed with an Avro alias naming the column: the column keeps its name, no new column
    renamed = schema_file(tmp_path, "v3.avsc", [{"name": "user_id", "type": "long", "aliases": ["user"]}], "user")
    roll_and_append(base, "clicks", [avro(renamed, {"user_id": 11, "page": "/z", "ms": 11})])
    assert export(*common, "--value-schema-file", renamed) == 0
    assert rows(table, "seq,user", fmt)[-1] == (6, 11)
    assert "user_id" not in TableLocation.of(table, {}, fmt).existing().arrow_schema().names


def test_an_incompatible_change_stops_the_export_with_nothing_committed(tmp_path, caplog):
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", {0: [avro(SMALL, {"user": 1, "page": "/p", "ms": 1})]})
    common = ["--data-dir", base, "--table", table, "--value-format", "avro"]
    assert export(*common, "--value-schema-file", SMALL) == 0
    before = TableLocation.of(table, {}, "delta").existing().version()
    bad = schema_file(tmp_path, "bad.avsc", [{"name": "page", "type": "long"}], drop="page")
    roll_and_append(base, "clicks", [avro(bad, {"user": 2, "page": 5, "ms": 2})])
    caplog.clear()
    assert export(*common, "--value-schema-file", bad) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line == "export_delta failed: field page: string cannot become int64 (not a compatible schema change)"
    t = TableLocation.of(table, {}, "delta", None, default_source()).existing()
    assert t.version() == before and t.recorded_version("clicks", 0) == 1
    assert rows(table, "seq") == [(1,)]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_widened_type_evolves_where_the_format_allows_it(tmp_path, fmt, caplog):
    """ms int -> long (and a new float -> double): Iceberg promotes the columns in place (`update_column`, the
    older rows read as the wider type, field ids kept); Delta (delta-rs writes no type widening) refuses in one line
    naming the field and both types, nothing committed, exit 1."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")

    def price(digits: int) -> dict:
        return {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": digits, "scale": 2}}

    v1 = schema_file(tmp_path, "v1.avsc", [{"name": "score", "type": "float"}, price(5)])
    write_topic(base, "clicks", {0: [avro(v1, {"user": 1, "page": "/p", "ms": 7, "score": 0.5, "price": D("1.25")})]})
    common = ["--data-dir", base, "--table", table, "--format", fmt, "--value-format", "avro"]
    assert export(*common, "--value-schema-file", v1) == 0
    before = TableLocation.of(table, {}, fmt, None, default_source()).existing()
    ids_before = {f.name: f.field_id for f in before.table.schema().fields} if fmt == "iceberg" else None
    wide = schema_file(tmp_path, "wide.avsc", [{"name": "score", "type": "double"}, price(9),
                                               {"name": "ms", "type": "long"}], drop="ms")  # fmt: skip
    wide_value = {"user": 2, "page": "/q", "ms": 2**40, "score": 0.25, "price": D("1234567.89")}
    roll_and_append(base, "clicks", [avro(wide, wide_value)])
    caplog.clear()
    rc = export(*common, "--value-schema-file", wide)
    t = TableLocation.of(table, {}, fmt, None, default_source()).existing()
    if fmt == "delta":
        assert rc == 1
        (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert "field ms: int32 -> int64 is a compatible change" in line and "delta table" in line
        assert t.version() == before.version() and rows(table, "seq", fmt) == [(1,)]
        return
    assert rc == 0
    types = {f.name: f.type for f in t.arrow_schema()}
    assert (types["ms"], types["score"], types["price"]) == (pa.int64(), pa.float64(), pa.decimal128(9, 2))
    assert {f.name: f.field_id for f in t.table.schema().fields} == ids_before
    assert rows(table, "seq,ms,score,price", fmt) == [(1, 7, 0.5, D("1.25")), (2, 2**40, 0.25, D("1234567.89"))]
    # the older, narrower schema still writes into the widened table
    roll_and_append(base, "clicks", [avro(v1, {"user": 3, "page": "/r", "ms": 3, "score": 1.5, "price": D("2")})])
    assert export(*common, "--value-schema-file", v1) == 0
    assert rows(table, "seq,ms", fmt)[-1] == (3, 3)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_renamed_protobuf_field_keeps_its_column_by_number(tmp_path, fmt, caplog):
    """v1's `string user = 3` renamed `user_id = 3` in v2: the table records each column's field number (a table
    property), so the column keeps its name and takes the newer rows; a number reused for another type is refused
    in one line naming the field, its new name and both types, nothing committed."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    v1 = proto(tmp_path, "v1.proto", "string user = 3;")
    v2 = proto(tmp_path, "v2.proto", "string user_id = 3; string page = 4;")
    write_topic(base, "clicks", {0: [click_pb(1, text3("a")), click_pb(2, text3("b"))]})
    common = ["--data-dir", base, "--table", table, "--format", fmt, "--value-format", "protobuf",
              "--value-message", "shop.v1.Click"]  # fmt: skip
    assert export(*common, "--value-schema-file", v1) == 0
    roll_and_append(base, "clicks", [click_pb(3, text3("c") + b"\x22\x02/p")])
    assert export(*common, "--value-schema-file", v2) == 0
    t = TableLocation.of(table, {}, fmt, None, default_source()).existing()
    assert [n for n in t.arrow_schema().names if n in ("n", "user", "user_id", "page")] == ["n", "user", "page"]
    got = duckdb_rows(table, fmt, 'SELECT seq, n, "user", page FROM t ORDER BY seq')
    assert got == [(1, 1, "a", None), (2, 2, "b", None), (3, 3, "c", "/p")]
    # the same number, another type: refused, naming the column, the field's new name and both types
    v3 = proto(tmp_path, "v3.proto", "int64 clicks = 3; string page = 4;")
    roll_and_append(base, "clicks", [click_pb(4, bytes([0x18, 7]))])
    before = t.version()
    caplog.clear()
    assert export(*common, "--value-schema-file", v3) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    want = "field user (renamed clicks, number 3): string cannot become int64 (not a compatible schema change)"
    assert line == f"export_delta failed: {want}"
    t.refresh()
    assert t.version() == before and rows(table, "seq", fmt) == [(1,), (2,), (3,)]


def test_a_table_that_records_no_protobuf_numbers(tmp_path, caplog):
    """A Protobuf table made before the export recorded field numbers: a new field beside a column the new schema
    lacks (a rename, or a removal and an addition?) is refused in one line, nothing committed; a run with the
    table's own schema records the numbers, and the rename then keeps its column."""
    base, made, table = str(tmp_path / "data"), str(tmp_path / "made"), str(tmp_path / "t")
    v1 = proto(tmp_path, "v1.proto", "string user = 3;")
    v2 = proto(tmp_path, "v2.proto", "string user_id = 3;")
    write_topic(base, "clicks", {0: [click_pb(1, text3("a"))]})
    flags = ["--data-dir", base, "--value-format", "protobuf", "--value-message", "shop.v1.Click"]
    assert export(*flags, "--table", made, "--value-schema-file", v1) == 0
    like = TableLocation.of(made, {}, "delta").existing()  # the same columns, no numbers recorded: made before
    TableLocation.of(table, {}, "delta").create(like.arrow_schema(), tuple(like.partition_spec()), None)
    caplog.clear()
    assert export(*flags, "--table", table, "--value-schema-file", v2) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith(
        f"export_delta failed: table {table} records no Protobuf field number of column(s) user, which the new "
        "schema lacks: field(s) user_id (number 3) may be one of them renamed: nothing committed; export once with "
        "the schema file the table was made with"
    ), line
    assert rows(table, "seq") == []
    assert export(*flags, "--table", table, "--value-schema-file", v1) == 0  # records the numbers
    roll_and_append(base, "clicks", [click_pb(2, text3("b"))])
    assert export(*flags, "--table", table, "--value-schema-file", v2) == 0
    assert rows(table, "seq,user") == [(1, "a"), (2, "b")]
    assert "user_id" not in TableLocation.of(table, {}, "delta").existing().arrow_schema().names


def test_an_iceberg_table_with_a_struct_key_column_gains_a_column(tmp_path):
    """An Iceberg table's struct column (an Avro key) is compared without its fields' ids (they follow the columns
    the table had when it was added): a newer value schema adds a column, and the export goes on."""
    key = str(tmp_path / "key.avsc")
    json.dump({"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}, open(key, "w"))
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    os.makedirs(os.path.join(base, "clicks", "0"))
    msgs = [Message(1, TS, avro(key, {"id": 1}), avro(SMALL, {"user": 1, "page": "/p", "ms": 1}))]
    write_segment(os.path.join(base, "clicks", "0"), msgs, active=True, ts=TS // 1000)
    common = ["--data-dir", base, "--table", table, "--format", "iceberg", "--value-format", "avro",
              "--key-format", "avro", "--key-schema-file", key]  # fmt: skip
    assert export(*common, "--value-schema-file", SMALL) == 0
    v2 = schema_file(tmp_path, "v2.avsc", [{"name": "referrer", "type": ["null", "string"], "default": None}])
    roll_and_append(base, "clicks", [avro(v2, {"user": 2, "page": "/q", "ms": 2, "referrer": "r"})])  # key b"n": 55
    assert export(*common, "--value-schema-file", v2) == 0
    assert rows(table, "seq,key,referrer", "iceberg") == [(1, {"id": 1}, None), (2, {"id": 55}, "r")]
