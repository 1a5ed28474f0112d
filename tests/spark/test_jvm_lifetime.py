"""The Spark JVM a job's driver launches (tank_spark/context.py) dies with the driver: SIGKILLed mid-job, on a busy
machine, with a process the driver forked still holding the JVM's stdin open (so PySpark's end-of-stdin never
comes), the JVM is gone within 2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, kill_session

GONE_WITHIN_S = 2.0

DRIVER = """
import os, sys, threading, time
from tank_log.jobs.config import JobConfig
from tank_spark.context import JobContext, spark_context

sc = spark_context(JobContext("lifetime", JobConfig(), ("/tmp",), None, False, None, "local[2]"))
threading.Thread(target=lambda: sc.parallelize(range(2), 2).foreach(lambda _: time.sleep(300)), daemon=True).start()
if os.fork() == 0:  # holds every descriptor of the driver, the JVM's stdin among them, and outlives it
    time.sleep(300)
    os._exit(0)
time.sleep(3)  # the job's tasks run
print(sc._gateway.proc.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_jvm_dies_within_2_s_of_its_drivers_sigkill_on_a_busy_machine():
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYTHONPATH=ROOT)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, start_new_session=True, env=env, cwd=ROOT
    )
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        jvm = int(driver.stdout.readline())  # type: ignore[union-attr]
        assert "java" in os.readlink(f"/proc/{jvm}/exe")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]  # a busy machine
        time.sleep(0.5)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        start = time.monotonic()
        while _alive(jvm) and time.monotonic() - start < 10:
            time.sleep(0.02)
        took = time.monotonic() - start
        assert not _alive(jvm), f"the JVM {jvm} still runs {took:.1f} s after its driver's SIGKILL"
        assert took < GONE_WITHIN_S, took
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        kill_session(driver.pid)
