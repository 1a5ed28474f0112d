"""Jobs/export_delta.py --continuous while a writer appends and rolls segments and retention deletes old ones:
kill -9 after a commit and before one, restart from the checkpoint, stop with SIGTERM. The table then holds every
message that still existed exactly once, and the ranges retention deleted before they were read are reported."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import ROOT, wait_for_hold
from deltalake import DeltaTable

from tank_log.format.bundle import Message
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import rescan_partition

JOB = os.path.join(ROOT, "jobs", "export_delta.py")


class Writer(threading.Thread):
    """Appends 10-message bundles to t/0 and t/1 every 20 ms, rolling 2 KB segments, as the broker would."""

    def __init__(self, base):
        super().__init__(daemon=True)
        self.paths = [os.path.join(base, "t", str(p)) for p in (0, 1)]
        self.apps = [PartitionAppender(p, segment_bytes=2000) for p in self.paths]
        self.lock, self.done = threading.Lock(), threading.Event()
        self.appended_at: dict[tuple[int, int], float] = {}  # (partition, last seq of a bundle) → time

    def run(self):
        while not self.done.is_set():
            with self.lock:
                for pid, app in enumerate(self.apps):
                    lo = app.next_seq
                    app.append([Message(s, int(time.time() * 1000), b"k", b"v%d" % s) for s in range(lo, lo + 10)])
                    self.appended_at[(pid, lo + 9)] = time.time()
            time.sleep(0.02)

    def written(self, pid):
        return list(range(1, self.apps[pid].next_seq))


def start(base, tmp_path, name, *flags, env_extra=None):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **(env_extra or {}))
    args = ["--data-dir", base, "--table", str(tmp_path / "table"), "--checkpoint", str(tmp_path / "ck")]
    return subprocess.Popen(
        [sys.executable, JOB, "--master", "local[2]", *args, "--continuous", "--trigger-interval", "1s", *flags,
         "--on-data-loss", "skip", "--report", str(tmp_path / f"{name}.json")],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w"), start_new_session=True,
    )  # fmt: skip


def kill_9(proc):
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
    proc.wait(30)


def table_seqs(table):
    d = DeltaTable(table).to_pyarrow_table(columns=["partition", "seq"]).to_pydict()
    out: dict = {0: [], 1: []}
    for p, s in zip(d["partition"], d["seq"], strict=True):
        out[p].append(s)
    return {p: sorted(v) for p, v in out.items()}


def test_kill_9_restart_retention_and_sigterm(tmp_path):
    base = str(tmp_path / "base")
    writer = Writer(base)
    writer.start()
    time.sleep(1)

    # 1. killed after batch 0's Delta commit, before Spark recorded the batch: the restart replays it
    a = start(base, tmp_path, "a", env_extra={"TANK_LOG_EXPORT_HOLD_AFTER": str(tmp_path / "h1")})
    wait_for_hold(tmp_path / "h1.ready", a, tmp_path / "a.log", timeout=240)
    kill_9(a)
    exported = max(table_seqs(tmp_path / "table")[0])

    # 2. while the job is down, retention deletes t/0's old segments, read and unread ones (§5), once the writer
    # has appended enough past the export (a count, not a time: a loaded machine appends more slowly)
    keep = 2
    deadline = time.monotonic() + 240  # bounds a hang only
    while True:
        with writer.lock:
            part = rescan_partition(writer.paths[0], "t", 0)
            if len(part.ro) > keep + 3 and part.ro[-keep - 1].base > exported + 1:
                break
        assert writer.is_alive() and time.monotonic() < deadline, "the writer did not get past the export"
        time.sleep(0.1)
    with writer.lock:
        part = rescan_partition(writer.paths[0], "t", 0)
        res = apply_retention(part, RetentionRules(segments_count=keep), RetentionOptions(broker_stopped=True))
        lost_to = part.ro[-keep - 1].last  # the last seq retention deleted
    assert res.segments_deleted == len(part.ro) - keep

    # 3. killed after writing a batch's files, before its commit: orphans, and the batch is written again
    b = start(base, tmp_path, "b", env_extra={"TANK_LOG_EXPORT_HOLD": str(tmp_path / "h2")})
    wait_for_hold(tmp_path / "h2.ready", b, tmp_path / "b.log", timeout=240)
    kill_9(b)

    # 4. runs until stopped by SIGTERM to its process group, after the writer stops and the table caught up
    c = start(base, tmp_path, "c")
    with writer.lock:
        live = writer.apps[1].next_seq  # appended before c started
    deadline = time.monotonic() + 240  # bounds a hang only
    while not ((seqs := table_seqs(tmp_path / "table")[1]) and seqs[-1] >= live):  # c exported while appends go on
        assert c.poll() is None and time.monotonic() < deadline, open(tmp_path / "c.log").read()[-3000:]
        time.sleep(0.2)
    writer.done.set()
    writer.join()
    written = {p: writer.written(p) for p in (0, 1)}
    deadline = time.monotonic() + 120
    while True:
        seqs = table_seqs(tmp_path / "table")
        if all(seqs[p] and seqs[p][-1] == written[p][-1] for p in (0, 1)):
            break
        assert c.poll() is None and time.monotonic() < deadline, open(tmp_path / "c.log").read()[-3000:]
        time.sleep(0.5)
    os.killpg(c.pid, signal.SIGTERM)
    assert c.wait(120) == 0, open(tmp_path / "c.log").read()[-3000:]

    report = json.loads(open(tmp_path / "c.json").read())
    assert report["status"] == "ok" and report["summary"]["stopped"] == "signal"
    lost = [(r["topic"], r["partition"], r["from_seq"], r["to_seq"]) for r in report["summary"]["data_loss"]]
    assert set(lost) == {("t", 0, exported + 1, lost_to)}
    seqs = table_seqs(tmp_path / "table")
    assert seqs[1] == written[1]  # exactly once: no duplicate, no gap
    assert seqs[0] == [s for s in written[0] if not exported < s <= lost_to]
    with open(tmp_path / "ck" / "tank-data-loss.jsonl") as fh:
        assert {(r["from_seq"], r["to_seq"]) for r in map(json.loads, fh)} == {(exported + 1, lost_to)}
