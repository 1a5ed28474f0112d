"""tank_spark/class_archive.py: the archive the test session built (conftest) is one a Spark driver maps, and a
driver a job launches itself maps it without being told."""

import os
import subprocess
import sys

from tank_spark.class_archive import default_path

DRIVER = """
from pyspark import SparkContext
sc = SparkContext(master="local[1]", appName="archive-check")
assert sc.parallelize(range(3)).sum() == 3
sc.stop()
"""


def test_a_driver_loads_its_classes_from_the_archive(tmp_path):
    archive = default_path()
    assert os.path.getsize(archive) > 10 << 20
    log = tmp_path / "classes.log"
    opts = f"{os.environ['SPARK_SUBMIT_OPTS']} -Xlog:class+load=info:file={log}"
    assert f"-XX:SharedArchiveFile={archive}" in opts  # set for every driver of the session
    env = dict(os.environ, SPARK_SUBMIT_OPTS=opts, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    run = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = log.read_text().splitlines()
    from_archive = [x for x in lines if "org.apache.spark." in x and "shared objects file (top)" in x]
    from_jars = [x for x in lines if "org.apache.spark." in x and ("source: jar:" in x or "spark-core" in x)]
    assert len(from_archive) > 1000 and len(from_archive) > 10 * len(from_jars)


JOB_DRIVER = """
import sys
from tank_log.jobs.config import JobConfig
from tank_spark.runner import JobContext, spark_context
sc = spark_context(JobContext("check", JobConfig(), ("/tmp",), None, False, None, "local[1]"))
maps = open(f"/proc/{sc._gateway.proc.pid}/maps").read()
print("mapped" if sys.argv[1] in maps else "not mapped")
sc.stop()
"""


def test_a_job_driver_maps_the_hosts_archive_by_itself_unless_turned_off(tmp_path):
    archive = default_path()
    opts = " ".join(o for o in os.environ["SPARK_SUBMIT_OPTS"].split() if "SharedArchiveFile" not in o)
    env = dict(os.environ, SPARK_SUBMIT_OPTS=opts, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    for setting, want in (("", "mapped"), ("off", "not mapped")):
        run = subprocess.run(
            [sys.executable, "-c", JOB_DRIVER, archive],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(env, TANK_LOG_CLASS_ARCHIVE=setting),
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip().splitlines()[-1] == want, (setting, run.stdout)
