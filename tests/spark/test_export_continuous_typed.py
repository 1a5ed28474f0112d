"""`--continuous` with typed values (tank_spark/export/continuous.py, docs/guides/export-continuous.md): Avro,
Protobuf and JSON Schema values (the Confluent wire format where framed) and decoded keys stream into Delta and
Iceberg tables that DuckDB reads with their types; values that do not decode go to the dead-letter table (committed
first), are skipped and counted, or stop the query with nothing of the batch committed, and so does a schema registry
out of reach; a query killed between the dead letters' commit and the table's is restarted and every message is in
exactly one table; a newer schema of the values evolves the table, an older one writes its columns, an incompatible
one is refused in one line.

Each query runs with `TANK_LOG_STREAM_AVAILABLE_NOW` (a trigger that reads what exists when the query starts, then
ends): on the tests' shared Spark session, or as `jobs/export_delta.py` where a test kills it."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, duckdb_with, wait_for_hold
from test_job_export_continuous import continuous
from test_typed_evolution import roll_and_append, schema_file
from test_typed_export import BAD_SEQS, SMALL, avro, click, config, framed, mixed_values, rows, write_topic

from tank_log.lakehouse import TableLocation, default_source
from tank_log.values.evolve import IncompatibleSchema
from tank_spark.export.continuous import AVAILABLE_NOW

pytestmark = pytest.mark.spark


def typed_config(tmp_path, mode="dead_letter"):
    return config(tmp_path, value_format="avro", value_schema_file=SMALL, value_schema_ids={1: SMALL},
                  value_wire="confluent", on_bad_record=mode)  # fmt: skip


def metrics_of(results, summary):
    """The Prometheus metrics `--metrics-file` writes of a run with these results (`tank_log.metrics`)."""
    from prometheus_client import generate_latest

    from tank_log.metrics import report_registry

    report = {"job": "export_delta", "status": "ok", "summary": summary, "partitions": results}
    return generate_latest(report_registry(report)).decode()


def recorded(table, fmt, partition, topic="clicks"):
    return TableLocation.of(table, {}, fmt, None, default_source()).existing().recorded_version(topic, partition)


@pytest.mark.slow
def test_killed_between_the_dead_letters_and_the_table_then_restarted(spark, tmp_path, monkeypatch):
    """Delta: killed (SIGKILL) after the dead letters' commit, before the table's; the restart replays the batch:
    the good values go to the table once, the dead letters are not added twice. A later batch under a newer schema
    of the values (an added optional field) evolves the table, and its bad values are dead-lettered and counted;
    DuckDB reads the typed columns. An incompatible schema is refused before the query starts."""
    base, table, ck = str(tmp_path / "data"), str(tmp_path / "t"), str(tmp_path / "ck")
    write_topic(base, "clicks", mixed_values())
    args = ["--config", typed_config(tmp_path), "--data-dir", base, "--table", table, "--checkpoint", ck]
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD_DEAD_LETTERS=hold, **{AVAILABLE_NOW: "1"})
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *args, "--continuous"]
    proc = subprocess.Popen(job, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "a.log", "w"),
                            start_new_session=True)  # fmt: skip
    try:
        wait_for_hold(hold + ".ready", proc, tmp_path / "a.log")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
        proc.wait(60)
    assert rows(table + "_dead_letters", "partition,seq") == [(0, s) for s in sorted(BAD_SEQS)]
    assert rows(table, "partition,seq") == [] and recorded(table, "delta", 0) is None

    monkeypatch.setenv(AVAILABLE_NOW, "1")
    results, summary = continuous(spark, *args)  # Spark replays the killed batch: its dead letters are there
    assert summary["batches"] == 1 and summary["dead_lettered"] == 0 and summary["rows"] == 13
    main, dead = rows(table, "partition,seq"), rows(table + "_dead_letters", "partition,seq")
    assert sorted(main + dead) == [(p, s) for p in (0, 1) for s in range(1, 9)]  # each once, in one table
    assert dead == [(0, s) for s in sorted(BAD_SEQS)]

    # a later batch, under a newer schema (an added optional field): the table evolves before the query starts,
    # the older rows read null in the new column; the batch's bad values are dead-lettered and counted
    referrer = {"name": "referrer", "type": ["null", "string"], "default": None}
    v2 = schema_file(tmp_path, "v2.avsc", [referrer])
    roll_and_append(base, "clicks", [framed(2, avro(v2, {**click(20), "referrer": "r"})), framed(2, b"\x28")])
    cfg = config(tmp_path, value_format="avro", value_schema_file=v2, value_schema_ids={1: SMALL, 2: v2},
                 value_wire="confluent")  # fmt: skip
    results, summary = continuous(spark, "--config", cfg, *args[2:])
    by_part = {r["partition"]: r for r in results}
    assert summary["dead_lettered"] == 2 and by_part[0]["dead_lettered"] == by_part[1]["dead_lettered"] == 1
    assert summary["dead_letter_table"] == table + "_dead_letters" and summary["stopped"] == "query ended"
    metric = f'tank_log_export_dead_lettered_records{{partition="1",table="{table}",topic="clicks"}} 1.0'
    assert metric in metrics_of(results, summary)
    main, dead = rows(table, "partition,seq"), rows(table + "_dead_letters", "partition,seq,error")
    assert sorted(main + [d[:2] for d in dead]) == [(p, s) for p in (0, 1) for s in range(1, 11)]  # each once
    assert [d[:2] for d in dead] == [(0, s) for s in (*sorted(BAD_SEQS), 10)] + [(1, 10)]
    assert "truncated" in dead[-1][2]
    assert recorded(table, "delta", 0) == 10 and recorded(table, "delta", 1) == 10

    con = duckdb_with("delta")
    types = dict(r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{table}')").fetchall())
    assert [types[c] for c in ("user", "page", "ms", "referrer")] == ["BIGINT", "VARCHAR", "INTEGER", "VARCHAR"]
    query = f"SELECT seq, \"user\", page, ms, referrer FROM delta_scan('{table}') WHERE partition = 0 ORDER BY seq"
    assert con.execute(query).fetchall() == [
        (1, 0, "/p0", 0, None), (2, 1, "/p1", 10, None), (4, 3, "/p3", 30, None), (7, None, None, None, None),
        (8, 7, "/p7", 70, None), (9, 20, "/p20", 200, "r"),
    ]  # fmt: skip

    # a stream started again under the older schema (the table evolved by another run meanwhile) writes the table's
    # columns: null in the one its schema lacks, nothing refused
    roll_and_append(base, "clicks", [framed(1, avro(SMALL, click(30)))])
    results, summary = continuous(spark, "--config", typed_config(tmp_path), *args[2:])
    assert summary["rows"] == 2 and recorded(table, "delta", 0) == recorded(table, "delta", 1) == 11
    assert con.execute(query.replace("ORDER BY seq", "AND seq > 9")).fetchall() == [(11, 30, "/p30", 300, None)]

    # an incompatible one (page: string -> long) is refused before anything is written
    bad = schema_file(tmp_path, "bad.avsc", [{"name": "page", "type": "long"}], drop="page")
    version = TableLocation.of(table, {}, "delta").existing().version()
    cfg = config(tmp_path, value_format="avro", value_schema_file=bad)
    with pytest.raises(IncompatibleSchema, match="field page: string cannot become int64"):
        continuous(spark, "--config", cfg, *args[2:])
    assert TableLocation.of(table, {}, "delta").existing().version() == version


@pytest.mark.slow
def test_iceberg_skip_and_fail(spark, tmp_path, monkeypatch):
    """Iceberg: `skip` leaves the bad values out and counts them (DuckDB reads the typed columns); `fail` stops the
    query naming the file, the seq and the error, with nothing of the batch committed."""
    from tank_log.errors import RunFailed

    monkeypatch.setenv(AVAILABLE_NOW, "1")
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", mixed_values())
    common = ["--data-dir", base, "--format", "iceberg"]
    results, summary = continuous(spark, "--config", typed_config(tmp_path, "skip"), *common, "--table", table,
                                  "--checkpoint", str(tmp_path / "ck-skip"))  # fmt: skip
    assert summary["skipped_bad_records"] == 3 and {r["partition"]: r["rows"] for r in results} == {0: 5, 1: 8}
    metric = f'tank_log_export_skipped_bad_records{{partition="0",table="{table}",topic="clicks"}} 3.0'
    assert metric in metrics_of(results, summary)
    assert not os.path.exists(table + "_dead_letters")
    assert recorded(table, "iceberg", 0) == 8 and recorded(table, "iceberg", 1) == 8
    metadata = TableLocation.of(table, {}, "iceberg").existing().table.metadata_location.removeprefix("file://")
    con = duckdb_with("avro", "iceberg")  # the manifests are Avro
    scan = f"iceberg_scan('{metadata}')"
    types = dict(r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall())
    assert (types["user"], types["page"], types["ms"]) == ("BIGINT", "VARCHAR", "INTEGER")
    got = con.execute(f'SELECT seq, "user" FROM {scan} WHERE partition = 0 ORDER BY seq').fetchall()
    assert got == [(1, 0), (2, 1), (4, 3), (7, None), (8, 7)]

    failing = str(tmp_path / "f")
    with pytest.raises(RunFailed) as err:
        continuous(spark, "--config", typed_config(tmp_path, "fail"), *common, "--table", failing,
                   "--checkpoint", str(tmp_path / "ck-fail"))  # fmt: skip
    message = str(err.value)
    assert message.startswith(f"continuous export stopped: {os.path.join(base, 'clicks', '0')}"), message
    assert ": seq 3: " in message and "truncated" in message and "nothing of batch 0 was committed" in message
    assert "\n" not in message
    assert rows(failing, "seq", "iceberg") == [] and recorded(failing, "iceberg", 0) is None


def keyed(base: str, topic: str, partition: int, first: int, pairs: list[tuple[bytes, bytes]]) -> None:
    """(key, value) messages from seq `first` in a new active segment of the partition, its active one rolled first
    (as `roll_and_append`)."""
    from test_typed_export import TS

    from tank_log.format.bundle import Message
    from tank_log.storage.datadir import partitions_at
    from tank_log.storage.writer import write_segment

    d = os.path.join(base, topic, str(partition))
    if os.path.isdir(d):
        (a,) = [p.active for p in partitions_at(base, [topic]) if p.id == partition]
        os.rename(a.path, os.path.join(d, f"{a.base}-{first - 1}_{a.name.ts}.ilog"))
    os.makedirs(d, exist_ok=True)
    msgs = [Message(first + i, TS + first + i, k, v) for i, (k, v) in enumerate(pairs)]
    write_segment(d, msgs, active=True, ts=TS // 1000 + first)


@pytest.mark.slow
def test_protobuf_json_schema_and_decoded_keys(spark, tmp_path, monkeypatch):
    """Iceberg: Protobuf values in the Confluent wire format (magic byte, schema id, message indexes) with Avro keys:
    the bad values (cut short, an unknown id, a wrong magic byte) and a bad key are dead letters (the raw key kept),
    the rest typed rows; a restart that needs a schema registry out of reach stops in one line, nothing committed;
    restarted under a newer .proto (a widened field, an added one) the table, with its struct
    key column, evolves and the next batch's rows and dead letters join: every message in exactly one table, each
    partition's version its last seq. Delta: JSON values with a JSON Schema and UTF-8 keys, `skip` counts the bad
    ones (a date-time with an offset stored in UTC); `fail` stops at the first, naming it, nothing committed."""
    from test_typed_export import VALUES

    from tank_log.errors import RunFailed
    from tank_log.values import ValueSpec, decoder_for

    monkeypatch.setenv(AVAILABLE_NOW, "1")
    desc = os.path.join(VALUES, "shop.desc")
    click_v2 = tmp_path / "click_v2.proto"  # Click with ms widened and a field added (compiled by protoc at load)
    click_v2.write_text('syntax = "proto3";\npackage shop.v1;\nmessage Click {\n  int64 user = 1;\n  string page = 2;\n'
                        '  int64 ms = 3;\n  optional string referrer = 4;\n}\n')  # fmt: skip
    base = str(tmp_path / "data")
    key_schema = tmp_path / "key.avsc"
    key_schema.write_text(json.dumps({"type": "record", "name": "K", "fields": [
        {"name": "id", "type": "long"}, {"name": "region", "type": "string"}]}))  # fmt: skip

    def key(i: int) -> bytes:
        return avro(str(key_schema), {"id": i, "region": "eu"})

    v1 = decoder_for(ValueSpec("protobuf", schema_file=desc, message="shop.v1.Click"))._cls
    v2 = decoder_for(ValueSpec("protobuf", schema_file=str(click_v2)))._cls

    def pb(i: int, schema_id: int = 3, magic: int = 0) -> bytes:  # indexes [2]: the file's third message, Click
        return framed(schema_id, b"\x02\x04" + v1(user=i, page=f"/p{i}", ms=i).SerializeToString(), magic)

    def pb2(i: int) -> bytes:  # the file's only message: indexes [0], one 0 byte
        return framed(4, b"\x00" + v2(user=i, page=f"/q{i}", ms=2**40 + i, referrer="r").SerializeToString())

    p0 = [(key(1), pb(1)), (key(2), pb(2)[:-1]), (key(3), pb(3, schema_id=9)), (key(4), pb(4, magic=7)),
          (b"\x02", pb(5)), (key(6), b""), (b"", pb(7)), (key(8), pb(8))]  # fmt: skip
    keyed(base, "clicks", 0, 1, p0)
    keyed(base, "clicks", 1, 1, [(key(i), pb(i)) for i in (1, 2, 3)])
    table, ck = str(tmp_path / "pb"), str(tmp_path / "ck-pb")
    args = ["--data-dir", base, "--format", "iceberg", "--table", table, "--checkpoint", ck]
    keys = {"key_format": "avro", "key_schema_file": str(key_schema), "key_wire": "plain"}
    cfg = config(tmp_path, value_format="protobuf", value_schema_file=desc, value_message="shop.v1.Click",
                 value_schema_ids={3: desc}, value_wire="confluent", **keys)  # fmt: skip
    results, summary = continuous(spark, "--config", cfg, *args)
    assert summary["dead_lettered"] == 4 and summary["rows"] == 7, summary
    dead = rows(table + "_dead_letters", "partition,seq,key,schema_id,error", "iceberg")
    assert [d[:4] for d in dead] == [(0, 2, key(2), 3), (0, 3, key(3), 9), (0, 4, key(4), None), (0, 5, b"\x02", 3)]
    assert "schema id 9" in dead[1][4] and "magic byte 0x07" in dead[2][4] and dead[3][4].startswith("key: ")
    assert (recorded(table, "iceberg", 0), recorded(table, "iceberg", 1)) == (8, 3)

    # restarted under a newer .proto (ms int32 -> int64, an added optional field): the table evolves; the older
    # values' id still decodes (into the newer message)
    keyed(base, "clicks", 0, 9, [(key(9), pb2(9)), (key(10), pb(10)), (key(11), pb2(11)[:-2])])
    keyed(base, "clicks", 1, 4, [(key(4), pb2(4))])
    # first with the newer id left to a schema registry out of reach (a socket bound, not listening): the query
    # stops in one line naming it, nothing of the batch committed (exit 1, not dead letters)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        cfg = config(tmp_path, value_format="protobuf", value_schema_file=str(click_v2), value_message="shop.v1.Click",
                     value_schema_ids={3: desc}, value_registry_url=url, value_wire="confluent", **keys)  # fmt: skip
        with pytest.raises(RunFailed) as err:
            continuous(spark, "--config", cfg, *args)
    assert str(err.value).startswith(f"continuous export stopped: schema registry {url}/schemas/ids/4: cannot reach")
    assert "\n" not in str(err.value) and (recorded(table, "iceberg", 0), recorded(table, "iceberg", 1)) == (8, 3)
    assert len(rows(table, "seq", "iceberg")) == 7 and len(rows(table + "_dead_letters", "seq", "iceberg")) == 4
    cfg = config(tmp_path, value_format="protobuf", value_schema_file=str(click_v2), value_message="shop.v1.Click",
                 value_schema_ids={3: desc, 4: str(click_v2)},
                 value_wire="confluent", **keys)  # fmt: skip
    results, summary = continuous(spark, "--config", cfg, *args)
    assert summary["dead_lettered"] == 1 and summary["rows"] == 3, summary
    main = rows(table, "partition,seq", "iceberg")
    dead = rows(table + "_dead_letters", "partition,seq,schema_id,error", "iceberg")
    assert sorted(main + [d[:2] for d in dead]) == [(0, s) for s in range(1, 12)] + [(1, s) for s in range(1, 5)]
    assert [d[:3] for d in dead][-1] == (0, 11, 4) and dead[-1][3].startswith("protobuf: ")
    assert [d[:2] for d in dead] == [(0, s) for s in (2, 3, 4, 5, 11)]  # each message once, in one table
    assert (recorded(table, "iceberg", 0), recorded(table, "iceberg", 1)) == (11, 4)
    metadata = TableLocation.of(table, {}, "iceberg").existing().table.metadata_location.removeprefix("file://")
    con = duckdb_with("avro", "iceberg")
    scan = f"iceberg_scan('{metadata}')"
    types = dict(r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall())
    assert [types[c] for c in ("key", "user", "page", "ms", "referrer")] == [
        "STRUCT(id BIGINT, region VARCHAR)", "BIGINT", "VARCHAR", "BIGINT", "VARCHAR",
    ]  # fmt: skip
    query = f'SELECT partition, seq, key.id, "user", page, ms, referrer FROM {scan} ORDER BY partition, seq'
    assert con.execute(query).fetchall() == [
        (0, 1, 1, 1, "/p1", 1, None), (0, 6, 6, None, None, None, None), (0, 7, None, 7, "/p7", 7, None),
        (0, 8, 8, 8, "/p8", 8, None), (0, 9, 9, 9, "/q9", 2**40 + 9, "r"), (0, 10, 10, 10, "/p10", 10, None),
        (1, 1, 1, 1, "/p1", 1, None), (1, 2, 2, 2, "/p2", 2, None), (1, 3, 3, 3, "/p3", 3, None),
        (1, 4, 4, 4, "/q4", 2**40 + 4, "r"),
    ]  # fmt: skip

    # Delta: JSON values by a JSON Schema, UTF-8 keys
    doc = {"id": 7, "total": 12.5, "paid": True, "at": "2024-02-29T23:59:59.123456+01:00", "day": "2024-02-29"}
    docs = [(b"a", json.dumps(doc).encode()), (b"b", b'{"id": 0}'), (b"\xff", json.dumps(doc).encode()),
            (b"", json.dumps({**doc, "id": 8}).encode()), (b"e", b"")]  # fmt: skip
    keyed(base, "docs", 0, 1, docs)
    js = {"value_format": "json", "value_schema_file": os.path.join(VALUES, "order.schema.json"), "key_format": "utf8"}
    common = ["--data-dir", base, "--topics", "docs"]
    table = str(tmp_path / "js")
    results, summary = continuous(spark, "--config", config(tmp_path, on_bad_record="skip", **js), *common,
                                  "--table", table, "--checkpoint", str(tmp_path / "ck-js"))  # fmt: skip
    assert summary["skipped_bad_records"] == 2 and summary["rows"] == 3, summary
    assert not os.path.exists(table + "_dead_letters") and recorded(table, "delta", 0, "docs") == 5
    con = duckdb_with("delta")
    con.execute("SET TimeZone = 'UTC'")
    types = dict(r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{table}')").fetchall())
    assert [types[c] for c in ("key", "id", "total", "paid", "at", "day")] == [
        "VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMP WITH TIME ZONE", "DATE",
    ]  # fmt: skip
    query = f'SELECT seq, key, id, total, paid, "at", "day" FROM delta_scan(\'{table}\') ORDER BY seq'
    at, day = dt.datetime(2024, 2, 29, 22, 59, 59, 123456, tzinfo=dt.UTC), dt.date(2024, 2, 29)  # +01:00 in UTC
    got = [
        (s, k, i, t, p, a.astimezone(dt.UTC) if a else a, d) for s, k, i, t, p, a, d in con.execute(query).fetchall()
    ]
    assert got == [(1, "a", 7, 12.5, True, at, day), (4, None, 8, 12.5, True, at, day), (5, "e", *[None] * 5)]

    failing = str(tmp_path / "f")
    with pytest.raises(RunFailed) as err:
        continuous(spark, "--config", config(tmp_path, on_bad_record="fail", **js), *common, "--table", failing,
                   "--checkpoint", str(tmp_path / "ck-fail"))  # fmt: skip
    message = str(err.value)
    assert message.startswith(f"continuous export stopped: {os.path.join(base, 'docs', '0')}"), message
    assert ": seq 2: json: " in message and "nothing of batch 0 was committed (2 such value(s)" in message
    assert rows(failing, "seq") == [] and recorded(failing, "delta", 0, "docs") is None
