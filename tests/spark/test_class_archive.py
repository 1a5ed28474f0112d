"""tank_spark/class_archive.py: the archive the test session built (conftest) is one a Spark driver maps, a driver
a job launches itself maps it without being told, and stale archives are removed."""

import json
import os
import shutil
import subprocess
import sys
import time

from tank_spark.class_archive import default_path, installation_key, prune

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
from tank_spark.context import JobContext, spark_session
spark = spark_session(JobContext("check", JobConfig(), ("/tmp",), None, False, None, "local[1]"), delta=True)
spark.range(3).write.format("delta").save(sys.argv[2])  # Delta's jars, loaded after the JVM started
assert spark.read.format("delta").load(sys.argv[2]).count() == 3
maps = open(f"/proc/{spark.sparkContext._gateway.proc.pid}/maps").read()
print("mapped" if sys.argv[1] in maps else "not mapped")
spark.stop()
"""


def test_a_job_driver_maps_the_hosts_archive_by_itself_unless_turned_off(tmp_path):
    """Also one that loads Delta's jars: they go into its class loader, its classpath stays the archive's. The two
    drivers (archive on, archive off) run side by side: each mostly waits on its JVM's start."""
    archive = default_path()
    opts = " ".join(o for o in os.environ["SPARK_SUBMIT_OPTS"].split() if "SharedArchiveFile" not in o)
    env = dict(os.environ, SPARK_SUBMIT_OPTS=opts, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    runs = {}
    try:
        for setting in ("", "off"):
            runs[setting] = subprocess.Popen(
                [sys.executable, "-c", JOB_DRIVER, archive, str(tmp_path / f"table-{setting}")],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(env, TANK_LOG_CLASS_ARCHIVE=setting),
            )
        for (setting, run), want in zip(runs.items(), ("mapped", "not mapped"), strict=True):
            stdout, stderr = run.communicate(timeout=300)
            assert run.returncode == 0, stderr[-2000:]
            assert stdout.strip().splitlines()[-1] == want, (setting, stdout)
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()


def test_prune_removes_the_archives_of_installations_that_are_gone_or_changed(tmp_path):
    """Every clone with its own virtualenv gets its own ~150 MB archive: `prune` (run by `--if-missing`, so by
    setup.sh) removes those whose Spark jars or JDK no longer match the archive's name, and unrecorded ones after a
    week, and records without an archive; the archive asked for, current ones, young unrecorded ones and other files
    stay."""
    java = tmp_path / "java"
    java.write_bytes(b"jdk")
    cache = tmp_path / "cache"
    cache.mkdir()

    def archive(name: str, record: bool = True):
        jars = tmp_path / f"jars-{name}"
        jars.mkdir()
        (jars / "spark-core.jar").write_bytes(b"classes")
        path = cache / f"spark-driver-{installation_key(str(jars), str(java))}.jsa"
        path.write_bytes(b"archive")
        if record:
            path.with_suffix(".json").write_text(json.dumps({"jars": str(jars), "java": str(java)}))
        return jars, path

    _, current = archive("current")
    changed_jars, changed = archive("changed")
    (changed_jars / "spark-core.jar").write_bytes(b"other classes")  # a reinstalled Spark
    gone_jars, gone = archive("gone")
    shutil.rmtree(gone_jars)  # a deleted clone's virtualenv
    _, young = archive("young", record=False)
    _, old = archive("old", record=False)
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    _, asked = archive("asked", record=False)
    os.utime(asked, (week_ago, week_ago))
    (cache / "notes.txt").write_text("mine")
    (cache / "spark-driver-0123456789abcdef.json").write_text("{}")  # a record whose archive is gone

    assert sorted(prune(str(asked))) == sorted(str(p) for p in (changed, gone, old))
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([current.name, current.with_suffix(".json").name, young.name, asked.name, "notes.txt"])
