"""The index and integrity job: verify every segment and index on the executors (one task per partition), rebuild
what is missing or wrong with the broker's rebuild rule, move `_64.index` aside, repair interrupted compactions,
salvage torn tails with --salvage, and report what needs a human."""

from __future__ import annotations

import argparse
from typing import Any

from tank_log.jobs.flags import add_broker_stopped, add_salvage
from tank_log.jobs.indexes import plan_index_run
from tank_log.jobs.planning import Plan
from tank_spark.context import JobContext
from tank_spark.runner import run_partition_job


def add_options(p: argparse.ArgumentParser) -> None:
    add_salvage(p)
    add_broker_stopped(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """The plan, before Spark starts (a run that matches nothing fails fast)."""
    return plan_index_run(ctx.data_dirs, ctx.topics, ctx.config, dry_run=ctx.dry_run, salvage=args.salvage)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    actions = [a["action"] for r in results for a in r.get("actions", [])]
    return {
        "indexes_rebuilt": actions.count("rebuilt-index"),
        "segments_salvaged": actions.count("salvaged"),
        "problems_found": sum(len(r.get("found", [])) for r in results),
        "problems_unfixed": sum(len(r.get("unfixed", [])) for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    return run_partition_job(
        "rebuild_indexes",
        "Verify and rebuild indexes, repair interrupted compactions, salvage tails.",
        add_options,
        prepare,
        summarize,
        argv=argv,
    )
