"""SIGKILL sweep: kill `tank-log compact`, `tank-log maintain` and a job's driver (jobs/maintain.py, its small run in
the driver's processes) at random points of multi-partition runs, and count what a scheduler's kill leaves behind:
processes of the run still alive 2 s after the kill, partitions `tank-log repair` cannot bring back, partitions the
next run refuses as held. The goal is 0 of each.

    python bench/kill_sweep.py [--kills 30] [--partitions 200] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def session_processes(sid: int) -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                out.append(pid)
        except (OSError, IndexError):
            continue
    return out


def make_base(path: str, n: int) -> str:
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition
    from tank_log.storage.writer import BundlePolicy

    msgs = [Message(s, 1_700_000_000_000 + s, b"k%d" % (s % 5), b"v%d" % s) for s in range(1, 61)]
    for pid in range(n):
        write_partition(os.path.join(path, "kv", str(pid)), msgs, segment_bytes=300, policy=BundlePolicy(5))
    with open(os.path.join(path, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    return path


def one_kill(kind: str, base: str, delay: float) -> dict:
    cmd = {
        "cli-compact": [*CLI, "compact", base, "--broker-stopped", "--force"],
        "cli-maintain": [*CLI, "maintain", base, "--broker-stopped", "--force"],
        "job-maintain": [
            sys.executable,
            os.path.join(ROOT, "jobs", "maintain.py"),
            "--master",
            "local[2]",
            "--data-dir",
            base,
            "--broker-stopped",
            "--force",
        ],
    }[kind]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    time.sleep(delay)
    finished_first = proc.poll() is not None
    if not finished_first:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    t0 = time.monotonic()
    while session_processes(proc.pid) and time.monotonic() - t0 < 2.0:
        time.sleep(0.02)
    left = session_processes(proc.pid)
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    rep = subprocess.run([*CLI, "repair", base], capture_output=True, text=True, timeout=600)
    ver = subprocess.run([*CLI, "verify", base], capture_output=True, text=True, timeout=600)
    rerun = subprocess.run([*CLI, "compact", base, "--broker-stopped"], capture_output=True, text=True, timeout=600)
    entries = [json.loads(x) for x in rerun.stdout.splitlines() if x.startswith("{")]
    refused = sum(1 for e in entries if e.get("held_by") or e.get("status") == "skipped")
    return {
        "kind": kind,
        "delay_s": round(delay, 2),
        "finished_before_kill": finished_first,
        "left_after_2s": len(left),
        "repair_exit": rep.returncode,
        "verify_exit": ver.returncode,
        "refused_by_rerun": refused,
        "rerun_exit": rerun.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.kills):
            kind = ("cli-compact", "cli-maintain", "job-maintain")[i % 3]
            base = make_base(os.path.join(tmp, f"b{i}"), args.partitions * (1 if kind.startswith("cli") else 3))
            delay = rnd.uniform(0.2, 1.5) if kind.startswith("cli") else rnd.uniform(1.0, 3.0)
            rows.append(one_kill(kind, base, delay))
            print(json.dumps(rows[-1]), flush=True)
    total = {
        "kills": len(rows),
        "killed_mid_run": sum(not r["finished_before_kill"] for r in rows),
        "processes_left": sum(r["left_after_2s"] for r in rows),
        "repair_failures": sum(r["repair_exit"] != 0 for r in rows),
        "verify_failures": sum(r["verify_exit"] != 0 for r in rows),
        "partitions_refused_by_rerun": sum(r["refused_by_rerun"] for r in rows),
    }
    print(json.dumps(total))


if __name__ == "__main__":
    main()
