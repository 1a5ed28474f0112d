"""The watermarks a person can read: every export commit's summary names its run, its source and, per partition, the
seqs it took the recorded version across (`tank-log.run`, `tank-log.source`, `tank-log.ranges`;
docs/reference/watermarks.md). Read as users read them: Spark's DESCRIBE HISTORY and deltalake's `history()` of a
Delta table written by both engines, DuckDB from the Delta log; pyiceberg's snapshots and DuckDB from the Iceberg
metadata file. And another writer's snapshot expiry does not break exactly-once: every old snapshot expired, the
next export adds each new message once; a rollback that expiry then hid is not taken for expiry."""

import json

import pytest
from conftest import copy_tree, data_dir, duckdb_with, load_dump
from test_delta_spark import export, export_on
from test_job_export import roll_and_append

from tank_log.lakehouse import ExportedSeqs, TableLocation, TableUnreadable, default_source
from tank_spark.export.run_id import is_run_id

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE = "broker-a"
KEYS = ("tank-log.run", "tank-log.source", "tank-log.ranges")


def last_seqs(name, topic):
    return {p: max(m[0] for m in msgs) for (t, p), msgs in load_dump(name).items() if t == topic}


def rows(table):
    """(topic, partition, seq) of every row of an Iceberg table (`IcebergTable`), sorted: duplicates kept."""
    d = table.table.scan(selected_fields=("topic", "partition", "seq")).to_arrow().to_pydict()
    return sorted(zip(d["topic"], d["partition"], d["seq"], strict=True))


def expected_rows(name, topic, appended=()):
    out = [(topic, p, m[0]) for (t, p), msgs in load_dump(name).items() if t == topic for m in msgs]
    return sorted(out + [(t, p, seq) for t, p, seq, _ in appended])


def test_every_delta_commit_names_its_run_source_and_ranges(tmp_path, spark):
    """A first export by delta-rs (one commit, every partition), new messages exported by delta-spark (one commit per
    partition): DESCRIBE HISTORY's `userMetadata`, deltalake's `history()` and DuckDB's read of the log's commit
    files give each commit's run, source and ranges; the ranges join end to start, from seq 1 to the last."""
    from deltalake import DeltaTable

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--topics", "small,seqgap", "--source", SOURCE]
    assert export(*args) == 0
    last = {f"{t}/0": last_seqs("A_multi", t)[0] for t in ("small", "seqgap")}
    for topic in ("small", "seqgap"):
        roll_and_append(base, topic, 5)
    export_on(spark, *args, "--engine", "spark")

    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "userMetadata").collect()
    shown = {r.version: json.loads(r.userMetadata) for r in history if r.userMetadata}
    assert sorted(shown) == [1, 2, 3]  # version 0 created the table: no summary
    first = shown[1]
    assert first["tank-log.source"] == SOURCE and is_run_id(first["tank-log.run"])
    assert first["tank-log.ranges"] == {k: [1, v] for k, v in last.items()}
    later = [shown[v] for v in (2, 3)]
    assert len({s["tank-log.run"] for s in later}) == 1 and later[0]["tank-log.run"] != first["tank-log.run"]
    assert {k: v for s in later for k, v in s["tank-log.ranges"].items()} == {
        k: [v + 1, v + 5] for k, v in last.items()
    }

    by_version = {h["version"]: h for h in DeltaTable(table).history()}
    assert {v: json.loads(by_version[v]["userMetadata"]) for v in shown} == shown
    own = by_version[1]  # delta-rs's commit: its fields of their own too, the ranges as a JSON string
    assert {k: own[k] for k in KEYS} == {
        "tank-log.run": first["tank-log.run"],
        "tank-log.source": SOURCE,
        "tank-log.ranges": json.dumps(first["tank-log.ranges"], separators=(",", ":")),
    }

    duck = duckdb_with().execute(  # the docs' query (docs/reference/watermarks.md)
        f"""SELECT parse_filename(filename, true)::BIGINT AS version, commitInfo.userMetadata
        FROM read_json('{table}/_delta_log/*.json', filename = true, union_by_name = true)
        WHERE commitInfo.userMetadata IS NOT NULL ORDER BY version"""
    )
    assert {v: json.loads(m) for v, m in duck.fetchall()} == shown


def test_every_iceberg_snapshot_names_its_run_source_and_ranges(tmp_path):
    """Two exports into an Iceberg table: each snapshot's summary (pyiceberg; DuckDB from the metadata file) names
    its run, its source and the ranges it covered, beside each partition's recorded version under its app id."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table, catalog = str(tmp_path / "t"), f"sqlite:///{tmp_path}/catalog.db"
    args = ["--data-dir", base, "--table", table, "--topics", "events", "--source", SOURCE]
    args += ["--format", "iceberg", "--catalog", catalog]
    assert export(*args) == 0
    roll_and_append(base, "events", 5)
    assert export(*args) == 0
    last = last_seqs("A_multi", "events")

    ice = TableLocation.of(table, fmt="iceberg", catalog=catalog, source=SOURCE).existing()
    summaries = [s.summary.additional_properties for s in ice.table.snapshots()]
    assert [json.loads(s["tank-log.ranges"]) for s in summaries] == [
        {f"events/{p}": [1, last[p]] for p in last},
        {f"events/{p}": [last[p] + 1, last[p] + 5] for p in last},
    ]
    assert {s["tank-log.source"] for s in summaries} == {SOURCE}
    assert all(is_run_id(s["tank-log.run"]) for s in summaries) and len({s["tank-log.run"] for s in summaries}) == 2
    assert all(summaries[1][ice.app_id("events", p)] == str(last[p] + 5) for p in last)

    metadata = ice.table.metadata_location.removeprefix("file://")
    duck = duckdb_with().execute(  # the docs' query (docs/reference/watermarks.md)
        f"""SELECT s."sequence-number", s.summary."tank-log.run", s.summary."tank-log.ranges"
        FROM (SELECT unnest(snapshots) AS s FROM read_json('{metadata}')) ORDER BY 1"""
    )
    assert duck.fetchall() == [(i + 1, s["tank-log.run"], s["tank-log.ranges"]) for i, s in enumerate(summaries)]


def test_another_writers_snapshot_expiry_keeps_exactly_once(tmp_path):
    """Another writer expires every snapshot but the current one (pyiceberg's `expire_snapshots`), twice: after the
    export's own snapshot, and after a snapshot of its own on top; each next export adds every new message once (no
    duplicate, no gap): the recorded versions are table properties, which expiry keeps, and a broken ancestry above
    the snapshot that recorded them is expiry, not a rollback."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table, catalog = str(tmp_path / "t"), f"sqlite:///{tmp_path}/catalog.db"
    args = ["--data-dir", base, "--table", table, "--topics", "events", "--format", "iceberg", "--catalog", catalog]
    location = TableLocation.of(table, fmt="iceberg", catalog=catalog, source=default_source())
    appended = []
    for step in range(3):
        assert export(*args) == 0
        ice = location.existing()
        if step == 1:  # another writer's snapshot (it rewrites nothing: only a property change and a new snapshot)
            ice.table.append(ice.table.scan(limit=0).to_arrow())
            ice.refresh()
        current = ice.table.current_snapshot()
        old = [s.snapshot_id for s in ice.table.snapshots() if s.snapshot_id != current.snapshot_id]
        if old:
            ice.table.maintenance.expire_snapshots().by_ids(old).commit()
        assert len(location.existing().table.snapshots()) == 1
        assert rows(location.existing()) == expected_rows("A_multi", "events", appended)
        appended += roll_and_append(base, "events", 3)
    assert export(*args) == 0
    assert rows(location.existing()) == expected_rows("A_multi", "events", appended)


def test_a_rollback_that_expiry_then_hid_is_not_taken_for_expiry(tmp_path, capsys):
    """Another writer's snapshot S, an export's E on top, a rollback to S, then the expiry of every other snapshot:
    E's recorded versions stay (table properties) but its rows are gone, and S's ancestry ends at an expired
    snapshot. S is older than E (a lower sequence number), so E is not its ancestor: not trusted — the export
    refuses to guess (the versions of before E expired with their snapshots) rather than skip E's rows."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table, catalog = str(tmp_path / "t"), f"sqlite:///{tmp_path}/catalog.db"
    args = ["--data-dir", base, "--table", table, "--topics", "events", "--format", "iceberg", "--catalog", catalog]
    location = TableLocation.of(table, fmt="iceberg", catalog=catalog, source=default_source())
    assert export(*args) == 0
    ice = location.existing()
    ice.table.append(ice.table.scan(limit=0).to_arrow())  # S: another writer's
    ice.refresh()
    rollback_to = ice.table.current_snapshot().snapshot_id
    roll_and_append(base, "events", 3)
    assert export(*args) == 0  # E
    ice = location.existing()
    ice.table.manage_snapshots().set_current_snapshot(rollback_to).commit()
    ice.refresh()
    old = [s.snapshot_id for s in ice.table.snapshots() if s.snapshot_id != rollback_to]
    ice.table.maintenance.expire_snapshots().by_ids(old).commit()
    ice = location.existing()
    assert [s.snapshot_id for s in ice.table.snapshots()] == [rollback_to]
    with pytest.raises(TableUnreadable, match="not an ancestor"):
        ice.recorded("events", 0)
    assert export(*args) == 2  # refused before anything is written, in one line (`runner`)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "what the table holds of this partition cannot be told" in err
    assert rows(location.existing()) == expected_rows("A_multi", "events")  # nothing skipped, nothing added
    with pytest.raises(TableUnreadable, match="cannot be told"):  # retention's guard: the log's data is kept
        ExportedSeqs(table, fmt="iceberg", catalog=catalog).last_seq("events", 1)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_latest_mode_merge_names_its_ranges(tmp_path, fmt):
    """`--mode latest` commits through each format's MERGE (delta-rs's; pyiceberg's overwrite): its commit names the
    run, the source and the range the merge took the partition across, as an append's does."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    table = str(tmp_path / "t")
    args = ["--data-dir", base, "--table", table, "--mode", "latest", "--source", SOURCE, "--format", fmt]
    if fmt == "iceberg":
        args += ["--catalog", f"sqlite:///{tmp_path}/catalog.db"]
    assert export(*args) == 0
    last = max(m[0] for m in load_dump("E_before")[("kv", 0)])
    if fmt == "delta":
        from deltalake import DeltaTable

        commit = DeltaTable(table).history(limit=1)[0]
        assert json.loads(commit["userMetadata"])["tank-log.ranges"] == {"kv/0": [1, last]}
    else:
        location = TableLocation.of(table, fmt="iceberg", catalog=f"sqlite:///{tmp_path}/catalog.db", source=SOURCE)
        commit = location.existing().table.current_snapshot().summary.additional_properties
    assert commit["tank-log.source"] == SOURCE and json.loads(commit["tank-log.ranges"]) == {"kv/0": [1, last]}
