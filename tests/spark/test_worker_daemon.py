"""tank_spark/worker_daemon.py: local-mode workers fork from our daemon and import the installed pyspark."""

import os
import subprocess
import sys
import zipfile

import pyspark
from pyspark import SparkConf

from tank_spark import worker_daemon


def test_local_workers_fork_from_the_daemon_and_import_the_installed_pyspark(spark):
    def where_workers_import_from(_):  # defined here: cloudpickle ships it by value
        import os
        import sys

        import pyspark as worker_pyspark

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            daemon = [a.decode() for a in f.read().split(b"\0")]
        return worker_pyspark.__file__, daemon, sys.path

    (file, daemon, path) = spark.sparkContext.parallelize([0], 1).map(where_workers_import_from).collect()[0]
    assert daemon[1:3] == ["-m", worker_daemon.MODULE]
    assert file == pyspark.__file__ and os.path.isfile(file)  # the driver's own package, not inside a zip
    assert not any(p.endswith("pyspark.zip") for p in path)


def test_only_a_zip_inside_an_installed_pyspark_is_replaced(tmp_path):
    site = tmp_path / "site-packages"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    pip_zip = str(site / "pyspark" / "python" / "lib" / "pyspark.zip")
    distribution_zip = str(tmp_path / "spark-4.0" / "python" / "lib" / "pyspark.zip")  # SPARK_HOME of a tarball
    py4j = str(site / "pyspark" / "python" / "lib" / "py4j-0.10.9.9-src.zip")

    assert worker_daemon.installed_pyspark_path([pip_zip, py4j, "/x"]) == [str(site), py4j, "/x"]
    assert worker_daemon.installed_pyspark_path([pip_zip, "/x", str(site)]) == ["/x", str(site)]
    assert worker_daemon.installed_pyspark_path([distribution_zip, "/x"]) == [distribution_zip, "/x"]


def test_configure_leaves_clusters_and_a_named_daemon_alone():
    local = SparkConf(loadDefaults=False).setMaster("local[2]").set("spark.executorEnv.PYTHONPATH", "/opt/x")
    assert worker_daemon.configure(local)
    assert local.get("spark.python.daemon.module") == worker_daemon.MODULE
    root = os.path.dirname(os.path.dirname(os.path.abspath(worker_daemon.__file__)))
    assert local.get("spark.executorEnv.PYTHONPATH") == os.pathsep.join([root, "/opt/x"])

    cluster = SparkConf(loadDefaults=False).setMaster("spark://127.0.0.1:7077")
    named = SparkConf(loadDefaults=False).setMaster("local[1]").set("spark.python.daemon.module", "my.daemon")
    assert not worker_daemon.configure(cluster) and not worker_daemon.configure(named)
    assert not cluster.contains("spark.python.daemon.module")
    assert named.get("spark.python.daemon.module") == "my.daemon"


def test_forgotten_zip_importers_come_back_when_an_import_needs_them(tmp_path):
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_pkg/__init__.py", "")
        z.writestr("zipped_pkg/a.py", "A = 1")
        z.writestr("zipped_pkg/b.py", "B = 2")
    code = f"""
import sys, zipimport
sys.path.insert(0, {str(archive)!r})
import zipped_pkg.a
from tank_spark.worker_daemon import forget_zip_importers
zips = lambda: [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
before = len(zips())
forget_zip_importers()
after = len(zips())
import zipped_pkg.b
print(before, after, zipped_pkg.a.A + zipped_pkg.b.B)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    before, after, total = out.split()
    assert int(before) >= 2 and after == "0" and total == "3"
