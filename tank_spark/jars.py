"""The lakehouse jars for Spark: delta-spark (Spark's Delta reader and writer: `--engine spark`, Spark users' tables),
Iceberg's Spark runtime (Spark's Iceberg catalogs and tables: `tank_spark.iceberg_catalog`) with SQLite's JDBC driver,
and hadoop-aws with its AWS SDK (`s3a://` tables), kept in the checkout's `.jars/`. Their Spark line is 4.1, the
newest with both runtimes on Maven Central (docs/development.md).

`scripts/setup.sh` fills `.jars/` once through Maven (`python -m tank_spark.jars install`: the artifacts of
`scripts/spark-jars/pom.xml` and what they depend on, less the jars pyspark ships itself); nothing is fetched when a
job runs. Every Spark driver the project starts loads them with Delta's SQL extension and catalog, and Iceberg's SQL
extension beside Delta's (`configure`): the
jobs run with `python jobs/<job>.py` or under spark-submit, the DAGs, the tests. `TANK_LOG_SPARK_JARS`
names another folder of jars, or `off` for none. A cluster gets them with `spark-submit --jars` or `--packages`
(docs/guides/export.md).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

from tank_log.storage.fsutil import atomic_write, fsync_dir

if TYPE_CHECKING:
    from pyspark import SparkConf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POM = os.path.join(ROOT, "scripts", "spark-jars", "pom.xml")
DEFAULT_DIR = os.path.join(ROOT, ".jars")
ENV = "TANK_LOG_SPARK_JARS"  # another folder of jars, or "off"
STAMP = ".installed"  # in the folder: the digest of the pom and pyspark's version it was filled for
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_CLASS = "io.delta.tables.DeltaTable"
DELTA_PACKAGE = "io.delta:delta-spark_4.1_2.13:4.4.0"  # the pom's, for spark-submit --packages
ICEBERG_EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
ICEBERG_PACKAGE = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"  # the pom's, for spark-submit --packages
SQLITE_JDBC_PACKAGE = "org.xerial:sqlite-jdbc:3.50.3.0"  # Iceberg's JdbcCatalog on a SQLite catalog file


def jar_dir() -> str | None:
    """The folder whose jars Spark drivers load, or None (`TANK_LOG_SPARK_JARS=off`)."""
    d = os.environ.get(ENV, DEFAULT_DIR)
    return None if d == "off" else d


def jars() -> list[str]:
    """The jars to load: every `*.jar` of `jar_dir()`, sorted; none when it is missing or off."""
    d = jar_dir()
    return sorted(glob.glob(os.path.join(d, "*.jar"))) if d else []


def has_delta(paths: list[str]) -> bool:
    return any(os.path.basename(p).startswith("delta-spark_") for p in paths)


def has_iceberg(paths: list[str]) -> bool:
    return any(os.path.basename(p).startswith("iceberg-spark-runtime-") for p in paths)


def configure(conf: SparkConf, *, jvm_running: bool = False) -> bool:
    """Load the jars in this run's driver and executors, and when delta-spark is among them turn on Delta's SQL
    extension and catalog, with Iceberg's SQL extension beside Delta's when Iceberg's Spark runtime is among them too
    (unless the configuration chose its extensions or catalog). Return whether delta-spark is loaded.

    A driver whose JVM runs already (`jvm_running`: spark-submit's, or the one a job launched before creating its
    SparkContext) gets them in its class loader. Its classpath stays the one the class archive was built with
    (`tank_spark.class_archive`), so it still maps the archive: a driver with the jars on its classpath cannot, and
    starts ~5 s slower. A driver not yet launched gets them on its classpath in local mode
    (`spark.driver.extraClassPath`: its executors are in its JVM; `spark.jars` would copy every jar, the AWS SDK's
    700 MB too, into each run's temporary folder). With a cluster master, `spark.jars` also ships them to the
    executors. Jars the submission chose itself (a delta-spark jar in `spark.jars`, Delta in `spark.jars.packages`)
    are left as they are."""
    paths = jars()
    chosen = [j for j in (conf.get("spark.jars") or "").split(",") if j]
    packages = conf.get("spark.jars.packages") or ""
    iceberg = has_iceberg(paths)
    if has_delta(chosen) or "io.delta:" in packages:
        paths = []
        iceberg = has_iceberg(chosen) or "org.apache.iceberg:iceberg-spark-runtime" in packages
    elif not paths:
        return False
    local = (conf.get("spark.master") or "local").startswith("local")
    if paths:
        if jvm_running:
            _add_to_driver(paths)
        elif local:
            cp = [c for c in (conf.get("spark.driver.extraClassPath") or "").split(os.pathsep) if c]
            conf.set("spark.driver.extraClassPath", os.pathsep.join([*cp, *(p for p in paths if p not in cp)]))
        if not local:
            conf.set("spark.jars", ",".join([*chosen, *(p for p in paths if p not in chosen)]))
    if not conf.contains("spark.sql.extensions"):
        conf.set("spark.sql.extensions", f"{DELTA_EXTENSION},{ICEBERG_EXTENSION}" if iceberg else DELTA_EXTENSION)
    if not conf.contains("spark.sql.catalog.spark_catalog"):
        conf.set("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    if local and not conf.contains("spark.databricks.delta.snapshotPartitions"):
        # Delta reads a table's log in 50 tasks by default (sized for clusters): ~30 s per new table on 2 cores
        conf.set("spark.databricks.delta.snapshotPartitions", "2")
    return True


def _add_to_driver(paths: list[str]) -> None:
    """Add jars to the class loader of a running driver JVM. spark-submit starts every driver JVM, PySpark's own too,
    with a `MutableURLClassLoader` for the submission's jars as the context class loader of the threads PySpark
    calls in through: where Spark looks up data sources, SQL extensions and catalogs, and, in local mode, the parent
    of the executors' class loader."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    assert jvm is not None  # spark-submit's JVM, connected
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for p in paths:
        loader.addURL(jvm.java.io.File(p).toURI().toURL())


def _digest() -> str:
    import pyspark

    with open(POM, "rb") as f:
        return hashlib.sha256(f.read() + pyspark.__version__.encode()).hexdigest()


def installed(directory: str = DEFAULT_DIR) -> bool:
    try:
        with open(os.path.join(directory, STAMP)) as f:
            return f.read().strip() == _digest()
    except FileNotFoundError:
        return False


_VERSION = re.compile(r"-\d[^-]*(?:\.Final)?\.jar$")


def artifact(jar: str) -> str:
    """`jackson-core-2.13.5.jar` → `jackson-core`."""
    return _VERSION.sub("", os.path.basename(jar))


def shipped_by_pyspark() -> set[str]:
    import pyspark

    return {artifact(j) for j in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*.jar"))}


def install(directory: str = DEFAULT_DIR, mvn: str = "mvn") -> bool:
    """Fill `directory` with the pom's jars unless it already holds them (return False then). Maven resolves them
    into a `.`-prefixed temporary folder beside it (its local repository caches the downloads), which replaces the
    folder only once complete: an interrupted install leaves the previous folder or none. The previous folder's
    subfolders (the REST catalog server's `iceberg-rest/`, filled by its own script) move into the new one first.

    Raises:
        RuntimeError: Maven is missing or failed (its last lines).
    """
    if installed(directory):
        return False
    if shutil.which(mvn) is None:
        raise RuntimeError(f"{mvn} not found: Maven fetches the lakehouse jars (apt-get install maven)")
    parent = os.path.dirname(os.path.abspath(directory))
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.", dir=parent)
    try:
        fetched = os.path.join(tmp, "fetched")
        r = subprocess.run(
            [mvn, "-B", "-q", "-f", POM, f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={fetched}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"mvn failed ({r.returncode}): {(r.stdout + r.stderr).strip()[-2000:]}")
        ours = os.path.join(tmp, "jars")
        os.mkdir(ours)
        spark_has = shipped_by_pyspark()
        for jar in sorted(glob.glob(os.path.join(fetched, "*.jar"))):
            if artifact(jar) not in spark_has:  # pyspark's own version wins (a second copy could shadow it)
                os.link(jar, os.path.join(ours, os.path.basename(jar)))
        atomic_write(os.path.join(ours, STAMP), _digest().encode() + b"\n")
        old = os.path.join(tmp, "old")
        if os.path.isdir(directory):
            for entry in sorted(os.listdir(directory)):
                src = os.path.join(directory, entry)
                if os.path.isdir(src) and not os.path.islink(src):
                    os.rename(src, os.path.join(ours, entry))
            fsync_dir(ours)
        if os.path.lexists(directory):
            os.rename(directory, old)
        os.rename(ours, directory)
        fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tank_spark.jars", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="fetch the jars with Maven into the folder, unless it holds them already")
    i.add_argument("--dir", default=DEFAULT_DIR, help="the folder (default: the checkout's .jars)")
    sub.add_parser("list", help="print the jars Spark drivers load, comma-separated (for spark-submit --jars)")
    args = p.parse_args(argv)
    if args.command == "list":
        print(",".join(jars()))
        return 0
    try:
        fetched = install(args.dir)
    except RuntimeError as err:
        print(f"tank_spark.jars: {err}", file=sys.stderr)
        return 1
    n = len(glob.glob(os.path.join(args.dir, "*.jar")))
    print(f"{'fetched' if fetched else 'already installed'}: {n} jars in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
