"""`--continuous` with typed values (tank_spark/export/continuous.py, docs/guides/export-continuous.md): Avro values
stream into Delta and Iceberg tables that DuckDB reads with their types; values that do not decode go to the
dead-letter table (committed first), are skipped and counted, or stop the query with nothing of the batch committed;
a query killed between the dead letters' commit and the table's is restarted and every message is in exactly one
table; a newer schema of the values evolves the table, an incompatible one is refused in one line.

Each query runs with `TANK_LOG_STREAM_AVAILABLE_NOW` (a trigger that reads what exists when the query starts, then
ends): on the tests' shared Spark session, or as `jobs/export_delta.py` where a test kills it."""

from __future__ import annotations

import os
import signal
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


def recorded(table, fmt, partition):
    return TableLocation.of(table, {}, fmt, None, default_source()).existing().recorded_version("clicks", partition)


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
