"""The retention job: the driver plans (rules per partition from the broker config + job overrides), executors
delete each partition's expired prefix (`RetentionTask.run`), the driver keeps
`.cleanup.log` consistent and writes the report."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tank_log.jobs.planning import Plan
from tank_log.jobs.retention import clamp_cleanup_marks, plan_retention_run
from tank_spark.runner import (
    JobContext,
    JobResult,
    add_broker_stopped,
    add_time_basis,
    count_by,
    needs_executors,
    run_job,
    run_plan,
)

if TYPE_CHECKING:
    from pyspark import SparkContext


def add_options(p: argparse.ArgumentParser) -> None:
    add_time_basis(p)
    add_broker_stopped(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """The plan, before Spark starts (a run that matches nothing fails fast)."""
    return plan_retention_run(ctx.data_dirs, ctx.topics, ctx.config, dry_run=ctx.dry_run, time_basis=args.time_basis)


def execute(ctx: JobContext, plan: Plan, sc: SparkContext | None) -> JobResult:
    results = run_plan(sc, ctx, plan, clamp_cleanup_marks)  # marks stay consistent with what was deleted
    summary = {
        "partitions": len(results),
        "by_status": count_by(results),
        "segments_deleted": sum(r.get("segments_deleted") or 0 for r in results if r["status"] == "deleted"),
        "bytes_deleted": sum(r.get("bytes_deleted") or 0 for r in results if r["status"] == "deleted"),
        "messages_deleted": sum(r.get("messages_deleted") or 0 for r in results if r["status"] == "deleted"),
        "would_delete_segments": sum(r.get("segments_deleted") or 0 for r in results if r["status"] == "dry-run"),
    }
    return results, summary


def main(argv: list[str] | None = None) -> int:
    return run_job(
        "retention",
        "Delete expired RO segments (count, size, age) of delete-policy topics.",
        add_options,
        prepare,
        execute,
        argv,
        sql=False,
        needs_spark=needs_executors,
    )
