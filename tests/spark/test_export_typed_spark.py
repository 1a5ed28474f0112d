"""Typed values by `--engine spark` (docs/guides/typed-tables.md): delta-spark (Delta) and Iceberg's Spark writer
(Iceberg) write the decoded columns, Spark's tasks decoding the values with the deltalake engine's decoders; the bad
values go to the dead-letter table, committed first (by delta-rs or pyiceberg), then the table. Every type of one
Avro schema and one Protobuf message read back by Spark and DuckDB with their types, the rows those of the deltalake
engine's table of the same input; bad records by `on_bad_record`; a run killed between the two commits, rerun. The
exports run on the suite's Spark session (`export_on`), but the one a test kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, duckdb_with, wait_for_hold
from test_delta_spark import export_on

from tank_log.errors import RunFailed

sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "values"))
from test_typed_export import (  # noqa: E402
    ALL_TYPES,
    BAD_SEQS,
    SMALL,
    avro,
    config,
    export,
    framed,
    mixed_values,
    rows,
    write_topic,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK = ("--engine", "spark")


def export_by_spark(spark, fmt: str, *argv: str):
    """`export_on` the suite's session (an Iceberg table's with the session's catalogs forgotten: `forget_catalogs`)."""
    if fmt == "iceberg":
        forget_catalogs(spark)
    return export_on(spark, *argv, *SPARK)


def forget_catalogs(spark) -> None:
    """Each local Iceberg table's SQLite catalog is Spark's catalog tank_log, which a session loads once: forget the
    loaded catalogs, so that the next use of tank_log loads the one the session's conf names now."""
    spark._jsparkSession.sessionState().catalogManager().reset()


def spark_frame(spark, table: str, fmt: str):
    """The table as Spark reads it: delta-spark's reader, or Iceberg's through the table's catalog."""
    if fmt == "delta":
        return spark.read.format("delta").load(table)
    from tank_log.lakehouse.location import locate
    from tank_spark.iceberg_catalog import spark_table

    t = spark_table(locate(table, {}, "iceberg"))
    forget_catalogs(spark)
    for key, value in t.conf.items():
        spark.conf.set(key, value)
    return spark.table(t.name)


def duckdb_types(table: str, fmt: str) -> dict[str, str]:
    from tank_log.lakehouse import TableLocation

    if fmt == "delta":
        scan = f"delta_scan('{table}')"
    else:
        metadata = TableLocation.of(table, {}, "iceberg").existing().table.metadata_location
        scan = f"iceberg_scan('{metadata.removeprefix('file://')}')"
    con = duckdb_with("delta", "avro", "iceberg")
    return {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}


def all_rows(table: str, fmt: str) -> list[dict]:
    """Every row through delta-rs or pyiceberg, all columns but `source`, by (topic, partition, seq)."""
    from tank_log.lakehouse import TableLocation

    t = TableLocation.of(table, {}, fmt).existing().to_pyarrow_dataset().to_table()
    t = t.sort_by([("topic", "ascending"), ("partition", "ascending"), ("seq", "ascending")])
    return [{k: v for k, v in r.items() if k != "source"} for r in t.to_pylist()]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_every_type_by_the_spark_engine_as_by_the_deltalake_engine(spark, tmp_path, fmt):
    """Avro values of every type but a 40-digit decimal (all_types.avsc) and a Protobuf message of every field kind
    (with UTF-8 keys), each with a tombstone and a value cut short: the spark engine's table holds the rows the
    deltalake engine's holds, Spark and DuckDB read each column with its type, the bad value is in the dead-letter
    table; a rerun adds nothing."""
    from test_values_avro import ORDER
    from test_values_protobuf import DESC, full_order, order_decoder

    schema = json.load(open(ALL_TYPES))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "big"]
    narrow = str(tmp_path / "narrow.avsc")
    json.dump(schema, open(narrow, "w"))
    base = str(tmp_path / "data")
    if fmt == "iceberg":  # a time of day: Iceberg's Spark runtime opens no table with a time column
        write_topic(base, "timed", {0: [avro(narrow, {k: v for k, v in ORDER.items() if k != "big"})]})
        flags = ["--value-format", "avro", "--value-schema-file", narrow, "--format", fmt, *SPARK]
        assert export("--data-dir", base, "--table", str(tmp_path / "timed"), *flags) == 2
        assert not os.path.exists(tmp_path / "timed")
        schema["fields"] = [f for f in schema["fields"] if not f["name"].startswith("tod_")]
        narrow = str(tmp_path / "untimed.avsc")  # a file of its own: a process builds a file's decoder once
        json.dump(schema, open(narrow, "w"))
    record = avro(narrow, {k: v for k, v in ORDER.items() if k in {f["name"] for f in schema["fields"]}})
    order = full_order(order_decoder()._cls).SerializeToString()
    write_topic(base, "orders", {0: [record, b"", record[:9], record]})
    write_topic(base, "pb", {0: [order, b"\x0a\xff", b"", order]})
    typed = {
        "orders": ["--value-format", "avro", "--value-schema-file", narrow],
        "pb": [
            "--value-format",
            "protobuf",
            "--value-schema-file",
            DESC,
            "--value-message",
            "shop.v1.Order",
            "--key-format",
            "utf8",
        ],  # fmt: skip
    }
    for topic, flags in typed.items():
        by_spark, by_rs = str(tmp_path / f"{topic}_spark"), str(tmp_path / f"{topic}_rs")
        args = ["--data-dir", base, "--topics", topic, "--format", fmt, *flags]
        results, summary = export_by_spark(spark, fmt, *args, "--table", by_spark)
        assert summary["engine"] == "spark" and summary["dead_lettered"] == 1, summary
        assert summary["rows"] == 3, summary
        assert export(*args, "--table", by_rs) == 0
        got = all_rows(by_spark, fmt)
        assert got == all_rows(by_rs, fmt) and len(got) == summary["rows"]
        dead = rows(by_spark + "_dead_letters", "partition,seq,value", fmt)
        assert dead == rows(by_rs + "_dead_letters", "partition,seq,value", fmt)
        assert dead == ([(0, 3, record[:9])] if topic == "orders" else [(0, 2, b"\x0a\xff")])

        types = dict(spark_frame(spark, by_spark, fmt).dtypes)
        duck = duckdb_types(by_spark, fmt)
        if topic == "orders":
            want_spark = {
                "address": "struct<city:string,zip:int>",
                "attrs": "map<string,bigint>",
                "tags": "array<string>",
                "price": "decimal(10,2)",
                "day": "date",
                "at_ms": "timestamp",
                "local_us": "timestamp_ntz",
                "lines": "array<struct<sku:string,qty:int>>",
                "status": "string",
                "i32": "int",
                "f32": "float",
                "raw": "binary",
                "id": "string",
            }
            want_duck = {"address": "STRUCT(city VARCHAR, zip INTEGER)", "attrs": "MAP(VARCHAR, BIGINT)",
                         "price": "DECIMAL(10,2)", "day": "DATE", "at_ms": "TIMESTAMP WITH TIME ZONE",
                         "local_us": "TIMESTAMP", "lines": "STRUCT(sku VARCHAR, qty INTEGER)[]"}  # fmt: skip
            if fmt == "delta":  # microseconds since midnight: Delta has no time type
                assert (types["tod_ms"], duck["tod_ms"]) == ("bigint", "BIGINT")
        else:
            want_spark = {"key": "string", "i64": "bigint", "u32": "bigint", "u64": "decimal(20,0)", "status": "string",
                          "at": "timestamp", "took": "bigint", "address": "struct<city:string,zip:int>",
                          "tags": "array<string>"}  # fmt: skip
            want_duck = {"i64": "BIGINT", "u64": "DECIMAL(20,0)", "at": "TIMESTAMP WITH TIME ZONE"}
        assert {k: types[k] for k in want_spark} == want_spark
        assert {k: duck[k] for k in want_duck} == want_duck
        first = spark_frame(spark, by_spark, fmt).where("seq = 1 AND partition = 0").collect()[0].asDict()
        if topic == "orders":
            assert (first["address"]["city"], str(first["price"]), first["lines"][1]["sku"]) == ("Oslo", "12.34", "s-2")
        else:
            assert (first["key"], first["u32"], first["took"], first["address"]["city"]) == (
                "k0",
                2**32 - 1,
                90_000_500,
                "Oslo",
            )

        _, summary = export_by_spark(spark, fmt, *args, "--table", by_spark)  # nothing new
        assert summary["rows"] == 0 and all_rows(by_spark, fmt) == got
        if fmt == "delta" and topic == "orders":  # the spark engine's Delta table: every struct field nullable
            assert export(*args, "--table", by_spark) == 0  # which the deltalake engine takes
            with pytest.raises(RunFailed, match=r"NOT NULL fields inside struct columns .*delta-io/delta#860"):
                export_by_spark(spark, fmt, *args, "--table", by_rs)  # the deltalake engine's: refused


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_bad_records_by_on_bad_record_and_an_added_field(spark, tmp_path, fmt):
    """A truncated value, an unknown schema id and a wrong magic byte: dead letters, skipped, or their partition
    failed with nothing of it committed; then a schema that adds a field evolves the table (a new column, null in
    the older rows)."""
    base = str(tmp_path / "data")
    write_topic(base, "clicks", mixed_values())
    section = {"value_format": "avro", "value_schema_file": SMALL, "value_schema_ids": {1: SMALL},
               "value_wire": "confluent"}  # fmt: skip
    by_mode = {}
    for mode in ("fail", "skip", "dead_letter"):
        table = str(tmp_path / mode)
        cfg = config(tmp_path, **section, on_bad_record=mode)
        results, summary = export_by_spark(spark, fmt, "--config", cfg, "--data-dir", base, "--table", table,
                                           "--format", fmt)  # fmt: skip
        by_part = {r["partition"]: r for r in results}
        by_mode[mode] = rows(table, "partition,seq,user", fmt)
        if mode == "fail":
            assert (by_part[0]["status"], by_part[1]["status"]) == ("failed", "exported"), results
            assert ": seq 3: " in by_part[0]["error"] and "truncated" in by_part[0]["error"]
            assert {p for p, _, _ in by_mode[mode]} == {1}
            assert not os.path.exists(table + "_dead_letters")
            continue
        assert summary["by_status"] == {"exported": 2} and by_part[0]["rows"] == 5, (summary, results)
        want = [(0, s, None if s == 7 else s - 1) for s in range(1, 9) if s not in BAD_SEQS]  # seq 7: the tombstone
        assert by_mode[mode] == want + [(1, s, s - 1) for s in range(1, 9)]
        if mode == "skip":
            assert summary["skipped_bad_records"] == 3 and not os.path.exists(table + "_dead_letters")
            continue
        assert summary["dead_lettered"] == 3
        dead = rows(table + "_dead_letters", "partition,seq,value,schema_id,error", fmt)
        assert [(p, s, v) for p, s, v, _, _ in dead] == [(0, s, mixed_values()[0][s - 1]) for s in sorted(BAD_SEQS)]
        errors = {s: (sid, e) for _, s, _, sid, e in dead}
        assert "truncated" in errors[3][1] and errors[5][0] == 9 and "magic byte 0x07" in errors[6][1]

    # schema evolution: v2 adds a field
    from tank_log.storage.appender import PartitionAppender

    v2 = str(tmp_path / "v2.avsc")
    schema = json.load(open(SMALL))
    schema["fields"].append({"name": "ref", "type": ["null", "string"], "default": None})
    json.dump(schema, open(v2, "w"))
    from tank_log.format.bundle import Message

    app = PartitionAppender(os.path.join(base, "clicks", "1"))
    app.append([Message(9, 1_800_000_000_100, b"k9", framed(2, avro(v2, {"user": 9, "page": "/p9", "ms": 90,
                                                                         "ref": "ad"})))])  # fmt: skip
    table = str(tmp_path / "dead_letter")
    cfg = config(tmp_path, **{**section, "value_schema_file": v2, "value_schema_ids": {1: SMALL, 2: v2}})
    _, summary = export_by_spark(spark, fmt, "--config", cfg, "--data-dir", base, "--table", table, "--format", fmt)
    assert summary["rows"] == 1, summary
    assert rows(table, "partition,seq,user,ref", fmt)[-3:] == [(1, 7, 6, None), (1, 8, 7, None), (1, 9, 9, "ad")]
    assert dict(spark_frame(spark, table, fmt).dtypes)["ref"] == "string"


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_spark_engine_run_killed_between_its_commits(spark, tmp_path, capsys, fmt):
    """Killed (SIGKILL) after the dead letters' commit, before the table's: the rerun writes the good values once and
    no dead letter twice; every message is in exactly one table, and audit accounts for each."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", mixed_values())
    cfg = config(tmp_path, value_format="avro", value_schema_file=SMALL, value_schema_ids={1: SMALL},
                 value_wire="confluent")  # fmt: skip
    args = ["--config", cfg, "--data-dir", base, "--table", table, "--format", fmt]
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD_DEAD_LETTERS=hold)
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", *args, *SPARK]
    proc = subprocess.Popen(job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_hold(hold + ".ready", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert rows(table + "_dead_letters", "partition,seq", fmt) == [(0, s) for s in sorted(BAD_SEQS)]
    assert rows(table, "partition,seq", fmt) == []
    _, summary = export_by_spark(spark, fmt, *args)
    assert summary["dead_lettered"] == 0 and summary["rows"] == 13, summary  # the killed run's are there
    main = rows(table, "partition,seq", fmt)
    dead = rows(table + "_dead_letters", "partition,seq", fmt)
    assert sorted(main + dead) == [(p, s) for p in (0, 1) for s in range(1, 9)]  # each once, in one table
    from tank_log.tools.cli import main as cli

    capsys.readouterr()
    assert cli(["audit", base, "--table", table, "--format", fmt, "--json"]) == 0
    audit = {p["partition"]: p for p in json.loads(capsys.readouterr().out)["partitions"]}
    assert audit[0]["verdict"] == "ok" and audit[0]["dead_lettered"]["count"] == 3 and audit[0]["unaccounted"] == 0
