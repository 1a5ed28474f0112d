"""PySpark's Python worker daemon, importing pyspark from its installed package rather than from `pyspark.zip`.

Spark starts the daemon that forks its Python workers with `$SPARK_HOME/python/lib/pyspark.zip` first on PYTHONPATH.
Under Python 3.11 that costs a job about a second before its first task runs (bench/RESULTS.md, "Spark's Python
workers"):

- zipimport keeps no bytecode, so the daemon compiles pyspark's sources at every start: 0.75 s, against 0.34 s
  importing the same modules from an installed package;
- each worker's first task adds Spark's files directory to `sys.path` and calls `importlib.invalidate_caches()`
  (pyspark/worker_util.py `setup_spark_files`), and every zipimporter the imports created — one per package of the
  zip, 16 — then re-reads the zip's directory of 1,377 entries: 0.5 s per worker.

When the zip lies inside an installed pyspark package (pip's pyspark, whose SPARK_HOME is the package itself) it is
the same distribution, so the daemon puts the package's directory where the zip was and imports from there. Any
other layout (a Spark distribution's zip) is left as it is. Before forking workers it forgets the zipimporters its
start left (`forget_zip_importers`). Then it is PySpark's own daemon.

`configure` turns it on for local masters (the daemon runs the driver's interpreter, which can import this module);
on a cluster, set `spark.python.daemon.module: tank_spark.worker_daemon` in the job config's `spark.conf` where
tank-log is installed on the executor hosts (not shipped with `--py-files`: the daemon starts before a task brings
those files).
"""

from __future__ import annotations

import os
import sys
import zipimport
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkConf

MODULE = "tank_spark.worker_daemon"
_CONF = "spark.python.daemon.module"


def installed_pyspark_path(path: list[str]) -> list[str]:
    """`path` with every `pyspark.zip` that lies in an installed pyspark package replaced by the directory holding
    that package (dropped when that directory is already on the path)."""
    out: list[str] = []
    for entry in path:
        if os.path.basename(entry) == "pyspark.zip":
            package = os.path.dirname(os.path.dirname(os.path.dirname(entry)))  # <pkg>/python/lib/pyspark.zip
            if os.path.basename(package) == "pyspark" and os.path.isfile(os.path.join(package, "__init__.py")):
                entry = os.path.dirname(package)
                if entry in path:
                    continue
        out.append(entry)
    return out


def configure(conf: SparkConf) -> bool:
    """Use this daemon in a local-mode run unless the configuration names a daemon; True if it was set. The daemon
    must import this module before any task: its root goes on the workers' PYTHONPATH (`spark.executorEnv`)."""
    if conf.contains(_CONF) or not (conf.get("spark.master") or "").startswith("local"):
        return False
    package = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(package)  # a directory, or the --py-files zip this module was imported from
    key = "spark.executorEnv.PYTHONPATH"
    paths = [p for p in (conf.get(key) or "").split(os.pathsep) if p]
    conf.set(key, os.pathsep.join([root, *(p for p in paths if p != root)]))
    conf.set(_CONF, MODULE)
    return True


def forget_zip_importers() -> None:
    """Drop the zipimporters of `sys.path_importer_cache`: finding this module left some for every zip and jar on the
    path (pyspark.zip, py4j's zip, spark-core's jar), and a worker's `invalidate_caches` would make each re-read its
    archive's directory. The import system makes them again when an import needs them, from zipimport's own cache of
    directories."""
    for entry, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            del sys.path_importer_cache[entry]


def main() -> None:
    sys.path[:] = installed_pyspark_path(sys.path)
    import pyspark.daemon

    forget_zip_importers()
    pyspark.daemon.manager()  # type: ignore[no-untyped-call]  # untyped in pyspark 4.1


if __name__ == "__main__":
    main()
