"""The lakehouse jars (tank_spark/jars.py): installed once by setup, loaded by the drivers that ask, never over a
submission's own choice."""

import os

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
