"""What every job shares: the command line, config merging, the Spark session, running one task per partition on
the executors (or, for a small run, in the driver's processes: `needs_executors`), the JSON run report and exit
codes an orchestrator can trust.

    spark-submit jobs/<job>.py --data-dir PATH [--data-dir PATH ...] [--config conf/FILE] [--topics t1,t2]
                               [--dry-run] [--report FILE.json] [job options]

Exit codes: 0 = done (or nothing to do), 1 = at least one partition failed (others done; the report says which),
2 = usage or configuration error (including nothing matched), 130 = interrupted (Ctrl-C, SIGTERM: the report lists
what finished). The report is written in every case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from tank_log.errors import JobConfigError, RunFailed, UsageError, describe_error
from tank_log.jobs.exits import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    EXIT_USAGE,
    exit_code,
    missed,
    missed_message,
)
from tank_log.jobs.planning import Plan, run_task
from tank_log.jobs.processes import exit_with_parent, run_in_processes
from tank_log.jobs.progress import Progress, interrupted_entry, interrupted_message
from tank_log.jobs.stopping import Interrupted, drain, on_sigterm, sigint_raises
from tank_log.maintenance.outcome import FAILING
from tank_log.storage.locking import run_marker
from tank_spark.context import (
    JobContext,
    build_context,
    driver_cores,
    remote_session,
    spark_context,
    spark_session,
    stop_spark,
)
from tank_spark.job_options import job_parser
from tank_spark.report import RunReport, count_by, report_arg
from tank_spark.tasks import deal

if TYPE_CHECKING:
    from pyspark import Accumulator, AccumulatorParam, SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger("tank_log.job")


JobResult: TypeAlias = tuple[list[dict[str, Any]], dict[str, Any]]
"""What a job's `execute` returns: every partition's report entry, and the run's summary."""


class _ListParam:
    """The accumulator of finished tasks' entries: an `AccumulatorParam` by its two methods (PySpark calls only
    these), so that the driver imports PySpark only when it starts Spark."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a


def run_on_executors(
    sc: SparkContext, tasks: Sequence[Any], fn: Callable[[Any], dict[str, Any]] = run_task, what: str = "partitions"
) -> list[dict[str, Any]]:
    """Run `fn` on every item (one per partition; by default `PartitionTask.run`) in a few Spark tasks per core
    (`tasks.deal`); results come back in order.

    Results also reach the driver as each Spark task finishes (an accumulator), so the driver logs a line per
    partition as its task finishes. On Ctrl-C/SIGTERM the run drains: a stop flag (a file beside the driver, seen by
    executors on its host) makes every task not yet started return `interrupted` at once, running ones finish
    (up to `STOP_GRACE_S`, or until a second Ctrl-C; then the job is cancelled — crash-safe, the next run repairs),
    and `Interrupted` is raised with what finished. Draining instead of killing also spares PySpark's daemon the
    end-of-stream tracebacks of killed Python workers.
    """
    if not tasks:
        return []
    finished = sc.accumulator([], cast("AccumulatorParam[list[Any]]", _ListParam()))
    driver = (socket.gethostname(), os.getpid())  # on its host, the driver's process family is not a holder
    stop_flag = os.path.join(tempfile.gettempdir(), f".tank-log-stop-{os.getpid()}-{uuid.uuid4().hex}")

    rdd = deal(sc, tasks).mapPartitions(_spark_task(fn, finished, driver, stop_flag))
    box: dict[str, Any] = {}
    done = threading.Event()  # set when the job ended: never `Thread.join` under a signal, see `_drain`

    def collect() -> None:
        try:
            box["results"] = rdd.collect()
        except BaseException as err:  # re-raised by the driver thread
            box["error"] = err
        finally:
            done.set()

    seen: dict[int, dict[str, Any]] = {}
    with Progress(what, len(tasks)) as progress, sigint_raises():

        def report_new(entries: Iterable[tuple[int, dict[str, Any]]]) -> None:
            for i, r in list(entries):
                if i not in seen:
                    seen[i] = r
                    progress.finished(r)

        try:
            threading.Thread(target=collect, name="tank-log-collect", daemon=True).start()
            while not done.wait(0.5):
                report_new(finished.value)
        except KeyboardInterrupt:
            _drain(sc, done, stop_flag)
            report_new(box.get("results") or finished.value)
            raise Interrupted([seen.get(i) or interrupted_entry(t) for i, t in enumerate(tasks)]) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stop_flag)
        if "error" in box:
            raise box["error"]
        report_new(box["results"])
    return [r for _, r in sorted(box["results"], key=lambda x: x[0])]


def _spark_task(
    fn: Callable[[Any], dict[str, Any]],
    finished: Accumulator[list[Any]],
    driver: tuple[str, int],
    stop_flag: str,
) -> Callable[[Iterable[tuple[int, Any]]], Iterator[tuple[int, dict[str, Any]]]]:
    """What one Spark task runs over its dealt items: `fn` of each (the driver's processes not taken for holders),
    each result also added to `finished`; once the driver's `stop_flag` exists, `interrupted` for the rest."""

    def run(items: Iterable[tuple[int, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
        from tank_log.storage.holders import also_ours

        for i, task in items:
            if os.path.exists(stop_flag):  # the driver was interrupted: start no new partition
                r = interrupted_entry(task)
            else:
                with also_ours(*driver):
                    r = fn(task)
            finished.add([(i, r)])
            yield i, r

    return run


def _drain(sc: SparkContext, done: threading.Event, stop_flag: str) -> None:
    """Stop an interrupted Spark run (`stopping.drain`): the stop flag keeps new partitions from starting; tasks
    still running after the grace period are cancelled."""
    open(stop_flag, "w").close()
    t0 = time.monotonic()
    if not drain(done.wait):
        sc.cancelAllJobs()
        done.wait(120)
    log.info("the running partitions stopped after %.1f s", time.monotonic() - t0)


def run_plan(
    sc: SparkContext | None,
    ctx: JobContext,
    plan: Plan,
    bookkeeping: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run a job's planned tasks (`plan` = tasks, report entries of what was left out) and return every entry.
    `bookkeeping(results)` — the driver's `.cleanup.log` update — runs unless dry, also on what finished before an
    interruption."""
    tasks, left_out = plan
    try:
        if sc is not None:
            results = run_on_executors(sc, tasks)
        elif tasks:  # `needs_executors` said no: the driver's processes
            processes = min(driver_cores(ctx), len(tasks))
            log.info("%s: %d partition(s) in %d process(es) of the driver's", ctx.job, len(tasks), processes)
            results = run_in_processes(tasks, processes)
        else:  # nothing to run: no master to look up (under spark-submit that connects to its JVM)
            results = []
    except Interrupted as stop:
        if bookkeeping and not ctx.dry_run:
            bookkeeping(stop.results)
        stop.results += left_out
        raise
    if bookkeeping and not ctx.dry_run:
        bookkeeping(results)
    return results + left_out


def needs_executors(ctx: JobContext, plan: Plan) -> bool:
    """`needs_spark` of the partition jobs: a plan without tasks (nothing selected needs the job) starts no Spark,
    nor does one whose partitions hold at most `ctx.in_driver_max_bytes` of segment data: it runs in the
    driver's processes (`processes.run_in_processes`; the data of these jobs is on the driver's host). Spark's start,
    first job and stop cost 5-7 s of a run (bench/RESULTS.md, "Spark's fixed costs")."""
    tasks = plan[0]
    if not tasks:
        return False
    if not ctx.in_driver_max_bytes:
        return True
    total = sum(t.data_bytes for t in tasks)  # as the planner's scan listed them
    within = total <= ctx.in_driver_max_bytes
    log.info(
        "%s: %s bytes of segment data, %s in_driver_max_bytes (%s bytes)%s",
        ctx.job,
        f"{total:,}",
        "within" if within else "more than",
        f"{ctx.in_driver_max_bytes:,}",
        "" if within else ": on Spark's executors",
    )
    return not within


def run_partition_job(
    job: str,
    description: str,
    add_options: Callable[[argparse.ArgumentParser], None],
    prepare: Callable[[JobContext, argparse.Namespace], Plan],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    bookkeeping: Callable[[list[dict[str, Any]]], None] | None = None,
    argv: list[str] | None = None,
) -> int:
    """`run_job` for a job of one task per partition (compact, retention, rebuild_indexes, maintain): `prepare`
    plans before Spark starts; the tasks run on the executors, or in the driver's processes when the partitions are
    small (`needs_executors`); then `bookkeeping` on the driver (`run_plan`). The summary: partitions, their count by
    status, and `summarize(results)`."""

    def execute(ctx: JobContext, plan: Plan, sc: SparkContext | None) -> JobResult:
        results = run_plan(sc, ctx, plan, bookkeeping)
        return results, {"partitions": len(results), "by_status": count_by(results), **summarize(results)}

    return run_job(job, description, add_options, prepare, execute, argv, sql=False, needs_spark=needs_executors)


def run_job(
    job: str,
    description: str,
    add_options: Callable[[argparse.ArgumentParser], None],
    prepare: Callable[[JobContext, argparse.Namespace], Any],
    execute: Callable[[JobContext, Any, Any], JobResult],
    argv: list[str] | None = None,
    *,
    sql: bool = True,
    needs_spark: Callable[[JobContext, Any], bool] | None = None,
    needs_delta: Callable[[JobContext, Any], bool] | None = None,
    not_through_connect: Callable[[JobContext, Any], str | None] | None = None,
    new_data_dir: bool = False,
) -> int:
    """Parse; `prepare(ctx, args)` validates job options before Spark starts (JobConfigError → exit 2);
    `execute(ctx, prepared, spark)` → (per-partition results, summary); then report and exit code. `spark` is a
    SparkSession, or with `sql=False` (jobs that only run tasks) a SparkContext; when `needs_spark(ctx, prepared)` says
    no (nothing to run on executors), Spark is not started and `spark` is None; when `needs_delta(ctx, prepared)`
    says yes, the session loads Delta's jars (`context.spark_context`). With `--remote`, a job that gives
    `not_through_connect` runs through that Spark Connect server unless it names a reason not to (exit 2); any other
    job refuses (its tasks are RDDs, which Connect has no API for). The report's `timings` split the
    run: `prepare_s` (options and the plan, before Spark), `spark_start_s`, `execute_s` (the tasks and the driver's
    bookkeeping) and `spark_stop_s`. With `new_data_dir` the data directory may not exist yet (`build_context`)."""
    with contextlib.ExitStack() as marks:  # the run marker (storage/locking.py), once the data dirs are known
        return _run_job(
            job,
            description,
            add_options,
            prepare,
            execute,
            argv,
            marks,
            sql=sql,
            needs_spark=needs_spark,
            needs_delta=needs_delta,
            not_through_connect=not_through_connect,
            new_data_dir=new_data_dir,
        )


def _run_job(
    job: str,
    description: str,
    add_options: Callable[[argparse.ArgumentParser], None],
    prepare: Callable[[JobContext, argparse.Namespace], Any],
    execute: Callable[[JobContext, Any, Any], JobResult],
    argv: list[str] | None,
    marks: contextlib.ExitStack,
    *,
    sql: bool,
    needs_spark: Callable[[JobContext, Any], bool] | None,
    needs_delta: Callable[[JobContext, Any], bool] | None,
    not_through_connect: Callable[[JobContext, Any], str | None] | None,
    new_data_dir: bool,
) -> int:
    """`run_job`, with `marks` holding the run marker once the data dirs are known."""
    # an orchestrator's stop, from here on: report what finished, like Ctrl-C (before, the entry point's
    # `stop_while_starting` ends a process that has done nothing yet)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _start_driver()
    parser = job_parser(job, description)
    add_options(parser)
    report = RunReport(job)
    args = None
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != ""]  # empty: omitted templated options
    try:
        args = parser.parse_args(argv)
        ctx, prepared = _prepare_run(job, args, prepare, marks, report, new_data_dir=new_data_dir)
    except (UsageError, JobConfigError) as err:
        print(f"{job}: {err}", file=sys.stderr)
        report.end(getattr(args, "report", None) or report_arg(argv), "usage-error", error=str(err))
        return EXIT_USAGE
    except RunFailed as err:  # a stated reason while planning (a catalog out of reach): one line, nothing ran
        print(f"{job}: {err}", file=sys.stderr)
        report.end(getattr(args, "report", None) or report_arg(argv), "failed", error=str(err))
        return EXIT_FAILED
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while the run reads its options and plans: no partition ran
        report.end(getattr(args, "report", None) or report_arg(argv), "interrupted", partitions=[])
        print(f"{job}: interrupted while planning, before any partition ran; a rerun does the work", file=sys.stderr)
        return EXIT_INTERRUPTED
    report.doc.update(dry_run=ctx.dry_run, data_dirs=list(ctx.data_dirs), topics=sorted(ctx.topics or []) or None)
    spark: SparkSession | SparkContext | None = None
    try:
        if ctx.remote is not None:
            _check_connect(job, ctx, prepared, not_through_connect)
        if needs_spark is None or needs_spark(ctx, prepared):
            spark = _start_spark(ctx, report, sql=sql, delta=needs_delta is not None and needs_delta(ctx, prepared))
        else:
            log.info(
                "%s: no Spark session started, also under spark-submit: the driver's own processes do this run "
                "(in-driver path: a dry run, nothing to do, or data within --in-driver-max-bytes)",
                job,
            )
        results, summary = execute(ctx, prepared, spark)
        report.phase_done("execute_s")
        report.doc["executed_on"] = "executors" if spark is not None else "driver"
    except UsageError as err:  # e.g. NothingMatched: what was asked for does not exist
        print(f"{job}: {err}", file=sys.stderr)
        report.end(ctx.report_path, "usage-error", error=str(err))
        return EXIT_USAGE
    except Interrupted as stop:
        summary = {"partitions": len(stop.results), "by_status": count_by(stop.results)}
        report.end(ctx.report_path, "interrupted", summary=summary, partitions=stop.results)
        print(interrupted_message(job, stop.results), file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside a drain: while Spark starts, or while a job sets up
        report.end(ctx.report_path, "interrupted", summary={"partitions": 0, "by_status": {}}, partitions=[])
        print(f"{job}: interrupted before any partition's result came back; a rerun does the work", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        report.end(ctx.report_path, "failed", error=_logged_failure(job, err))
        return EXIT_FAILED
    finally:
        if spark is not None:
            stop_spark(spark)
    report.phase_done("spark_stop_s")
    return _end_run(job, report, ctx.report_path, results, summary)


def _start_driver() -> None:
    """The driver's logging; under spark-submit, its death with it (a scheduler kills spark-submit)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection chatter is not the job's output
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        exit_with_parent(os.getppid())


def _prepare_run(
    job: str,
    args: argparse.Namespace,
    prepare: Callable[[JobContext, argparse.Namespace], Any],
    marks: contextlib.ExitStack,
    report: RunReport,
    *,
    new_data_dir: bool,
) -> tuple[JobContext, Any]:
    """The run's context, its run marker, its metrics file checked, and the job's plan (`prepare`).

    Raises:
        UsageError, JobConfigError: the flags or the job configuration.
    """
    ctx = build_context(job, args, new_data_dir=new_data_dir)
    if not ctx.dry_run:  # another run of ours tells this one from the broker (storage/holders.py)
        marks.enter_context(run_marker(ctx.data_dirs))
    metrics_path = args.metrics_file or ctx.config.metrics_file
    if metrics_path:  # found now, not after all the work
        from tank_log.metrics import check_metrics_path

        check_metrics_path(metrics_path)
    report.metrics_path = metrics_path
    prepared = prepare(ctx, args)
    report.phase_done("prepare_s")
    return ctx, prepared


def _check_connect(
    job: str, ctx: JobContext, prepared: Any, not_through_connect: Callable[[JobContext, Any], str | None] | None
) -> None:
    """Refuse a `--remote` run that cannot go through Spark Connect, before anything starts.

    Raises:
        UsageError: the job runs its tasks as RDDs, or this run needs what Connect lacks (`not_through_connect`).
    """
    reason = (
        "its tasks run as RDDs over a SparkContext, which Spark Connect has no API for"
        if not_through_connect is None
        else not_through_connect(ctx, prepared)
    )
    if reason:
        raise UsageError(f"--remote {ctx.remote}: {job} does not run through Spark Connect: {reason}")


def _start_spark(ctx: JobContext, report: RunReport, *, sql: bool, delta: bool) -> SparkSession | SparkContext:
    """The run's Spark: a session (`sql`, with Delta's jars if `delta`) or a context, recorded in the report; with
    `--remote`, a Spark Connect session (`context.remote_session`)."""
    spark: SparkSession | SparkContext
    if ctx.remote is not None:
        session = remote_session(ctx)
        report.phase_done("spark_start_s")
        session_id = getattr(session, "session_id", None)  # a Connect session's (pyspark.sql.connect.session)
        report.doc["spark"] = {"remote": ctx.remote, "version": session.version, "session_id": session_id}
        return session
    if sql:
        spark = spark_session(ctx, delta=delta)
        sc = spark.sparkContext
    else:
        spark = sc = spark_context(ctx)
    report.phase_done("spark_start_s")
    report.doc["spark"] = {"master": sc.master, "app_id": sc.applicationId}
    return spark


def _end_run(
    job: str, report: RunReport, report_path: str | None, results: list[dict[str, Any]], summary: dict[str, Any]
) -> int:
    """A run that finished: its report, a log line per failing partition and its summary; its exit code."""
    failed = [r for r in results if r.get("status") in FAILING]  # needs-attention too
    code = exit_code(results)
    ending = {EXIT_FAILED: "partial-failure", EXIT_PARTIAL: "partial"}.get(code, "ok")
    extra: dict[str, Any] = {}
    if code == EXIT_PARTIAL:
        summary["skipped_needing_work"] = [f"{r.get('topic')}/{r.get('partition')}" for r in missed(results)]
        extra["error"] = missed_message(job, results)
    report.end(report_path, ending, summary=summary, partitions=results, **extra)
    for r in failed:
        log.error(
            "%s/%s %s: %s",
            r.get("topic"),
            r.get("partition"),
            r.get("status"),
            r.get("error") or r.get("unfixed") or r.get("reason"),
        )
    log.info("%s: %s", job, json.dumps(summary))
    if code == EXIT_PARTIAL:
        log.error("%s", missed_message(job, results))
    return code


def _logged_failure(job: str, err: Exception) -> str:
    """Log a run's failure and return the report's `error`: the environment (a full disk, a read-only mount) and
    stated reasons (`RunFailed`) in one line; anything else is a bug, with its traceback in the log."""
    if isinstance(err, OSError):
        error = describe_error(err)  # errno and file
    elif isinstance(err, RunFailed):
        error = str(err)
    else:
        log.exception("%s failed", job)
        return f"internal error: {type(err).__name__}: {err}"
    log.error("%s failed: %s", job, error)
    return error
