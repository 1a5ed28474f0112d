"""Importing partitions through a staging directory — crash at any point, then recovery, leaves either the
whole import or nothing (TANK_FORMAT.md §9 rules 3, 4, 8)."""

import json
import multiprocessing
import os
import threading
import time
from dataclasses import asdict

import pytest

from tank_log.errors import ImportAborted, ImportRefused
from tank_log.format.bundle import Message
from tank_log.format.messages import MessageColumns
from tank_log.storage.datadir import partitions_at
from tank_log.storage.fsutil import atomic_write
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.repair import repair_base
from tank_log.storage.staging import (
    MANIFEST,
    abort_import,
    commit_import,
    open_import,
    recover_imports,
    stage_partition,
    stage_root,
)
from tank_log.storage.writer import BundlePolicy


def msgs(lo, hi, step=1):
    return [Message(s, 1_800_000_000_000 + s, None, b"v%d" % s) for s in range(lo, hi + 1, step)]


def chunks(*runs):
    """Rows to stage: one chunk of columns per run of messages."""
    return [MessageColumns.from_messages(r) for r in runs]


def messages_of(base):
    return {(p.topic, p.id): [m.seq for s in p.segments for m in s.messages()] for p in partitions_at(base)}


def test_a_new_topic_and_an_appended_partition_commit_together(tmp_path):
    base = str(tmp_path)
    write_partition(os.path.join(base, "old", "0"), msgs(1, 50), segment_bytes=400)
    open_import(base, "r1")
    staged = [
        stage_partition(base, "r1", "0-0", "new", 2, chunks(msgs(1, 30)), append=False, segment_bytes=300),
        stage_partition(base, "r1", "1-0", "old", 0, chunks(msgs(51, 80)), append=True, segment_bytes=1 << 30),
    ]
    assert messages_of(base) == {("old", 0): list(range(1, 51))}  # nothing visible before the commit
    commit_import(base, "r1", staged)
    got = messages_of(base)
    assert got[("old", 0)] == list(range(1, 81)) and got[("new", 2)] == list(range(1, 31))
    assert got[("new", 0)] == got[("new", 1)] == []  # the broker serves partitions 0..N-1 (§1.4)
    assert not os.path.exists(stage_root(base, "r1"))


@pytest.mark.parametrize("point", ["before-manifest", "after-manifest", "after-seal"])
def test_recovery_after_a_crash_finishes_or_removes_the_import(tmp_path, point):
    base = str(tmp_path)
    write_partition(os.path.join(base, "t", "0"), msgs(1, 20), segment_bytes=200)
    open_import(base, "r2")
    staged = [stage_partition(base, "r2", "0-0", "t", 0, chunks(msgs(21, 40)), append=True, segment_bytes=1 << 30)]
    if point != "before-manifest":  # the commit point: the manifest is durable
        atomic_write(os.path.join(stage_root(base, "r2"), MANIFEST), json.dumps([asdict(s) for s in staged]).encode())
    if point == "after-seal":
        active, sealed = staged[0].seal
        os.rename(os.path.join(base, "t", "0", active), os.path.join(base, "t", "0", sealed))
    done = repair_base(base)
    assert len(done) == 1 and not os.path.exists(stage_root(base, "r2"))
    want = list(range(1, 21)) if point == "before-manifest" else list(range(1, 41))
    assert messages_of(base) == {("t", 0): want}
    part = partitions_at(base)[0]
    assert part.active is not None and (not part.ro or part.active.base == part.ro[-1].last + 1)


def test_refusals(tmp_path):
    base = str(tmp_path)
    write_partition(os.path.join(base, "t", "0"), msgs(1, 10))
    open_import(base, "r")
    with pytest.raises(ImportRefused, match="the partition exists"):
        stage_partition(base, "r", "0-0", "t", 0, chunks(msgs(11, 12)), append=False, segment_bytes=1 << 20)
    with pytest.raises(ImportRefused, match="not above the partition's last seq"):
        stage_partition(base, "r", "0-0", "t", 0, chunks(msgs(10, 12)), append=True, segment_bytes=1 << 20)
    with pytest.raises(ImportRefused, match="not above the previous row"):
        stage_partition(
            base, "r", "0-0", "t", 0, chunks(msgs(11, 12), msgs(12, 12)), append=True, segment_bytes=1 << 20
        )
    with pytest.raises(ImportRefused, match=r"seq 12 is not above the previous row \(12\)"):  # within one chunk
        stage_partition(base, "r", "0-0", "t", 0, chunks([*msgs(11, 12), *msgs(12, 12)]), append=True, segment_bytes=1)
    with pytest.raises(ImportRefused, match="gap would precede the active segment"):
        stage_partition(base, "r", "0-0", "t", 0, chunks(msgs(20, 30, 2)), append=True, segment_bytes=1 << 20)
    a = stage_partition(base, "r", "0-0", "u", 0, chunks(msgs(1, 5)), append=False, segment_bytes=1 << 20)
    b = stage_partition(base, "r", "1-0", "u", 0, chunks(msgs(6, 9)), append=False, segment_bytes=1 << 20)
    with pytest.raises(ImportRefused, match="two tasks"):
        commit_import(base, "r", [a, b])
    assert messages_of(base) == {("t", 0): list(range(1, 11))}


def _writer_staging(tmp_path) -> tuple[str, multiprocessing.process.BaseProcess, str]:
    """An opened import under tmp_path/base and a writer (its own process, as a Spark task's Python worker) staging
    into it, whose rows arrive once the test creates the file `release`; returned once it holds the writers' lock:
    (base, the writer, release)."""
    base, started, release = str(tmp_path / "base"), str(tmp_path / "started"), str(tmp_path / "release")
    os.mkdir(base)
    open_import(base, "r")

    def stage() -> None:
        def rows():
            open(started, "w").close()
            deadline = time.monotonic() + 120  # bounds a hang only
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.01)
            yield from chunks(msgs(1, 5))

        stage_partition(base, "r", "1-0", "late", 0, rows(), append=False, segment_bytes=1 << 20)

    writer = multiprocessing.get_context("fork").Process(target=stage)
    writer.start()
    while not os.path.exists(started):
        assert writer.exitcode is None, "the writer ended before it staged"
        time.sleep(0.01)
    return base, writer, release


def _has_open(path: str) -> bool:
    """Whether this process has `path` open (the abort, once it has opened the writers' lock, only waits on it)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False


def test_the_abort_waits_for_a_running_writer_and_a_writer_after_it_stages_nothing(tmp_path):
    """A failed Spark job calls the abort before its other tasks are killed: a task still staging must not leave
    files behind it (CI found `.tank-import-*/1-0/t/1/...` after a refused import)."""
    base, writer, release = _writer_staging(tmp_path)
    lock = os.path.join(stage_root(base, "r"), ".writers.lock")
    abort = threading.Thread(target=abort_import, args=(base, "r"))
    abort.start()
    deadline = time.monotonic() + 60  # bounds a hang only
    while not _has_open(lock):  # the abort is in its wait for the writers
        assert abort.is_alive() and time.monotonic() < deadline, "the abort did not wait for the writer"
        time.sleep(0.01)
    assert abort.is_alive() and os.path.exists(lock)  # still waiting: the writer holds the lock
    open(release, "w").close()
    abort.join(60)
    writer.join(60)
    assert writer.exitcode == 0  # the writer staged its partition in full ...
    assert os.listdir(base) == []  # ... and then the abort removed it with everything else
    with pytest.raises(ImportAborted):  # a task that starts after the abort
        stage_partition(base, "r", "2-0", "t", 0, chunks(msgs(1, 5)), append=False, segment_bytes=1 << 20)
    assert os.listdir(base) == []


def test_an_abort_gives_up_on_a_hung_writer_and_the_next_recovery_removes_its_files(tmp_path):
    base, writer, release = _writer_staging(tmp_path)
    abort_import(base, "r", wait_s=0.1)  # the writer is held until after the abort gave up
    open(release, "w").close()
    writer.join(60)
    assert writer.exitcode == 0
    leftover = os.listdir(base)
    assert leftover == [os.path.basename(stage_root(base, "r"))]  # the writer outlived the wait
    assert recover_imports(base) == [f"removed the uncommitted import {leftover[0]}"]
    assert os.listdir(base) == []


@pytest.mark.parametrize(
    ("topic", "partition", "rule"),
    [
        ("../escaped", 0, "contains '/'"),
        ("a/b", 0, "contains '/'"),
        ("", 0, "not a directory name"),
        (".", 0, "not a directory name"),
        ("..", 0, "not a directory name"),
        (".t", 0, "stray topic"),
        ("t", -1, "outside 0..65529"),
        ("t", 65530, "outside 0..65529"),
        ("t", 2**31 - 1, "outside 0..65529"),
    ],
)
def test_a_writer_refuses_a_partition_the_broker_would_not_serve(tmp_path, topic, partition, rule):
    """The `tank` data source writer's last line of defence: nothing is staged, nothing outside the base path."""
    base = tmp_path / "base"
    base.mkdir()
    open_import(str(base), "r")
    with pytest.raises(ImportRefused, match=rule):
        stage_partition(str(base), "r", "0-0", topic, partition, chunks(msgs(1, 3)), append=False, segment_bytes=1)
    assert os.listdir(tmp_path) == ["base"] and os.listdir(base) == [os.path.basename(stage_root(str(base), "r"))]
    assert os.listdir(stage_root(str(base), "r")) == [".writers.lock"]


def test_appending_to_a_partition_with_an_unreadable_segment_is_refused(tmp_path):
    """A directory in place of an RO segment: the import counted on the other segments and appended after them,
    though the partition claims seqs nobody can read (storage/completeness.py)."""
    base = str(tmp_path)
    write_partition(os.path.join(base, "t", "0"), msgs(1, 40), segment_bytes=200, policy=BundlePolicy(max_messages=5))
    seg = partitions_at(base)[0].ro[0]
    os.unlink(seg.path)
    os.mkdir(seg.path)
    open_import(base, "r")
    with pytest.raises(ImportRefused, match=rf"{seg.path}: not read, seqs {seg.base}\.\.{seg.last} "):
        stage_partition(base, "r", "0-0", "t", 0, chunks(msgs(41, 45)), append=True, segment_bytes=1 << 20)


def test_staged_segments_are_named_by_the_imports_clock_and_a_seal_by_the_logs_mtime(tmp_path):
    """The broker ages RO segments by the name's ts (§5) and names a segment at its roll with the log's mtime
    (§2.5): staged segments carry the import's clock (or `name_ts`), never their messages' ts (here from 2020, which
    the broker's retention would delete at once), and a sealed active segment its log's mtime."""
    base = str(tmp_path)
    old = [Message(s, 1_600_000_000_000 + s, None, b"v" * 40) for s in range(1, 41)]
    five = BundlePolicy(max_messages=5)
    write_partition(os.path.join(base, "t", "0"), old[:20], segment_bytes=200, policy=five)
    (active,) = [n for n in os.listdir(os.path.join(base, "t", "0")) if n.endswith(".log")]
    os.utime(os.path.join(base, "t", "0", active), (1_790_000_123, 1_790_000_123))
    open_import(base, "r")
    t0 = int(time.time())
    appended = stage_partition(base, "r", "0-0", "t", 0, chunks(old[20:]), append=True, segment_bytes=200, policy=five)
    fresh = stage_partition(
        base, "r", "1-0", "u", 0, chunks(old), append=False, segment_bytes=200, policy=five, name_ts=1_800_000_000
    )
    commit_import(base, "r", [appended, fresh])
    t, u = partitions_at(base, ["t"])[0], partitions_at(base, ["u"])[0]
    sealed = next(s for s in t.ro if s.last == 20)
    assert sealed.ts == 1_790_000_123
    assert all(t0 <= s.ts <= time.time() for s in t.segments if s.base > 20) and len(t.segments) > 3
    assert {s.ts for s in u.segments} == {1_800_000_000} and len(u.ro) >= 2


def test_an_import_fills_a_partition_directory_that_holds_no_segment(tmp_path):
    """A partition directory with only a `config` and a `.gitkeep` is a partition without data: the commit moves the
    segments in and keeps the files (it refused: "appeared while importing")."""
    base = str(tmp_path)
    pdir = os.path.join(base, "t", "0")
    os.makedirs(pdir)
    for name in ("config", ".gitkeep"):
        with open(os.path.join(pdir, name), "w") as fh:
            fh.write("log.retention.secs=3days\n" if name == "config" else "")
    open_import(base, "r")
    staged = stage_partition(base, "r", "0-0", "t", 0, chunks(msgs(1, 30)), append=False, segment_bytes=300)
    commit_import(base, "r", [staged])
    assert messages_of(base) == {("t", 0): list(range(1, 31))}
    assert open(os.path.join(pdir, "config")).read() == "log.retention.secs=3days\n"
    assert os.path.exists(os.path.join(pdir, ".gitkeep")) and not os.path.exists(stage_root(base, "r"))
