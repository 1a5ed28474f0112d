"""The maintenance job: per partition, in one task (a Spark task, or a process of the driver's for a small run),
repair → retention → compaction → index verify/rebuild → final verify (`tank_log/jobs/maintain.py`); at most one
Spark start-up and one report for the nightly run."""

from __future__ import annotations

import argparse

from tank_log.jobs.compaction import apply_flags
from tank_log.jobs.flags import (
    add_broker_stopped,
    add_force,
    add_keep_unexported,
    add_salvage,
    add_time_basis,
    apply_guard_flags,
)
from tank_log.jobs.maintain import plan_maintenance, record_maintenance_marks, summarize
from tank_log.jobs.planning import Plan
from tank_spark.context import JobContext
from tank_spark.runner import run_partition_job


def add_options(p: argparse.ArgumentParser) -> None:
    add_broker_stopped(p)
    add_salvage(p)
    add_force(p)
    add_time_basis(p)
    add_keep_unexported(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """The plan, before Spark starts (a run that matches nothing fails fast)."""
    config = apply_flags(ctx.config, force=args.force)
    config = apply_guard_flags(config, args)
    return plan_maintenance(
        ctx.data_dirs, ctx.topics, config, dry_run=ctx.dry_run, salvage=args.salvage, time_basis=args.time_basis
    )


def main(argv: list[str] | None = None) -> int:
    return run_partition_job(
        "maintain",
        "Nightly maintenance per partition: repair, retention, compaction, index verify/rebuild, final verify.",
        add_options,
        prepare,
        summarize,
        record_maintenance_marks,
        argv,
    )
