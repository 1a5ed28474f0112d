"""The holder check (`storage/holders.py`) over many partition directories: `tank-log verify` of one topic whose
partition 0 holds messages and whose other partitions are empty directories (a legal layout: an import of a table
with one row of partition N makes N + 1 of them), and `partition_holders` of every partition directory alone.

    .venv/bin/python bench/holders.py [--sizes 1,100,1000,10000] [--big 65530] [--rounds 3] [--budget 120]

Each figure is measured in a fresh process (nothing cached from a previous round) and bounded: a round that takes
longer than `--budget` seconds is stopped and reported as `>BUDGET` (for `partition_holders`, with the partitions it
checked in the budget, so the cost per partition is known anyway). Prints, per size, the range over the rounds of
the seconds of each and the milliseconds per partition, with the processes on the machine and the load average."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import load_average, machine

CHILD = r"""
import json, os, sys, time
mode, topic, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0 = time.perf_counter()
if mode == "verify":
    from tank_log.maintenance.verify import verify_path
    problems = verify_path(topic)
    out = {"s": time.perf_counter() - t0, "done": None, "problems": len(problems)}
else:
    from tank_log.storage.holders import partition_holders
    names = sorted(os.listdir(topic), key=lambda n: int(n) if n.isdigit() else -1)
    dirs = [os.path.join(topic, n) for n in names if n.isdigit()]
    done = 0
    for d in dirs:
        partition_holders(d)
        done += 1
        if time.perf_counter() - t0 > budget:
            break
    out = {"s": time.perf_counter() - t0, "done": done, "of": len(dirs)}
print(json.dumps(out))
"""


def make_topic(base: str, partitions: int) -> str:
    """Partition 0 with 60 messages in 3 RO segments and an active one, partitions 1..N-1 empty directories."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition

    topic = os.path.join(base, "t")
    msgs = [Message(s, 1_700_000_000_000 + s, b"k%d" % (s % 5), b"v%d" % s) for s in range(1, 61)]
    write_partition(os.path.join(topic, "0"), msgs, segment_bytes=300)
    for pid in range(1, partitions):
        os.mkdir(os.path.join(topic, str(pid)))
    return topic


def processes() -> int:
    return sum(1 for e in os.listdir("/proc") if e.isdigit())


def measure(mode: str, topic: str, budget: float) -> dict[str, float | int | None]:
    """One round in a fresh process; `s` is None when it was stopped at the budget (verify cannot stop itself)."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, mode, topic, str(budget)],
            capture_output=True,
            text=True,
            timeout=budget + 60 if mode == "holders" else budget,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return {"s": None, "done": None}
    out: dict[str, float | int | None] = json.loads(r.stdout.splitlines()[-1])
    return out


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,100,1000,10000", help="partition directories per topic (comma-separated)")
    ap.add_argument("--big", type=int, default=65530, help="also verify a topic of this many (0: not)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds a round may take before it is stopped")
    ap.add_argument("--workdir", default=None, help="where the topics are written (default: a temporary directory)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"machine: {machine()}; processes: {processes()}; load average: {load_average()}")
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-holders-") as work:
        for n in sizes + ([args.big] if args.big else []):
            t0 = time.perf_counter()
            topic = make_topic(os.path.join(work, str(n)), n)
            made = time.perf_counter() - t0
            modes = ["verify"] if n == args.big and n not in sizes else ["verify", "holders"]
            for mode in modes:
                rounds = [measure(mode, topic, args.budget) for _ in range(args.rounds)]
                line = f"{n:>6} partition dirs  {mode:<8}"
                if mode == "verify":
                    secs = [r["s"] for r in rounds if r["s"] is not None]
                    stopped = len(rounds) - len(secs)
                    line += f" {span(secs) + ' s' if secs else '-'}"
                    line += f"  ({span([s * 1000 / n for s in secs], '{:.3f}')} ms a partition)" if secs else ""
                    line += f"  {stopped} of {len(rounds)} rounds stopped at >{args.budget:.0f} s" if stopped else ""
                else:
                    per = [float(r["s"] or 0) * 1000 / int(r["done"] or 1) for r in rounds]
                    done = min(int(r["done"] or 0) for r in rounds)
                    secs = [float(r["s"] or 0) for r in rounds]
                    line += f" {span(secs)} s  ({span(per, '{:.3f}')} ms a partition"
                    line += f"; {done} of {n} in the budget)" if done < n else ")"
                print(line, flush=True)
            print(f"{'':>6} (made in {made:.1f} s; processes now: {processes()}, load {load_average()})", flush=True)


if __name__ == "__main__":
    main()
