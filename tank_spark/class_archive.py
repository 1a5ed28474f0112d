"""A class-data archive (the JDK's AppCDS) for Spark driver JVMs: about 4 s less start-up per job run.

A Spark driver loads and verifies tens of thousands of classes before it runs anything (a SparkSession: 6.9–7.6 s
on 2 cores here). A dynamic CDS archive of the classes one short Spark run loaded (`-XX:ArchiveClassesAtExit`,
JDK 13+) lets every later driver map them instead: 2.9–3.8 s (bench/RESULTS.md, "Spark's fixed costs"). Build it
once per host and Spark installation (`scripts/setup.sh` does):

    python -m tank_spark.class_archive            # to default_path(); or give a path

Drivers the jobs launch themselves (local mode, a `--master` URL) map the archive at `default_path()` when it exists
(`use_default`); `TANK_LOG_CLASS_ARCHIVE` names another file, or `off`. Drivers spark-submit launches need
`-XX:SharedArchiveFile=<path>` in SPARK_SUBMIT_OPTS or `spark-submit --driver-java-options`. The default path is keyed
by the JDK and every Spark jar (path, size, mtime): the JVM ignores an archive whose jars differ ("Unable to use
shared archive") and starts as before, so an upgrade or reinstall simply finds no archive until it is rebuilt.
Executors are unaffected. Building, or checking with `--if-missing`, removes the archives of installations that are
gone or changed (`prune`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkConf

ENV = "TANK_LOG_CLASS_ARCHIVE"  # another archive for self-launched drivers, or "off"
_OPTION = "-XX:SharedArchiveFile="
_PREFIX = "spark-driver-"

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


def default_path() -> str:
    """Where this host's archive for this JDK and Spark installation lives: `$XDG_CACHE_HOME/tank-log/` (or
    `~/.cache/tank-log/`), named by a digest of the java binary and every Spark jar (path, size, mtime)."""
    jars, java = _installation()
    return os.path.join(_cache_dir(), f"{_PREFIX}{installation_key(jars, java)}.jsa")


def _installation() -> tuple[str, str]:
    """This process's Spark jars directory and java binary."""
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "jars"), os.path.realpath(shutil.which("java") or "java")


def installation_key(jars: str, java: str) -> str | None:
    """The digest naming the archive of a Spark installation (its jars directory) and JDK (its java binary); None
    when either is gone."""
    try:
        names = sorted(os.listdir(jars))
        stats = [(n, st.st_size, st.st_mtime_ns) for n in names for st in [os.stat(os.path.join(jars, n))]]
        java_mtime = os.stat(java).st_mtime_ns
    except OSError:
        return None
    return hashlib.sha256(repr((jars, stats, java, java_mtime)).encode()).hexdigest()[:16]


def _cache_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tank-log")


def prune(keep: str, unrecorded_after_s: float = 7 * 86400) -> list[str]:
    """Remove the archives beside `keep` whose installation is gone or changed (each archive's `.json` names its jars
    directory and java binary, `build`), and those without a record older than `unrecorded_after_s`; the paths
    removed. Every clone with its own virtualenv gets its own archive (~150 MB), so without this a host that runs CI
    on fresh clones fills its cache. A driver that has mapped a removed archive keeps it; later drivers of that
    installation start without one until it is built again."""
    directory = os.path.dirname(os.path.abspath(keep))
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(_PREFIX) and name.endswith(".json") and name.removesuffix(".json") + ".jsa" not in names:
            with contextlib.suppress(FileNotFoundError):  # a record whose archive is gone
                os.unlink(path)
            continue
        if not (name.startswith(_PREFIX) and name.endswith(".jsa")) or path == os.path.abspath(keep):
            continue
        record = path.removesuffix(".jsa") + ".json"
        try:
            with open(record) as fh:
                installation = json.load(fh)
            stale = installation_key(installation["jars"], installation["java"]) != name[len(_PREFIX) : -len(".jsa")]
        except (OSError, ValueError, KeyError, TypeError):
            try:
                stale = time.time() - os.stat(path).st_mtime > unrecorded_after_s
            except FileNotFoundError:
                continue
        if stale:
            for p in (path, record):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            removed.append(path)
    return removed


def use_default(conf: SparkConf) -> str | None:
    """Point a self-launched driver's JVM at the archive (`spark.driver.extraJavaOptions`) unless one is named
    already or `TANK_LOG_CLASS_ARCHIVE=off`; the archive used, or None (none built yet: the driver starts as before)."""
    chosen = os.environ.get(ENV) or ""
    extra = conf.get("spark.driver.extraJavaOptions") or ""
    if chosen == "off" or _OPTION in extra or _OPTION in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        return None
    path = chosen or default_path()
    if not os.path.isfile(path):
        return None
    conf.set("spark.driver.extraJavaOptions", f"{extra} {_OPTION}{path}".strip())
    return path


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
        jars, java = _installation()
        with open(f"{tmp}.json", "w") as fh:  # what `prune` checks the archive against
            json.dump({"jars": jars, "java": java}, fh)
        os.replace(f"{tmp}.json", path.removesuffix(".jsa") + ".json")
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, f"{tmp}.json"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tank_spark.class_archive", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "path", nargs="?", help="where to write the archive (default: default_path(), which the jobs use)"
    )
    parser.add_argument("--if-missing", action="store_true", help="do nothing when the archive exists")
    args = parser.parse_args(argv)
    args.path = args.path or default_path()
    for stale in prune(args.path):
        print(f"removed {stale} (its Spark installation or JDK is gone or changed)")
    if args.if_missing and os.path.isfile(args.path):
        print(f"{args.path} exists")
        return 0
    try:
        build(args.path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        print(f"class archive: {err}", file=sys.stderr)
        return 1
    size_mib = os.path.getsize(args.path) >> 20
    print(f"wrote {args.path} ({size_mib} MiB); drivers started by spark-submit need {_OPTION}{args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
