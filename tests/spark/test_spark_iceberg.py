"""Spark reads the Iceberg tables the export commits with pyiceberg, through Iceberg's Spark runtime (among the
lakehouse jars) and the Spark catalog `tank_spark.iceberg_catalog` configures: a local table's SQLite catalog (the
JDBC catalog, on the file pyiceberg writes) and a table named in the reference REST catalog server. Every row equals
the broker's dump and what pyiceberg reads; the columns have Spark's types (ts a timestamp, seq a long, key and
value binary)."""

import datetime as dt
import os

import pytest
from conftest import data_dir, load_dump
from test_delta_spark import export
from test_export_iceberg_rest import config, server  # noqa: F401 — the module's REST catalog server fixture

from tank_log.lakehouse.location import RestCatalog, locate
from tank_spark.iceberg_catalog import SparkIcebergTable, jdbc_properties, spark_table

pytestmark = [pytest.mark.slow, pytest.mark.spark]

TOPICS = {"events", "seqgap"}
COLUMNS = ["topic", "partition", "seq", "ts", "key", "value"]


def dump_messages(name, topics):
    """(topic, partition, seq, ts as a UTC datetime, key, value) of the broker's dump."""
    return sorted(
        (t, p, seq, dt.datetime.fromtimestamp(ts / 1000, dt.UTC), key, value)
        for (t, p), msgs in load_dump(name).items()
        if t in topics
        for seq, ts, key, value in msgs
    )


def read_by_spark(spark, t: SparkIcebergTable, how="table"):
    """The table's rows through a new session (its own catalogs) with `t`'s Spark catalog, and the frame's types."""
    from pyspark.sql.types import BinaryType, LongType, TimestampType

    s = spark.newSession()
    for key, value in t.conf.items():
        s.conf.set(key, value)
    df = s.table(t.name) if how == "table" else s.read.format("iceberg").load(t.name)
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types["ts"] == TimestampType() and types["seq"] == LongType(), types
    assert types["key"] == BinaryType() and types["value"] == BinaryType(), types
    out = []
    for r in df.select(*COLUMNS).collect():
        ts = r.ts.replace(tzinfo=dt.UTC)  # the session's time zone is UTC (conftest)
        key = None if r.key is None else bytes(r.key)
        out.append((r.topic, r.partition, r.seq, ts, key or None, bytes(r.value)))
    return sorted(out)


def read_by_pyiceberg(location):
    d = location.existing().table.scan().to_arrow().select(COLUMNS).to_pylist()
    return sorted((r["topic"], r["partition"], r["seq"], r["ts"], r["key"] or None, r["value"]) for r in d)


def test_spark_reads_a_table_of_the_sqlite_catalog(spark, tmp_path):
    """A local table with its default SQLite catalog beside it: Spark's JDBC catalog reads what pyiceberg committed,
    by `spark.table` and by `spark.read.format("iceberg")`, after an incremental export too."""
    table = str(tmp_path / "events")
    topics = ",".join(sorted(TOPICS))
    assert export("--data-dir", data_dir("A_multi"), "--table", table, "--format", "iceberg", "--topics", topics) == 0
    location = locate(table, {}, "iceberg")
    t = spark_table(location)
    assert t.name == "tank_log.tank_log.events"
    assert t.conf["spark.sql.catalog.tank_log.uri"] == f"jdbc:sqlite:{table}.iceberg-catalog.db"
    expected = dump_messages("A_multi", TOPICS)
    assert read_by_spark(spark, t) == expected
    assert read_by_spark(spark, t, how="format") == expected
    assert read_by_pyiceberg(location) == expected


def test_spark_reads_a_table_named_in_the_rest_catalog(spark, tmp_path, server):  # noqa: F811
    """`tank.spark_read` in the reference REST catalog server, read by Spark through a REST Spark catalog."""
    cfg = config(tmp_path, server, "tank.spark_read")
    assert export("--config", cfg, "--data-dir", data_dir("A_multi"), "--topics", ",".join(sorted(TOPICS))) == 0
    location = locate("tank.spark_read", {}, "iceberg", RestCatalog(server.uri))
    t = spark_table(location, "rest")
    assert t.name == "rest.tank.spark_read"
    assert t.conf == {
        "spark.sql.catalog.rest": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.rest.cache-enabled": "false",
        "spark.sql.catalog.rest.type": "rest",
        "spark.sql.catalog.rest.uri": server.uri,
    }
    expected = dump_messages("A_multi", TOPICS)
    assert read_by_spark(spark, t) == expected
    assert read_by_pyiceberg(location) == expected


def test_the_spark_catalog_of_other_settings_or_none():
    """Credentials and warehouse reach the REST catalog's properties; a SQL catalog's Spark catalog keeps
    pyiceberg's name; databases the JDBC catalog cannot open, and Delta tables, are refused by name."""
    rest = RestCatalog("https://cat.example/api", warehouse="lake", credential="id:secret")
    t = spark_table(locate_without_catalog("tank.events", rest), "lake")
    assert t.conf["spark.sql.catalog.lake.warehouse"] == "lake"
    assert t.conf["spark.sql.catalog.lake.credential"] == "id:secret" and "secret" not in repr(t)
    assert jdbc_properties("postgresql+psycopg2://u:p%40ss@db:5432/cat") == {
        "uri": "jdbc:postgresql://db:5432/cat", "jdbc.user": "u", "jdbc.password": "p@ss",
    }  # fmt: skip
    with pytest.raises(ValueError, match="mysql://db/cat: Spark's Iceberg JDBC catalog"):
        jdbc_properties("mysql://u:pw@db/cat")
    with pytest.raises(ValueError, match="absolute path"):
        jdbc_properties("sqlite:///relative.db")
    with pytest.raises(ValueError, match="named tank_log"):
        spark_table(locate("/tmp/t", {}, "iceberg"), "other")
    with pytest.raises(ValueError, match="format delta, not iceberg"):
        spark_table(locate("/tmp/t", {}, "delta"))


def locate_without_catalog(name, catalog):
    """A REST table's location as `locate` makes it, without asking a catalog where it is."""
    from tank_log.lakehouse.location import TableLocation

    return TableLocation(os.path.join("/warehouse", *name.split(".")), {}, "iceberg", catalog, None, name)
