"""A run's settings (`JobContext`: flags over the job config) and its Spark: the context or session, the master, the
cores the driver may use, the stop."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tank_log.errors import JobConfigError
from tank_log.jobs.config import JobConfig, load_job_config, parse_size_arg
from tank_log.jobs.processes import killed_with_parent
from tank_log.jobs.stopping import handling
from tank_spark import class_archive, jars, worker_daemon
from tank_spark.tasks import driver_processes, is_connect

if TYPE_CHECKING:
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger("tank_log.job")

# Settings every run's Spark holds whatever the config says: the tables it writes are the ones the delta-rs engine
# writes. Parquet timestamps as 64-bit microseconds (Spark's default, INT96, is read as nanoseconds by Arrow, delta-rs,
# Polars: a ts past 2262-04-11 comes back wrapped, e.g. 3000 as 1830; `ts` goes up to 9999-12-31).
FIXED_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",  # dates and generated partition columns derived from ts are UTC's
}


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
    remote: str | None = None  # a Spark Connect server (`--remote sc://HOST:PORT`)


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
    remote = getattr(args, "remote", None) or None
    if remote is not None and not remote.startswith("sc://"):
        raise JobConfigError(f"--remote {remote!r}: a Spark Connect server is named sc://HOST:PORT")
    topics = frozenset(t for t in args.topics.split(",") if t) if args.topics else None
    if topics is not None and not topics:  # `--topics ,` names no topic: not "every topic"
        raise JobConfigError(f"--topics {args.topics!r} names no topic (give T1,T2, or leave it out for every topic)")
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
        remote,
    )


def spark_context(ctx: JobContext, *, delta: bool = False) -> SparkContext:
    """A SparkContext; the master comes from spark-submit when present, else --master, the config, local[*]. The
    jobs that only run tasks (compact, retention, rebuild, maintain) need no SparkSession: creating one costs ~3 s
    more per run (bench/RESULTS.md). With `delta`, the driver loads Delta's jars (`jars.configure`: those
    scripts/setup.sh fetched) and Delta's SQL extension and catalog; only the runs that use Delta through Spark ask
    for them, in its class loader once its JVM runs (`jars.configure`: the class archive still maps)."""
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
    for k, v in ctx.config.spark.conf.items():
        if k in FIXED_CONF and v != FIXED_CONF[k]:
            log.warning("%s: spark.conf %s=%s ignored: the job writes %s", ctx.job, k, v, FIXED_CONF[k])
        conf.set(k, v)
    conf.setAll(list(FIXED_CONF.items()))
    conf.set("spark.ui.showConsoleProgress", "false")
    worker_daemon.configure(conf)  # local mode: workers import the installed pyspark, ~1 s less per run
    if not under_spark_submit:
        class_archive.use_default(conf)  # ~4 s less start-up once the host's archive is built
    _launch_jvm(conf, under_spark_submit)  # the JVM (local runs) is launched with these settings
    if delta:
        jars.configure(conf, jvm_running=True)
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


def spark_session(ctx: JobContext, *, delta: bool = False) -> SparkSession:
    """A SparkSession over `spark_context(ctx, delta=delta)` (the jobs that read or write DataFrames)."""
    from pyspark.sql import SparkSession

    spark_context(ctx, delta=delta)
    session = SparkSession.builder.getOrCreate()
    for k, v in FIXED_CONF.items():  # also on a session that existed before this run (spark-submit, a notebook)
        session.conf.set(k, v)
    return session


def remote_session(ctx: JobContext) -> SparkSession:
    """A Spark Connect session on `ctx.remote` (`SparkSession.builder.remote`: this process's PySpark turns to
    Connect mode), with the settings every run's Spark holds that a client may set (`FIXED_CONF`, UTC dates). The
    server's own settings (master, jars, `spark.conf` of the config) are the server's: a client cannot change them."""
    from pyspark.sql import SparkSession

    assert ctx.remote is not None
    session = SparkSession.builder.remote(ctx.remote).getOrCreate()
    for k, v in FIXED_CONF.items():
        session.conf.set(k, v)
    return session


def stop_spark(spark: SparkSession | SparkContext) -> None:
    """`spark.stop()` without its ~1 s wait: PySpark's accumulator server (pyspark/accumulators.py) answers a
    connection the JVM keeps open and looks at its shutdown flag once a second, and `SparkContext.stop` waits for it.
    The JVM side stops here; the server shuts down in a background (daemon) thread. A Spark Connect session ends
    its session on the server, which keeps running."""
    if is_connect(spark):
        spark.stop()
        return
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
    kill the run mid-write. The JVM exits with the driver: PySpark's gateway ends when its stdin closes, and the
    kernel SIGKILLs it when the driver dies (`_dies_with_this_process`), also while a process the driver forked
    still holds that stdin open."""
    from pyspark import SparkContext

    if under_spark_submit:
        SparkContext._ensure_initialized(conf=conf)
        return
    with handling(signal.SIG_IGN, signal.SIGTERM), _dies_with_this_process():
        SparkContext._ensure_initialized(conf=conf)


@contextlib.contextmanager
def _dies_with_this_process() -> Iterator[None]:
    """While PySpark launches its JVM (`pyspark.java_gateway.launch_gateway`, which sets its own `preexec_fn` on the
    `Popen` it calls), add the kernel's parent-death signal to that preexec_fn (`killed_with_parent`: kept across
    spark-submit's exec of java). The signal comes when the thread that forked the JVM ends: only the main thread's
    launch asks for it (it ends with the process); another thread's relies on the gateway's stdin alone."""
    from pyspark import java_gateway

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    popen = java_gateway.Popen

    def launch(*args: Any, **kwargs: Any) -> Any:
        theirs = kwargs.get("preexec_fn")

        def preexec() -> None:
            if theirs is not None:
                theirs()
            killed_with_parent()

        kwargs["preexec_fn"] = preexec
        return popen(*args, **kwargs)

    java_gateway.Popen = launch  # type: ignore[misc,assignment]  # the launch only: restored below
    try:
        yield
    finally:
        java_gateway.Popen = popen  # type: ignore[misc]
