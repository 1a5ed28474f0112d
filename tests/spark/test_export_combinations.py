"""Export options tried together: a table partitioned by `partition` (whose files hold no such column) exported to
again, in both modes and with both engines."""

import pytest
from conftest import copy_tree, data_dir
from deltalake import DeltaTable
from test_delta_spark import export
from test_job_export import roll_and_append

from tank_log.storage.datadir import partitions_at
from tank_log.tools.demo import write_demo

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def on_disk(base, topics=None):
    """(topic, partition, seq) of every message under `base`."""
    return sorted((p.topic, p.id, m.seq) for p in partitions_at(base, topics) for s in p.segments for m in s.messages())


def table_rows(table):
    d = DeltaTable(table).to_pyarrow_table(columns=["topic", "partition", "seq", "key", "value"]).to_pydict()
    return sorted(zip(d["topic"], d["partition"], d["seq"], d["key"], d["value"], strict=True))


COMBINATIONS = [
    ("A_multi", "topic,partition", "append"),
    ("demo", "partition,date", "append"),
    ("A_multi", "topic,partition", "latest"),
    ("demo", "partition,date", "latest"),
]


@pytest.mark.parametrize(("data", "partition_by", "mode"), COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_a_table_partitioned_by_partition_takes_every_later_export(tmp_path, data, partition_by, mode):
    """The Parquet files of a table partitioned by `partition` hold no `partition` column (Delta keeps its value in
    the file's add action): the look for another writer's rows reads it from there. A rerun with nothing new, a dry
    run and a run with new messages all succeed, and the table holds each message once (append) or each key's last
    value (latest)."""
    base = str(tmp_path / "base")
    if data == "demo":
        write_demo(base)
    else:
        copy_tree(data_dir(data), base)
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--partition-by", partition_by, "--mode", mode]
    assert export(*args) == 0
    assert DeltaTable(table).metadata().partition_columns == partition_by.split(",")
    first = table_rows(table)
    version = DeltaTable(table).version()
    assert export(*args) == 0  # nothing new
    assert export(*args, "--dry-run") == 0
    assert DeltaTable(table).version() == version and table_rows(table) == first
    topic = sorted({r[0] for r in first})[0]
    appended = roll_and_append(base, topic, 5)
    assert export(*args, "--dry-run") == 0 and DeltaTable(table).version() == version
    assert export(*args) == 0
    assert export(*args) == 0 and DeltaTable(table).version() == version + 1
    rows = table_rows(table)
    if mode == "append":
        assert [r[:3] for r in rows] == on_disk(base)
    else:  # every appended message has key b"new": the table holds its last value, once per partition
        new = [r for r in rows if r[3] == b"new"]
        last = {(t, p): v for t, p, _, v in appended}
        assert sorted((t, p, v) for t, p, _, _, v in new) == sorted((t, p, v) for (t, p), v in last.items())
        assert [r for r in rows if r[3] != b"new"] == [r for r in first if r[3] != b"new"]


def test_engine_spark_exports_again_to_a_table_partitioned_by_partition(spark, tmp_path):
    """The same with the delta-spark engine, and alternating with the delta-rs engine on the same table."""
    from test_delta_spark import export_on

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--partition-by", "topic,partition", "--topics", "events,small"]
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] > 0
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 0
    _, summary = export_on(spark, *args, "--engine", "spark", "--dry-run")
    assert export(*args) == 0 and export(*args, "--dry-run") == 0
    roll_and_append(base, "events", 7)
    assert export(*args) == 0
    roll_and_append(base, "small", 3)
    _, summary = export_on(spark, *args, "--engine", "spark")
    assert summary["rows"] == 3
    assert [r[:3] for r in table_rows(table)] == on_disk(base, ["events", "small"])
