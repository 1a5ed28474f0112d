"""The export into Apache Iceberg tables (pyiceberg with a real SQLite catalog, locally and on the loopback S3 server):
each (topic, partition, seq) exactly once across reruns, a crash before the commit and a concurrent writer; read back
by pyiceberg's scan and by DuckDB's iceberg extension (from its PyPI package, never downloaded), each equal to the
dump; retention's guard and the stats' export lag through the table; orphans and upkeep; bad input refused."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import copy_tree, data_dir, duckdb_with, new_bucket, run_job_script, wait_for_hold
from test_job_export import dump_rows, roll_and_append
from test_lakehouse_guard import GUARDED_LIMITS, _logs, _ro, _roll

from tank_log.lakehouse import CommitConflict, DataFile, ExportedSeqs, TableLocation, default_source

TOPICS = {"events", "seqgap"}
COLUMNS = ["topic", "partition", "seq", "ts", "key", "value", "date", "ts_raw", "source"]  # binary values
CLI = [sys.executable, "-m", "tank_log.tools.cli"]


class IcebergLake:
    """A test's Iceberg table and its SQLite catalog: on local disk, or in a bucket of the loopback S3 server."""

    def __init__(self, tmp_path, s3=None):
        self.catalog = f"sqlite:///{tmp_path}/catalog.db"
        if s3 is None:
            self.uri, self.options, self.env, self.flags = str(tmp_path / "table"), {}, {}, []
        else:
            bucket = f"ice-{os.path.basename(str(tmp_path)).lower().replace('_', '-')[-40:]}"
            new_bucket(s3, bucket)
            self.uri, self.env = f"s3://{bucket}/tank/events", dict(s3["env"])
            self.options = {**self.env, "AWS_ENDPOINT_URL": s3["endpoint"], "AWS_ALLOW_HTTP": "true"}
            self.flags = [f"--storage-option=AWS_ENDPOINT_URL={s3['endpoint']}", "--storage-option=AWS_ALLOW_HTTP=true"]
        self.flags += ["--format", "iceberg", "--catalog", self.catalog]

    def location(self):
        return TableLocation.of(self.uri, self.options, "iceberg", self.catalog, default_source())

    def table(self):
        return self.location().existing()

    def rows(self):
        d = self.table().table.scan().to_arrow().to_pydict()
        return sorted(zip(d["topic"], d["partition"], d["seq"], d["value"], strict=True))

    def data_files(self):
        return {f.rel for f in self.location().data_files()}


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    return IcebergLake(tmp_path, request.getfixturevalue("s3_server") if request.param == "s3" else None)


def run(lake, *args, env=None):
    """The export job into the lake's table, in the driver (these fixtures are small), with the store's credentials."""
    env_extra = {**lake.env, **(env or {})}
    return run_job_script("export_delta", "--table", lake.uri, *lake.flags, *args, where="driver", env_extra=env_extra)


def report(path):
    return json.load(open(path))


def test_exactly_once_across_a_rerun_and_a_crash_before_the_commit(tmp_path, lake):
    """First export, a rerun (nothing), new messages with a crash after their files are written, a rerun (on Spark's
    executors): every (topic, partition, seq) once, equal to the dump; the Delta export's columns and partitioning;
    each partition's version a table property set in the data's own commit."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--topics", ",".join(sorted(TOPICS))]
    expected = dump_rows("A_multi", TOPICS)
    r = run(lake, *args, "--report", str(tmp_path / "1.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert lake.rows() == expected
    table = lake.table()
    assert table.table.metadata.location.startswith("s3://" if lake.env else "file:///")
    assert table.arrow_schema().names == COLUMNS
    spec = table.table.spec()
    assert [(table.table.schema().find_field(f.source_id).name, str(f.transform)) for f in spec.fields] == [
        ("topic", "identity"),
        ("date", "identity"),
    ]
    assert table.recorded_version("seqgap", 0) == 5185
    assert table.table.metadata.properties[table.app_id("seqgap", 0)] == "5185"
    # one commit after the creation: the snapshot and the versions came in the same new metadata
    assert table.version() == 1 and len(table.table.metadata.metadata_log) == 1
    seqs = ExportedSeqs(lake.uri, lake.options, "iceberg", lake.catalog)  # what retention's guard and stats read
    assert seqs.last_seq("seqgap", 0) == 5185 and seqs.last_seq("events", 9) is None

    r = run(lake, *args, "--report", str(tmp_path / "2.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert report(tmp_path / "2.json")["summary"]["rows"] == 0 and lake.table().version() == 1

    expected += roll_and_append(base, "events", 40)
    files_before = lake.data_files()
    r = run(lake, *args, env={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-2000:]
    assert lake.data_files() > files_before  # files written ...
    assert lake.table().version() == 1 and lake.rows() == dump_rows("A_multi", TOPICS)  # ... but not in the table
    r = run(lake, *args, "--in-driver-max-bytes=0", "--report", str(tmp_path / "3.json"))  # on Spark's executors
    assert r.returncode == 0, r.stderr[-3000:]
    assert report(tmp_path / "3.json")["summary"]["executed_on"] == "executors"
    assert lake.rows() == sorted(expected) and report(tmp_path / "3.json")["summary"]["rows"] == 120
    assert lake.table().version() == 2 and lake.table().recorded_version("events", 0) == 1540


def test_a_stale_writer_gets_a_conflict_and_commits_nothing(tmp_path):
    """Two writers read the table at the same snapshot; the second to commit is refused (`CommitConflict`), its
    versions and files are not in the table: pyiceberg's retries, which would re-apply its append on top of the
    first writer's, are off. The first writer's data and version came in one new metadata file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    location = TableLocation.of(str(tmp_path / "t"), fmt="iceberg")
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("seq", pa.int64())])
    created = location.create(schema, ("topic",))
    assert created.properties()["commit.retry.num-retries"] == "0"

    def data_file(name, seqs):
        os.makedirs(tmp_path / "t" / "topic=a", exist_ok=True)
        path = f"topic=a/{name}.parquet"
        pq.write_table(
            pa.table({"topic": ["a"] * len(seqs), "partition": [0] * len(seqs), "seq": seqs}, schema),
            str(tmp_path / "t" / path),
        )
        return DataFile(path, os.path.getsize(tmp_path / "t" / path), {"topic": "a"}, 0, len(seqs), "{}")

    first, stale = location.existing(), location.existing()
    aid = first.app_id("a", 0)
    first.commit(schema, [data_file("first", [1, 2, 3])], {aid: 3}, "run-1", {})
    with pytest.raises(CommitConflict):
        stale.commit(schema, [data_file("stale", [1, 2, 3, 4])], {aid: 4}, "run-2", {})
    table = location.existing()
    assert table.recorded_version("a", 0) == 3 and table.version() == 1
    assert sorted(table.table.scan().to_arrow()["seq"].to_pylist()) == [1, 2, 3]
    assert table.referenced_files() == {"topic=a/first.parquet"}
    (previous,) = table.table.metadata.metadata_log  # the creation's metadata: neither the data nor the version
    created_metadata = json.load(open(previous.metadata_file.removeprefix("file://")))
    assert created_metadata.get("current-snapshot-id") in (None, -1) and aid not in created_metadata["properties"]
    assert [h.run for h in table.run_history() if h.run] == ["run-1"]


def test_two_exports_at_once_export_each_message_once(tmp_path):
    """Run A plans and writes, then waits at its commit; run B exports the same new messages and commits; A finds
    the recorded versions moved, re-plans, finds nothing left, removes its files and exits 0."""

    from conftest import ROOT, WHERE

    lake = IcebergLake(tmp_path)
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--topics", "events"]
    assert run(lake, *args).returncode == 0  # the table exists: both runs plan against the same snapshot
    appended = roll_and_append(base, "events", 7)
    hold = str(tmp_path / "release")
    a = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *WHERE["driver"]]
        + ["--table", lake.uri, *lake.flags, *args, "--report", str(tmp_path / "a.json")],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD=hold),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_hold(hold + ".ready", a)
    r = run(lake, *args, "--report", str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    open(hold, "w").close()
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0 and "re-planning" in err, err[-3000:]
    assert report(tmp_path / "a.json")["summary"]["rows"] == 0
    assert lake.rows() == sorted(dump_rows("A_multi", {"events"}) + appended)
    assert lake.data_files() == lake.table().referenced_files()  # A removed what it wrote and did not commit


@pytest.mark.parametrize("name", ["C_misc", "M_mirror"])
def test_pyiceberg_and_duckdb_read_what_the_export_wrote(tmp_path, name):
    """Two engines nobody here wrote read the table as the broker's dump says, each on its own: pyiceberg's scan
    (through the catalog) and DuckDB's `iceberg_scan` of the table's metadata file."""
    lake = IcebergLake(tmp_path)
    r = run(lake, "--data-dir", data_dir(name), "--target-file-size", "64kb")
    assert r.returncode == 0, r.stderr[-3000:]
    expected = dump_rows(name)
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("tank_log", uri=lake.catalog)  # the catalog name the export registers under
    scanned = catalog.load_table(("tank_log", "table")).scan().to_arrow().to_pydict()
    assert (
        sorted(zip(scanned["topic"], scanned["partition"], scanned["seq"], scanned["value"], strict=True)) == expected
    )
    metadata = lake.table().table.metadata_location.removeprefix("file://")
    rows = duckdb_with("avro", "iceberg").execute(
        f"SELECT topic, partition, seq, value FROM iceberg_scan('{metadata}')"
    )
    assert sorted(rows.fetchall()) == expected


def test_optimize_rewrites_small_files_in_one_commit(tmp_path):
    """`--optimize` on an Iceberg table (a rewrite of our own: pyiceberg has none): each table partition holding two
    or more small files is rewritten as one file in ONE commit; a dry run changes nothing; the rows, the recorded
    versions and the readers' view stay, and the next export brings exactly the new messages."""
    lake = IcebergLake(tmp_path)
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--topics", "events,seqgap"]
    expected = dump_rows("A_multi", {"events", "seqgap"})
    assert run(lake, *args).returncode == 0
    for _ in range(2):  # two more runs: more small files in the partitions the new messages land in
        expected += roll_and_append(base, "events", 5)
        assert run(lake, *args).returncode == 0

    def files_by_partition():
        files = lake.table().table.inspect.data_files().select(["partition"]).to_pylist()
        counts = {}
        for f in files:
            key = tuple(sorted(f["partition"].items()))
            counts[key] = counts.get(key, 0) + 1
        return counts

    before = files_by_partition()
    assert max(before.values()) >= 2, before
    versions = {k: v for k, v in lake.table().properties().items() if not k.startswith("write.")}
    snapshots = len(lake.table().table.snapshots())
    commits = len(lake.table().table.metadata.metadata_log)
    r = run(lake, *args, "--upkeep-only", "--optimize", "--dry-run", "--report", str(tmp_path / "dry.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert files_by_partition() == before and len(lake.table().table.snapshots()) == snapshots

    r = run(lake, *args, "--upkeep-only", "--optimize", "--report", str(tmp_path / "opt.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    (step,) = report(tmp_path / "opt.json")["summary"]["upkeep"]
    after = files_by_partition()
    assert after == dict.fromkeys(before, 1)  # one file per partition: every one was small
    assert step["operation"] == "optimize" and step["files_before"] == sum(before.values())
    assert step["files_after"] == len(after) and step["files_removed"] - step["files_written"] == sum(
        n - 1 for n in before.values()
    )
    # one commit: one new metadata file (pyiceberg's overwrite is a delete and an append snapshot, committed together)
    assert len(lake.table().table.metadata.metadata_log) == commits + 1
    assert lake.rows() == sorted(expected)
    assert {k: v for k, v in lake.table().properties().items() if not k.startswith("write.")} == versions
    metadata = lake.table().table.metadata_location.removeprefix("file://")
    duck = duckdb_with("avro", "iceberg").execute(
        f"SELECT topic, partition, seq, value FROM iceberg_scan('{metadata}')"
    )
    assert sorted(duck.fetchall()) == sorted(expected)

    expected += roll_and_append(base, "events", 3)
    r = run(lake, *args, "--report", str(tmp_path / "next.json"))
    assert r.returncode == 0 and report(tmp_path / "next.json")["summary"]["rows"] == 9, r.stderr[-3000:]
    assert lake.rows() == sorted(expected)


def write_config(tmp_path, lake, extra=None):
    """The job YAML choosing the Iceberg table: `export.format: iceberg` and its catalog, plus `extra` sections."""
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump({**(extra or {}), "export": {"table": lake.uri, "format": "iceberg", "catalog": lake.catalog}})
    )
    return str(path)


def test_retention_keeps_what_the_iceberg_table_lacks(tmp_path):
    """`retention.keep_unexported: {table: export}` reads the export's Iceberg table (the config's export.format and
    catalog): retention deletes only what the table holds, and the rest once the export caught up (then with the
    table named in `keep_unexported` with its own format and catalog)."""
    lake = IcebergLake(tmp_path)
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    guarded = {"retention": {**GUARDED_LIMITS["retention"], "keep_unexported": {"table": "export"}}}
    config = write_config(tmp_path, lake, guarded)
    export = ["export_delta", "--data-dir", base, "--config", config]
    r = run_job_script(*export, where="driver")  # the table's format and catalog come from the config
    assert r.returncode == 0, r.stderr[-3000:]  # the table holds 1..40
    assert lake.table().recorded_version("logs", 0) == 40
    _roll(pdir, [41, 51, 61], 71)  # 41..70 RO, 71..80 active: the table lacks 41..80

    def retention(name, config=config):
        rep = tmp_path / f"{name}.json"
        args = ["--data-dir", base, "--broker-stopped", "--config", config, "--report", str(rep)]
        r = run_job_script("retention", *args, where="driver")
        assert r.returncode == 0, r.stderr[-3000:]
        return r, report(rep)

    r, rep = retention("behind")
    (p,) = rep["partitions"]
    assert p["status"] == "deleted" and p["exported_last"] == 40
    assert [d["base"] for d in p["deleted"]] == [1, 11, 21, 31]  # the limit wanted 1..50 gone (2 RO kept)
    assert (p["kept_unexported"]["first_seq"], p["kept_unexported"]["last_seq"]) == (41, 50)
    assert _ro(pdir) == [(41, 50), (51, 60), (61, 70)] and f"not yet in {lake.uri}" in r.stderr

    assert run_job_script(*export, where="driver").returncode == 0  # caught up: 1..80
    # the same table named by itself, with its format and catalog
    explicit = {"table": lake.uri, "format": "iceberg", "catalog": lake.catalog}
    (tmp_path / "explicit").mkdir()
    guarded["retention"]["keep_unexported"] = explicit
    _, rep = retention("caught-up", write_config(tmp_path / "explicit", lake, guarded))
    assert rep["partitions"][0]["kept_unexported"] is None and _ro(pdir) == [(51, 60), (61, 70)]


def test_stats_measure_the_lag_of_an_iceberg_table(tmp_path):
    """`tank-log stats --export-table T --export-format iceberg --export-catalog URI`: the messages and seconds the
    table lags behind each partition."""
    lake = IcebergLake(tmp_path)
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10)], 21)
    assert run(lake, "--data-dir", base).returncode == 0  # 1..30
    _roll(pdir, [31, 41], 51)  # 30 messages the table lacks
    stats = [*CLI, "stats", base, "--json", "--export-table", lake.uri, "--export-format", "iceberg"]
    r = subprocess.run([*stats, "--export-catalog", lake.catalog], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["export_lag_messages"] == 30 and row["export_lag_seconds"] > 0
    assert run(lake, "--data-dir", base).returncode == 0
    r = subprocess.run([*stats, "--export-catalog", lake.catalog], capture_output=True, text=True)
    (row,) = json.loads(r.stdout)
    assert (row["export_lag_messages"], row["export_lag_seconds"]) == (0, 0)
    r = subprocess.run(stats, capture_output=True, text=True)  # no catalog here: the table is not in the default one
    assert r.returncode == 1 and r.stderr.startswith("tank-log stats: the export lag is unknown:"), r.stderr


def test_orphans_of_a_crashed_run_and_upkeep(tmp_path):
    """The files of a run that died before its commit are removed once older than the orphan horizon; `--vacuum`
    expires the snapshots older than its retention (never the current one, never below the table's
    `history.expire.max-snapshot-age-ms`) and deletes the data files no kept snapshot references; every row and
    every recorded version stay."""
    lake = IcebergLake(tmp_path)
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--topics", "events"]
    expected = dump_rows("A_multi", {"events"})
    assert run(lake, *args).returncode == 0
    expected += roll_and_append(base, "events", 5)
    committed = lake.data_files()
    r = run(lake, *args, env={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-2000:]
    crashed_at = time.monotonic()
    crashed = lake.data_files() - committed
    assert crashed
    r = run(lake, *args, "--report", str(tmp_path / "next.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert report(tmp_path / "next.json")["summary"]["orphans"]["recent_files"] == len(crashed)  # within 12 h
    assert lake.rows() == sorted(expected)

    # the crashed run started over a second ago, longer than a 1 s horizon: its files go, nothing else
    time.sleep(max(0.0, 1.5 - (time.monotonic() - crashed_at)))  # the run above alone usually took longer
    r = run(lake, *args, "--upkeep-only", "--orphan-horizon=1s", "--report", str(tmp_path / "sweep.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    orphans = report(tmp_path / "sweep.json")["summary"]["orphans"]
    assert (orphans["files"], orphans["recent_files"], len(orphans["runs"])) == (len(crashed), 0, 1)
    assert lake.data_files() == lake.table().referenced_files() and lake.rows() == sorted(expected)

    r = run(lake, *args, "--upkeep-only", "--vacuum=1h")
    assert r.returncode == 2 and "shorter than the table's snapshot retention (120h" in r.stderr
    with lake.table().table.transaction() as tx:  # the table allows any retention
        tx.set_properties({"history.expire.max-snapshot-age-ms": "0"})
    # a file no snapshot references, written long ago (another writer's, say)
    stray = os.path.join(lake.uri, "topic=events", "stray.parquet")
    with open(stray, "wb") as f:
        f.write(b"PAR1")
    os.utime(stray, (1_600_000_000, 1_600_000_000))
    snapshots = len(lake.table().table.snapshots())
    assert snapshots == 2

    upkeep = [*args, "--upkeep-only", "--vacuum=0h"]
    r = run(lake, *upkeep, "--dry-run", "--report", str(tmp_path / "dry.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    (dry,) = report(tmp_path / "dry.json")["summary"]["upkeep"]
    assert dry["files_removed"] == 1 and os.path.exists(stray) and len(lake.table().table.snapshots()) == 2
    r = run(lake, *upkeep, "--report", str(tmp_path / "up.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    (vacuumed,) = report(tmp_path / "up.json")["summary"]["upkeep"]
    table = lake.table()
    assert vacuumed["operation"] == "vacuum" and vacuumed["files_removed"] == 1 and not os.path.exists(stray)
    assert vacuumed["files_before"] == vacuumed["files_after"] + 1 == len(lake.data_files()) + 1
    assert [s.snapshot_id for s in table.table.snapshots()] == [table.table.current_snapshot().snapshot_id]
    assert lake.rows() == sorted(expected) and lake.data_files() == table.referenced_files()

    # the recorded versions survive the expiry: the next export brings exactly the new messages
    expected += roll_and_append(base, "events", 3)
    r = run(lake, *args, "--report", str(tmp_path / "after.json"))
    assert r.returncode == 0 and report(tmp_path / "after.json")["summary"]["rows"] == 9
    assert lake.rows() == sorted(expected)


def test_the_import_reads_an_iceberg_export_back(tmp_path):
    """Every fixture → export to Iceberg → import (`--format iceberg --catalog URI`) into a new base path: `tank-log
    dump` gives the fixtures' dumps line for line and verify is clean; a second import with --append finds nothing
    new."""
    from test_job_import import TANK_LOG, all_fixtures, dump_lines, layout_problems, renamed_dump_lines, run_import

    lake = IcebergLake(tmp_path)
    src = str(tmp_path / "src")
    names = all_fixtures(src)
    r = run(lake, "--data-dir", src)
    assert r.returncode == 0, r.stderr[-3000:]
    dst = str(tmp_path / "dst")
    args = ["--data-dir", dst, "--table", lake.uri, *lake.flags]
    r = run_import(*args, "--report", str(tmp_path / "1.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p["status"] for p in report(tmp_path / "1.json")["partitions"]} == {"imported"}
    want = renamed_dump_lines(names)
    got = dump_lines(dst)
    assert sorted(got) == sorted(want) and len(got) == len(want)
    assert subprocess.run([TANK_LOG, "verify", dst], capture_output=True, timeout=600).returncode == 0
    assert layout_problems(dst) == []
    r = run_import(*args, "--append", "--report", str(tmp_path / "2.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p["status"] for p in report(tmp_path / "2.json")["partitions"]} == {"up-to-date"}


def iceberg_state(lake):
    """{(topic, partition, key): (seq, value)} of an Iceberg latest table; each key once."""
    d = lake.table().table.scan().to_arrow().to_pydict()
    keys = list(zip(d["topic"], d["partition"], d["key"], strict=True))
    assert len(keys) == len(set(keys))
    return dict(zip(keys, zip(d["seq"], d["value"], strict=True), strict=True))


def test_latest_mode_merges_as_the_delta_export_does(tmp_path):
    """`--mode latest` into an Iceberg table (pyiceberg has no MERGE: the touched partitions' rows are merged and
    overwritten in one commit with the versions): after a crash before the commit, a run, a rerun and new messages
    (an update, a tombstone, a new key), the table holds what the Delta export's MERGE leaves of the same data."""
    from test_export_latest import produce, state

    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    lake = IcebergLake(tmp_path)
    args = ["--data-dir", base, "--mode", "latest"]
    r = run(lake, *args, env={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-2000:]
    assert lake.table().version() == 0 and not iceberg_state(lake)  # created, nothing merged
    r = run(lake, *args, "--report", str(tmp_path / "1.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    kv = report(tmp_path / "1.json")["partitions"][0]
    assert (kv["rows"], kv["keys"], kv["tombstones"], kv["keyless_skipped"]) == (8810, 2150, 47, 458)
    first = iceberg_state(lake)
    assert len(first) == 2150 - 47 and lake.table().recorded_version("kv", 0) == 8810
    assert lake.table().properties()["tank_log.export.mode"] == "latest"

    r = run(lake, *args, "--report", str(tmp_path / "2.json"))  # nothing new
    assert r.returncode == 0 and report(tmp_path / "2.json")["partitions"][0]["status"] == "up-to-date"
    assert iceberg_state(lake) == first

    assert produce(base, "kv") == 5
    r = run(lake, *args, "--report", str(tmp_path / "3.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    merge = report(tmp_path / "3.json")["summary"]["merge"]
    assert (merge["num_target_rows_inserted"], merge["num_target_rows_updated"]) == (1, 1)
    assert merge["num_target_rows_deleted"] == 1 and lake.table().recorded_version("kv", 0) == 8815
    delta = str(tmp_path / "delta")
    r = run_job_script("export_delta", "--table", delta, *args, where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    assert iceberg_state(lake) == state(delta) and len(state(delta)) == len(first)
    r = run(lake, *args, "--mode", "append")
    assert r.returncode == 2 and "was created with export mode latest" in r.stderr


def test_a_stale_latest_merge_gets_a_conflict(tmp_path):
    """The latest mode's merge commits against the snapshot it read: a writer that merged from an older snapshot is
    refused, and the table keeps the first merge (a newer row replaced its key, a tombstone deleted one)."""
    import pyarrow as pa

    from tank_log.format.latest import TOMBSTONE

    location = TableLocation.of(str(tmp_path / "t"), fmt="iceberg")
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("key", pa.binary()), ("seq", pa.int64())])
    location.create(schema, ("topic",))

    def rows(keys, seqs, tombstones):
        return pa.table(
            {"topic": ["a"] * len(keys), "partition": [0] * len(keys), "key": keys, "seq": seqs, TOMBSTONE: tombstones},
            schema.append(pa.field(TOMBSTONE, pa.bool_())),
        )

    merge = {"keys": ("topic", "partition", "key"), "order": "seq", "tombstone": TOMBSTONE, "metadata": {}}
    table = location.existing()
    aid = table.app_id("a", 0)
    table.merge_latest(rows([b"x", b"y"], [1, 2], [False, False]), versions={aid: 2}, run_id="r1", **merge)
    first, stale = location.existing(), location.existing()
    got = first.merge_latest(
        rows([b"x", b"y", b"z"], [3, 4, 5], [False, True, False]), versions={aid: 5}, run_id="r2", **merge
    )
    assert got == {
        "num_target_rows_inserted": 1,
        "num_target_rows_updated": 1,
        "num_target_rows_deleted": 1,
        "num_target_rows_copied": 0,
    }
    with pytest.raises(CommitConflict):
        stale.merge_latest(rows([b"w"], [5], [False]), versions={aid: 5}, run_id="r3", **merge)
    table = location.existing()
    d = table.table.scan().to_arrow().sort_by("key").to_pydict()
    assert (d["key"], d["seq"]) == ([b"x", b"z"], [3, 5]) and table.recorded_version("a", 0) == 5


def test_bad_input_is_one_line_and_exit_2(tmp_path, s3_server):
    """What the Iceberg export cannot do is refused before anything is written, in one line, exit 2."""
    base = data_dir("A_multi")

    def refused(*args, config=None):
        more = ["--config", str(config)] if config else []
        r = run_job_script("export_delta", "--data-dir", base, *more, *args, where="driver", env_extra=s3_server["env"])
        lines = [line for line in r.stderr.strip().splitlines() if line]
        assert r.returncode == 2, r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        return lines[-1]

    new_bucket(s3_server, "ice-bad")
    s3 = ["--table", "s3://ice-bad/t", f"--storage-option=AWS_ENDPOINT_URL={s3_server['endpoint']}"]
    assert "needs --catalog URI or export.catalog" in refused(*s3, "--format", "iceberg")
    assert "invalid choice: 'hudi'" in refused("--table", str(tmp_path / "t"), "--format", "hudi")
    config = tmp_path / "bad.yaml"
    config.write_text(f"export: {{table: {tmp_path / 't'}, format: hudi}}\n")
    assert "export.format" in refused(config=config)
    assert "--catalog/export.catalog: only with --format iceberg" in refused(
        "--table", str(tmp_path / "t"), "--catalog", "sqlite:///x.db"
    )
    assert not os.path.exists(tmp_path / "t")
