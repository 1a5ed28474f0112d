"""Jobs/export_delta.py --continuous while a writer appends and rolls segments and retention deletes old ones:
kill -9 after a commit and before one, restart from the checkpoint, stop with SIGTERM. The table then holds every
message that still existed exactly once, and the ranges retention deleted before they were read are reported. The
seqs our compaction removed from a `cleanup` partition before they were exported are named as the batch export
names them."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, wait_for_hold
from deltalake import DeltaTable

from tank_log.format.bundle import Message
from tank_log.jobs.exits import exit_code
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import rescan_partition
from tank_spark.export.continuous import AVAILABLE_NOW  # a test hook: the query reads what exists, then ends

JOB = os.path.join(ROOT, "jobs", "export_delta.py")


def continuous(spark, *argv):
    """The continuous export's own `prepare` and `execute` on the tests' shared session, on the `AVAILABLE_NOW`
    trigger (set it: monkeypatch): (results, summary) once the query ended."""
    from tank_spark.context import build_context
    from tank_spark.export import job
    from tank_spark.job_options import job_parser

    parser = job_parser("export_delta", "")
    job.add_options(parser)
    args = parser.parse_args(["--master", "local[2]", *argv, "--continuous"])
    ctx = build_context("export_delta", args)
    return job.execute(ctx, job._prepare(ctx, args), spark)


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


@pytest.mark.spark
@pytest.mark.slow
def test_a_compaction_gap_is_named_as_the_batch_export_names_it(spark, tmp_path, monkeypatch):
    """A `cleanup` partition compacted by `tank-log compact` past what the append table holds: its log now starts
    after seqs the table never received. The batch export names them (status data-loss, exit 1, `lost_*`,
    `lost_before_export`, the `export_lost_messages` metric); the continuous export crossed them without a word
    (exported, exit 0). Now it names them the same way."""
    from prometheus_client import generate_latest

    from tank_log.metrics import report_registry
    from tank_log.storage.datadir import scan_data_dir
    from tank_log.tools.cli import main as tank_log

    monkeypatch.setenv(AVAILABLE_NOW, "1")
    base, table = str(tmp_path / "base"), str(tmp_path / "table")
    pdir = os.path.join(base, "kv", "0")
    os.makedirs(pdir)
    with open(os.path.join(base, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\nlog.segment.bytes=1kb\n")
    app = PartitionAppender(pdir)

    def produce(n):  # keys k0..k2, incompressible 300-byte values: a roll every few messages
        lo = app.last + 1
        app.append([Message(s, 1_790_000_000_000, b"k%d" % (s % 3), bytes((s * 7 + j * j) % 251 for j in range(300)))
                    for s in range(lo, lo + n)])  # fmt: skip

    produce(6)
    args = ["--data-dir", base, "--table", table, "--checkpoint", str(tmp_path / "ck")]
    (entry,), _ = continuous(spark, *args)
    assert entry["status"] == "exported" and entry["last_row_seq"] == 6
    for _ in range(4):
        produce(6)  # 7..30
    assert tank_log(["compact", "--force", "--broker-stopped", base]) == 0
    (part,) = scan_data_dir(base).partitions()
    start = part.segments[0].base
    assert start > 7  # the log starts past the table's seq 6: 7.. were superseded

    results, summary = continuous(spark, *args)
    (entry,) = results
    n = start - 7
    assert entry["status"] == "data-loss" and exit_code(results) == 1
    assert (entry["lost_first_seq"], entry["lost_last_seq"], entry["lost_messages"]) == (7, start - 1, n)
    assert entry["reason"] == (
        f"seqs 7..{start - 1} ({n} seqs) are in neither the table nor the log: deleted before they were exported "
        f"(the log now starts at {start})"
    )
    assert summary["lost_before_export"] == n and summary["by_status"] == {"data-loss": 1}
    report = {"job": "export_delta", "status": "partial-failure", "summary": summary, "partitions": results}
    metrics = generate_latest(report_registry(report)).decode()
    assert f'tank_log_export_lost_messages{{partition="0",table="{table}",topic="kv"}} {float(n)}' in metrics
    d = DeltaTable(table).to_pyarrow_table(columns=["seq"]).to_pydict()
    assert sorted(d["seq"]) == list(range(1, 7)) + sorted(m.seq for seg in part.segments for m in seg.messages())
