"""`--engine spark` into Iceberg tables named in a REST catalog (Iceberg's reference server, as
test_export_iceberg_rest.py starts it): Iceberg's Spark writer stages the rows, pyiceberg commits them with the
recorded versions (tank_spark/export/iceberg_spark.py). Exactly once across a rerun and a kill before the commit, and
the rows equal to the deltalake engine's export of the same data; Spark reads the table back."""

import json
import os
import threading
import time

import pytest
from conftest import copy_tree, data_dir, load_dump, run_job_script
from test_delta_spark import export, export_on
from test_export_iceberg_rest import config, server  # noqa: F401 (the module's REST catalog server)
from test_job_export import roll_and_append

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COLUMNS = ("topic", "partition", "seq", "ts", "key", "value", "date", "ts_raw", "source")


def rows(server, name):  # noqa: F811 (the fixture's name)
    """Every row of the table through pyiceberg, all columns, sorted; duplicates kept."""
    d = server.catalog().load_table(name).scan().to_arrow().to_pydict()
    return sorted(zip(*(d[c] for c in COLUMNS), strict=True), key=lambda r: (r[0], r[1], r[2]))


def test_spark_engine_exports_exactly_once_as_the_deltalake_engine(tmp_path, server, spark):  # noqa: F811
    """The same fixture exported by each engine into its own table: the same rows; a rerun commits nothing; new
    messages with the driver killed after Spark staged them and before the commit: nothing of them in the table,
    and the rerun adds each once; Spark reads what the table holds; Spark's `expire_snapshots` of every old snapshot
    keeps every published file, and the next export adds each new message once. The commit's summary names the run
    and ranges and the staged snapshot is gone."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    (tmp_path / "s").mkdir()
    (tmp_path / "r").mkdir()
    by_spark, by_rs = config(tmp_path / "s", server, "tank.by_spark"), config(tmp_path / "r", server, "tank.by_rs")
    args = ["--data-dir", base, "--topics", "events,seqgap"]
    _, summary = export_on(spark, "--config", by_spark, *args, "--engine", "spark")
    assert summary["engine"] == "spark" and summary["by_status"] == {"exported": 4}, summary
    assert export("--config", by_rs, *args) == 0
    first = rows(server, "tank.by_rs")
    assert rows(server, "tank.by_spark") == first and len(first) == len({r[:3] for r in first})
    table = server.catalog().load_table("tank.by_spark")
    assert [s.summary.additional_properties.get("wap.id") for s in table.snapshots()] == [None]  # unstaged
    ranges = json.loads(table.current_snapshot().summary.additional_properties["tank-log.ranges"])
    assert sorted(ranges) == ["events/0", "events/1", "events/2", "seqgap/0"]

    _, summary = export_on(spark, "--config", by_spark, *args, "--engine", "spark")  # nothing new
    assert summary["rows"] == 0 and len(server.catalog().load_table("tank.by_spark").snapshots()) == 1

    roll_and_append(base, "events", 7)
    r = run_job_script(
        "export_delta",
        "--config",
        by_spark,
        *args,
        "--engine",
        "spark",
        env_extra={"TANK_LOG_EXPORT_CRASH": "before-commit"},
    )
    assert r.returncode == 137, r.stderr[-3000:]
    assert rows(server, "tank.by_spark") == first  # staged, not committed: no reader sees it
    _, summary = export_on(spark, "--config", by_spark, *args, "--engine", "spark")
    assert summary["rows"] == 21, summary  # 7 new messages in each of the topic's 3 partitions, once
    assert export("--config", by_rs, *args) == 0
    assert rows(server, "tank.by_spark") == rows(server, "tank.by_rs")

    catalog = f"rest_{server.port}"  # the REST catalog in Spark, as a user's session names it
    for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": server.uri}.items():
        spark.conf.set(f"spark.sql.catalog.{catalog}{key}", value)
    assert spark.table(f"{catalog}.tank.by_spark").count() == len(first) + 21
    snapshots = spark.sql(  # the docs' query (docs/reference/watermarks.md): the killed run's staged one has none
        f"SELECT summary['tank-log.ranges'] AS ranges FROM {catalog}.tank.by_spark.snapshots ORDER BY committed_at"
    ).collect()
    assert [s.ranges and json.loads(s.ranges) == ranges for s in snapshots] == [True, None, False]

    # another writer expires every snapshot but the current one with Iceberg's own procedure, which deletes the
    # files only expired snapshots reference (the killed run's staged ones), not those the commits published
    spark.sql(
        f"CALL {catalog}.system.expire_snapshots(table => 'tank.by_spark', older_than => TIMESTAMP '2999-01-01', "
        "retain_last => 1)"
    )
    assert len(server.catalog().load_table("tank.by_spark").snapshots()) == 1
    assert rows(server, "tank.by_spark") == rows(server, "tank.by_rs")  # every file still there
    roll_and_append(base, "events", 4)
    _, summary = export_on(spark, "--config", by_spark, *args, "--engine", "spark")
    assert summary["rows"] == 12, summary
    assert export("--config", by_rs, *args) == 0
    assert rows(server, "tank.by_spark") == rows(server, "tank.by_rs")


def test_a_concurrent_export_fails_the_held_commit_and_the_replan_finds_nothing(tmp_path, server, spark, monkeypatch):  # noqa: F811
    """The spark engine held before its commit, its rows staged; the deltalake engine exports the same partitions
    meanwhile; released, the held commit finds the recorded versions moved and commits nothing, and its re-plan
    finds nothing left: every message once."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    (tmp_path / "c").mkdir()
    cfg = config(tmp_path / "c", server, "tank.raced")
    args = ["--data-dir", base, "--topics", "events"]
    held = tmp_path / "hold"
    monkeypatch.setenv("TANK_LOG_EXPORT_HOLD", str(held))
    out = {}

    def held_run():
        try:
            out["result"] = export_on(spark, "--config", cfg, *args, "--engine", "spark")
        except BaseException as err:  # reported below
            out["error"] = err

    run = threading.Thread(target=held_run)
    run.start()
    deadline = time.monotonic() + 300
    while not os.path.exists(f"{held}.ready"):
        assert run.is_alive(), out
        assert time.monotonic() < deadline, "the spark engine did not reach its hold"
        time.sleep(0.05)
    monkeypatch.delenv("TANK_LOG_EXPORT_HOLD")  # the other export runs through
    assert export("--config", cfg, *args) == 0
    held.touch()
    run.join(300)
    assert "error" not in out, out
    assert out["result"][1]["rows"] == 0, out["result"][1]
    got = rows(server, "tank.raced")
    want = sorted((t, p, m[0]) for (t, p), msgs in load_dump("A_multi").items() if t == "events" for m in msgs)
    assert [r[:3] for r in got] == want
