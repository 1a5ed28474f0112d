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
import datetime as dt
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, cast

from tank_log import __version__
from tank_log.errors import JobConfigError, RunFailed, UsageError, describe_error
from tank_log.jobs.config import JobConfig, load_job_config, parse_size_arg
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
from tank_log.jobs.stopping import Interrupted, drain, handling, on_sigterm, sigint_raises
from tank_log.maintenance.outcome import FAILING
from tank_spark import class_archive, worker_daemon
from tank_spark.tasks import deal, driver_processes

if TYPE_CHECKING:
    from pyspark import AccumulatorParam, SparkConf, SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger("tank_log.job")


JobResult: TypeAlias = tuple[list[dict[str, Any]], dict[str, Any]]
"""What a job's `execute` returns: every partition's report entry, and the run's summary."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 itself; keep that but through our report path
        raise UsageError(message)


def job_parser(job: str, description: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"{job}.py", description=description)
    p.add_argument("--version", action="version", version=f"{job} (tank-log {__version__})")
    p.add_argument(
        "--data-dir",
        action="append",
        default=[],
        metavar="PATH",
        help="broker base path (repeatable); overrides data_dirs of the config",
    )
    p.add_argument("--config", metavar="FILE", help="YAML job configuration (conf/)")
    p.add_argument("--topics", metavar="T1,T2", help="only these topics")
    p.add_argument("--dry-run", action="store_true", help="report what would be done, change nothing")
    p.add_argument("--report", metavar="FILE.json", help="write the JSON run report here")
    p.add_argument(
        "--metrics-file",
        metavar="FILE.prom",
        help="write the run's Prometheus metrics here, atomically (node_exporter's textfile collector); "
        "default: the config's metrics_file",
    )
    p.add_argument("--master", help="Spark master when not launched by spark-submit (default: config or local[*])")
    p.add_argument(
        "--in-driver-max-bytes",
        metavar="SIZE",
        help="a run reading at most this much segment data runs in the driver's processes without starting Spark "
        "(default: the config's in_driver_max_bytes, 1gb; the export's: export.in_driver_max_bytes, 128mb, with "
        "binary/utf8 values and engine deltalake); 0: always on executors",
    )
    p.add_argument(
        "--spark-log-level",
        default="WARN",
        choices=("ERROR", "WARN", "INFO", "DEBUG"),
        help="Spark's own log level, from its start-up on (default WARN: no INFO lines before the job's output)",
    )
    return p


def add_broker_stopped(p: argparse.ArgumentParser) -> None:
    """`--broker-stopped` of the mutating jobs (read by `build_context`)."""
    p.add_argument(
        "--broker-stopped",
        action="store_true",
        help="the broker is stopped (required to mutate partitions that changed recently, §9)",
    )


def add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="compact even when the dirty ratio is below the threshold")


def add_salvage(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--salvage",
        action="store_true",
        help="cut torn tails after the last complete bundle (cut bytes kept in a .-prefixed side file)",
    )


def add_time_basis(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--time-basis",
        choices=("name", "message"),
        help="retention ages from the name's ts (the broker's rule) or the newest message ts (Kafka's rule)",
    )


@dataclass(frozen=True)
class JobContext:
    job: str
    config: JobConfig
    data_dirs: tuple[str, ...]
    topics: frozenset[str] | None
    dry_run: bool
    report_path: str | None
    master: str | None
    spark_log_level: str = "WARN"
    in_driver_max_bytes: int = 0  # the partition jobs' (`needs_executors`); the export has its own


def build_context(job: str, args: argparse.Namespace, *, new_data_dir: bool = False) -> JobContext:
    """The run's settings from its flags and configuration. Each data directory must exist, except with
    `new_data_dir` (a job that creates its base path): then a missing one needs only its parent.

    Raises:
        JobConfigError: no data directory, or one that does not exist (or, with `new_data_dir`, cannot be created).
    """
    config = load_job_config(args.config)
    if getattr(args, "broker_stopped", False):
        config = config.model_copy(update={"broker_stopped": True})
    data_dirs = tuple(args.data_dir) or config.data_dirs
    if not data_dirs:
        raise JobConfigError("no data directory: pass --data-dir PATH or set data_dirs in the config")
    for d in data_dirs:
        if os.path.isdir(d):
            continue
        if not new_data_dir or os.path.lexists(d):
            raise JobConfigError(
                f"data directory not found: {d}" if not os.path.lexists(d) else f"not a directory: {d}"
            )
        parent = os.path.dirname(os.path.abspath(d))
        if not os.path.isdir(parent):
            raise JobConfigError(f"cannot create the data directory {d}: its parent {parent} does not exist")
    topics = frozenset(t for t in args.topics.split(",") if t) if args.topics else None
    return JobContext(
        job,
        config,
        tuple(os.path.abspath(d) for d in data_dirs),
        topics,
        args.dry_run,
        args.report,
        args.master,
        args.spark_log_level,
        (
            parse_size_arg(args.in_driver_max_bytes, "--in-driver-max-bytes")
            if args.in_driver_max_bytes is not None
            else config.in_driver_max_bytes
        ),
    )


def spark_context(ctx: JobContext) -> SparkContext:
    """A SparkContext; the master comes from spark-submit when present, else --master, the config, local[*]. The
    jobs that only run tasks (compact, retention, rebuild, maintain) need no SparkSession: creating one costs ~3 s
    more per run (bench/RESULTS.md)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # local mode: workers run this interpreter
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if under_spark_submit:
        SparkContext._ensure_initialized()  # connect to its JVM, whose properties carry its --master
    conf = SparkConf()  # under spark-submit: loaded from its JVM's properties
    if not conf.contains("spark.master"):
        conf.setMaster(job_master(ctx))
    conf.setAppName(f"{ctx.config.spark.app_name}-{ctx.job}")
    conf.set("spark.sql.session.timeZone", "UTC")  # dates derived from ts are UTC dates
    for k, v in ctx.config.spark.conf.items():
        conf.set(k, v)
    conf.set("spark.ui.showConsoleProgress", "false")
    worker_daemon.configure(conf)  # local mode: workers import the installed pyspark, ~1 s less per run
    if not under_spark_submit:
        class_archive.use_default(conf)  # ~4 s less start-up once the host's archive is built
    _launch_jvm(conf, under_spark_submit)  # the JVM (local runs) is launched with these settings
    jvm = SparkContext._jvm
    assert jvm is not None
    log4j = jvm.org.apache.logging.log4j  # before the context starts: its start-up lines obey the level too
    log4j.core.config.Configurator.setRootLevel(log4j.Level.getLevel(ctx.spark_log_level))
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel(ctx.spark_log_level)
    return sc


def job_master(ctx: JobContext) -> str:
    """The Spark master of this run: spark-submit's (from its JVM's properties), else --master, the config's,
    local[*]."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit started this driver
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        master = SparkConf().get("spark.master")
        if master:
            return master
    return ctx.master or ctx.config.spark.master or "local[*]"


def driver_cores(ctx: JobContext) -> int:
    """How many processes or threads a run without Spark uses in the driver: the cores of its master
    (`tasks.driver_processes`: local[N] gives N)."""
    return driver_processes(job_master(ctx))


def spark_session(ctx: JobContext) -> SparkSession:
    """A SparkSession over `spark_context(ctx)` (the jobs that read or write DataFrames)."""
    from pyspark.sql import SparkSession

    spark_context(ctx)
    return SparkSession.builder.getOrCreate()


def stop_spark(spark: SparkSession | SparkContext) -> None:
    """`spark.stop()` without its ~1 s wait: PySpark's accumulator server (pyspark/accumulators.py) answers a
    connection the JVM keeps open and looks at its shutdown flag once a second, and `SparkContext.stop` waits for it.
    The JVM side stops here; the server shuts down in a background (daemon) thread."""
    sc = cast("SparkContext", getattr(spark, "sparkContext", spark))
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        sc._accumulatorServer = None  # type: ignore[assignment]  # SparkContext.stop skips it
        threading.Thread(target=server.shutdown, name="accumulator-server-shutdown", daemon=True).start()
    spark.stop()


def _launch_jvm(conf: SparkConf, under_spark_submit: bool) -> None:
    """Start (or, under spark-submit, connect to) Spark's JVM. A JVM this driver launches inherits SIGTERM ignored,
    and HotSpot keeps an inherited ignored signal ignored: a SIGTERM sent to the whole process group (Airflow,
    systemd, `timeout`) then reaches the driver, which stops the run cleanly, not the JVM, whose shutdown hook would
    kill the run mid-write. The JVM still exits with the driver (PySpark's gateway ends when its stdin closes)."""
    from pyspark import SparkContext

    with contextlib.nullcontext() if under_spark_submit else handling(signal.SIG_IGN, signal.SIGTERM):
        SparkContext._ensure_initialized(conf=conf)


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

    rdd = deal(sc, tasks).mapPartitions(run)
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
    first job and stop cost 5-7 s of a run (bench/RESULTS.md, "Small partition runs in the driver's processes")."""
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


def write_report(path: str | None, report: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


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
    new_data_dir: bool = False,
) -> int:
    """Parse; `prepare(ctx, args)` validates job options before Spark starts (JobConfigError → exit 2);
    `execute(ctx, prepared, spark)` → (per-partition results, summary); then report and exit code. `spark` is a
    SparkSession, or with `sql=False` (jobs that only run tasks) a SparkContext; when `needs_spark(ctx, prepared)` says
    no (nothing to run on executors), Spark is not started and `spark` is None. The report's `timings` split the
    run: `prepare_s` (options and the plan, before Spark), `spark_start_s`, `execute_s` (the tasks and the driver's
    bookkeeping) and `spark_stop_s`. With `new_data_dir` the data directory may not exist yet (`build_context`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection chatter is not the job's output
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # started by spark-submit: die with it (a scheduler kills spark-submit)
        exit_with_parent(os.getppid())
    parser = job_parser(job, description)
    add_options(parser)
    report = RunReport(job)
    args = None
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != ""]  # empty: omitted templated options
    try:
        args = parser.parse_args(argv)
        ctx = build_context(job, args, new_data_dir=new_data_dir)
        report.metrics_path = args.metrics_file or ctx.config.metrics_file
        prepared = prepare(ctx, args)
        report.phase_done("prepare_s")
    except (UsageError, JobConfigError) as err:
        print(f"{job}: {err}", file=sys.stderr)
        report.end(getattr(args, "report", None) or _report_arg(argv), "usage-error", error=str(err))
        return EXIT_USAGE
    report.doc.update(dry_run=ctx.dry_run, data_dirs=list(ctx.data_dirs), topics=sorted(ctx.topics or []) or None)
    spark: SparkSession | SparkContext | None = None
    signal.signal(signal.SIGTERM, on_sigterm)  # an orchestrator's stop: report what finished, like Ctrl-C
    try:
        if needs_spark is None or needs_spark(ctx, prepared):
            if sql:
                spark = spark_session(ctx)
                sc = spark.sparkContext
            else:
                spark = sc = spark_context(ctx)
            report.phase_done("spark_start_s")
            report.doc["spark"] = {"master": sc.master, "app_id": sc.applicationId}
        else:
            log.info("%s: Spark is not started", job)
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
    except Exception as err:
        report.end(ctx.report_path, "failed", error=_logged_failure(job, err))
        return EXIT_FAILED
    finally:
        if spark is not None:
            stop_spark(spark)
    report.phase_done("spark_stop_s")
    failed = [r for r in results if r.get("status") in FAILING]  # needs-attention too
    code = exit_code(results)
    ending = {EXIT_FAILED: "partial-failure", EXIT_PARTIAL: "partial"}.get(code, "ok")
    extra: dict[str, Any] = {}
    if code == EXIT_PARTIAL:
        summary["skipped_needing_work"] = [f"{r.get('topic')}/{r.get('partition')}" for r in missed(results)]
        extra["error"] = missed_message(job, results)
    report.end(ctx.report_path, ending, summary=summary, partitions=results, **extra)
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


class RunReport:
    """One run's JSON report (`--report`): what was asked, where the time went (`timings`, phase by phase), how it
    ended. Every exit path ends it with `end`, so every report has `status`, `finished`, `duration_s` and
    `timings` (the phases it got through)."""

    def __init__(self, job: str) -> None:
        self.doc: dict[str, Any] = {"job": job, "tank_log_version": __version__, "started": _now()}
        self.timings: dict[str, float] = {}
        self._t0 = self._phase = time.monotonic()
        self.metrics_path: str | None = None  # where `end` also writes the run's Prometheus metrics

    def phase_done(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self._phase, 3)
        self._phase = now

    def end(self, path: str | None, status: str, **fields: Any) -> None:
        """Set how the run ended (and `fields`: summary, partitions, error) and write the report to `path`."""
        duration = round(time.monotonic() - self._t0, 3)
        self.doc.update(status=status, finished=_now(), duration_s=duration, timings=self.timings, **fields)
        write_report(path, self.doc)
        if self.metrics_path:
            from tank_log.metrics import write_report_metrics

            write_report_metrics(self.metrics_path, self.doc)


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


def _report_arg(argv: list[str] | None) -> str | None:
    argv = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(argv):
        if a == "--report" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--report="):
            return a.split("=", 1)[1]
    return None


def count_by(results: list[dict[str, Any]], key: str = "status") -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        value = str(r.get(key))
        out[value] = out.get(value, 0) + 1
    return out
