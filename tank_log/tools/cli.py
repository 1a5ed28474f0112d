"""`tank-log` command line: dump, verify, stats, audit, repair, compact, demo (see --help of each)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

# numpy's OpenBLAS starts a thread per core that spins between calls; tank-log does no linear algebra, and on a
# small machine those threads take CPU from the work (7% of a dump's samples). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tank_log.errors import PartitionHeld, RunFailed, TankFormatError, UsageError  # noqa: E402
from tank_log.jobs.allocator import reuse_freed_buffers  # noqa: E402
from tank_log.jobs.entry_points import NAMES as JOB_NAMES  # noqa: E402
from tank_log.jobs.entry_points import job_path  # noqa: E402
from tank_log.jobs.flags import (  # noqa: E402
    add_broker_stopped,
    add_compaction_rules,
    add_dead_letter_table,
    add_force,
    add_keep_unexported,
    add_metrics_file,
    add_salvage,
    add_source,
    add_storage_option,
    add_table_format,
)
from tank_log.lakehouse.location import FORMATS  # noqa: E402

if TYPE_CHECKING:
    from tank_log.jobs.planning import PartitionTask
    from tank_log.lakehouse.location import Catalog
    from tank_log.problems import Problem


def _cmd_dump(args: argparse.Namespace) -> int:
    from tank_log.storage.datadir import Unread
    from tank_log.tools.dump import dump_path

    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)  # the lines are ASCII bytes: written as they are, no text layer
    write = binary.write if binary is not None else lambda lines: sys.stdout.write(lines.decode("ascii"))
    unread: list[Unread] = []
    for lines in dump_path(args.path, bundles=args.bundles, topics=args.topics, unread=unread):
        write(lines)
    (binary or sys.stdout).flush()
    return _incomplete("dump", unread)


def _incomplete(command: str, unread: Sequence[object]) -> int:
    """Exit 1 when a read-only command left out data it found on disk (each item was logged as it was found): a
    pipeline that checks the exit code never takes a partial output for a whole one."""
    if not unread:
        return 0
    print(f"tank-log {command}: incomplete: {len(unread)} file(s) or directories not read in full:", file=sys.stderr)
    for u in unread:
        print(f"  {u}", file=sys.stderr)
    return 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from tank_log.maintenance.verify import verify_path

    problems = verify_path(args.path)
    if args.config:
        problems += _guard_problems(args.path, args.config)
    shown = [p for p in problems if args.warnings or p.severity == "error"]
    if args.json:
        for p in shown:
            print(json.dumps(p.to_dict()))
    else:
        for p in shown:
            print(p)
        errors = sum(p.severity == "error" for p in problems)
        print(f"{errors} error(s), {len(problems) - errors} warning(s)", file=sys.stderr)
    return 1 if any(p.severity == "error" for p in problems) else 0


def _guard_problems(path: str, config_file: str) -> list[Problem]:
    """A problem per topic under `path` that the job config's lakehouse guard covers while the topic's config lets
    the broker delete segments itself (`maintenance.retention.broker_retention_problem`)."""
    from tank_log.jobs.config import load_job_config
    from tank_log.maintenance.retention import broker_retention_problem
    from tank_log.problems import Problem
    from tank_log.storage.datadir import partitions_at

    retention = load_job_config(config_file).retention
    out: dict[str, Problem] = {}
    for part in partitions_at(path):
        if part.topic in out or retention.guard_of(part.topic) is None:
            continue
        problem = broker_retention_problem(part.topic, part.config)
        if problem:
            out[part.topic] = Problem(os.path.dirname(part.path), None, "broker-retention", problem)
    return list(out.values())


def _cmd_stats(args: argparse.Namespace) -> int:
    from tank_log.lakehouse import ExportedSeqs, TableUnreadable
    from tank_log.lakehouse.location import catalog_setting
    from tank_log.metrics import stats_registry, write_metrics
    from tank_log.storage.datadir import Unread
    from tank_log.tools.stats import format_table, stats_path

    unread: list[Unread] = []
    exported = None
    table, options, fmt, catalog, source = _export_table(args, args.export_table, args.export_format)
    if table:
        catalog = catalog_setting(args.export_catalog, catalog, fmt, "--export-catalog")
        exported = ExportedSeqs(table, options, fmt, catalog, source)
    try:
        rows = stats_path(args.path, args.topics, unread=unread, exported=exported)
    except TableUnreadable as err:
        print(f"tank-log stats: the export lag is unknown: {err}", file=sys.stderr)
        return 1
    table = None if exported is None else exported.uri
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    elif fmt == "prometheus":
        from prometheus_client import generate_latest

        sys.stdout.write(generate_latest(stats_registry(rows, table)).decode())
    else:
        print(format_table(rows))
    if args.metrics_file:
        write_metrics(args.metrics_file, stats_registry(rows, table))
    for r in rows:
        if r.error:
            print(f"tank-log stats: {r.topic}/{r.partition}: {r.error}", file=sys.stderr)
    sys.stdout.flush()
    return _incomplete("stats", unread) or (1 if any(r.error for r in rows) else 0)


def _export_table(
    args: argparse.Namespace, table: str | None, fmt: str | None
) -> tuple[str | None, dict[str, str], str, Catalog | None, str | None]:
    """The export's table as `--config FILE`'s export section names it (table, format, catalog, storage options,
    source), the flags over it: (table, storage options, format, catalog, source)."""
    from tank_log.lakehouse import check_source, storage_options

    export = None
    if args.config:
        from tank_log.jobs.config import load_job_config

        export = load_job_config(args.config).export
    options = storage_options(dict(export.storage_options) if export else {}, args.storage_option)
    source = check_source(args.source, "--source") if args.source else (export.source if export else None)
    return (
        table or (export.table if export else None),
        options,
        fmt or (export.format if export else "delta"),
        export.catalog if export else None,
        source,
    )


def _dead_letter_table(args: argparse.Namespace, table: str) -> str:
    """Where the export put the table's dead letters, as it chose: --dead-letter-table, --config's
    export.dead_letter_table, else beside the table."""
    from tank_log.jobs.config.models import default_dead_letter_table

    if args.dead_letter_table:
        return str(args.dead_letter_table)
    if args.config:
        from tank_log.jobs.config import load_job_config

        configured = load_job_config(args.config).export.dead_letter_table
        if configured:
            return str(configured)
    return default_dead_letter_table(table)


def _cmd_audit(args: argparse.Namespace) -> int:
    from tank_log.lakehouse import TableUnreadable, default_source
    from tank_log.lakehouse.location import catalog_setting, locate
    from tank_log.tools.audit import audit_table, format_table

    name, options, fmt, catalog, source = _export_table(args, args.table, args.format)
    if not name:
        raise UsageError("--table TABLE, or --config FILE whose export section names it")
    catalog = catalog_setting(args.catalog, catalog, fmt)
    if not os.path.isdir(args.path):
        raise UsageError(f"{args.path}: not a directory (give a broker base path, a topic or a partition directory)")
    source = source or default_source()
    try:
        location = locate(name, options, fmt, catalog, source)
    except RunFailed as err:  # a REST catalog out of reach
        print(f"tank-log audit: {err}", file=sys.stderr)
        return 1
    try:
        table = location.open()
    except Exception as err:  # the formats' libraries raise their own types for a store they cannot reach
        print(
            f"tank-log audit: {TableUnreadable(location)}: {type(err).__name__}: {err}".splitlines()[0], file=sys.stderr
        )
        return 1
    if table is None:
        raise UsageError(f"{location}: no {fmt} table there")
    dead = locate(_dead_letter_table(args, name), options, fmt, catalog, source).open()  # typed values'
    try:
        report = audit_table(args.path, table, str(location), args.topics, source, dead)
    except TableUnreadable as err:  # e.g. a reader feature delta-rs lacks: what the table holds is unknown
        print(f"tank-log audit: {err}".splitlines()[0], file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_table(report))
    return report.exit_code


def _cmd_demo(args: argparse.Namespace) -> int:
    from tank_log.tools.demo import write_demo

    path = write_demo(args.dir, seed=args.seed, typed=args.typed)
    print(f"demo data written to {path}", file=sys.stderr)
    return 0


def _cmd_repair(args: argparse.Namespace) -> int:
    from tank_log.errors import NeedsAttention, PartitionHeld, PartitionLocked, describe_error
    from tank_log.storage.datadir import classify_path, partitions_at
    from tank_log.storage.holders import check_not_held
    from tank_log.storage.locking import PartitionLock
    from tank_log.storage.repair import repair_base, repair_partition

    status = 0
    if classify_path(args.path) == "base":
        try:
            temps = repair_base(args.path, dry_run=args.dry_run)
        except (PartitionLocked, OSError) as err:
            action = "skipped" if isinstance(err, PartitionLocked) else "failed"
            print(json.dumps({"path": args.path, "action": action, "reason": describe_error(err)}))
            temps, status = [], 1
        if temps or args.verbose:
            print(json.dumps({"path": args.path, "removed": temps, "dry_run": args.dry_run}))
    for part in partitions_at(args.path):
        try:
            if args.dry_run:
                res = repair_partition(part.path, dry_run=True)
            else:
                check_not_held(part.path)
                with PartitionLock(part.path, "repair"):
                    res = repair_partition(part.path)
        except (PartitionLocked, PartitionHeld, NeedsAttention, OSError) as err:  # reported; the others are repaired
            kinds: dict[type[Exception], str] = {
                PartitionLocked: "skipped",
                PartitionHeld: "skipped",
                NeedsAttention: "needs-attention",
            }
            action = kinds.get(type(err), "failed")
            print(json.dumps({"path": part.path, "action": action, "reason": describe_error(err)}))
            status = 1
            continue
        if res.has_work or res.problems or args.verbose:
            print(json.dumps({**res.to_dict(), "dry_run": args.dry_run}))
        status = 1 if res.problems else status  # what repair left, and why: verify reports it too
    return status


def _cmd_compact(args: argparse.Namespace) -> int:
    from tank_log.jobs.compaction import apply_flags, plan_compaction, record_cleanup_marks
    from tank_log.jobs.config import load_job_config

    _require_base_path(args.path)
    _mark_run(args)
    config = apply_flags(
        load_job_config(args.config),
        force=args.force,
        tombstone_retention=args.tombstone_retention,
        drop_keyless=args.drop_keyless,
        broker_stopped=args.broker_stopped,
    )
    tasks, skipped = plan_compaction(
        [args.path], set(args.topics) if args.topics else None, config, dry_run=args.dry_run
    )
    return _run_tasks(
        "compact",
        tasks,
        skipped,
        record_cleanup_marks,
        dry_run=args.dry_run,
        processes=args.processes,
        metrics_file=args.metrics_file or config.metrics_file,
    )


def _cmd_maintain(args: argparse.Namespace) -> int:
    from tank_log.jobs.compaction import apply_flags
    from tank_log.jobs.config import load_job_config
    from tank_log.jobs.flags import apply_guard_flags
    from tank_log.jobs.maintain import plan_maintenance, record_maintenance_marks

    _require_base_path(args.path)
    _mark_run(args)
    config = apply_flags(load_job_config(args.config), force=args.force, broker_stopped=args.broker_stopped)
    config = apply_guard_flags(config, args)
    tasks, left_out = plan_maintenance(
        [args.path], set(args.topics) if args.topics else None, config, dry_run=args.dry_run, salvage=args.salvage
    )
    return _run_tasks(
        "maintain",
        tasks,
        left_out,
        record_maintenance_marks,
        dry_run=args.dry_run,
        processes=args.processes,
        metrics_file=args.metrics_file or config.metrics_file,
    )


def _mark_run(args: argparse.Namespace) -> None:
    """Mark this process as a tank-log run on its base path until it exits (`storage/locking.run_marker`): another
    run of ours then waits for the partition lock or skips, never taking this one for the broker."""
    from tank_log.storage.locking import run_marker

    if not args.dry_run:
        _RUN_MARKS.enter_context(run_marker([args.path]))


_RUN_MARKS = contextlib.ExitStack()  # closed when the process exits


def given_path(path: str, *, segment: bool = False) -> None:
    """Check a path given on the command line before any work: it exists, its symbolic links resolve, and a file is a
    segment log file by its name (§2.1: `<base>_<ts>.log`, `<base>-<last>_<ts>.ilog`); with `segment`, it must be
    one. These are the user's mistakes, not the data's, so each is a usage error (exit 2), whatever the command.

    Raises:
        UsageError: one line naming the path and the rule.
    """
    import errno
    import stat

    from tank_log.format.names import FileName, Kind, parse_name

    try:
        st = os.stat(path)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise UsageError(f"{path}: no such file or directory") from None
        if err.errno == errno.ELOOP:
            raise UsageError(f"{path}: a loop of symbolic links (give the path they should lead to)") from None
        raise UsageError(f"{path}: cannot be opened: {err.strerror}") from None
    wanted = "a segment log file (.ilog or .log)" if segment else "a segment log file or a directory"
    if stat.S_ISDIR(st.st_mode):
        if segment:
            raise UsageError(f"{path}: a directory, not {wanted}")
        return
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: not a regular file: give {wanted}")
    try:
        parsed = parse_name(os.path.basename(path))
    except TankFormatError as err:
        raise UsageError(f"{path}: {err}") from None
    if not isinstance(parsed, FileName) or parsed.kind is Kind.INDEX:
        raise UsageError(
            f"{path}: not {wanted}: a segment is named <base>_<ts>.log or <base>-<last>_<ts>.ilog (FORMAT.md §2.1)"
        )


def _require_base_path(path: str) -> None:
    from tank_log.storage.datadir import classify_path

    if classify_path(path) != "base":
        raise UsageError(f"{path}: give the broker base path (the directory holding topic directories)")


def _write_run_metrics(path: str, what: str, status: str, results: list[dict[str, Any]], duration_s: float) -> None:
    """The run's Prometheus metrics as a job's: its status, duration and partitions by status."""
    from tank_log.metrics import write_report_metrics

    by_status: dict[str, int] = {}
    for r in results:
        by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
    doc = {"job": f"tank-log {what}", "status": status, "duration_s": duration_s}
    write_report_metrics(path, {**doc, "summary": {"by_status": by_status}, "partitions": results})


def _run_tasks(
    what: str,
    tasks: Sequence[PartitionTask],
    left_out: list[dict[str, Any]],
    bookkeeping: Callable[[list[dict[str, Any]]], None],
    *,
    dry_run: bool,
    processes: int | None,
    metrics_file: str | None = None,
) -> int:
    """Run tasks in worker processes (one per CPU unless `processes`): a JSON line per partition as it finishes (and a
    progress bar on a terminal); the bookkeeping for what finished, also on Ctrl-C/SIGTERM, which drains the run
    (exit 130, listing what finished). Exit codes as a job's (`jobs/exits.py`): 3 when a partition needing work was
    skipped because the broker holds it. With `metrics_file`, the run's Prometheus metrics as a job's
    (`metrics.report_registry`)."""
    from tank_log.jobs.exits import EXIT_PARTIAL, exit_code, missed_message
    from tank_log.jobs.processes import run_in_processes, usable_cpus
    from tank_log.jobs.progress import interrupted_message
    from tank_log.jobs.stopping import Interrupted, handling
    from tank_log.maintenance.outcome import Status

    if metrics_file:  # found now, not after all the work
        from tank_log.metrics import check_metrics_path

        check_metrics_path(metrics_file)

    def print_entry(r: dict[str, Any]) -> None:
        if r["status"] != Status.INTERRUPTED:  # queued when the run was stopped: listed by the message below
            print(json.dumps(r), flush=True)

    t0 = time.monotonic()

    def metrics(status: str, results: list[dict[str, Any]]) -> None:
        if metrics_file:
            _write_run_metrics(metrics_file, what, status, results, time.monotonic() - t0)

    late: list[int] = []  # Ctrl-C/SIGTERM after every partition finished: the bookkeeping and the summary still run
    with handling(lambda signum, frame: late.append(signum), signal.SIGINT, signal.SIGTERM):
        try:
            results = run_in_processes(tasks, processes or usable_cpus(), what=what, on_finished=print_entry)
        except Interrupted as stop:  # what finished keeps its bookkeeping; the rest is crash-safe
            if not dry_run:
                bookkeeping(stop.results)
            print(interrupted_message(f"tank-log {what}", stop.results), file=sys.stderr)
            metrics("interrupted", stop.results)
            return EXIT_INTERRUPTED
        if not dry_run:
            bookkeeping(results)
        for r in left_out:
            print(json.dumps(r))
        code = exit_code(results)
        if code == EXIT_PARTIAL:
            print(missed_message(f"tank-log {what}", results), file=sys.stderr)
        metrics({0: "ok", EXIT_PARTIAL: "partial"}.get(code, "partial-failure"), results)
        if late:
            name = signal.Signals(late[0]).name
            print(
                f"tank-log {what}: {name} came after every partition had finished: the run is complete", file=sys.stderr
            )
        return code


def _cmd_rebuild_index(args: argparse.Namespace) -> int:
    from tank_log.format.broker_config import load_config
    from tank_log.maintenance.indexes import rebuild_index_file
    from tank_log.storage.holders import check_not_held
    from tank_log.storage.segment import Segment

    seg = Segment(args.segment)
    if args.out is None:  # replacing the segment's own index: nobody may hold the partition (§9 rule 1)
        check_not_held(os.path.dirname(os.path.abspath(args.segment)))
    interval = args.interval
    if args.rule == "append" and interval is None:  # the partition's log.index.interval.bytes (§1.5)
        pdir = os.path.dirname(os.path.abspath(args.segment))
        topic_cfg, _ = load_config(os.path.join(os.path.dirname(pdir), "config"))
        interval = load_config(os.path.join(pdir, "config"), topic_cfg)[0].index_interval_bytes
    path, n, tail = rebuild_index_file(seg, args.out, rule=args.rule, interval=interval or 4096)
    print(
        json.dumps(
            {
                "segment": args.segment,
                "index": path,
                "rule": args.rule,
                "entries": n,
                "torn_bytes": tail.torn_bytes if tail else 0,
            }
        )
    )
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from tank_log.jobs.config import json_schema, load_job_config

    if args.what == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    config = load_job_config(args.file)  # check: exit 2 naming the key when it is wrong
    print(json.dumps(_hide_catalog_secrets(config.model_dump(mode="json")), indent=2))  # units: _ms, _s
    return 0


def _hide_catalog_secrets(value: Any) -> Any:
    """The config as printed: a REST catalog's `token` and `credential` (wherever a catalog is set) shown as `***`."""
    if isinstance(value, dict):
        catalog = "uri" in value  # a REST catalog's settings (`location.RestCatalog`)
        return {
            k: "***" if catalog and k in ("token", "credential") and isinstance(v, str) else _hide_catalog_secrets(v)
            for k, v in value.items()
        }
    return [_hide_catalog_secrets(v) for v in value] if isinstance(value, list) else value


def _cmd_job_path(args: argparse.Namespace) -> int:
    print(job_path(args.job))
    return 0


def _add_processes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--processes",
        type=_positive,
        metavar="N",
        help="partitions run at once, each in its own process (default: one per CPU this process may use)",
    )


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return n


def _topics(value: str) -> list[str]:
    topics = [t for t in value.split(",") if t]
    if not topics:  # `--topics ,` names no topic: not "every topic"
        raise argparse.ArgumentTypeError(f"{value!r} names no topic (give T1,T2, or leave it out for every topic)")
    return topics


def build_parser() -> argparse.ArgumentParser:
    from tank_log import __version__

    parser = argparse.ArgumentParser(prog="tank-log", description="Inspect and maintain TANK broker data files.")
    parser.add_argument("--version", action="version", version=f"tank-log {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging; repair also prints clean partitions"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_inspection_commands(sub)
    _add_maintenance_commands(sub)
    _add_helper_commands(sub)
    return parser


def _add_inspection_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read and change nothing: dump, verify, stats, audit."""
    p = sub.add_parser("dump", help="messages as JSON lines (or bundle headers with --bundles)")
    p.add_argument("path", help="segment file, partition dir, topic dir or base path")
    p.add_argument("--bundles", action="store_true", help="print bundle headers instead of messages")
    p.add_argument("--topics", type=_topics, help="comma-separated topics (base path only)")
    p.set_defaults(func=_cmd_dump)

    p = sub.add_parser("verify", help="check segments, indexes, names and layout; exit 0 only if clean")
    p.add_argument("path", help="segment file, partition dir, topic dir or base path")
    p.add_argument("--json", action="store_true", help="one JSON object per problem")
    p.add_argument("--warnings", action="store_true", help="also print warnings")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the job configuration: also report topics retention's lakehouse guard (keep_unexported) cannot protect "
        "because their config lets the broker delete segments itself",
    )
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("stats", help="per-partition statistics")
    p.add_argument("path", help="partition dir, topic dir or base path")
    p.add_argument(
        "--format",
        choices=("table", "json", "prometheus"),
        default="table",
        help="a table, a JSON list, or Prometheus text exposition (default table)",
    )
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument(
        "--export-table",
        metavar="TABLE",
        help="also the lag of this table (an export of the path) behind each partition: messages and seconds",
    )
    add_storage_option(p, "--export-table")
    p.add_argument(
        "--export-format",
        choices=sorted(FORMATS),
        help="the --export-table's format (default: --config's export.format, else delta)",
    )
    _add_export_config(p)
    p.add_argument(
        "--export-catalog",
        metavar="URI",
        help="with --export-format iceberg: the table's catalog: a REST catalog's http(s):// URI (--export-table names "
        "the table, namespace.table; warehouse and credentials from TANK_LOG_CATALOG_WAREHOUSE, TANK_LOG_CATALOG_TOKEN "
        "or TANK_LOG_CATALOG_CREDENTIAL), or a SQL catalog's SQLAlchemy URI (default: a SQLite file beside a local "
        "table)",
    )
    add_source(p)
    add_metrics_file(p)
    p.add_argument("--topics", type=_topics, help="comma-separated topics (base path only)")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser(
        "audit",
        help="does a table hold the log? per partition: missing, duplicated and pending seqs; exit 0 only when every "
        "difference is accounted for",
    )
    p.add_argument("path", help="base path (or topic or partition directory) the table was exported from")
    p.add_argument(
        "--table",
        metavar="TABLE",
        help="the export's table: a path or URI, or with a REST --catalog its name (namespace.table); default: "
        "--config's export.table",
    )
    _add_export_config(p)
    add_table_format(p)
    add_storage_option(p, "--table")
    add_dead_letter_table(p)
    p.add_argument("--topics", type=_topics, help="comma-separated topics (default: every topic of either side)")
    add_source(p)
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=_cmd_audit)


def _add_export_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the job configuration whose export section names the table (table, format, catalog, storage options, "
        "source), as the export job reads it; each flag overrides its own",
    )


def _add_maintenance_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that change data: repair, compact, maintain, rebuild-index."""
    p = sub.add_parser(
        "repair", help="recover partitions from interrupted compactions, salvages and broker rolls (§6.4, §3.11, §2.5)"
    )
    p.add_argument("path", help="partition dir, topic dir or base path")
    p.add_argument("--dry-run", action="store_true", help="print what would be done")
    p.set_defaults(func=_cmd_repair)

    p = sub.add_parser("compact", help="compact a base path without Spark (same rules as jobs/compact.py)")
    p.add_argument("path", help="broker base path")
    p.add_argument("--config", metavar="FILE", help="YAML job configuration (its compaction section applies)")
    p.add_argument("--topics", type=_topics, metavar="T1,T2", help="only these topics (each must exist)")
    p.add_argument("--dry-run", action="store_true", help="print what would be compacted; change nothing")
    add_force(p)
    add_broker_stopped(p)
    add_compaction_rules(p)
    _add_processes(p)
    add_metrics_file(p)
    p.set_defaults(func=_cmd_compact)

    p = sub.add_parser(
        "maintain", help="nightly maintenance without Spark: repair, retention, compaction, indexes, final verify"
    )
    p.add_argument("path", help="broker base path")
    p.add_argument("--config", metavar="FILE", help="YAML job configuration (its compaction and retention sections)")
    p.add_argument("--topics", type=_topics, metavar="T1,T2", help="only these topics (each must exist)")
    p.add_argument("--dry-run", action="store_true", help="print what each step would do; change nothing")
    add_broker_stopped(p)
    add_salvage(p)
    add_force(p)
    add_keep_unexported(p)
    _add_processes(p)
    add_metrics_file(p)
    p.set_defaults(func=_cmd_maintain)

    p = sub.add_parser("rebuild-index", help="write the index of one segment (atomically)")
    p.add_argument("segment", help="segment log file (.ilog or .log)")
    p.add_argument(
        "--rule",
        choices=("rebuild", "append"),
        default="rebuild",
        help="rebuild: the broker's rebuild (4096 step, §4.5); append: log.index.interval.bytes (§4.3)",
    )
    p.add_argument("--interval", type=int, help="append rule interval (default: the partition's config)")
    p.add_argument("--out", help="output file (default: <base>.index next to the segment)")
    p.set_defaults(func=_cmd_rebuild_index)


def _add_helper_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands around the data: job-path, config, demo."""
    p = sub.add_parser(
        "job-path", help="the file spark-submit runs for a job: spark-submit $(tank-log job-path compact)"
    )
    p.add_argument("job", choices=JOB_NAMES, metavar="JOB", help="one of: " + ", ".join(JOB_NAMES))
    p.set_defaults(func=_cmd_job_path)

    p = sub.add_parser("config", help="the job configuration: its JSON Schema, or a file checked and shown in full")
    p.add_argument("what", choices=("schema", "check"), help="schema: the JSON Schema; check: validate FILE")
    p.add_argument("file", nargs="?", help="with check: the YAML job configuration")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("demo", help="write a demo data directory")
    p.add_argument("dir", help="directory to create (must not exist)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the generated messages (default 7)")
    p.add_argument(
        "--typed",
        action="store_true",
        help="also payments, a topic of Avro values, and shipments, of Protobuf values with UTF-8 keys, and their "
        "schemas (typed tables)",
    )
    p.set_defaults(func=_cmd_demo)


def exit_code_for(err: BaseException) -> int:
    """2 for a usage error (bad flags, config, a path that does not exist), 1 for anything about the data."""
    if isinstance(err, UsageError | FileNotFoundError | NotADirectoryError):
        return 2
    return 1


EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped by an orchestrator: like Ctrl-C
    reuse_freed_buffers()  # every command decodes chunk after chunk (jobs/allocator.py)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if getattr(args, "segment", None) is not None:  # rebuild-index
            given_path(args.segment, segment=True)
        elif getattr(args, "path", None) is not None:  # dump, verify, stats, repair, compact, maintain
            given_path(args.path)
        code: int = args.func(args)
        return code
    except BrokenPipeError:  # an OSError: must come first (`tank-log dump ... | head` is not an error)
        return 0
    except KeyboardInterrupt:
        print("tank-log: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (TankFormatError, UsageError, OSError, ValueError, PartitionHeld) as err:  # expected: one line
        print(f"tank-log: {err}", file=sys.stderr)
        return exit_code_for(err)


if __name__ == "__main__":
    sys.exit(main())
