"""The export's current-state tables (`--mode latest`, tank_spark/export/latest.py) on real Delta tables: key by key
what `tank-log compact` keeps of every `cleanup` fixture, tombstones deleting, reruns and crashes changing nothing
twice, two runs equal to one, keyless messages counted, and a table's mode fixed. Small runs: in the driver, no
JVM; one test reads a table back with Spark's Delta reader on the suite's shared session."""

import json
import os
import subprocess
import sys

import pytest
from conftest import DATASETS, ROOT, copy_tree, data_dir, run_job_script, wait_for_hold
from deltalake import DeltaTable
from test_delta_spark import export, spark_transactions

from tank_log.format.bundle import Message
from tank_log.lakehouse import app_id, default_source, table_id
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import partitions_at

CLEANUP = sorted(  # every (dataset, topic) of the fixtures whose topic config says log.cleanup.policy=cleanup
    {
        (name, part.topic)
        for name in DATASETS
        for part in partitions_at(data_dir(name))
        if part.config.cleanup_policy == "cleanup"
    }
)


def state(uri):
    """{(topic, partition, key): (seq, value)} of a latest table; each key once."""
    d = DeltaTable(uri).to_pyarrow_table().to_pydict()
    keys = list(zip(d["topic"], d["partition"], d["key"], strict=True))
    assert len(keys) == len(set(keys))
    return dict(zip(keys, zip(d["seq"], d["value"], strict=True), strict=True))


def compacted_state(base, topic, tmp_path):
    """What `tank-log compact` keeps of the topic (run on a copy), as a current state: per key its message with the
    highest seq among the compacted segments and the active one, tombstones (kept by compaction) deleting it."""
    copy = copy_tree(base, str(tmp_path / "compacted"))
    cli = [sys.executable, "-m", "tank_log.tools.cli", "compact", copy, "--topics", topic, "--broker-stopped"]
    r = subprocess.run([*cli, "--force"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    latest = {}
    for part in partitions_at(copy, [topic]):
        for seg in part.segments:
            for m in seg.messages():
                if m.key:
                    latest[(topic, part.id, m.key)] = (m.seq, m.value)
    return {k: v for k, v in latest.items() if v[1]}, copy


def report(path):
    return json.load(open(path))


@pytest.mark.parametrize(("name", "topic"), CLEANUP, ids=[f"{n}-{t}" for n, t in CLEANUP])
def test_the_latest_table_is_what_compaction_keeps(tmp_path, name, topic):
    base = copy_tree(data_dir(name), str(tmp_path / "data"))
    want, compacted = compacted_state(base, topic, tmp_path)
    uri = str(tmp_path / "table")
    assert export("--data-dir", base, "--table", uri, "--topics", topic, "--mode", "latest") == 0
    assert state(uri) == want and want
    # compaction does not change the current state: the compacted copy's table is the same
    other = str(tmp_path / "table-of-compacted")
    assert export("--data-dir", compacted, "--table", other, "--topics", topic, "--mode", "latest") == 0
    assert state(other) == want


def produce(base, topic):
    """Through the appender: an update of a live key, a tombstone of another, a new key, a tombstone of a key never
    seen, and a keyless message, in each partition; returns how many messages."""
    n = 0
    for part in partitions_at(base, [topic]):
        live = sorted(
            {m.key for s in part.segments for m in s.messages() if m.key and m.value}
        )  # not necessarily live at the end: the test compares tables, not this list
        app = PartitionAppender(part.path)
        s, ts = app.next_seq, 1_800_000_000_000
        msgs = [
            Message(s, ts, live[0], b"updated"),
            Message(s + 1, ts, live[1], b""),
            Message(s + 2, ts, b"brand-new", b"v"),
            Message(s + 3, ts, b"never-seen", b""),
            Message(s + 4, ts, None, b"keyless"),
        ]
        app.append(msgs[:3])
        app.append(msgs[3:])
        n += len(msgs)
    return n


def test_reruns_a_crash_and_two_runs_equal_one(tmp_path):
    """On the kv data of E_before (many updates per key, tombstones, keyless messages; before the broker compacted
    it): a latest table does not need a `cleanup` topic."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    uri = str(tmp_path / "table")
    args = ["--data-dir", base, "--table", uri, "--mode", "latest"]

    # a run that dies before its MERGE commits nothing; the rerun merges everything once
    r = run_job_script("export_delta", *args, where="driver", env_extra={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-2000:]
    assert DeltaTable(uri).version() == 0 and not state(uri)  # created, nothing merged
    r = run_job_script("export_delta", *args, "--report", str(tmp_path / "1.json"), where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "export: 458 keyless messages skipped" in r.stderr
    rep = report(tmp_path / "1.json")
    kv = rep["partitions"][0]
    assert (kv["rows"], kv["keys"], kv["tombstones"], kv["keyless_skipped"]) == (8810, 2150, 47, 458)
    assert rep["summary"]["keyless_skipped"] == 458 and rep["summary"]["table_version"] == 1
    first = state(uri)
    assert len(first) == 2150 - 47 == rep["summary"]["merge"]["num_target_rows_inserted"]
    assert DeltaTable(uri).transaction_version(kv["app_id"]) == 8810

    # a rerun finds nothing new and commits nothing
    assert export(*args, "--report", str(tmp_path / "2.json")) == 0
    assert report(tmp_path / "2.json")["partitions"][0]["status"] == "up-to-date"
    assert DeltaTable(uri).version() == 1 and state(uri) == first

    # more messages; the second run merges only them, in one commit: updated, deleted, inserted
    assert produce(base, "kv") == 5
    assert export(*args, "--report", str(tmp_path / "3.json")) == 0
    rep = report(tmp_path / "3.json")
    assert rep["summary"]["rows"] == 5 and rep["summary"]["keyless_skipped"] == 1
    assert rep["summary"]["merge"] == {
        "num_target_rows_inserted": 1,
        "num_target_rows_updated": 1,
        "num_target_rows_deleted": 1,
        "num_target_rows_copied": rep["summary"]["merge"]["num_target_rows_copied"],
    }
    assert DeltaTable(uri).version() == 2
    second = state(uri)
    assert second[("kv", 0, b"brand-new")][1] == b"v" and ("kv", 0, b"never-seen") not in second
    assert len(second) == len(first)  # one deleted, one inserted
    assert {k for k, v in second.items() if v[1] == b"updated"} - first.keys() == set()

    # one run over everything gives the same table
    once = str(tmp_path / "once")
    assert export("--data-dir", base, "--table", once, "--mode", "latest") == 0
    assert state(once) == second


def test_a_table_keeps_its_mode(tmp_path, capsys):
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    latest, append = str(tmp_path / "latest"), str(tmp_path / "append")
    conf = tmp_path / "job.yaml"
    conf.write_text(f"export:\n  table: {latest}\n  mode: latest\n")
    assert export("--data-dir", base, "--config", str(conf)) == 0  # the config's mode
    configuration = {"tank_log.export.mode": "latest", "tank_log.export.legacy_source": default_source()}
    assert DeltaTable(latest).metadata().configuration == configuration
    assert export("--data-dir", base, "--table", append) == 0
    for uri, mode, other in ((latest, "append", "latest"), (append, "latest", "append")):
        capsys.readouterr()
        assert export("--data-dir", base, "--table", uri, "--mode", mode) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"export_delta: table {uri} was created with export mode {other}, this run's mode is {mode}: a table's "
            "mode is fixed when it is created (export to another table)"
        )
    for flags in (
        ["--continuous", "--checkpoint", str(tmp_path / "c")],
        ["--value-format", "json", "--value-schema", "a int"],
        ["--since", "2024-01-01"],
    ):
        capsys.readouterr()
        assert export("--data-dir", base, "--table", str(tmp_path / "t"), "--mode", "latest", *flags) == 2
        assert f"--mode latest does not take {flags[0]}" in capsys.readouterr().err


def test_a_concurrent_latest_export_makes_the_other_replan(tmp_path):
    """Run A reads and reduces, then waits before its MERGE; run B merges the same messages; A re-reads the recorded
    versions, re-plans, finds nothing left and commits nothing: each message is merged once."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    uri = str(tmp_path / "table")
    args = ["--data-dir", base, "--table", uri, "--mode", "latest"]
    assert export(*args) == 0
    produce(base, "kv")
    hold = str(tmp_path / "release")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TANK_LOG_EXPORT_HOLD": hold}
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", *args]
    a = subprocess.Popen([*job, "--report", str(tmp_path / "a.json")], env=env, stderr=subprocess.PIPE, text=True)
    wait_for_hold(hold + ".ready", a)
    assert export(*args) == 0 and DeltaTable(uri).version() == 2
    merged = state(uri)
    open(hold, "w").close()
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    assert "re-planning (attempt 2)" in err
    assert report(tmp_path / "a.json")["partitions"][0]["status"] == "up-to-date"
    assert DeltaTable(uri).version() == 2 and state(uri) == merged


def test_spark_reads_a_latest_table(spark, tmp_path):
    """Delta's own reader (the suite's shared session) reads a table two MERGEs wrote: the same keys and rows as
    delta-rs, and the same recorded versions."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    uri = str(tmp_path / "table")
    assert export("--data-dir", base, "--table", uri, "--mode", "latest") == 0
    produce(base, "kv")
    assert export("--data-dir", base, "--table", uri, "--mode", "latest") == 0
    rows = spark.read.format("delta").load(uri).select("topic", "partition", "key", "seq", "value").collect()
    assert {(r[0], r[1], bytes(r[2])): (r[3], bytes(r[4])) for r in rows} == state(uri) and len(rows) == len(state(uri))
    aid = app_id(table_id(DeltaTable(uri)), "kv", 0, default_source())
    assert spark_transactions(spark, uri) == {aid: DeltaTable(uri).transaction_version(aid)} == {aid: 8810 + 5}
