"""The compaction job: the driver plans (which partitions, why), executors compact one partition each
(`CompactionTask.run`), the driver records `.cleanup.log` marks and the report."""

from __future__ import annotations

import argparse
from typing import Any

from tank_log.jobs.compaction import apply_flags, plan_compaction, record_cleanup_marks
from tank_log.jobs.flags import add_broker_stopped, add_compaction_rules, add_force
from tank_log.jobs.planning import Plan
from tank_spark.context import JobContext
from tank_spark.runner import run_partition_job


def add_options(p: argparse.ArgumentParser) -> None:
    add_force(p)
    add_broker_stopped(p)
    add_compaction_rules(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """Flags over the config file, then the plan (before Spark starts: a run that matches nothing fails fast)."""
    config = apply_flags(
        ctx.config, force=args.force, tombstone_retention=args.tombstone_retention, drop_keyless=args.drop_keyless
    )
    return plan_compaction(ctx.data_dirs, ctx.topics, config, dry_run=ctx.dry_run)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if r.get("status") == "compacted"]
    return {
        "bytes_before": sum(r.get("bytes_before") or 0 for r in done),
        "bytes_after": sum(r.get("bytes_after") or 0 for r in done),
        "messages_before": sum(r.get("messages_before") or 0 for r in done),
        "messages_after": sum(r.get("messages_after") or 0 for r in done),
    }


def main(argv: list[str] | None = None) -> int:
    return run_partition_job(
        "compact",
        "Compact keyed (log.cleanup.policy=cleanup) partitions into sparse bundles.",
        add_options,
        prepare,
        summarize,
        record_cleanup_marks,  # finished partitions get their marks
        argv,
    )
