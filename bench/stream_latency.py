"""Continuous export latency: from an append to a TANK partition to the row being visible in the Delta table.

A writer appends one 100-message bundle (BENCH.md messages) to each of 4 partitions every 0.5 s, rolling segments
as the broker would (`PartitionAppender`), while `jobs/export_delta.py --continuous --trigger-interval 5s` runs.
A poller reads each new Delta commit's app transactions (the last exported seq per partition) as it lands; a bundle
is visible once a commit's version for its partition reaches its last seq. The trigger interval is the reference:
a bundle waits on average half of it for the next micro-batch, then the batch's own time.

    python bench/stream_latency.py [--seconds 60] [--trigger 5s] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, bundle_messages, machine  # noqa: E402

from tank_log.format.bundle import Message  # noqa: E402
from tank_log.storage.appender import PartitionAppender  # noqa: E402

PARTITIONS = 4


def one_run(seconds: float, trigger: str) -> dict:
    work = tempfile.mkdtemp(prefix="tank-stream-bench-")
    base, table = os.path.join(work, "base"), os.path.join(work, "table")
    apps = [PartitionAppender(os.path.join(base, "events", str(p)), segment_bytes=1 << 20) for p in range(PARTITIONS)]
    appended: dict[tuple[int, int], float] = {}
    b = 0

    def append_all() -> None:
        nonlocal b
        for p, app in enumerate(apps):
            msgs = [Message(app.next_seq + i, ts, k, v) for i, (ts, k, v) in enumerate(bundle_messages(b))]
            app.append(msgs)
            appended[(p, msgs[-1].seq)] = time.time()
            b += 1

    append_all()  # the partitions exist before the job starts
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    log_path = os.path.join(work, "job.log")
    job = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", "--data-dir", base,
         "--table", table, "--continuous", "--trigger-interval", trigger, "--checkpoint", os.path.join(work, "ck")],
        env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), start_new_session=True,
    )  # fmt: skip
    visible: dict[int, list[tuple[int, float]]] = {p: [] for p in range(PARTITIONS)}  # (version, seen at)
    stop = threading.Event()

    def poll() -> None:
        log_dir, seen = os.path.join(table, "_delta_log"), set()
        while not stop.is_set():
            for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
                if not name.endswith(".json") or name in seen:
                    continue
                seen.add(name)
                now = time.time()
                for line in open(os.path.join(log_dir, name)):
                    txn = json.loads(line).get("txn")
                    if txn:
                        visible[int(txn["appId"].rsplit(":", 1)[1])].append((txn["version"], now))
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    while not visible[0]:  # the first batch: Spark's start-up, not steady-state latency
        assert job.poll() is None, open(log_path).read()[-3000:]
        time.sleep(0.2)
    t_start = time.time()
    while time.time() - t_start < seconds:
        append_all()
        time.sleep(0.5)
    last = {p: app.last for p, app in enumerate(apps)}
    while any(not visible[p] or visible[p][-1][0] < last[p] for p in range(PARTITIONS)):
        assert job.poll() is None, open(log_path).read()[-3000:]
        time.sleep(0.2)
    stop.set()
    os.killpg(job.pid, signal.SIGTERM)
    job.wait(120)
    latencies = []
    for (p, seq), t in appended.items():
        if t < t_start:
            continue
        seen = next(at for version, at in visible[p] if version >= seq)
        latencies.append(seen - t)
    batch_s = [float(x) for x in re.findall(r"table version \d+ in ([\d.]+)s", open(log_path).read())[1:]]
    latencies.sort()
    return {
        "bundles": len(latencies),
        "p50": statistics.median(latencies),
        "p95": latencies[int(0.95 * (len(latencies) - 1))],
        "max": latencies[-1],
        "batch_median": statistics.median(batch_s) if batch_s else None,
        "batches": len(batch_s) + 1,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--trigger", default="5s")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    trigger_s = float(args.trigger.rstrip("s"))
    print(f"machine: {machine()}; trigger {args.trigger}; {PARTITIONS} partitions, a bundle each every 0.5 s")
    for run in range(1, args.runs + 1):
        r = one_run(args.seconds, args.trigger)
        print(
            f"run {run}: {r['bundles']} bundles; latency p50 {r['p50']:.2f} s ({r['p50'] / trigger_s:.2f}× trigger), "
            f"p95 {r['p95']:.2f} s ({r['p95'] / trigger_s:.2f}×), max {r['max']:.2f} s; {r['batches']} batches, "
            f"median batch {r['batch_median']:.2f} s"
        )


if __name__ == "__main__":
    main()
