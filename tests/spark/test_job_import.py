"""The way back — jobs/import_delta.py and the `tank` data source writer: Delta → TANK partitions."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import DATASETS, ROOT, copy_tree, data_dir, load_dump_lines
from test_job_export import Lake, roll_and_append
from test_job_export import run_job as run_export

from tank_log.format.bundle import Message
from tank_log.storage.datadir import partitions_at, scan_data_dir
from tank_log.storage.writer import write_segment

IMPORT = os.path.join(ROOT, "jobs", "import_delta.py")
TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")


def run_import(*args, env_extra=None):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **(env_extra or {}))
    return subprocess.run(
        [sys.executable, IMPORT, "--master", "local[2]", *args], capture_output=True, text=True, timeout=600, env=env
    )


def all_fixtures(root) -> dict[str, tuple[str, str]]:
    """Every fixture's topics in one base path, as `<fixture>__<topic>` (fixtures share topic names): new topic →
    (fixture, topic)."""
    os.makedirs(root)
    names = {}
    for name in DATASETS:
        for topic in os.listdir(data_dir(name)):
            if os.path.isdir(os.path.join(data_dir(name), topic)) and not topic.startswith("."):
                copy_tree(os.path.join(data_dir(name), topic), os.path.join(root, f"{name}__{topic}"))
                names[f"{name}__{topic}"] = (name, topic)
    return names


def dump_lines(base) -> list[str]:
    r = subprocess.run([TANK_LOG, "dump", base], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.splitlines()


def renamed_dump_lines(names) -> list[str]:
    """The broker dumps' lines of `all_fixtures`' topics, each under its new name."""
    want = []
    for new, (name, topic) in sorted(names.items()):
        for (t, _), lines in sorted(load_dump_lines(name).items()):
            if t == topic:
                want += [x.replace(f'"topic":"{topic}"', f'"topic":"{new}"', 1) for x in lines]
    return want


def layout_problems(base) -> list[str]:
    """What the broker's rules forbid (TANK_FORMAT.md §1.4, §9 rules 3, 4, 6) in a base path."""
    out = [f"{p.path}: {p.message}" for p in scan_data_dir(base).all_problems() if p.severity != "warning"]
    for topic in os.listdir(base):
        tdir = os.path.join(base, topic)
        if topic.startswith(".") or not os.path.isdir(tdir):
            if topic.startswith(".tank-import-"):
                out.append(f"{tdir}: staging left behind")
            continue
        ids = sorted(int(n) for n in os.listdir(tdir) if n.isdigit())
        if ids != list(range(len(ids))):
            out.append(f"{tdir}: partitions {ids} are not 0..N-1 (§1.4)")
    for part in partitions_at(base):
        logs = [n for n in os.listdir(part.path) if n.endswith(".log")]
        if len(logs) > 1:
            out.append(f"{part.path}: two .log files")
        if part.ro and (part.active is None or part.active.size == 0):
            out.append(f"{part.path}: RO segments without a non-empty active segment (rule 4)")
        for a, b in zip(part.ro, part.ro[1:], strict=False):
            if b.base <= a.last:
                out.append(f"{part.path}: overlapping RO segments {a.file_name} {b.file_name}")
        if part.ro and part.active is not None and part.active.base != part.ro[-1].last + 1:
            out.append(f"{part.path}: a seq gap before the active segment (rule 3)")
        for seg in part.segments:
            if not seg.ts:
                out.append(f"{seg.path}: name ts 0 (rule 6)")
    return out


def tree(base) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(d, f), base): os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(base)
        for f in files
        if not f.startswith(".")
    }


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    return Lake(tmp_path, request.getfixturevalue("s3_server") if request.param == "s3" else None)


def test_every_fixture_round_trips_through_delta(tmp_path, lake):
    """Every fixture → export to Delta → import into a base path that does not exist yet (seeding a new cluster):
    `tank-log dump` gives the fixture's dump line for line, verify is clean, the broker's layout rules hold; a second
    import refuses the existing partitions (or, with --append, finds nothing new) and changes nothing."""
    src = str(tmp_path / "src")
    names = all_fixtures(src)
    r = run_export("--data-dir", src, "--table", lake.uri, *lake.flags, env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]

    dst = str(tmp_path / "dst")  # created by the import
    args = ["--data-dir", dst, "--table", lake.uri, *lake.flags]
    r = run_import(*args, "--report", str(tmp_path / "1.json"), env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "1.json"))
    assert {p["status"] for p in rep["partitions"]} == {"imported"}
    assert all(p["segments"] >= 1 and p["bytes"] > 0 for p in rep["partitions"])
    want = renamed_dump_lines(names)
    got = dump_lines(dst)
    assert rep["summary"]["rows"] == len(want)
    assert sorted(got) == sorted(want) and len(got) == len(want)
    assert subprocess.run([TANK_LOG, "verify", dst], capture_output=True, timeout=600).returncode == 0
    assert layout_problems(dst) == []

    before = tree(dst)
    r = run_import(*args, "--report", str(tmp_path / "2.json"), env_extra=lake.env)
    assert r.returncode == 1
    rep = json.load(open(tmp_path / "2.json"))
    parts = rep["partitions"]
    assert {p["status"] for p in parts} == {"failed"} and all("exists" in p["error"] for p in parts)
    assert "spark" not in rep  # decided on the driver: nothing to write, no JVM
    r = run_import(*args, "--append", "--report", str(tmp_path / "3.json"), env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "3.json"))
    assert {p["status"] for p in rep["partitions"]} == {"up-to-date"} and "spark" not in rep
    assert tree(dst) == before


def test_import_creates_only_the_base_path_itself(tmp_path):
    """A new base path is created, but only it: a missing parent, or a path that is a file, is a usage error (exit
    2, nothing created); a dry run creates nothing."""
    lake = Lake(tmp_path)
    src = copy_tree(data_dir("A_multi"), str(tmp_path / "src"))
    assert run_export("--data-dir", src, "--table", lake.uri, "--topics", "small").returncode == 0
    deep = tmp_path / "no" / "such" / "base"
    r = run_import("--data-dir", str(deep), "--table", lake.uri)
    assert r.returncode == 2 and "parent" in r.stderr and not (tmp_path / "no").exists()
    (tmp_path / "file").write_text("x")
    r = run_import("--data-dir", str(tmp_path / "file"), "--table", lake.uri)
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = run_import("--data-dir", str(tmp_path / "new"), "--table", lake.uri, "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (tmp_path / "new").exists()


def test_append_continues_partitions_also_across_a_seq_gap(tmp_path):
    """--append imports only what is above each partition's last seq: the old active segment is sealed under its
    true last seq; rows after a seq gap start an RO segment, so the gap never precedes the active one (§9 rule 3)."""
    lake = Lake(tmp_path)
    src = copy_tree(data_dir("A_multi"), str(tmp_path / "src"))
    dst = str(tmp_path / "dst")
    os.makedirs(dst)
    exp = ["--data-dir", src, "--table", lake.uri, "--topics", "events,seqgap"]
    imp = ["--data-dir", dst, "--table", lake.uri, "--append"]
    assert run_export(*exp).returncode == 0
    assert run_import(*imp).returncode == 0

    roll_and_append(src, "events", 30)  # continues the counter
    for part in partitions_at(src, ["seqgap"]):  # a new active segment 100 seqs above the last one
        a = part.active
        last = max(m.seq for m in a.messages())
        os.rename(a.path, os.path.join(part.path, f"{a.base}-{last}_{a.name.ts}.ilog"))
        msgs = [Message(last + 100 + i, 1_800_000_000_000 + i, b"k", b"after-gap-%d" % i) for i in range(12)]
        write_segment(part.path, msgs, active=True, ts=1_800_000_000)
    assert run_export(*exp).returncode == 0
    r = run_import(*imp, "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "r.json"))
    assert rep["summary"]["rows"] == 30 * 3 + 12 * len(partitions_at(src, ["seqgap"]))
    assert sorted(dump_lines(dst)) == sorted(
        x for x in dump_lines(src) if '"topic":"events"' in x or '"topic":"seqgap"' in x
    )
    assert layout_problems(dst) == []
    assert subprocess.run([TANK_LOG, "verify", dst], capture_output=True, timeout=600).returncode == 0
    for part in partitions_at(dst, ["seqgap"]):
        assert len(part.ro) >= 2 and part.ro[-1].base == part.ro[-1].last  # the message after the gap, alone in RO


def test_the_writer_refuses_bad_input_and_leaves_nothing(spark, tmp_path):
    """A partition's rows in two tasks, or an existing partition without existing=append: the write fails and the
    base path is exactly as before (the staging directory is gone)."""
    from pyspark.sql import functions as F

    from tank_spark.source import register

    register(spark)
    dst = str(tmp_path / "dst")
    shutil.copytree(data_dir("C_misc"), dst)
    before = tree(dst)
    df = spark.read.format("tank").load(data_dir("A_multi")).where(F.col("topic") == "events")
    with pytest.raises(Exception, match="two tasks|not contiguous"):
        df.repartition(4).sortWithinPartitions("topic", "partition", "seq").write.format("tank").mode("append").save(
            dst
        )
    with pytest.raises(Exception, match="the partition exists"):
        spark.read.format("tank").load(data_dir("C_misc")).write.format("tank").mode("append").save(dst)
    with pytest.raises(Exception, match="overwrite"):
        df.write.format("tank").mode("overwrite").save(dst)
    assert tree(dst) == before and not [n for n in os.listdir(dst) if n.startswith(".tank-import-")]


def test_a_partition_refused_in_its_task_fails_the_run_and_nothing_is_written(tmp_path):
    """Rows that cannot continue an existing partition (a seq gap with no two consecutive seqs to start its new
    active segment at, §9 rule 3) fail that task: the run fails, names the reason, and no partition changes — not
    even the new one another task staged (the staging directory is removed)."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    dst = str(tmp_path / "dst")
    os.makedirs(os.path.join(dst, "t", "0"))
    write_segment(os.path.join(dst, "t", "0"), [Message(s, 1_800_000_000_000, None, b"old") for s in range(1, 6)])
    ts = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    rows = [("t", 0, s, ts, None, b"gap") for s in (10, 12, 14)] + [("t", 1, s, ts, b"k", b"new") for s in (1, 2)]
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", "UTC")),
            ("key", pa.binary()),
            ("value", pa.binary()),
        ]
    )
    table = str(tmp_path / "table")
    write_deltalake(table, pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema))
    before = tree(dst)
    r = run_import("--data-dir", dst, "--table", table, "--append", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "r.json"))
    assert rep["status"] == "failed" and "gap would precede the active segment" in rep["error"]
    assert tree(dst) == before and not [n for n in os.listdir(dst) if n.startswith(".tank-import-")]


def _table(path, rows, *, value_nullable_rows=()):
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    ts = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", "UTC")),
            ("key", pa.binary()),
            ("value", pa.binary()),
        ]
    )
    records = [
        {"topic": t, "partition": p, "seq": s, "ts": ts, "key": None, "value": None if v is None else b"v"}
        for t, p, s, v in rows
    ]
    write_deltalake(str(path), pa.Table.from_pylist(records, schema))
    return str(path)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([("../../escaped", 0, 1, 1)], "column topic: '../../escaped' contains '/'"),
        ([("a/b", 0, 1, 1)], "column topic: 'a/b' contains '/'"),
        ([("", 0, 1, 1)], "column topic: '' is not a directory name"),
        ([(".", 0, 1, 1)], "column topic: '.' is not a directory name"),
        ([(".hidden", 0, 1, 1)], "column topic: '.hidden' starts with '.'"),
        ([("t" * 256, 0, 1, 1)], "is longer than 255 bytes"),
        ([(None, 0, 1, 1), ("ok", 0, 1, 1)], "column topic: null in 1 row(s)"),
        ([("t", -1, 1, 1)], "column partition: -1 (topic 't') is outside 0..65529"),
        ([("t", 2147483647, 1, 1)], "column partition: 2147483647 (topic 't') is outside 0..65529"),
        ([("t", 65530, 1, 1)], "column partition: 65530 (topic 't') is outside 0..65529"),
        ([("t", None, 1, 1)], "column partition: null in 1 row(s)"),
        ([("t", 0, 0, 1), ("t", 0, 1, 1)], "column seq: 0 (topic 't', partition 0) is below 1"),
        ([("t", 0, 5, 1), ("t", 0, 5, 1)], "column seq: 5 appears more than once in topic 't' partition 0"),
        ([("t", 0, 1, 1), ("t", 0, 2, None)], "column value: null in 1 row(s)"),
    ],
)
def test_import_refuses_a_hostile_table_before_writing_anything(tmp_path, rows, expected):
    """A table is input like any other: a topic that is not a directory name the broker loads (or would take the write
    outside the base path), a partition id outside 0..65529, a null key column, a seq below 1 or twice in a partition,
    a null value: exit 2 with one line naming the column, the value and the rule; nothing is written — not the base
    path, no staging, nothing beside the base path — in bounded time."""
    import time

    table = _table(tmp_path / "table", rows)
    base = tmp_path / "x" / "base"
    os.makedirs(base.parent)
    t0 = time.monotonic()
    r = run_import("--data-dir", str(base), "--table", table)
    assert time.monotonic() - t0 < 120
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert expected in last and "nothing was imported" in last, last
    assert os.listdir(tmp_path / "x") == []  # not even the base path


def test_an_import_refused_in_a_task_says_why_in_one_line(tmp_path):
    """A refusal only a task can make (rows that cannot continue an existing partition) ends the run with one line
    naming the partition and the rule, not a Java stack trace; nothing is written."""
    dst = str(tmp_path / "dst")
    os.makedirs(os.path.join(dst, "t", "0"))
    write_segment(os.path.join(dst, "t", "0"), [Message(s, 1_800_000_000_000, None, b"old") for s in range(1, 6)])
    table = _table(tmp_path / "table", [("t", 0, s, 1) for s in (3, 4, 10)])
    before = tree(dst)
    r = run_import("--data-dir", dst, "--table", table, "--append", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stderr[-3000:]
    error = json.load(open(tmp_path / "r.json"))["error"]
    assert error.startswith("import refused, nothing was imported: ") and "\n" not in error, error
    assert "gap would precede the active segment" in error, error
    assert "\tat org.apache" not in r.stderr and "Traceback" not in r.stderr  # no stack trace, Java's or ours
    assert tree(dst) == before and not [n for n in os.listdir(dst) if n.startswith(".tank-import-")]


def test_an_imported_topic_gets_back_its_config(tmp_path):
    """The export records each topic's `config` in the table (its commit info); the import writes it back atomically
    where the topic has none: a `cleanup` topic comes back `cleanup`, its limits with it. A topic the table records
    no config for, or one whose config exists and differs, is named in the report, not overwritten."""
    from conftest import many_small_partitions
    from deltalake import DeltaTable

    src = many_small_partitions(tmp_path / "src", 2)
    text = "log.cleanup.policy=cleanup\nlog.retention.secs=3days # kept as written\n"
    with open(os.path.join(src, "kv", "config"), "w") as fh:
        fh.write(text)
    os.makedirs(os.path.join(src, "plain", "0"))
    write_segment(os.path.join(src, "plain", "0"), [Message(s, 1_800_000_000_000, None, b"p") for s in range(1, 4)])
    table = str(tmp_path / "table")
    r = run_export("--data-dir", src, "--table", table)
    assert r.returncode == 0, r.stderr[-3000:]
    (commit,) = [h for h in DeltaTable(table).history() if "tank_log.topic_config.kv" in h]
    assert commit["tank_log.topic_config.kv"] == text and "tank_log.topic_config.plain" not in commit
    dst = str(tmp_path / "dst")
    r = run_import("--data-dir", dst, "--table", table, "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.load(open(tmp_path / "r.json"))["summary"]
    assert summary["topic_configs_restored"] == ["kv"]
    assert list(summary["topic_configs_not_restored"]) == ["plain"]
    assert open(os.path.join(dst, "kv", "config")).read() == text
    assert not os.path.exists(os.path.join(dst, "plain", "config"))
    assert [n for n in os.listdir(os.path.join(dst, "kv")) if n.startswith(".")] == []  # no temporary left
    assert sorted(dump_lines(dst)) == sorted(dump_lines(src))


def _pinned_table(path) -> str:
    """A fixed table of 2 topics, 3 partitions (seq gaps, keyed and keyless rows, values of several sizes), written
    in 3 appends so that a partition's rows span files, and out of seq order within each file."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", "UTC")),
            ("key", pa.binary()),
            ("value", pa.binary()),
        ]
    )
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # in the past: segment names take their ts from the messages'
    for part in range(3):
        records = []
        for topic, partition, seqs in (
            ("a", 0, range(1, 2001)),
            ("a", 1, [s for s in range(1, 3001) if s % 97]),  # gaps: sparse bundles
            ("b", 0, range(5, 1505)),
        ):
            mine = [s for s in seqs if (s * 7919) % 3 == part]
            for s in reversed(mine):
                records.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "seq": s,
                        "ts": t0 + dt.timedelta(milliseconds=s * 13),
                        "key": None if s % 5 == 0 else b"key-%d" % (s % 41),
                        "value": bytes((s * 31 + i) % 251 for i in range(s % 300)),
                    }
                )
        write_deltalake(str(path), pa.Table.from_pylist(records, schema), mode="append")
    return str(path)


# the SHA-256 of every segment and index file the import writes from `_pinned_table` (name with its ts as `T`, then
# bytes): the names' ts is the import's clock, checked on its own
IMPORT_DIGEST = "6024f170de4e73147743bd7fbae26922e89b918aa01a7b17dba7aa23e322aa35"


@pytest.mark.parametrize("where", ["default", "executors"])
def test_import_writes_the_same_bytes_as_before(tmp_path, where):
    """The import's segment and index files, byte for byte, whichever way the rows reach the writer: a table this
    small is written by the driver without a JVM (no Spark in the report), or forced onto Spark's executors."""
    import hashlib
    import re
    import time

    table = _pinned_table(tmp_path / "table")
    dst = str(tmp_path / "dst")
    t0 = int(time.time())
    flags = ["--in-driver-max-bytes", "0"] if where == "executors" else []
    r = run_import(
        "--data-dir", dst, "--table", table, "--segment-bytes", "64kb", *flags, "--report", str(tmp_path / "r")
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "r"))
    assert rep["executed_on"] == rep["summary"]["executed_on"] == ("executors" if flags else "driver")
    assert ("spark" in rep) == bool(flags)
    digest = hashlib.sha256()
    files = 0
    for d, _, names in sorted(os.walk(dst)):
        for name in sorted(names):
            if name.endswith((".log", ".ilog", ".index")):
                files += 1
                ts = re.search(r"_(\d+)\.i?log$", name)
                assert ts is None or t0 <= int(ts.group(1)) <= time.time(), name
                named = re.sub(r"_\d+(\.i?log)$", r"_T\1", name)
                digest.update(os.path.relpath(os.path.join(d, named), dst).encode() + b"\0")
                digest.update(open(os.path.join(d, name), "rb").read())
    assert files > 6
    assert digest.hexdigest() == IMPORT_DIGEST


def _typed_table(path, **types):
    """A one-partition table whose columns have the export's types except `types` (column → (Arrow type, value))."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    cols = {
        "topic": (pa.string(), "t"),
        "partition": (pa.int32(), 0),
        "seq": (pa.int64(), 1),
        "ts": (pa.timestamp("us", "UTC"), dt.datetime(2027, 1, 1, tzinfo=dt.UTC)),
        "key": (pa.binary(), b"k"),
        "value": (pa.binary(), b"v"),
        **types,
    }
    schema = pa.schema([(name, t) for name, (t, _) in cols.items()])
    rows = [{name: v for name, (_, v) in cols.items()}, {**{name: v for name, (_, v) in cols.items()}}]
    rows[1]["seq"] = {"string": "2", "double": 2.5}.get(str(cols["seq"][0]), 2)
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema))
    return str(path)


@pytest.mark.parametrize(
    ("types", "expected"),
    [
        ({"seq": ("string", "1")}, "column seq is of type string; it must be an integer"),
        ({"seq": ("float64", 1.5)}, "column seq is of type double; it must be an integer"),
        ({"partition": ("string", "0")}, "column partition is of type string; it must be an integer"),
        ({"topic": ("binary", b"t")}, "column topic is of type binary; it must be a string"),
        ({"topic": ("int64", 7)}, "column topic is of type int64; it must be a string"),
        ({"key": ("string", "k")}, "column key is of type string; it must be binary"),
        ({"ts": ("string", "2027-01-01T00:00:00Z")}, "column ts is of type string; it must be a timestamp"),
    ],
)
def test_import_refuses_a_table_whose_columns_have_the_wrong_types(tmp_path, types, expected):
    """A seq as a string or a fractional float, a partition as a string, a topic or key of another type, a ts as a
    string (tracebacks, exit 1): exit 2, one line naming the column, the type found and the rule; nothing written."""
    import pyarrow as pa

    table = _typed_table(tmp_path / "table", **{c: (getattr(pa, t)(), v) for c, (t, v) in types.items()})
    base = tmp_path / "x" / "base"
    os.makedirs(base.parent)
    r = run_import("--data-dir", str(base), "--table", table)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert expected in last and "nothing was imported" in last, last
    assert os.listdir(tmp_path / "x") == []


def test_import_reads_other_integer_and_timestamp_widths_as_the_exports(tmp_path):
    """What the type check lets through is read as the export's types: a partition as int64, a seq as uint64 or
    int32, a ts in ns or ms, a topic as large_string, a key as large_binary."""
    import datetime as dt

    import pyarrow as pa

    ts = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    table = _typed_table(
        tmp_path / "table",
        topic=(pa.large_string(), "t"),
        partition=(pa.int64(), 0),
        seq=(pa.int32(), 1),
        ts=(pa.timestamp("ms", "UTC"), ts),
        key=(pa.large_binary(), b"k"),
    )
    dst = str(tmp_path / "dst")
    r = run_import("--data-dir", dst, "--table", table)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in dump_lines(dst)]
    assert [(x["seq"], x["ts"], x["key"]) for x in lines] == [(1, 1798761600000, "k"), (2, 1798761600000, "k")]


def test_append_into_a_partition_with_a_torn_active_segment_is_refused_naming_it(tmp_path):
    """--append onto a partition whose active segment ends in a torn bundle (a traceback): one line naming the file,
    the byte offset and what to do, exit 1, nothing written anywhere (not even other partitions)."""
    dst = str(tmp_path / "dst")
    os.makedirs(os.path.join(dst, "t", "0"))
    msgs = [Message(s, 1_800_000_000_000, None, b"old") for s in range(1, 6)]
    write_segment(os.path.join(dst, "t", "0"), msgs, active=True)
    (active,) = [n for n in os.listdir(os.path.join(dst, "t", "0")) if n.endswith(".log")]
    size = os.path.getsize(os.path.join(dst, "t", "0", active))
    with open(os.path.join(dst, "t", "0", active), "ab") as fh:
        fh.write(b"\x40\x00\x00")  # a bundle's length and no body: torn
    table = _table(tmp_path / "table", [("t", 0, s, 1) for s in range(6, 9)] + [("u", 0, s, 1) for s in (1, 2)])
    before = tree(dst)
    r = run_import("--data-dir", dst, "--table", table, "--append", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    rep = json.load(open(tmp_path / "r.json"))
    assert rep["error"].startswith("import refused, nothing was imported: ") and "\n" not in rep["error"]
    assert active in rep["error"] and f"torn bundle at byte {size}" in rep["error"], rep["error"]
    assert tree(dst) == before and not [n for n in os.listdir(dst) if n.startswith(".tank-import-")]


def test_append_into_partition_directories_without_segments_keeps_their_files(tmp_path):
    """A partition directory the table has rows for that holds only a `.gitkeep` or a partition `config` (exit 1,
    "appeared while importing", nothing imported): the rows are imported into it, its files kept."""
    src = copy_tree(data_dir("A_multi"), str(tmp_path / "src"))
    table = str(tmp_path / "table")
    assert run_export("--data-dir", src, "--table", table, "--topics", "events").returncode == 0
    dst = str(tmp_path / "dst")
    for pid, name, text in ((0, ".gitkeep", ""), (1, "config", "log.retention.secs=90days\n")):
        os.makedirs(os.path.join(dst, "events", str(pid)))
        with open(os.path.join(dst, "events", str(pid), name), "w") as fh:
            fh.write(text)
    r = run_import("--data-dir", dst, "--table", table, "--append")
    assert r.returncode == 0, r.stderr[-3000:]
    assert os.path.exists(os.path.join(dst, "events", "0", ".gitkeep"))
    assert open(os.path.join(dst, "events", "1", "config")).read() == "log.retention.secs=90days\n"
    assert sorted(dump_lines(dst)) == sorted(x for x in dump_lines(src) if '"topic":"events"' in x)
    assert layout_problems(dst) == []


def _deadlines(base, topic) -> dict[tuple[int, int], float]:
    """(partition, seq) → when the broker's age retention may delete the message: its RO segment's name ts (§5; an
    active segment's messages: never, until a roll)."""
    out = {}
    for part in partitions_at(base, [topic]):
        for seg in part.segments:
            for m in seg.messages():
                out[(part.id, m.seq)] = float("inf") if seg.is_active else seg.ts
    return out


def test_a_restore_is_not_aged_out_by_the_broker_sooner_than_the_original(tmp_path):
    """The broker ages an RO segment by its name's ts (§2.2, §5). The original base's names are roll times; the
    messages' ts (here a year older) are the producer's. Restored segments are named by the import's clock: with the
    topic's `log.retention.secs=30days`, the broker's retention at a roll today deletes nothing of the restore, as it
    deletes nothing of the original (it deleted most of the restore), and no restored message's age deadline comes
    before the original's (or, for the original's active segment, before the import)."""
    import time

    from tank_log.tools.standin_life import broker_retention

    src = str(tmp_path / "src")
    copy_tree(os.path.join(data_dir("A_multi"), "events"), os.path.join(src, "events"))
    with open(os.path.join(src, "events", "config"), "w") as fh:
        fh.write("log.retention.secs=30days\n")
    table = str(tmp_path / "table")
    assert run_export("--data-dir", src, "--table", table).returncode == 0
    dst = str(tmp_path / "dst")
    t0 = int(time.time())
    r = run_import("--data-dir", dst, "--table", table, "--segment-bytes", "16kb")
    assert r.returncode == 0, r.stderr[-3000:]
    original, restored = _deadlines(src, "events"), _deadlines(dst, "events")
    assert original.keys() == restored.keys() and min(original.values()) + 30 * 86400 > time.time()
    assert sum(seg.ts < t0 for part in partitions_at(dst) for seg in part.ro) == 0
    # a message of the original's active segment ages from the original's next roll, which no table records: at
    # the import's time at the earliest, like the restore's
    assert [k for k in original if restored[k] < min(original[k], t0)] == []
    assert sum(original[k] == float("inf") and restored[k] < float("inf") for k in original) > 0  # such messages
    now = int(time.time())
    for part in partitions_at(dst, ["events"]):
        assert len(part.ro) >= 2
        assert broker_retention(part.path, "events", part.id, now) == []
        assert broker_retention(part.path, "events", part.id, now + 29 * 86400) == []
        assert broker_retention(part.path, "events", part.id, now + 31 * 86400)  # it does age, after 30 days


def test_append_seals_the_active_segment_under_its_mtime(tmp_path):
    """--append seals the partition's active segment as the broker's roll would: named with the log's mtime (§2.5),
    not its newest message's ts; the appended segments carry the import's clock."""
    import time

    dst = str(tmp_path / "dst")
    os.makedirs(os.path.join(dst, "t", "0"))
    old = [Message(s, 1_600_000_000_000, None, b"old") for s in range(1, 6)]  # messages from 2020
    write_segment(os.path.join(dst, "t", "0"), old, active=True, ts=1_790_000_000)
    (active,) = [n for n in os.listdir(os.path.join(dst, "t", "0")) if n.endswith(".log")]
    mtime = 1_795_000_000
    os.utime(os.path.join(dst, "t", "0", active), (mtime, mtime))
    table = _table(tmp_path / "table", [("t", 0, s, 1) for s in range(6, 9)])
    t0 = int(time.time())
    r = run_import("--data-dir", dst, "--table", table, "--append")
    assert r.returncode == 0, r.stderr[-3000:]
    (part,) = partitions_at(dst)
    assert [(s.base, s.last, s.ts) for s in part.ro] == [(1, 5, mtime)]
    assert part.active.base == 6 and t0 <= part.active.ts <= time.time()


def test_import_rolls_at_the_restored_segment_bytes_and_restores_partition_configs(tmp_path):
    """Into a fresh base, without --segment-bytes: segments roll at the `log.segment.bytes` the table recorded (the
    partition's over the topic's), not at 1 GiB because the config was written after them; a partition's `config`
    comes back too, and the summary says which were restored."""
    src = str(tmp_path / "src")
    copy_tree(os.path.join(data_dir("A_multi"), "events"), os.path.join(src, "events"))
    topic_text, part_text = "log.segment.bytes=16kb\n", "log.segment.bytes=8kb\nlog.retention.secs=90days\n"
    with open(os.path.join(src, "events", "config"), "w") as fh:
        fh.write(topic_text)
    with open(os.path.join(src, "events", "1", "config"), "w") as fh:
        fh.write(part_text)
    table = str(tmp_path / "table")
    assert run_export("--data-dir", src, "--table", table).returncode == 0
    dst = str(tmp_path / "dst")
    r = run_import("--data-dir", dst, "--table", table, "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.load(open(tmp_path / "r.json"))["summary"]
    assert summary["topic_configs_restored"] == ["events"] and summary["partition_configs_restored"] == ["events/1"]
    assert open(os.path.join(dst, "events", "config")).read() == topic_text
    assert open(os.path.join(dst, "events", "1", "config")).read() == part_text
    assert not os.path.exists(os.path.join(dst, "events", "0", "config"))
    parts = {p.id: p for p in partitions_at(dst)}
    for pid, limit in ((0, 16 << 10), (1, 8 << 10), (2, 16 << 10)):
        part = parts[pid]
        total = sum(s.size for s in part.segments)
        assert len(part.ro) >= total // (2 * limit) >= 1, (pid, [s.size for s in part.segments])
        assert all(s.size <= limit + 64 * 1024 for s in part.ro)  # a roll lets a segment exceed by one bundle
    assert sorted(dump_lines(dst)) == sorted(dump_lines(src))
    assert layout_problems(dst) == []
