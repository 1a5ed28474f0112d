"""Planning a run over many small partitions: each job's planner, and sizing the plan for `in_driver_max_bytes`
(`runner.needs_executors`) from the sizes the tasks carry. The reference, measured in the same run: listing every
planned partition again (`partitions_at`), which is how the plan was sized before the tasks carried their size.

    .venv/bin/python bench/plan.py [--partitions 1000] [--rounds 5]

Data: one `cleanup` topic of N partitions, each 3 RO segments + an active one (60 messages). Prints the range over
the rounds of each figure, in milliseconds."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import machine


def make_data(base: str, partitions: int) -> str:
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition
    from tank_log.storage.writer import BundlePolicy

    msgs = [Message(s, 1_700_000_000_000 + s, b"k%d" % (s % 5), b"v%d" % s) for s in range(1, 61)]
    for pid in range(partitions):
        write_partition(os.path.join(base, "kv", str(pid)), msgs, segment_bytes=300, policy=BundlePolicy(5))
    with open(os.path.join(base, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    return base


def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def relisted_bytes(tasks: Any) -> int:
    """The reference: every planned partition listed again."""
    from tank_log.storage.datadir import partitions_at

    return sum(s.size for t in tasks for part in partitions_at(t.path) for s in part.segments)


def main() -> None:
    from tank_log.jobs.compaction import plan_compaction
    from tank_log.jobs.config import JobConfig
    from tank_log.jobs.indexes import plan_index_run
    from tank_log.jobs.maintain import plan_maintenance
    from tank_log.jobs.retention import plan_retention_run

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"machine: {machine()}")
    config = JobConfig(broker_stopped=True)
    planners = {
        "compaction": lambda base: plan_compaction([base], None, config, dry_run=True),
        "retention": lambda base: plan_retention_run([base], None, config, dry_run=True),
        "indexes": lambda base: plan_index_run([base], None, config, dry_run=True, salvage=False),
        "maintenance": lambda base: plan_maintenance([base], None, config, dry_run=True),
    }
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = make_data(os.path.join(tmp, "base"), args.partitions)
        for _ in range(args.rounds):
            for name, plan in planners.items():
                ms, _ = timed_ms(lambda plan=plan: plan(base))
                figures.setdefault(f"plan {name}", []).append(ms)
            planned, _ = plan_compaction([base], None, config, dry_run=True)
            ms_carried, carried = timed_ms(lambda tasks=planned: sum(t.data_bytes for t in tasks))
            ms_listed, listed = timed_ms(lambda tasks=planned: relisted_bytes(tasks))
            assert carried == listed > 0, (carried, listed)
            figures.setdefault("size from the tasks", []).append(ms_carried)
            figures.setdefault("reference: list again", []).append(ms_listed)
    print(f"{args.partitions} partitions, {args.rounds} rounds (ms, min-max):")
    for name, values in figures.items():
        print(f"  {name:24s} {min(values):9.3f} - {max(values):9.3f}")


if __name__ == "__main__":
    main()
