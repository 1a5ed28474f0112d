"""jobs/export_delta.py end to end: exactly-once incremental export into a real Delta table (deltalake)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import DATASETS, ROOT, copy_tree, data_dir, duckdb_with, load_dump, run_job_script, wait_for_hold
from deltalake import DeltaTable

from tank_log.format.bundle import Message
from tank_log.lakehouse import default_source
from tank_log.storage.datadir import partitions_at
from tank_log.storage.writer import SegmentWriter, write_segment

JOB = os.path.join(ROOT, "jobs", "export_delta.py")


def run_job(*args, env_extra=None, executors=False):
    """The export job on local[2], in the driver as it runs on data this small by default, or forced onto Spark's
    executors with `executors` (each test of what a task does there: a crash, a failing partition)."""
    return run_job_script("export_delta", *args, env_extra=env_extra, where="executors" if executors else "driver")


class Lake:
    """Where a test's Delta table lives: a local directory, or a bucket on the loopback S3 server (credentials in
    the job's environment, the endpoint as --storage-option flags)."""

    def __init__(self, tmp_path, s3=None):
        self.s3 = s3
        if s3 is None:
            self.uri, self.options, self.env, self.flags = str(tmp_path / "table"), None, {}, []
            return
        from conftest import new_bucket

        bucket = f"lake-{os.path.basename(str(tmp_path)).lower().replace('_', '-')[-40:]}"
        new_bucket(s3, bucket)
        self.uri = f"s3://{bucket}/tank/events"
        self.env = dict(s3["env"])
        self.options = {**self.env, "AWS_ENDPOINT_URL": s3["endpoint"], "AWS_ALLOW_HTTP": "true"}
        self.flags = [f"--storage-option=AWS_ENDPOINT_URL={s3['endpoint']}", "--storage-option=AWS_ALLOW_HTTP=true"]

    def table(self):
        return DeltaTable(self.uri, storage_options=self.options)

    def file_count(self) -> int:
        from pyarrow import fs

        from tank_spark.export.location import TableLocation

        filesystem, root = TableLocation.of(self.uri, self.options).filesystem()
        infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
        return sum(i.type == fs.FileType.File for i in infos)


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    return Lake(tmp_path, request.getfixturevalue("s3_server") if request.param == "s3" else None)


def table_rows(table):
    t = (table.table() if isinstance(table, Lake) else DeltaTable(table)).to_pyarrow_table()
    d = t.to_pydict()
    return sorted(zip(d["topic"], d["partition"], d["seq"], d["value"], strict=True))


def dump_rows(name, topics=None):
    return sorted(
        (t, p, seq, value)
        for (t, p), msgs in load_dump(name).items()
        if topics is None or t in topics
        for seq, _, _, value in msgs
    )


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_duckdb_reads_what_the_export_writes(tmp_path, name):
    """Every fixture, exported by the delta-rs engine, read by DuckDB's delta extension (delta-kernel, an engine
    nobody here wrote): the same rows as the broker's dump, timestamps included, partitioned by topic and date."""
    table = str(tmp_path / "t")
    r = run_job_script(
        "export_delta", "--data-dir", data_dir(name), "--table", table, "--target-file-size", "64kb", where="driver"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    con = duckdb_with("delta")
    con.execute("SET TimeZone = 'UTC'")
    got = con.execute(
        f"SELECT topic, partition, seq, coalesce(epoch_ms(ts), ts_raw::BIGINT), key, value, date = ts::DATE "
        f"FROM delta_scan('{table}')"
    ).fetchall()
    want = sorted(
        (t, p, seq, ts, key, value) for (t, p), msgs in load_dump(name).items() for seq, ts, key, value in msgs
    )
    assert sorted(row[:6] for row in got) == want
    assert all(row[6] in (True, None) for row in got)  # date: the UTC date of ts (null with ts)


def roll_and_append(base, topic, n):
    """What the broker does on a roll: the active segment becomes RO, new messages go to a new active one."""
    out = []
    for part in partitions_at(base, [topic]):
        a = part.active
        last = max(m.seq for m in a.messages())
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{a.name.ts}.ilog"))
        msgs = [Message(last + 1 + i, 1_800_000_000_000 + i, b"new", b"appended-%d" % i) for i in range(n)]
        write_segment(part.path, msgs, active=True, ts=1_800_000_000)
        out += [(topic, part.id, m.seq, m.value) for m in msgs]
    return out


def test_incremental_exactly_once_with_a_crash_before_commit(tmp_path, lake):
    """The same on a local path and on S3 (a real S3-API server on loopback)."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--table", lake.uri, *lake.flags, "--topics", "events,seqgap"]
    r = run_job(*args, "--report", str(tmp_path / "1.json"), env_extra=lake.env, executors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    expected = dump_rows("A_multi", {"events", "seqgap"})
    assert table_rows(lake) == expected
    rep = json.load(open(tmp_path / "1.json"))
    assert rep["summary"]["rows"] == len(expected) and rep["summary"]["table_version"] == 1
    assert rep["summary"]["table"] == lake.uri and "AWS_SECRET" not in json.dumps(rep)
    seqgap = next(p for p in rep["partitions"] if p["topic"] == "seqgap")
    assert (seqgap["from_seq"], seqgap["to_seq"], seqgap["rows"]) == (1, 5185, 800)
    assert lake.table().transaction_version(seqgap["app_id"]) == 5185

    # a run that finds nothing new commits nothing, and starts no Spark
    r = run_job(*args, "--report", str(tmp_path / "2.json"), env_extra=lake.env, executors=True)
    assert r.returncode == 0 and lake.table().version() == 1
    rep = json.load(open(tmp_path / "2.json"))
    assert {p["status"] for p in rep["partitions"]} == {"up-to-date"}
    assert "spark" not in rep and "spark_start_s" not in rep["timings"]

    # new messages; the next run dies after writing its Parquet files, before the commit
    expected += roll_and_append(base, "events", 50)
    files_before = lake.file_count()
    r = run_job(*args, env_extra={**lake.env, "TANK_LOG_EXPORT_CRASH": "before-commit"}, executors=True)
    assert r.returncode == 137, r.stderr[-2000:]
    assert lake.file_count() > files_before  # files written ...
    assert lake.table().version() == 1  # ... but invisible
    assert table_rows(lake) == dump_rows("A_multi", {"events", "seqgap"})

    crashed_files = lake.file_count() - files_before
    crashed_at = time.monotonic()

    r = run_job(*args, "--report", str(tmp_path / "3.json"), env_extra=lake.env, executors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert table_rows(lake) == sorted(expected)  # every message exactly once, no gap
    rep = json.load(open(tmp_path / "3.json"))
    assert rep["summary"]["rows"] == 150 and rep["summary"]["table_version"] == 2
    # the crashed run's files are younger than the horizon (12 h): left alone, as a run in flight would be
    assert rep["summary"]["orphans"] == {
        "files": 0,
        "bytes": 0,
        "runs": [],
        "recent_files": crashed_files,
        "dry_run": False,
    }

    # once they are older than the horizon, the next run removes them itself (no manual vacuum)
    horizon_s = 6  # run 3 alone took longer: usually no wait
    time.sleep(max(0.0, horizon_s + 1 - (time.monotonic() - crashed_at)))
    stored = lake.file_count()
    r = run_job(
        *args,
        f"--orphan-horizon={horizon_s}s",
        "--report",
        str(tmp_path / "4.json"),
        env_extra=lake.env,
        executors=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    orphans = json.load(open(tmp_path / "4.json"))["summary"]["orphans"]
    assert (orphans["files"], orphans["recent_files"], len(orphans["runs"])) == (crashed_files, 0, 1)
    assert orphans["bytes"] > 0 and lake.file_count() == stored - crashed_files
    assert table_rows(lake) == sorted(expected) and lake.table().version() == 2


def test_a_small_export_runs_in_the_driver_without_spark_exactly_once(tmp_path, lake):
    """By default an export reading at most `export.in_driver_max_bytes` (128 MiB) of segment data is read and
    written by the driver itself (no JVM), in as many threads as the master has cores; it commits the same way, so a
    crash before the commit and a rerun still export every message once, locally and on object storage. Above the
    limit, executors do the work."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--table", lake.uri, "--topics", "events,seqgap", *lake.flags]

    def report(name):
        return json.load(open(tmp_path / name))

    def run(*more, env=None):
        return run_job(*args, *more, env_extra={**lake.env, **(env or {})})

    r = run("--dry-run", "--master", "local[1]", "--report", str(tmp_path / "0.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "export: in 1 thread(s) of the driver's" in r.stderr  # as many threads as the master has cores
    rep = report("0.json")
    expected = dump_rows("A_multi", {"events", "seqgap"})
    assert rep["summary"]["executed_on"] == "driver" and rep["summary"]["rows"] == len(expected)
    assert "spark" not in rep and lake.file_count() == 0

    r = run("--report", str(tmp_path / "1.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "export: in 2 thread(s) of the driver's" in r.stderr  # local[2]
    rep = report("1.json")
    assert rep["summary"]["executed_on"] == "driver" and "spark" not in rep and "spark_start_s" not in rep["timings"]
    assert table_rows(lake) == expected and rep["summary"]["rows"] == len(expected)

    expected += roll_and_append(base, "events", 50)
    r = run(env={"TANK_LOG_EXPORT_CRASH": "before-commit"})
    assert r.returncode == 137, r.stderr[-2000:]
    assert lake.table().version() == 1
    r = run("--report", str(tmp_path / "2.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert table_rows(lake) == sorted(expected) and report("2.json")["summary"]["rows"] == 150

    expected += roll_and_append(base, "events", 20)  # above the limit: executors
    r = run("--in-driver-max-bytes", "1kb", "--report", str(tmp_path / "3.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report("3.json")
    assert rep["summary"]["executed_on"] == "executors" and "spark_start_s" in rep["timings"]
    assert table_rows(lake) == sorted(expected) and rep["summary"]["rows"] == 60


def test_upkeep_optimize_and_vacuum_and_a_run_past_the_orphan_horizon(tmp_path, s3_server):
    """--optimize compacts the small files of incremental runs, --vacuum deletes what no version within the
    retention needs; both report files/bytes before and after and keep every row and every partition's version.
    A run going longer than the orphan horizon does not commit (its files could be swept). On the S3 server
    (the local table's upkeep runs in the Airflow test of tank_export_nightly)."""
    from tank_spark.export.location import TableLocation

    lake = Lake(tmp_path, s3_server)

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    args = ["--data-dir", base, "--table", lake.uri, *lake.flags, "--topics", "events"]
    expected = dump_rows("A_multi", {"events"})
    for i in range(3):  # three incremental runs: three small files per (topic, date)
        if i:
            expected += roll_and_append(base, "events", 20)
        r = run_job(*args, env_extra=lake.env)
        assert r.returncode == 0, r.stderr[-3000:]
    data_files = lambda: TableLocation.of(lake.uri, lake.options).data_files()  # noqa: E731

    r = run_job(*args, "--upkeep-only", "--vacuum=1h", env_extra=lake.env)
    assert r.returncode == 2 and "shorter than the table's deleted-file retention (168h" in r.stderr
    lake.table().alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 hours"})

    stored = data_files()
    upkeep = [*args, "--upkeep-only", "--optimize", "--vacuum=0h"]
    r = run_job(*upkeep, "--dry-run", "--report", str(tmp_path / "dry.json"), env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert data_files() == stored and lake.table().version() == 4
    r = run_job(*upkeep, "--report", str(tmp_path / "up.json"), env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]
    up = json.load(open(tmp_path / "up.json"))
    assert "spark" not in up  # upkeep is delta-rs on the driver: no JVM
    optimized, vacuumed = up["summary"]["upkeep"]
    live = lake.table().get_add_actions(flatten=True).column("size_bytes").to_pylist()
    assert optimized["operation"] == "optimize" and optimized["files_before"] == len(stored)
    assert optimized["bytes_before"] == sum(f.size for f in stored)
    assert (optimized["files_after"], optimized["bytes_after"]) == (len(live), sum(live))
    assert (optimized["files_removed"], optimized["files_written"]) == (len(stored), len(live))  # no other writer
    assert len(live) < len(stored)
    after = data_files()
    assert vacuumed["operation"] == "vacuum" and vacuumed["files_before"] == len(stored) + len(live)
    assert (vacuumed["files_after"], vacuumed["bytes_after"]) == (len(after), sum(f.size for f in after))
    assert len(after) == len(live)  # only the live files are left
    assert table_rows(lake) == sorted(expected)

    # the recorded versions survive the rewrite: the next export brings exactly the new messages
    new = roll_and_append(base, "events", 7)
    expected += new
    r = run_job(*args, "--report", str(tmp_path / "next.json"), env_extra=lake.env)
    assert r.returncode == 0 and json.load(open(tmp_path / "next.json"))["summary"]["rows"] == len(new)
    assert table_rows(lake) == sorted(expected)

    # a run that outlives the orphan horizon does not commit, and leaves none of its files behind: its files are
    # written on Spark's executors, then it is held at its commit until it is older than the horizon
    roll_and_append(base, "events", 3)
    version, stored = lake.table().version(), data_files()
    hold = str(tmp_path / "release")
    release = threading.Thread(target=_release_after, args=(hold, 1.5), daemon=True)
    release.start()
    env = {**lake.env, "TANK_LOG_EXPORT_HOLD": hold}
    r = run_job(*args, "--orphan-horizon=1s", "--report", str(tmp_path / "old.json"), env_extra=env, executors=True)
    release.join(timeout=5)
    assert r.returncode == 1 and "longer than the orphan horizon" in json.load(open(tmp_path / "old.json"))["error"]
    assert lake.table().version() == version and data_files() == stored


def _release_after(hold: str, seconds: float) -> None:
    """Let a run held at its commit (`TANK_LOG_EXPORT_HOLD`) go on `seconds` after it reached the hold."""
    deadline = time.monotonic() + 300
    while not os.path.exists(hold + ".ready") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(seconds)
    open(hold, "w").close()


@pytest.fixture
def json_data(tmp_path):
    pdir = tmp_path / "data" / "js" / "0"
    pdir.mkdir(parents=True)
    values = [
        b'{"id": 1, "name": "a", "amount": 1.5}',
        b'{"id": 2, "name": "b"}',
        b"not json",
        b'{"id": "three", "name": "c"}',
        b"\xff\xfe bad utf8",
        b"",
        b'{"id": 7, "name": "\\u00e9", "x": 1}',
    ]
    w = SegmentWriter(str(pdir), active=True, ts=1_800_000_000)
    for i, v in enumerate(values):
        w.add(Message(i + 1, 1_800_000_000_000 + i, b"k%d" % i, v))
    w.close()
    return str(tmp_path / "data")


def test_json_values_typed_and_quarantined(tmp_path, json_data):
    table = str(tmp_path / "jt")
    r = run_job(
        "--data-dir",
        json_data,
        "--table",
        table,
        "--value-format",
        "json",
        "--value-schema",
        "id long, name string, amount double",
        "--partition-by",
        "topic",
        "--report",
        str(tmp_path / "r.json"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    t = DeltaTable(table).to_pyarrow_table().sort_by("seq").to_pydict()
    assert t["id"] == [1, 2, None, None, None, None, 7]
    assert t["name"] == ["a", "b", None, None, None, None, "é"]
    assert t["amount"] == [1.5, None, None, None, None, None, None]
    assert t["decode_error"] == [
        None,
        None,
        "not valid JSON for the value schema",
        "not valid JSON for the value schema",
        "invalid UTF-8",
        None,
        None,
    ]
    assert t["raw_value"][2] == b"not json" and t["raw_value"][4] == b"\xff\xfe bad utf8" and t["raw_value"][0] is None
    assert json.load(open(tmp_path / "r.json"))["summary"]["quarantined"] == 3
    # an incompatible table: the same table, another value format
    r = run_job("--data-dir", json_data, "--table", table, "--value-format", "binary", "--partition-by", "topic")
    assert r.returncode == 2 and "does not match this export" in r.stderr
    assert "value: missing in the table (this export writes binary)" in r.stderr
    # the same column names with other types was accepted and left a table delta-rs could not read
    version = DeltaTable(table).version()
    r = run_job(
        "--data-dir",
        json_data,
        "--table",
        table,
        "--value-format",
        "json",
        "--value-schema",
        "id string, name string, amount double",
        "--partition-by",
        "topic",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "id: table has long, this export writes string" in r.stderr
    assert DeltaTable(table).version() == version and DeltaTable(table).to_pyarrow_table().num_rows == 7


def test_dry_run_and_usage_errors(tmp_path):
    base = data_dir("C_misc")
    table = str(tmp_path / "t")
    r = run_job("--data-dir", base, "--table", table, "--dry-run", "--report", str(tmp_path / "d.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert not os.path.exists(table)
    parts = {(p["topic"], p["partition"]): p for p in json.load(open(tmp_path / "d.json"))["partitions"]}
    timeroll = load_dump("C_misc")[("timeroll", 0)]
    assert parts[("timeroll", 0)]["status"] == "dry-run" and parts[("timeroll", 0)]["rows"] == len(timeroll)
    assert (parts[("timeroll", 0)]["from_seq"], parts[("timeroll", 0)]["to_seq"]) == (1, timeroll[-1][0])
    assert parts[("holes", 0)]["status"] == "up-to-date"
    for args, needle in [
        (["--topics", "nope"], "unknown topic"),
        ([], None),
        (["--value-format", "json"], "--value-schema"),
        (["--partition-by", "colour"], "--partition-by"),
        (["--continuous"], "--continuous needs --checkpoint"),
        (["--checkpoint", str(tmp_path / "ck")], "--checkpoint: only with --continuous"),
        (["--continuous", "--checkpoint", "ck", "--dry-run"], "--continuous does not take --dry-run"),
        (["--continuous", "--checkpoint", "ck", "--vacuum", "200h"], "does not take --vacuum"),
    ]:
        cmd = ["--data-dir", base, *args] + ([] if needle is None else ["--table", table])
        r = run_job(*cmd)
        assert r.returncode == 2, (args, r.stderr[-1500:])
        assert (needle or "no Delta table") in r.stderr


def test_engine_spark_without_jars_is_a_clear_error(tmp_path):
    """Without Delta's jars (none fetched: TANK_LOG_SPARK_JARS=off) the engine says what to do, in one line."""
    r = run_job(
        "--data-dir", data_dir("C_misc"), "--table", str(tmp_path / "t"), "--engine", "spark",
        env_extra={"TANK_LOG_SPARK_JARS": "off"},
    )  # fmt: skip
    assert r.returncode == 2 and "Delta Lake's jars" in r.stderr and "scripts/setup.sh" in r.stderr
    assert "Traceback" not in r.stderr


def test_timestamps_out_of_range_are_quarantined_and_old_tables_evolve(tmp_path):
    """A ts beyond 9999-12-31 is stored as null ts + exact ts_raw and counted quarantined, never wrapped; a
    table made before ts_raw existed gains the column (schema evolution) and keeps its rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tank_log.storage.partition_writer import write_partition
    from tank_spark.schema import MAX_TS_MS

    base = tmp_path / "data"
    pdir = base / "t" / "0"
    pdir.mkdir(parents=True)
    stamps = [1_700_000_000_000, 2**62, 2**64 - 1, MAX_TS_MS + 1]
    write_partition(pdir, [Message(i + 1, ts, None, b"v%d" % i) for i, ts in enumerate(stamps)])
    table = str(tmp_path / "table")
    old = pa.schema(
        [
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("seq", pa.int64()),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("date", pa.date32()),
        ]
    )
    write_deltalake(table, pa.Table.from_pylist([], old), partition_by=["topic", "date"])
    report = tmp_path / "r.json"
    r = run_job("--data-dir", str(base), "--table", table, "--value-format", "binary", "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(report.read_text())["summary"]
    assert summary["quarantined"] == 3 and summary["rows"] == 4
    t = DeltaTable(table)
    assert [f.name for f in t.schema().fields[-2:]] == ["ts_raw", "source"]
    rows = sorted(t.to_pyarrow_table().to_pylist(), key=lambda r: r["seq"])
    assert {r["source"] for r in rows} == {default_source()}
    assert [r["ts_raw"] for r in rows] == [None, 2**62, 2**64 - 1, MAX_TS_MS + 1]
    assert [r["ts"] is None for r in rows] == [False, True, True, True]
    assert [r["date"] is None for r in rows] == [False, True, True, True]


def _rows_of_report(path):
    return json.loads(open(path).read())["summary"]


def test_exactly_once_belongs_to_the_table_not_its_path(tmp_path):
    """The app ids come from the table's own id: reaching the table through a symlink, or copying it to a
    new place, exports nothing twice."""
    import shutil

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "lake" / "t")
    os.makedirs(os.path.dirname(table))
    args = ("--data-dir", base, "--topics", "events", "--value-format", "binary")
    r = run_job(*args, "--table", table)
    assert r.returncode == 0, r.stderr[-3000:]
    expected = dump_rows("A_multi", {"events"})
    assert table_rows(table) == expected
    os.symlink(str(tmp_path / "lake"), str(tmp_path / "lake_link"))
    r = run_job(*args, "--table", str(tmp_path / "lake_link" / "t"), "--report", str(tmp_path / "2.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _rows_of_report(tmp_path / "2.json")["rows"] == 0 and table_rows(table) == expected
    copy = str(tmp_path / "elsewhere")
    shutil.copytree(table, copy)
    appended = roll_and_append(base, "events", 5)
    r = run_job(*args, "--table", copy, "--report", str(tmp_path / "3.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _rows_of_report(tmp_path / "3.json")["rows"] == len(appended)
    assert table_rows(copy) == sorted(expected + appended)


def test_a_concurrent_export_that_already_committed_makes_the_other_replan(tmp_path):
    """Run A plans and writes, then waits; run B exports the same ranges and commits; A re-reads the table
    before committing, sees B's versions, re-plans, finds nothing left, removes its files and exits 0."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ("--data-dir", base, "--topics", "events", "--value-format", "binary", "--table", table)
    r = run_job(*args)  # the table exists: both runs plan against the same version
    assert r.returncode == 0, r.stderr[-3000:]
    appended = roll_and_append(base, "events", 7)
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD=hold)
    a = subprocess.Popen(
        [sys.executable, JOB, "--master", "local[2]", *args, "--report", str(tmp_path / "a.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_hold(hold + ".ready", a)
    r = run_job(*args, "--report", str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _rows_of_report(tmp_path / "b.json")["rows"] == len(appended)
    open(hold, "w").close()
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    assert "re-planning" in err
    report = json.loads(open(tmp_path / "a.json").read())
    assert report["summary"]["rows"] == 0
    assert table_rows(table) == sorted(dump_rows("A_multi", {"events"}) + appended)
    from urllib.parse import unquote

    committed = {os.path.relpath(unquote(u.removeprefix("file://")), table) for u in DeltaTable(table).file_uris()}
    on_disk = {
        os.path.relpath(os.path.join(d, f), table)
        for d, _, fs in os.walk(table)
        if "_delta_log" not in d
        for f in fs
        if f.endswith(".parquet")
    }
    assert on_disk == committed  # A removed what it wrote and did not commit


def _corrupt_first_bundle(path):
    """The first bundle's flags: bit 7 + codec 3 (an unknown codec; only a full read finds it, docs/FORMAT.md §3.1)."""
    with open(path, "r+b") as fh:
        flags_at = 1 if fh.read(1)[0] < 0x80 else 2
        fh.seek(flags_at)
        fh.write(b"\xc3")


def test_a_corrupt_partition_fails_alone_and_the_others_are_exported(tmp_path):
    """One corrupt segment failed the whole export (no partition exported, a 190-line traceback)."""
    from tank_log.tools.demo import write_demo

    demo = write_demo(str(tmp_path / "demo"))
    expected = sorted(
        (p.topic, p.id, m.seq, m.value) for p in partitions_at(demo) for s in p.segments for m in s.messages()
    )
    (orders1,) = [p for p in partitions_at(demo, ["orders"]) if p.id == 1]
    bad = orders1.ro[1]
    _corrupt_first_bundle(bad.path)
    cut = bad.base - 1  # the rows before the corrupt bundle: the whole first segment
    table, report_path = str(tmp_path / "t"), str(tmp_path / "r.json")
    r = run_job("--data-dir", demo, "--table", table, "--report", report_path, executors=True)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    report = json.load(open(report_path))
    parts = {(p["topic"], p["partition"]): p for p in report["partitions"]}
    failed = parts[("orders", 1)]
    assert failed["status"] == "failed" and failed["exported_to_seq"] == cut and failed["on_corruption"] == "prefix"
    assert failed["error"].startswith(f"{bad.path} @")
    assert all(p["status"] == "exported" for k, p in parts.items() if k != ("orders", 1))
    assert report["status"] == "partial-failure" and report["summary"]["by_status"] == {"exported": 5, "failed": 1}
    want = [row for row in expected if row[:2] != ("orders", 1) or row[2] <= cut]
    assert table_rows(table) == want
    # the rerun starts after the cut and stops at the same place: nothing duplicated, nothing committed
    version = DeltaTable(table).version()
    r = run_job("--data-dir", demo, "--table", table, "--report", report_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert DeltaTable(table).version() == version and table_rows(table) == want
    assert {p["status"] for p in json.load(open(report_path))["partitions"]} == {"up-to-date", "failed"}
    # skip: nothing of the corrupt partition; the same with values through Spark SQL (the pre-pass)
    for fmt in ("binary", "json"):
        skip_table = str(tmp_path / f"skip-{fmt}")
        extra = ["--value-format", "json", "--value-schema", "id long"] if fmt == "json" else []
        r = run_job(
            "--data-dir", demo, "--table", skip_table, "--on-corruption", "skip", *extra, executors=fmt == "json"
        )
        assert r.returncode == 1, r.stderr[-3000:]
        rows = DeltaTable(skip_table).to_pyarrow_table().to_pydict()
        got = sorted(zip(rows["topic"], rows["partition"], rows["seq"], strict=True))
        assert got == [row[:3] for row in expected if row[:2] != ("orders", 1)]


def test_a_commit_that_landed_though_delta_rs_reported_a_conflict_stands(tmp_path, monkeypatch):
    """The object store took the commit but its answer was lost; delta-rs retried, met its own commit and reported
    "Concurrent transaction failed". The export took that for a failure and deleted the committed files: rows lost
    with their app transactions recorded, so retention then deleted them from TANK too (found by the fleet soak).
    The run now finds its own commit in the table and succeeds; every row is readable."""
    from deltalake import DeltaTable as Table
    from deltalake.exceptions import CommitFailedError

    from tank_spark.export.job import main

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    commit = Table.create_write_transaction

    def lost_answer(self, *args, **kwargs):  # the commit lands, the writer hears of a conflict
        commit(self, *args, **kwargs)
        raise CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")

    monkeypatch.setattr(Table, "create_write_transaction", lost_answer)
    args = ["--data-dir", base, "--topics", "events", "--value-format", "binary", "--table", table]
    assert main([*args, "--report", str(tmp_path / "r.json")]) == 0
    assert table_rows(table) == dump_rows("A_multi", {"events"})  # every committed file is still there
    monkeypatch.setattr(Table, "create_write_transaction", commit)
    assert main([*args, "--report", str(tmp_path / "again.json")]) == 0
    assert _rows_of_report(tmp_path / "again.json")["rows"] == 0  # recorded: nothing exported twice
