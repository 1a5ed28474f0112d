"""Typed tables on Spark's executors (tank_spark/export, docs/guides/typed-tables.md): the values decode in the
executors' Python workers, the bad ones go to the dead-letter table, and Spark's own Delta reader (the suite's
shared session) reads the typed columns with their types. The driver-side behaviour is in tests/test_typed_*.py."""

from __future__ import annotations

import json
import os

import pytest
from conftest import ROOT, run_job_script

VALUES = os.path.join(ROOT, "tests", "data", "values")
SMALL = os.path.join(VALUES, "small.avsc")


@pytest.mark.slow  # a Spark job of its own, then Spark's Delta reader
def test_executors_decode_and_spark_reads_the_typed_columns(spark, tmp_path):
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_typed_export import avro, write_topic

    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    values = [avro(SMALL, {"user": i, "page": f"/p{i}", "ms": i}) for i in range(20)]
    values[7] = values[7][:1]  # truncated
    write_topic(base, "clicks", {0: values, 1: values[:5]})
    report = str(tmp_path / "r.json")
    args = ["--data-dir", base, "--table", table, "--value-format", "avro", "--value-schema-file", SMALL]
    args += ["--key-format", "utf8"]  # the keys decode on the executors too: a string column
    r = run_job_script("export_delta", *args, "--report", report, where="executors")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.load(open(report))["summary"]
    assert summary["executed_on"] == "executors" and summary["rows"] == 24 and summary["dead_lettered"] == 1
    df = spark.read.format("delta").load(table)
    types = dict(df.dtypes)
    assert (types["user"], types["page"], types["ms"], types["key"]) == ("bigint", "string", "int", "string")
    got = sorted(tuple(r) for r in df.select("partition", "seq", "user", "page", "key").collect())
    assert got == sorted(
        [(0, i + 1, i, f"/p{i}", f"k{i}") for i in range(20) if i != 7]
        + [(1, i + 1, i, f"/p{i}", f"k{i}") for i in range(5)]
    )
    dead = spark.read.format("delta").load(table + "_dead_letters").select("partition", "seq", "value", "error")
    ((p, seq, value, error),) = [tuple(r) for r in dead.collect()]
    assert (p, seq, bytes(value)) == (0, 8, values[7]) and "truncated" in error
