"""The retention job: the driver plans (rules per partition from the broker config + job overrides), executors
delete each partition's expired prefix (`RetentionTask.run`), the driver keeps
`.cleanup.log` consistent and writes the report."""

from __future__ import annotations

import argparse
from typing import Any

from tank_log.jobs.flags import add_broker_stopped, add_keep_unexported, add_time_basis, apply_guard_flags
from tank_log.jobs.planning import Plan
from tank_log.jobs.retention import clamp_cleanup_marks, plan_retention_run
from tank_spark.context import JobContext
from tank_spark.runner import run_partition_job


def add_options(p: argparse.ArgumentParser) -> None:
    add_time_basis(p)
    add_broker_stopped(p)
    add_keep_unexported(p)


def prepare(ctx: JobContext, args: argparse.Namespace) -> Plan:
    """The plan, before Spark starts (a run that matches nothing fails fast); the lakehouse guard's table is read
    here, once."""
    config = apply_guard_flags(ctx.config, args)
    return plan_retention_run(ctx.data_dirs, ctx.topics, config, dry_run=ctx.dry_run, time_basis=args.time_basis)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    deleted = [r for r in results if r["status"] in ("deleted", "data-loss")]
    kept = [r["kept_unexported"] for r in results if r.get("kept_unexported")]
    return {
        "kept_unexported_segments": sum(k["segments"] for k in kept),
        "kept_unexported_bytes": sum(k["bytes"] for k in kept),
        "data_loss_partitions": sum(r["status"] == "data-loss" for r in results),
        "segments_deleted": sum(r.get("segments_deleted") or 0 for r in deleted),
        "bytes_deleted": sum(r.get("bytes_deleted") or 0 for r in deleted),
        "messages_deleted": sum(r.get("messages_deleted") or 0 for r in deleted),
        "would_delete_segments": sum(r.get("segments_deleted") or 0 for r in results if r["status"] == "dry-run"),
    }


def main(argv: list[str] | None = None) -> int:
    return run_partition_job(
        "retention",
        "Delete expired RO segments (count, size, age) of delete-policy topics.",
        add_options,
        prepare,
        summarize,
        clamp_cleanup_marks,  # marks stay consistent with what was deleted
        argv,
    )
