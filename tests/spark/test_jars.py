"""The lakehouse jars (tank_spark/jars.py): installed once by setup, loaded by the drivers that ask, never over a
submission's own choice."""

import os

import pytest
from pyspark import SparkConf

from tank_spark import jars


def test_setup_installed_them_once_and_a_rerun_fetches_nothing():
    assert jars.installed(), "run scripts/setup.sh (python -m tank_spark.jars install)"
    names = {jars.artifact(j) for j in jars.jars()}
    assert {
        "delta-spark_4.1_2.13",
        "delta-storage",
        "iceberg-spark-runtime-4.1_2.13",
        "sqlite-jdbc",
        "hadoop-aws",
    } <= names
    assert "bundle" in names
    assert not names & jars.shipped_by_pyspark()  # pyspark's own jars are never shadowed by a second copy
    assert jars.install() is False  # stamped for this pom and pyspark: no Maven run


def test_a_local_driver_gets_them_on_its_classpath_a_cluster_through_spark_jars():
    conf = SparkConf(loadDefaults=False).setMaster("local[2]")
    assert jars.configure(conf)
    assert conf.get("spark.driver.extraClassPath").split(os.pathsep) == jars.jars() and not conf.get("spark.jars")
    assert conf.get("spark.sql.extensions") == f"{jars.DELTA_EXTENSION},{jars.ICEBERG_EXTENSION}"
    assert conf.get("spark.sql.catalog.spark_catalog") == jars.DELTA_CATALOG
    conf = SparkConf(loadDefaults=False).setMaster("spark://host:7077")
    assert jars.configure(conf) and conf.get("spark.jars").split(",") == jars.jars()


def test_a_submission_that_names_delta_itself_keeps_it(monkeypatch):
    conf = SparkConf(loadDefaults=False).setMaster("yarn").set("spark.jars.packages", jars.DELTA_PACKAGE)
    conf.set("spark.sql.extensions", "my.Extension")
    assert jars.configure(conf)
    assert not conf.get("spark.jars") and conf.get("spark.sql.extensions") == "my.Extension"
    monkeypatch.setenv(jars.ENV, "off")
    conf = SparkConf(loadDefaults=False).setMaster("local[1]")
    assert not jars.configure(conf) and not conf.contains("spark.sql.extensions")


@pytest.mark.slow
def test_an_install_keeps_the_folders_beside_the_jars(tmp_path):
    """A refill (a new pom or pyspark) replaces the jars, never the REST catalog server's `iceberg-rest/` inside."""
    d = tmp_path / "jars"
    (d / "iceberg-rest").mkdir(parents=True)
    (d / "iceberg-rest" / "server.jar").write_bytes(b"kept")
    (d / "old-1.0.jar").write_bytes(b"gone")
    assert jars.install(str(d)) is True  # Maven from its local repository: setup's downloads
    assert (d / "iceberg-rest" / "server.jar").read_bytes() == b"kept"
    assert not (d / "old-1.0.jar").exists() and jars.installed(str(d))
    names = {jars.artifact(j) for j in os.listdir(d) if j.endswith(".jar")}
    assert {"delta-spark_4.1_2.13", "iceberg-spark-runtime-4.1_2.13"} <= names
    assert [p.name for p in tmp_path.iterdir()] == ["jars"]  # no temporary folder left
