"""The `tank` data source through Spark Connect: a local Connect server (pyspark's own, `SparkConnectServer` under
spark-submit) on a loopback port, and a client (`SparkSession.builder.remote`) that registers the source from its
side: the server pickles nothing of ours at start, the client sends the class, and the server's Python workers import
tank_spark to plan and read. A batch read and an `availableNow` stream each return every message of a real-broker
fixture. The client runs in a process of its own (a remote session turns this process's PySpark into Connect mode),
and the server's process group is killed when the module is done. The export job runs through the same server
(`--remote`): its files are written by `mapInArrow` on the server's workers, and the job's driver commits them."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT, copy_tree, data_dir, free_port, load_dump, run_job_script, wait_for_port
from deltalake import DeltaTable
from test_job_export import roll_and_append

pytestmark = [pytest.mark.slow, pytest.mark.spark]

TOPICS = ["events", "seqgap"]
SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
CLIENT = """
import json, sys
from pyspark.sql import SparkSession
from tank_spark.source import register

url, base, topics = sys.argv[1:4]
spark = SparkSession.builder.remote(url).getOrCreate()
register(spark)
def rows(df):
    return sorted([r.topic, r.partition, r.seq, r.value.hex()] for r in df.collect())
out = {"version": spark.version}
out["batch"] = rows(spark.read.format("tank").option("topics", topics).load(base))
query = (
    spark.readStream.format("tank").option("topics", topics).load(base)
    .writeStream.format("memory").queryName("tank_stream").trigger(availableNow=True).start()
)
query.awaitTermination(300)
out["stream"] = rows(spark.table("tank_stream"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    """A Spark Connect server on 127.0.0.1 in a process group of its own, killed at the end of the module."""
    import pyspark

    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [
        submit, "--class", SERVER, "--master", "local[2]", "--name", "tank-log-connect-test",
        "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC", "spark-internal",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        wait_for_port(port, f"the Spark Connect server (log: {log})", proc, timeout=300)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 30
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        assert not group_alive(proc.pid), "the Connect server's processes outlived the test"


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_tank_source_batch_and_stream_through_spark_connect(connect_url):
    import pyspark

    r = subprocess.run(
        [sys.executable, "-c", CLIENT, connect_url, data_dir("A_multi"), ",".join(TOPICS)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["version"] == pyspark.__version__
    expected = sorted(
        [t, p, seq, value.hex()]
        for (t, p), msgs in load_dump("A_multi").items()
        if t in TOPICS
        for seq, *_, value in msgs
    )
    assert expected and out["batch"] == expected
    assert out["stream"] == expected


def test_the_export_runs_through_spark_connect_exactly_once(connect_url, tmp_path):
    """`export_delta.py --remote`: a run on the server's executors writes every message of the topics once; after
    the broker appended, a dry run counts the new ones and writes nothing, and a run exports only them, both through
    the server too; a run with nothing new commits nothing. What cannot go through Connect is refused before
    anything starts, in one line (exit 2)."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    table = str(tmp_path / "t")
    args = ["--remote", connect_url, "--data-dir", base, "--table", table, "--topics", ",".join(TOPICS)]

    def export(n, *more):
        r = run_job_script("export_delta", *args, *more, "--report", str(tmp_path / f"{n}.json"))
        assert r.returncode == 0, r.stderr[:6000]
        return json.load(open(tmp_path / f"{n}.json"))

    def rows():
        d = DeltaTable(table).to_pyarrow_table(columns=["topic", "partition", "seq", "value"]).to_pydict()
        return sorted(zip(d["topic"], d["partition"], d["seq"], d["value"], strict=True))

    expected = sorted(
        (t, p, seq, value) for (t, p), msgs in load_dump("A_multi").items() if t in TOPICS for seq, *_, value in msgs
    )
    first = export(1)
    assert first["spark"]["remote"] == connect_url and first["executed_on"] == "executors"
    assert first["summary"]["rows"] == len(expected) and rows() == expected
    version = DeltaTable(table).version()

    appended = roll_and_append(base, "events", 5)
    dry = export("dry", "--dry-run")  # every range read through the server (`scan_ranges`), nothing written
    assert dry["spark"]["remote"] == connect_url and dry["summary"]["rows"] == len(appended)
    assert DeltaTable(table).version() == version
    second = export(2)
    assert second["spark"]["remote"] == connect_url and second["summary"]["rows"] == len(appended)
    assert rows() == sorted(expected + appended) and DeltaTable(table).version() == version + 1
    assert export(3)["summary"]["rows"] == 0 and DeltaTable(table).version() == version + 1

    refused = [
        ("export_delta", ["--engine", "spark"], "--engine spark"),
        ("export_delta", ["--remote", "localhost:15002"], "sc://HOST:PORT"),
        ("compact", [], "RDDs"),
    ]
    with ThreadPoolExecutor(len(refused)) as pool:  # each refused before it starts anything: side by side
        runs = [
            pool.submit(run_job_script, job, *(args + more if job == "export_delta" else args[:4]))
            for job, more, _ in refused
        ]
        for (_, _, why), run in zip(refused, runs, strict=True):
            r = run.result()
            assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert rows() == sorted(expected + appended)
