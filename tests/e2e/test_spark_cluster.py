"""The jobs on a real Spark standalone cluster on loopback — a master and two workers as separate JVMs
started from the pyspark installation, executors in their own JVMs and Python workers, the code shipped with
--py-files — leave the same results as local mode."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pyspark
import pytest
from conftest import ROOT, tree_digest

from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.tools.demo import write_demo

SPARK_HOME = os.path.dirname(pyspark.__file__)
BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what, check, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(what)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """spark://127.0.0.1:PORT with two 1-core workers; every JVM stopped by pid afterwards."""
    work = tmp_path_factory.mktemp("cluster")
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(work))
    port, ui = _free_port(), _free_port()
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    procs = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
            + ["--webui-port", str(ui)],
            env=env,
            stdout=open(work / "master.log", "w"),
            stderr=subprocess.STDOUT,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    try:
        _wait("master", lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None)
        for i in range(2):
            worker_args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0"]
            procs.append(
                subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", url, *worker_args]
                    + ["--work-dir", str(work / f"w{i}")],
                    env=env,
                    stdout=open(work / f"worker{i}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )

        def alive():
            state = json.load(urllib.request.urlopen(f"http://127.0.0.1:{ui}/json", timeout=2))
            return state.get("aliveworkers") == 2

        _wait("two workers", alive)
        yield url, [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def py_files():
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "package.sh")], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


def submit(master, py_files, job, *args, cwd):
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    cmd = [os.path.join(BIN, "spark-submit"), "--master", master, "--py-files", py_files]
    cmd += ["--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.executor.memory=768m"]
    if master.startswith("spark://"):  # tank-log is installed on the "hosts" too (README: worker daemon)
        cmd += ["--conf", "spark.python.daemon.module=tank_spark.worker_daemon"]
    r = subprocess.run(
        [*cmd, os.path.join(ROOT, "jobs", f"{job}.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=cwd,
    )
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"  # the job logs to stdout, Spark to stderr
    return r


@pytest.mark.parametrize("job", ["compact", "maintain"])
def test_mutating_jobs_on_the_cluster_equal_local_mode(cluster, py_files, tmp_path, job):
    url, _ = cluster
    on_cluster = write_demo(str(tmp_path / "cluster"), now_ms=1_790_000_000_000)
    local = shutil.copytree(on_cluster, str(tmp_path / "local"))
    report = tmp_path / "r.json"
    args = ["--broker-stopped", "--report", str(report)]
    submit(url, py_files, job, "--data-dir", on_cluster, "--in-driver-max-bytes=0", *args, cwd=tmp_path)
    rep = json.load(open(report))
    assert rep["status"] == "ok" and rep["spark"]["master"] == url and rep["executed_on"] == "executors"
    assert not [p for p in rep["partitions"] if p["status"] == "skipped" and "held by" in p.get("reason", "")]
    # under spark-submit --master local[2], with the default: data this small runs in 2 processes of the driver's
    r = submit("local[2]", py_files, job, "--data-dir", local, *args, cwd=tmp_path)
    assert json.load(open(report))["executed_on"] == "driver"
    assert "in 2 process(es) of the driver's" in r.stdout  # spark-submit passes the driver's stderr to its stdout
    assert tree_digest(on_cluster) == tree_digest(local) and read_cleanup_log(on_cluster) == read_cleanup_log(local)


def test_export_on_the_cluster_equals_local_mode(cluster, py_files, tmp_path):
    from deltalake import DeltaTable

    url, _ = cluster
    base = write_demo(str(tmp_path / "demo"))
    tables = {}
    # on the cluster's executors; under spark-submit --master local[2] with the export's default: this small export
    # runs in the driver, as it does when the job starts itself
    for name, master, where in (("cluster", url, ["--in-driver-max-bytes=0"]), ("local", "local[2]", [])):
        tables[name], report = str(tmp_path / f"t-{name}"), tmp_path / f"{name}.json"
        args = ["--data-dir", base, "--table", tables[name], *where, "--report", str(report)]
        submit(master, py_files, "export_delta", *args, cwd=tmp_path)
        executed_on = json.load(open(report))["summary"]["executed_on"]
        assert executed_on == ("executors" if name == "cluster" else "driver")
    rows = {
        name: sorted(
            zip(
                *(DeltaTable(t).to_pyarrow_table().to_pydict()[c] for c in ("topic", "partition", "seq", "value")),
                strict=True,
            )
        )
        for name, t in tables.items()
    }
    assert rows["cluster"] == rows["local"] and len(rows["cluster"]) == 30000  # every demo message, once
