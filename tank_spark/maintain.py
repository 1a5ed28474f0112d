"""The maintenance job: per partition, in one Spark task, repair → retention → compaction → index verify/rebuild →
final verify (`tank_log/jobs/maintain.py`); one Spark start-up and one report for the nightly run."""

from __future__ import annotations

import argparse

from tank_log.jobs.compaction import apply_flags
from tank_log.jobs.maintain import plan_maintenance, record_maintenance_marks, summarize
from tank_spark.runner import add_broker_stopped, count_by, run_job, run_plan


def add_options(p: argparse.ArgumentParser) -> None:
    add_broker_stopped(p)
    p.add_argument(
        "--salvage",
        action="store_true",
        help="cut torn tails after the last complete bundle (cut bytes kept in a .-prefixed side file)",
    )
    p.add_argument("--force", action="store_true", help="compact even when the dirty ratio is below the threshold")
    p.add_argument(
        "--time-basis",
        choices=("name", "message"),
        help="retention ages from the name's ts (the broker's rule) or the newest message ts (Kafka's rule)",
    )


def prepare(ctx, args):
    """The plan, before Spark starts (a run that matches nothing fails fast)."""
    config = apply_flags(ctx.config, force=args.force)
    return plan_maintenance(
        ctx.data_dirs, ctx.topics, config, dry_run=ctx.dry_run, salvage=args.salvage, time_basis=args.time_basis
    )


def execute(ctx, plan, spark):
    results = run_plan(spark, ctx, plan, record_maintenance_marks)
    return results, {"partitions": len(results), "by_status": count_by(results), **summarize(results)}


def main(argv: list[str] | None = None) -> int:
    return run_job(
        "maintain",
        "Nightly maintenance per partition: repair, retention, compaction, index verify/rebuild, final verify.",
        add_options,
        prepare,
        execute,
        argv,
    )
