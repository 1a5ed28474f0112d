"""Delta type widening by `--engine spark` (tank_spark/export/schema.py `_widen_delta`): a newer Avro schema that
widens an int field to long widens the Delta column in place through delta-spark's typeWidening table feature; the
older rows (int32 Parquet files) and the newer read right in delta-spark and DuckDB. delta-rs (deltalake 1.6.6)
neither reads nor writes such a table: the deltalake engine refuses it in one line; a widening delta-spark does not
make and an incompatible change stay refused. On the suite's Spark session (`export_on`)."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import ROOT, duckdb_with
from test_delta_spark import export_on

from tank_log.errors import IncompatibleSchema, RunFailed
from tank_log.lakehouse import TableLocation, TableUnreadable
from tank_log.tools.cli import main as cli_main

sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_typed_evolution import roll_and_append, schema_file  # noqa: E402
from test_typed_export import avro, export, write_topic  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_an_int_widened_to_long_widens_the_delta_column(spark, tmp_path, capsys):
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    v1 = schema_file(tmp_path, "v1.avsc", [])  # user long, page string, ms int
    write_topic(base, "clicks", {0: [avro(v1, {"user": 1, "page": "/p", "ms": 7})]})
    common = ["--data-dir", base, "--table", table, "--value-format", "avro"]
    assert export(*common, "--value-schema-file", v1) == 0  # a table of the deltalake engine's (in the driver)

    # v2: ms widened to long, and a record field added (its required field nullable in the table: delta-spark's)
    geo = {"name": "geo", "type": ["null", {"type": "record", "name": "Geo", "fields": [{"name": "lat",
                                                                                      "type": "double"}]}]}  # fmt: skip
    v2 = schema_file(tmp_path, "v2.avsc", [{"name": "ms", "type": "long"}, geo], drop="ms")
    roll_and_append(base, "clicks", [avro(v2, {"user": 2, "page": "/q", "ms": 2**40, "geo": {"lat": 59.9}})])
    _, summary = export_on(spark, *common, "--value-schema-file", v2, "--engine", "spark")
    assert summary["rows"] == 1, summary
    delta = TableLocation.of(table, {}, "delta").existing()
    assert "typeWidening" in delta.protocol().reader_features
    frame = spark.read.format("delta").load(table)
    assert dict(frame.dtypes)["ms"] == "bigint" and dict(frame.dtypes)["geo"] == "struct<lat:double>"
    want = [(1, 7, None), (2, 2**40, 59.9)]
    got = [(r.seq, r.ms, r.geo and r.geo.lat) for r in frame.orderBy("seq").collect()]
    assert got == want
    con = duckdb_with("delta")
    scan = f"delta_scan('{table}')"
    assert con.execute(f"SELECT typeof(ms) FROM {scan} LIMIT 1").fetchone() == ("BIGINT",)
    assert con.execute(f"SELECT seq, ms, geo.lat FROM {scan} ORDER BY seq").fetchall() == want
    with pytest.raises(TableUnreadable, match="typeWidening"):  # delta-rs refuses to read the rows: no wrong read
        delta.to_pyarrow_dataset()

    # the deltalake engine refuses the table in one line; the older, narrower schema writes by --engine spark
    roll_and_append(base, "clicks", [avro(v1, {"user": 3, "page": "/r", "ms": 3})])
    version = delta.version()
    capsys.readouterr()
    assert export(*common, "--value-schema-file", v1) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "table feature typeWidening" in line and "--engine spark" in line, line
    assert TableLocation.of(table, {}, "delta").existing().version() == version
    # what else delta-rs would do on the table is refused in one line too, nothing written: the audit (its rows
    # cannot be read: exit 1) and the upkeep (delta-rs cannot commit: exit 2)
    assert cli_main(["audit", "--table", table, base]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "delta-rs cannot read the table's rows" in line and "typeWidening" in line, line
    for step in (["--optimize"], ["--vacuum", "168h"]):
        assert export("--data-dir", base, "--table", table, "--upkeep-only", *step) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "typeWidening" in x]
        assert f"{step[0]}: the table uses table feature(s) typeWidening" in line, line
    assert TableLocation.of(table, {}, "delta").existing().version() == version
    _, summary = export_on(spark, *common, "--value-schema-file", v1, "--engine", "spark")
    assert summary["rows"] == 1, summary
    got = [(r.seq, r.ms, r.geo) for r in spark.read.format("delta").load(table).orderBy("seq").collect()]
    assert got[-1] == (3, 3, None)

    # long -> double is no widening of Delta's; string is no widening at all: refused, nothing committed
    roll_and_append(base, "clicks", [avro(v2, {"user": 4, "page": "/s", "ms": 4, "geo": None})])
    version = TableLocation.of(table, {}, "delta").existing().version()
    as_double = schema_file(tmp_path, "v3.avsc", [{"name": "ms", "type": "double"}], drop="ms")
    with pytest.raises(RunFailed, match=r"^field ms: int64 -> double is a compatible change, but delta-spark's"):
        export_on(spark, *common, "--value-schema-file", as_double, "--engine", "spark")
    as_text = schema_file(tmp_path, "v4.avsc", [{"name": "ms", "type": "string"}], drop="ms")
    with pytest.raises(IncompatibleSchema, match=r"^field ms: int64 cannot become string \(not a compatible"):
        export_on(spark, *common, "--value-schema-file", as_text, "--engine", "spark")
    assert TableLocation.of(table, {}, "delta").existing().version() == version
