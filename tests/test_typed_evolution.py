"""Schema evolution of typed tables (tank_spark/export/schema.py `evolved_schema`, tank_log.values.evolve): a new
version of the values' schema that adds an optional field evolves the table (Delta and Iceberg: a new nullable
column, the older rows null, Iceberg's field ids kept); an incompatible one stops the export in one line naming the
field and both types, nothing committed, exit 1. In the driver, no JVM."""

from __future__ import annotations

import json
import os

import pytest
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
