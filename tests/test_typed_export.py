"""Typed tables (tank_spark/export, docs/guides/typed-tables.md): Avro values exported as typed columns that DuckDB
reads with their types, bad values (truncated, a wrong schema id, a wrong magic byte) into the dead-letter table,
skipped or failing their partition, runs killed at each commit and rerun (every message in exactly one table),
and bad settings refused in one line. Small topics written by the storage writer; the export runs in the driver
(no JVM): in this process, or as `jobs/export_delta.py` where a test kills it."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import fastavro
import pytest
from conftest import ROOT, duckdb_with, wait_for_hold

from tank_log.format.bundle import Message
from tank_log.lakehouse import TableLocation, default_source
from tank_log.storage.writer import write_segment

VALUES = os.path.join(ROOT, "tests", "data", "values")
SMALL = os.path.join(VALUES, "small.avsc")
ALL_TYPES = os.path.join(VALUES, "all_types.avsc")
TS = 1_800_000_000_000


def avro(schema_path: str, record: dict) -> bytes:
    with open(schema_path, encoding="utf-8") as fh:
        schema = fastavro.parse_schema(json.load(fh))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def framed(schema_id: int, payload: bytes, magic: int = 0) -> bytes:
    return bytes([magic]) + schema_id.to_bytes(4, "big") + payload


def click(i: int) -> dict:
    return {"user": i, "page": f"/p{i}", "ms": 10 * i}


def write_topic(base, topic: str, values_by_partition: dict[int, list[bytes]]) -> None:
    for p, values in values_by_partition.items():
        d = os.path.join(base, topic, str(p))
        os.makedirs(d)
        msgs = [Message(i + 1, TS + i, b"k%d" % i, v) for i, v in enumerate(values)]
        write_segment(d, msgs, active=True, ts=TS // 1000)


def export(*argv: str) -> int:
    from tank_spark.export.job import main

    return main(["--master", "local[1]", *argv])


def rows(table: str, columns: str = "*", fmt: str = "delta") -> list[tuple]:
    t = TableLocation.of(table, {}, fmt).open()
    if t is None:
        return []
    d = t.to_pyarrow_dataset().to_table().sort_by([("partition", "ascending"), ("seq", "ascending")])
    names = d.column_names if columns == "*" else columns.split(",")
    return list(zip(*(d[c].to_pylist() for c in names), strict=True))


def config(tmp_path, **export_section) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"export": export_section}))  # JSON is YAML
    return str(path)


def mixed_values() -> dict[int, list[bytes]]:
    """Partition 0: good framed values, one truncated, one with an unknown schema id, one with a wrong magic byte, a
    tombstone; partition 1: all good."""
    good = [framed(1, avro(SMALL, click(i))) for i in range(8)]
    p0 = list(good)
    p0[2] = good[2][:7]  # truncated inside the first field
    p0[4] = framed(9, avro(SMALL, click(4)))  # schema id 9: not configured
    p0[5] = framed(1, avro(SMALL, click(5)), magic=7)  # wrong magic byte
    p0[6] = b""  # a tombstone: nulls, not a bad record
    return {0: p0, 1: good}


BAD_SEQS = {3, 5, 6}  # partition 0's bad values (seq = index + 1)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_every_avro_type_becomes_a_typed_column(tmp_path, fmt):
    """all_types.avsc (but a decimal of 40 digits, which no table holds: refused naming the field) read back by
    DuckDB (Delta) and pyiceberg (Iceberg) with each type."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "values"))
    from test_values_avro import ORDER

    schema = json.load(open(ALL_TYPES))
    wide = os.path.join(tmp_path, "wide.avsc")
    json.dump(schema, open(wide, "w"))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "big"]
    narrow = os.path.join(tmp_path, "narrow.avsc")
    json.dump(schema, open(narrow, "w"))
    record = {k: v for k, v in ORDER.items() if k != "big"}
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "orders", {0: [avro(narrow, record), b"", avro(narrow, record)]})
    common = ["--data-dir", base, "--table", table, "--format", fmt, "--value-format", "avro"]
    assert export(*common, "--value-schema-file", wide) == 2  # big: decimal(40, 3)
    assert not os.path.exists(table)
    assert export(*common, "--value-schema-file", narrow) == 0
    if fmt == "delta":
        con = duckdb_with("delta")
        con.execute("SET TimeZone = 'UTC'")
        types = dict((r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{table}')").fetchall())
        got = con.execute(
            f"SELECT seq, address, attrs, tags, price, day, at_ms, local_us, tod_ms, lines, choice, status "
            f"FROM delta_scan('{table}') ORDER BY seq"
        ).fetchall()
    else:
        t = TableLocation.of(table, {}, "iceberg").existing()
        arrow = t.to_pyarrow_dataset().to_table().sort_by("seq")
        types = {f.name: str(f.type) for f in arrow.schema}
        got = [
            tuple(
                arrow[c][i].as_py()
                for c in (
                    "seq",
                    "address",
                    "attrs",
                    "tags",
                    "price",
                    "day",
                    "at_ms",
                    "local_us",
                    "tod_ms",
                    "lines",
                    "choice",
                    "status",
                )
            )  # fmt: skip
            for i in range(arrow.num_rows)
        ]
    want_types = {
        "delta": {
            "address": "STRUCT(city VARCHAR, zip INTEGER)",
            "attrs": "MAP(VARCHAR, BIGINT)",
            "tags": "VARCHAR[]",
            "price": "DECIMAL(10,2)",
            "day": "DATE",
            "at_ms": "TIMESTAMP WITH TIME ZONE",
            "local_us": "TIMESTAMP",
            "tod_ms": "BIGINT",  # microseconds since midnight: Delta has no time type
            "lines": "STRUCT(sku VARCHAR, qty INTEGER)[]",
            "status": "VARCHAR",
            "i32": "INTEGER",
            "f32": "FLOAT",
            "raw": "BLOB",
            "digest": "BLOB",
            "id": "VARCHAR",
        },
        "iceberg": {
            "price": "decimal128(10, 2)",
            "day": "date32[day]",
            "at_ms": "timestamp[us, tz=UTC]",
            "tod_ms": "time64[us]",
            "status": "large_string",  # pyiceberg reads strings as large_string
            "i32": "int32",
        },
    }[fmt]
    assert {k: types[k] for k in want_types} == want_types
    assert [r[0] for r in got] == [1, 2, 3]
    first, tombstone = got[0], got[1]
    assert first[1] == {"city": "Oslo", "zip": 150}
    assert (dict(first[2]) if not isinstance(first[2], dict) else first[2]) == {"x": 1, "y": -2}
    assert first[3] == ["a", "b"] and str(first[4]) == "12.34" and str(first[5]) == "2024-02-29"
    assert first[9] == [{"sku": "s-1", "qty": 2}, {"sku": "s-2", "qty": 0}] and first[11] == "PAID"
    assert all(v is None for v in tombstone[1:])  # an empty value: a row of nulls
    assert rows(table + "_dead_letters", fmt=fmt) == []


@pytest.mark.parametrize("mode", ["dead_letter", "skip", "fail"])
def test_bad_values_by_on_bad_record(tmp_path, mode):
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", mixed_values())
    cfg = config(tmp_path, value_format="avro", value_schema_file=SMALL, value_schema_ids={1: SMALL},
                 value_wire="confluent", on_bad_record=mode)  # fmt: skip
    report, metrics = str(tmp_path / "r.json"), str(tmp_path / "export.prom")
    rc = export("--config", cfg, "--data-dir", base, "--table", table, "--report", report, "--metrics-file", metrics)
    r = json.load(open(report))
    by_part = {p["partition"]: p for p in r["partitions"]}
    got = rows(table, "partition,seq,user")
    dead = rows(table + "_dead_letters", "partition,seq,value,schema_id,error")
    if mode == "fail":
        assert rc == 1
        assert by_part[0]["status"] == "failed" and by_part[1]["status"] == "exported"
        assert by_part[0]["error"].startswith(os.path.join(base, "clicks", "0")) and ": seq 3: " in by_part[0]["error"]
        assert "truncated" in by_part[0]["error"]
        assert {p for p, _, _ in got} == {1}  # nothing of partition 0
        t = TableLocation.of(table, {}, "delta", None, default_source()).existing()
        assert t.recorded_version("clicks", 0) is None and t.recorded_version("clicks", 1) == 8
        assert not os.path.exists(table + "_dead_letters")
        return
    assert rc == 0, r
    want_good = [(0, s, s - 1) for s in range(1, 9) if s not in BAD_SEQS]
    want_good = [(p, s, None if s == 7 else u) for p, s, u in want_good]  # seq 7: the tombstone
    assert got == want_good + [(1, s, s - 1) for s in range(1, 9)]
    metric = {"skip": "skipped_bad_records", "dead_letter": "dead_lettered_records"}[mode]
    assert f'tank_log_export_{metric}{{partition="0",table="{table}",topic="clicks"}} 3.0' in open(metrics).read()
    if mode == "skip":
        assert by_part[0]["skipped_bad_records"] == 3 and r["summary"]["skipped_bad_records"] == 3
        assert dead == [] and not os.path.exists(table + "_dead_letters")
    else:
        assert by_part[0]["dead_lettered"] == 3 and r["summary"]["dead_lettered"] == 3
        values = mixed_values()[0]
        assert [(p, s, v) for p, s, v, _, _ in dead] == [(0, s, values[s - 1]) for s in sorted(BAD_SEQS)]
        errors = {s: (sid, e) for _, s, _, sid, e in dead}
        assert "truncated" in errors[3][1]
        assert errors[5][0] == 9 and "schema id 9" in errors[5][1]
        assert "magic byte 0x07" in errors[6][1]
    # a rerun finds nothing to do and writes nothing twice
    assert export("--config", cfg, "--data-dir", base, "--table", table) == 0
    assert rows(table, "partition,seq,user") == got
    assert rows(table + "_dead_letters", "partition,seq,value,schema_id,error") == dead


@pytest.mark.parametrize("hold_env", ["TANK_LOG_EXPORT_HOLD", "TANK_LOG_EXPORT_HOLD_DEAD_LETTERS"])
def test_a_run_killed_at_either_commit_leaves_every_message_in_one_table(tmp_path, hold_env):
    """Killed before both commits, or between the dead letters' and the table's: the rerun exports what is left,
    and every message is in exactly one of the two tables."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", mixed_values())
    cfg = config(tmp_path, value_format="avro", value_schema_file=SMALL, value_schema_ids={1: SMALL},
                 value_wire="confluent")  # fmt: skip
    args = ["--config", cfg, "--data-dir", base, "--table", table]
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **{hold_env: hold})
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", *args]
    proc = subprocess.Popen(job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_hold(hold + ".ready", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    dead_before = rows(table + "_dead_letters", "partition,seq")
    assert dead_before == ([] if hold_env == "TANK_LOG_EXPORT_HOLD" else [(0, s) for s in sorted(BAD_SEQS)])
    assert rows(table, "partition,seq") == []
    assert export(*args, "--report", str(tmp_path / "r.json")) == 0
    report = json.load(open(tmp_path / "r.json"))
    new_dead = 0 if hold_env == "TANK_LOG_EXPORT_HOLD_DEAD_LETTERS" else 3
    assert report["summary"]["dead_lettered"] == new_dead
    main = rows(table, "partition,seq")
    dead = rows(table + "_dead_letters", "partition,seq")
    assert sorted(main + dead) == [(p, s) for p in (0, 1) for s in range(1, 9)]  # each once, in one table
    assert dead == [(0, s) for s in sorted(BAD_SEQS)]
    # tank-log audit: the dead letters are accounted for
    cli = [sys.executable, "-m", "tank_log.tools.cli", "audit", base, "--table", table, "--json"]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    audit = {p["partition"]: p for p in json.loads(r.stdout)["partitions"]}
    assert audit[0]["verdict"] == "ok" and audit[0]["dead_lettered"]["count"] == 3 and audit[0]["unaccounted"] == 0


def test_bad_settings_are_refused_in_one_line(tmp_path, capfd):
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", {0: [avro(SMALL, click(1))]})
    clash = tmp_path / "clash.avsc"
    clash.write_text(json.dumps({"type": "record", "name": "C", "fields": [{"name": "seq", "type": "long"}]}))
    avro_values = ["--value-format", "avro", "--value-schema-file", SMALL]
    cases = {
        "no such file": ["--value-format", "avro", "--value-schema-file", str(tmp_path / "missing.avsc")],
        "--value-message": ["--value-format", "protobuf", "--value-schema-file", SMALL],
        "seq": ["--value-format", "avro", "--value-schema-file", str(clash)],
        "--key-format utf8 does not take --mode latest": ["--key-format", "utf8", "--mode", "latest"],
        "--key-format avro does not take --mode latest": [
            *avro_values,
            "--key-format",
            "avro",
            "--key-schema-file",
            SMALL,
            "--mode",
            "latest",
        ],
        "does not take --replay-dead-letters": [*avro_values, "--mode", "latest", "--replay-dead-letters"],
        "decoded keys take": ["--key-format", "utf8", "--value-format", "json", "--value-schema", "id long"],
        "--key-message": [*avro_values, "--key-format", "protobuf", "--key-schema-file", SMALL],
        "does not bucket": [
            *avro_values,
            "--key-format",
            "avro",
            "--key-schema-file",
            SMALL,
            "--format",
            "iceberg",
            "--partition-by",
            "bucket(4, key)",
        ],  # fmt: skip
    }
    for needle, flags in cases.items():
        rc = export("--data-dir", base, "--table", table, *flags)
        err = capfd.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("export_delta:")]
        assert rc == 2, (needle, err[-2000:])
        assert "Traceback" not in err and len(lines) == 1 and needle in lines[0], (needle, err[-2000:])
        assert not os.path.exists(table) and not os.path.exists(table + "_dead_letters")


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_the_spark_engine_plans_typed_values(tmp_path, fmt):
    """--engine spark takes typed values and decoded keys in append mode (Spark's tasks decode them:
    tests/spark/test_export_typed_spark.py): planned without a refusal, before Spark starts."""
    from tank_spark.context import build_context
    from tank_spark.export import job
    from tank_spark.job_options import job_parser

    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", {0: [avro(SMALL, click(1))]})
    parser = job_parser("export_delta", "")
    job.add_options(parser)
    typed = ["--value-format", "avro", "--value-schema-file", SMALL, "--key-format", "utf8"]
    args = parser.parse_args(["--data-dir", base, "--table", table, "--format", fmt, "--engine", "spark", *typed])
    settings, plans, _ = job._prepare(build_context("export_delta", args), args)
    assert (settings.engine, settings.typed, settings.key_spec is not None) == ("spark", True, True)
    assert [(p.topic, p.first, p.end) for p in plans] == [("clicks", 1, 1)]
    assert not os.path.exists(table)


def test_protobuf_and_json_schema_values_become_typed_columns(tmp_path):
    """Every Protobuf field kind (a .desc and its message) and a JSON Schema's types, read back by DuckDB; a bad
    value of each goes to the dead letters."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "values"))
    from test_values_protobuf import DESC, full_order, order_decoder

    order = full_order(order_decoder()._cls).SerializeToString()
    schema = os.path.join(VALUES, "order.schema.json")
    doc = {"id": 7, "total": 12.5, "paid": True, "at": "2024-02-29T23:59:59.123456+01:00", "day": "2024-02-29",
           "address": {"city": "Oslo", "zip": None}, "tags": ["a"], "attrs": {"x": 1}, "code": "A1"}  # fmt: skip
    base = str(tmp_path / "data")
    write_topic(base, "orders", {0: [order, b"\x0a\xff", order]})
    write_topic(base, "docs", {0: [json.dumps(doc).encode(), b'{"id": 0}', json.dumps(doc).encode()]})
    pb, js = str(tmp_path / "pb"), str(tmp_path / "js")
    flags = ["--value-format", "protobuf", "--value-schema-file", DESC, "--value-message", "shop.v1.Order"]
    assert export("--data-dir", base, "--topics", "orders", "--table", pb, *flags) == 0
    assert export("--data-dir", base, "--topics", "docs", "--table", js, "--value-format", "json",
                  "--value-schema-file", schema) == 0  # fmt: skip
    con = duckdb_with("delta")
    con.execute("SET TimeZone = 'UTC'")

    def described(table):
        return dict((r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{table}')").fetchall())

    types = described(pb)
    assert (types["i64"], types["u32"], types["u64"], types["status"], types["at"], types["took"]) == (
        "BIGINT", "BIGINT", "DECIMAL(20,0)", "VARCHAR", "TIMESTAMP WITH TIME ZONE", "BIGINT",
    )  # fmt: skip
    assert types["address"] == "STRUCT(city VARCHAR, zip INTEGER)" and types["tags"] == "VARCHAR[]"
    got = con.execute(f"SELECT seq, u32, took, address.city, history FROM delta_scan('{pb}') ORDER BY seq").fetchall()
    assert got == [(s, 2**32 - 1, 90_000_500, "Oslo", ["NEW", "PAID", "7"]) for s in (1, 3)]  # took: microseconds
    assert rows(pb + "_dead_letters", "seq") == [(2,)]
    types = described(js)
    assert (types["id"], types["total"], types["paid"], types["at"], types["day"]) == (
        "BIGINT", "DOUBLE", "BOOLEAN", "TIMESTAMP WITH TIME ZONE", "DATE",
    )  # fmt: skip
    got = con.execute(f"SELECT seq, id, address.city, attrs FROM delta_scan('{js}') ORDER BY seq").fetchall()
    assert got == [(1, 7, "Oslo", {"x": 1}), (3, 7, "Oslo", {"x": 1})]
    ((seq, error),) = rows(js + "_dead_letters", "seq,error")
    assert seq == 2 and error


def test_per_topic_value_settings(tmp_path, capfd):
    """export.topics.<topic> overrides the section for its topic; a run whose topics decode differently is refused
    (one table holds one set of value columns); --value-format applies to every topic of the run."""
    base = str(tmp_path / "data")
    write_topic(base, "clicks", {0: [avro(SMALL, click(1))]})
    write_topic(base, "raw", {0: [b"bytes"]})
    clicks = {"value_format": "avro", "value_schema_file": SMALL, "key_format": "utf8"}
    cfg = config(tmp_path, value_format="binary", topics={"clicks": clicks})
    table = str(tmp_path / "t")
    report = str(tmp_path / "r.json")
    assert export("--config", cfg, "--data-dir", base, "--topics", "clicks", "--table", table, "--report", report) == 0
    assert rows(table, "seq,user,page,key") == [(1, 1, "/p1", "k0")]
    assert json.load(open(report))["summary"]["dead_letter_table"] == table + "_dead_letters"
    assert export("--config", cfg, "--data-dir", base, "--topics", "raw", "--table", str(tmp_path / "r")) == 0
    assert rows(str(tmp_path / "r"), "seq,value,key") == [(1, b"bytes", b"k0")]
    capfd.readouterr()
    assert export("--config", cfg, "--data-dir", base, "--table", str(tmp_path / "both")) == 2
    assert "have different value formats" in capfd.readouterr().err and not os.path.exists(tmp_path / "both")
    both = ["--config", cfg, "--data-dir", base, "--table", str(tmp_path / "both")]
    assert export(*both, "--value-format", "binary") == 2
    assert "have different key formats" in capfd.readouterr().err and not os.path.exists(tmp_path / "both")
    flags = ["--value-format", "binary", "--key-format", "binary"]  # every topic's: the overrides do not apply
    assert export("--config", cfg, "--data-dir", base, "--table", str(tmp_path / "b"), *flags) == 0
    assert rows(str(tmp_path / "b"), "topic,value") == [("clicks", avro(SMALL, click(1))), ("raw", b"bytes")]


def test_schema_ids_from_a_registry(tmp_path, capsys):
    """`export.value_registry_url`: a writer's schema by its id from a Schema Registry (a real HTTP server on
    loopback speaking `GET /schemas/ids/{id}`); an id the registry does not know is a dead letter."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    schema_text = open(SMALL).read()

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            known = self.path == "/schemas/ids/5"
            body = json.dumps({"schema": schema_text} if known else {"error_code": 40403, "message": "not found"})
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base, table = str(tmp_path / "data"), str(tmp_path / "t")
        write_topic(
            base, "clicks", {0: [framed(5, avro(SMALL, click(i))) if i != 1 else framed(6, b"") for i in range(3)]}
        )
        url = f"http://127.0.0.1:{server.server_address[1]}"
        dead = str(tmp_path / "dead")  # not beside the table: the audit finds it through the config
        cfg = config(tmp_path, value_format="avro", value_schema_file=SMALL, value_registry_url=url,
                     dead_letter_table=dead)  # fmt: skip
        assert export("--config", cfg, "--data-dir", base, "--table", table) == 0
    finally:
        server.shutdown()
    assert rows(table, "seq,user") == [(1, 0), (3, 2)]
    ((seq, schema_id, error),) = rows(dead, "seq,schema_id,error")
    assert (seq, schema_id) == (2, 6) and "6" in error
    assert not os.path.exists(table + "_dead_letters")
    from tank_log.tools.cli import main as cli

    for how in (["--config", cfg], ["--dead-letter-table", dead]):
        assert cli(["audit", base, "--table", table, "--json", *how]) == 0, how
        (audit,) = json.loads(capsys.readouterr().out)["partitions"]
        assert audit["dead_lettered"]["count"] == 1 and audit["unaccounted"] == 0, how
    assert cli(["audit", base, "--table", table]) == 1  # looked beside the table: seq 2 is missing


def test_keys_decode_into_the_key_column(tmp_path, caplog):
    """--key-format avro: `key` a struct of the key schema's fields (as Redpanda's and Tableflow's decoded keys), a
    null or empty key a null `key`, a key that does not decode a dead letter (raw key kept); utf8: `key` a string.
    A table's key column does not change type: refused in one line naming the key, nothing committed."""
    key_schema = tmp_path / "key.avsc"
    key_schema.write_text(json.dumps({"type": "record", "name": "K", "fields": [
        {"name": "id", "type": "long"}, {"name": "region", "type": "string"}]}))  # fmt: skip
    keys = [avro(str(key_schema), {"id": i, "region": "eu"}) for i in range(5)]
    keys[2] = b"\x02"  # cut short after the id: a bad key
    keys[3] = b""  # no key: null, not bad
    keys[4] = b"\xff"  # not UTF-8 either
    base = str(tmp_path / "data")
    d = os.path.join(base, "clicks", "0")
    os.makedirs(d)
    msgs = [Message(i + 1, TS + i, k, avro(SMALL, click(i))) for i, k in enumerate(keys)]
    write_segment(d, msgs, active=True, ts=TS // 1000)
    values = ["--value-format", "avro", "--value-schema-file", SMALL]
    table = str(tmp_path / "t")
    assert export("--data-dir", base, "--table", table, *values, "--key-format", "avro",
                  "--key-schema-file", str(key_schema)) == 0  # fmt: skip
    con = duckdb_with("delta")
    ((_, key_type, *_),) = con.execute(f"DESCRIBE SELECT key FROM delta_scan('{table}')").fetchall()
    assert key_type == "STRUCT(id BIGINT, region VARCHAR)"
    got = con.execute(f"SELECT seq, key.id, key.region, \"user\" FROM delta_scan('{table}') ORDER BY seq").fetchall()
    assert got == [(1, 0, "eu", 0), (2, 1, "eu", 1), (4, None, None, 3)]
    dead = rows(table + "_dead_letters", "seq,key,error")
    assert [(s, k) for s, k, _ in dead] == [(3, b"\x02"), (5, b"\xff")]
    assert all(e.startswith("key: ") for _, _, e in dead), dead
    caplog.clear()
    assert export("--data-dir", base, "--table", table, *values, "--key-format", "utf8") == 1
    (failed,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "field key: struct<id: int64, region: string> cannot become string" in failed
    assert rows(table, "seq") == [(1,), (2,), (4,)]
    text = str(tmp_path / "text")  # utf8 keys of binary values: `value` the bytes, an empty key null
    assert export("--data-dir", base, "--table", text, "--key-format", "utf8") == 0
    want = [(m.seq, k.decode() if k else None, m.value) for k, m in zip(keys[:4], msgs, strict=False)]
    assert rows(text, "seq,key,value") == want  # seq 3's key b"\x02" is valid UTF-8
    assert rows(text + "_dead_letters", "seq,error") == [(5, "key: byte 0: not UTF-8")]


def latest_messages(seq: int, batch: list[tuple[bytes | None, bytes]]) -> list[Message]:
    return [Message(seq + i, TS + seq + i, k, v) for i, (k, v) in enumerate(batch)]


def good(i: int) -> bytes:
    return framed(1, avro(SMALL, click(i)))


# partition 0 of the latest tests: updates, a bad newest value of b, a bad only value of d, a tombstone, a keyless one
LATEST_FIRST = [
    (b"a", good(1)),  # seq 1
    (b"b", good(2)),
    (b"a", good(3)),  # a's latest
    (b"c", good(4)),
    (b"b", good(5)[:7]),  # seq 5: b's newest, truncated: b keeps seq 2
    (b"c", b""),  # a tombstone: c is deleted
    (None, good(7)),  # keyless: skipped
    (b"d", framed(1, avro(SMALL, click(8)), magic=7)),  # seq 8: d's only value is bad: no row
]
LATEST_CFG = {"value_format": "avro", "value_schema_file": SMALL, "value_schema_ids": {1: SMALL},
              "value_wire": "confluent", "mode": "latest"}  # fmt: skip


def latest_state(table: str, fmt: str = "delta") -> list[tuple]:
    """(key, seq, user, page) of the latest table's rows, by key: read by DuckDB (Delta) or pyiceberg."""
    if fmt == "iceberg":
        return sorted((k.decode(), *rest) for k, *rest in rows(table, "key,seq,user,page", fmt))
    con = duckdb_with("delta")
    q = f"SELECT CAST(key AS VARCHAR), seq, \"user\", page FROM delta_scan('{table}') ORDER BY key"
    return con.execute(q).fetchall()


def audit(base: str, table: str, capsys, fmt: str = "delta") -> dict:
    from tank_log.tools.cli import main

    capsys.readouterr()
    rc = main(["audit", base, "--table", table, "--format", fmt, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return {p["partition"]: p for p in out["partitions"]}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_latest_mode_merges_each_keys_latest_value_that_decodes(tmp_path, capsys, fmt):
    """--mode latest with Avro values: one row per key in typed columns (DuckDB, pyiceberg); a value that does not
    decode is a dead letter and never a key's latest: the key keeps its older row, in one run or across two; audit
    accounts for the dead letters."""
    from tank_log.storage.appender import PartitionAppender

    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    d = os.path.join(base, "clicks", "0")
    os.makedirs(d)
    write_segment(d, latest_messages(1, LATEST_FIRST), active=True, ts=TS // 1000)
    args = ["--config", config(tmp_path, **LATEST_CFG), "--data-dir", base, "--table", table, "--format", fmt]
    assert export(*args, "--report", str(tmp_path / "1.json")) == 0
    r = json.load(open(tmp_path / "1.json"))
    (p0,) = r["partitions"]
    assert (p0["rows"], p0["keys"], p0["tombstones"], p0["keyless_skipped"], p0["dead_lettered"]) == (8, 3, 1, 1, 2)
    if fmt == "delta":
        con = duckdb_with("delta")
        types = dict((c[0], c[1]) for c in con.execute(f"DESCRIBE SELECT * FROM delta_scan('{table}')").fetchall())
        assert (types["user"], types["page"], types["ms"], types["key"]) == ("BIGINT", "VARCHAR", "INTEGER", "BLOB")
    assert latest_state(table, fmt) == [("a", 3, 3, "/p3"), ("b", 2, 2, "/p2")]
    assert rows(table + "_dead_letters", "seq,key", fmt) == [(5, b"b"), (8, b"d")]
    assert audit(base, table, capsys, fmt)[0]["dead_lettered"]["count"] == 2

    # across runs: b's newest is bad again (b keeps seq 2), a is updated, d gets a good value
    app = PartitionAppender(d)
    assert app.next_seq == 9
    app.append(latest_messages(9, [(b"b", good(9)[:6]), (b"a", good(10)), (b"d", good(11))]))
    assert export(*args, "--report", str(tmp_path / "2.json")) == 0
    assert json.load(open(tmp_path / "2.json"))["summary"]["dead_lettered"] == 1
    assert latest_state(table, fmt) == [("a", 10, 10, "/p10"), ("b", 2, 2, "/p2"), ("d", 11, 11, "/p11")]
    assert rows(table + "_dead_letters", "seq", fmt) == [(5,), (8,), (9,)]
    found = audit(base, table, capsys, fmt)[0]
    assert (found["verdict"], found["unaccounted"], found["dead_lettered"]["count"]) == ("ok", 0, 3)


def test_a_latest_run_killed_between_its_commits_is_merged_once_by_the_rerun(tmp_path, capsys):
    """Killed after the dead letters' commit, before the MERGE: the rerun merges the good values, adds no dead letter
    twice, and audit finds every message accounted for."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    d = os.path.join(base, "clicks", "0")
    os.makedirs(d)
    write_segment(d, latest_messages(1, LATEST_FIRST), active=True, ts=TS // 1000)
    args = ["--config", config(tmp_path, **LATEST_CFG), "--data-dir", base, "--table", table]
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD_DEAD_LETTERS=hold)
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", *args]
    proc = subprocess.Popen(job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_hold(hold + ".ready", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert rows(table + "_dead_letters", "seq") == [(5,), (8,)]
    assert latest_state(table) == []
    assert export(*args, "--report", str(tmp_path / "r.json")) == 0
    assert json.load(open(tmp_path / "r.json"))["summary"]["dead_lettered"] == 0  # the killed run's are there
    assert rows(table + "_dead_letters", "seq") == [(5,), (8,)]
    assert latest_state(table) == [("a", 3, 3, "/p3"), ("b", 2, 2, "/p2")]
    found = audit(base, table, capsys)[0]
    assert (found["verdict"], found["unaccounted"], found["dead_lettered"]["count"]) == ("ok", 0, 2)
