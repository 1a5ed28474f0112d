"""A class-data archive (the JDK's AppCDS) for Spark driver JVMs: about 4 s less start-up per job run.

A Spark driver loads and verifies tens of thousands of classes before it runs anything (a SparkSession: 6.9–7.6 s
on 2 cores here). A dynamic CDS archive of the classes one short Spark run loaded (`-XX:ArchiveClassesAtExit`,
JDK 13+) lets every later driver map them instead: 2.9–3.8 s (bench/RESULTS.md, 2026-11-23). Build it once per host
and Spark installation:

    python -m tank_spark.class_archive /var/cache/tank-log/spark-driver.jsa

and start the drivers with `-XX:SharedArchiveFile=<that path>`: the job config's
`spark.conf: {spark.driver.extraJavaOptions: "-XX:SharedArchiveFile=..."}` (drivers the jobs launch themselves), or
SPARK_SUBMIT_OPTS / `spark-submit --driver-java-options` (drivers spark-submit launches). A JVM whose JDK or Spark
jars differ from the archive's (path, size or mtime: a reinstall counts) prints "Unable to use shared archive" and
starts as before (the default `-Xshare:auto`): rebuild after upgrading or reinstalling either. Executors are
unaffected.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

# What a job's driver loads: a SparkSession, a DataFrame through Arrow, an RDD job. Then the JVM is told to exit
# (the archive is written at a normal exit) and this process waits until it has.
_DRIVER = """
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("tank-log-class-archive")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.range(4).mapInArrow(lambda batches: batches, "id long").collect()
spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).collect()
spark.stop()
gateway = SparkContext._gateway
try:
    gateway.jvm.System.exit(0)
except Exception:
    pass  # the connection ends with the JVM
gateway.proc.wait(timeout=600)
"""


def build(path: str, timeout: float = 900) -> None:
    """Write the archive to `path` (atomically: a `.`-prefixed temporary, then renamed).

    Raises:
        RuntimeError: the short Spark run failed or its JVM wrote no archive (e.g. a JDK before 13).
    """
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    opts = " ".join(o for o in (os.environ.get("SPARK_SUBMIT_OPTS", ""), f"-XX:ArchiveClassesAtExit={tmp}") if o)
    env = dict(os.environ, SPARK_SUBMIT_OPTS=opts, PYSPARK_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        run = subprocess.run(
            [sys.executable, "-c", _DRIVER],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        if run.returncode != 0 or not os.path.exists(tmp):
            raise RuntimeError(f"no class archive written (exit {run.returncode}): {run.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tank_spark.class_archive", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="where to write the archive (e.g. /var/cache/tank-log/spark-driver.jsa)")
    args = parser.parse_args(argv)
    try:
        build(args.path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        print(f"class archive: {err}", file=sys.stderr)
        return 1
    size_mib = os.path.getsize(args.path) >> 20
    print(f"wrote {args.path} ({size_mib} MiB); start drivers with -XX:SharedArchiveFile={args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
