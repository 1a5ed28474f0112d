"""The index and integrity job: verify every segment and index on the executors (one task per partition), rebuild
what is missing or wrong with the broker's rebuild rule, move `_64.index` aside, repair interrupted compactions,
salvage torn tails with --salvage, and report what needs a human."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tank_log.jobs.indexes import plan_index_run
from tank_log.jobs.planning import Plan
from tank_spark.runner import (
    JobContext,
    JobResult,
    add_broker_stopped,
    add_salvage,
    count_by,
    needs_executors,
    run_job,
    run_plan,
)

if TYPE_CHECKING:
    from pyspark import SparkContext


def add_options(p: argparse.ArgumentParser) -> None:
    add_salvage(p)
    add_broker_stopped(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """The plan, before Spark starts (a run that matches nothing fails fast)."""
    return plan_index_run(ctx.data_dirs, ctx.topics, ctx.config, dry_run=ctx.dry_run, salvage=args.salvage)


def execute(ctx: JobContext, plan: Plan, sc: SparkContext | None) -> JobResult:
    results = run_plan(sc, ctx, plan)
    summary = {
        "partitions": len(results),
        "by_status": count_by(results),
        "indexes_rebuilt": sum(1 for r in results for a in r.get("actions", []) if a["action"] == "rebuilt-index"),
        "segments_salvaged": sum(1 for r in results for a in r.get("actions", []) if a["action"] == "salvaged"),
        "problems_found": sum(len(r.get("found", [])) for r in results),
        "problems_unfixed": sum(len(r.get("unfixed", [])) for r in results),
    }
    return results, summary


def main(argv: list[str] | None = None) -> int:
    code = run_job(
        "rebuild_indexes",
        "Verify and rebuild indexes, repair interrupted compactions, salvage tails.",
        add_options,
        prepare,
        execute,
        argv,
        sql=False,
        needs_spark=needs_executors,
    )
    return code
