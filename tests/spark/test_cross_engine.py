"""One real-broker fixture exported to Iceberg and to Delta by both engines each (Iceberg: pyiceberg, and
Iceberg's Spark writer staging what pyiceberg commits; Delta: delta-rs, and delta-spark; the Spark engines on the
shared session, the SQLite catalog beside each Iceberg table), each table read by every engine that reads its format:
Spark (Iceberg through `tank_spark.iceberg_catalog`'s JDBC catalog), DuckDB (its iceberg and delta extensions),
pyiceberg or deltalake (DataFusion's SQL over the table), and Polars. Every reader returns the same rows, equal to the
broker's dump: topic, partition, seq, ts to the microsecond, key and value. Polars also reads a table the REST
catalog names, loaded through the catalog."""

import datetime as dt

import pyarrow as pa
import pytest
from conftest import data_dir, duckdb_with, load_dump
from test_delta_spark import export, export_on
from test_export_iceberg_rest import server as rest_server  # noqa: F401 (a fixture: the REST catalog server)

from tank_log.lakehouse.location import locate
from tank_spark.iceberg_catalog import spark_table

pytestmark = [pytest.mark.slow, pytest.mark.spark]

FIXTURE = "A_multi"
TOPICS = {"events", "seqgap"}
COLUMNS = ["topic", "partition", "seq", "ts", "key", "value"]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def micros(ts):
    """A timestamp as microseconds since the epoch: Spark's are naive (the session's zone is UTC), the others'
    carry UTC; an int is taken as microseconds already."""
    if ts is None or isinstance(ts, int):
        return ts
    return ((ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)) - EPOCH) // dt.timedelta(microseconds=1)


def normal(rows):
    """(topic, partition, seq, ts µs, key or None, value) of each row (a tuple or a mapping), sorted."""
    out = []
    for r in rows:
        t, p, seq, ts, key, value = (r[c] for c in COLUMNS) if isinstance(r, dict) else r
        out.append((t, p, seq, micros(ts), bytes(key) if key else None, bytes(value)))
    return sorted(out)


def expected_rows():
    return sorted(
        (t, p, seq, ts * 1000, key, value)
        for (t, p), msgs in load_dump(FIXTURE).items()
        if t in TOPICS
        for seq, ts, key, value in msgs
    )


def by_spark(df):
    return normal(tuple(r) for r in df.select(*COLUMNS).collect())


def by_duckdb(scan):
    con = duckdb_with("avro", "iceberg", "delta")
    return normal(con.execute(f"SELECT {', '.join(COLUMNS)} FROM {scan}").fetchall())


def by_polars(frame):
    return normal(frame.select(COLUMNS).collect().iter_rows())


def test_every_engine_reads_every_export_alike(spark, tmp_path, monkeypatch):
    import polars as pl
    from deltalake import DeltaTable, QueryBuilder

    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # Polars' own planner is a package not installed here
    expected = expected_rows()
    assert expected
    args = ["--data-dir", data_dir(FIXTURE), "--topics", ",".join(sorted(TOPICS))]
    names = ("iceberg_pyiceberg", "iceberg_spark", "delta_rs", "delta_spark")
    iceberg_py, iceberg_spark, delta_rs, delta_spark = (str(tmp_path / n) for n in names)
    assert export(*args, "--table", iceberg_py, "--format", "iceberg") == 0
    _, summary = export_on(spark, *args, "--table", iceberg_spark, "--format", "iceberg", "--engine", "spark")
    assert summary["rows"] == len(expected) and summary["engine"] == "spark", summary
    assert export(*args, "--table", delta_rs) == 0
    _, summary = export_on(spark, *args, "--table", delta_spark, "--engine", "spark")
    assert summary["rows"] == len(expected) and summary["engine"] == "spark", summary

    readers = {}
    for name, path in (("iceberg by pyiceberg", iceberg_py), ("iceberg by spark", iceberg_spark)):
        location = locate(path, {}, "iceberg")
        table = location.existing().table
        t = spark_table(location)
        session = spark.newSession()  # a session of its own: each SQLite catalog is Spark's catalog tank_log
        for key, value in t.conf.items():
            session.conf.set(key, value)
        readers[name, "spark"] = by_spark(session.table(t.name))
        readers[name, "duckdb"] = by_duckdb(f"iceberg_scan('{table.metadata_location}')")
        readers[name, "pyiceberg"] = normal(table.scan().to_arrow().select(COLUMNS).to_pylist())
        readers[name, "polars"] = by_polars(pl.scan_iceberg(table))
    for name, path in (("delta-rs", delta_rs), ("delta-spark", delta_spark)):
        readers[name, "spark"] = by_spark(spark.read.format("delta").load(path))
        readers[name, "duckdb"] = by_duckdb(f"delta_scan('{path}')")
        sql = QueryBuilder().register("t", DeltaTable(path)).execute(f"SELECT {', '.join(COLUMNS)} FROM t")
        readers[name, "deltalake"] = normal(pa.table(sql.read_all()).to_pylist())  # arro3 → pyarrow
        readers[name, "polars"] = by_polars(pl.scan_delta(path))

    differ = {k: len(v) for k, v in readers.items() if v != expected}
    assert not differ, f"{len(expected)} rows expected; these readers return others: {differ}"


def test_polars_reads_an_iceberg_table_of_the_rest_catalog(tmp_path, monkeypatch, request):
    """An export into a table the REST catalog names (the reference server, `test_export_iceberg_rest.Server`), read
    by Polars as its users do with a catalog: the table pyiceberg loads through the catalog, by `pl.scan_iceberg`
    and by pyiceberg's `scan().to_polars()`, each the broker's dump to the microsecond."""
    import polars as pl
    from test_export_iceberg_rest import config

    server = request.getfixturevalue("rest_server")
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    cfg = config(tmp_path, server, "tank.cross")
    assert export("--config", cfg, "--data-dir", data_dir(FIXTURE), "--topics", ",".join(sorted(TOPICS))) == 0
    table = server.catalog().load_table("tank.cross")
    expected = expected_rows()
    assert by_polars(pl.scan_iceberg(table)) == expected
    assert normal(table.scan().to_polars().select(COLUMNS).iter_rows()) == expected
