"""A test run leaves no process behind, even when pytest itself is SIGKILLed (tests/reaper.py), and nothing in /tmp:
its JVMs' temporary files go to the run's scratch directory, removed at the end (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import HERE, ROOT, SCRATCH, kill_session, many_small_partitions, session_processes

INNER = """
import os, subprocess, time

def test_leaves_a_detached_process(tmp_path_factory):
    scratch = os.environ["TANK_LOG_TEST_SCRATCH"]
    open(os.path.join(scratch, "left"), "w").close()  # as a JVM that the reaper ends leaves its files
    open({pidfile!r} + ".scratch", "w").write(scratch)
    child = subprocess.Popen(["setsid", "sleep", "300"])  # its own session: no process group kill reaches it
    open({pidfile!r} + ".tmp", "w").write(str(child.pid))
    os.rename({pidfile!r} + ".tmp", {pidfile!r})
    time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sigkilled_run_leaves_no_process_and_no_scratch_directory(tmp_path):
    pidfile = str(tmp_path / "child.pid")
    (tmp_path / "test_inner.py").write_text(INNER.format(pidfile=pidfile))
    env = {k: v for k, v in os.environ.items() if k != "TANK_LOG_TEST_RUN"}
    env["PYTHONPATH"] = HERE  # the inner run loads the suite's conftest (and so starts its own reaper)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(pidfile):
        assert run.poll() is None and time.monotonic() < deadline, "the inner run did not start its test"
        time.sleep(0.1)
    child, scratch = int(open(pidfile).read()), open(pidfile + ".scratch").read()
    assert alive(child) and os.path.isdir(scratch)
    run.send_signal(signal.SIGKILL)
    _, err = run.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        raise AssertionError(f"process {child} outlived its SIGKILLed test run")
    assert f"ended 1 processes the test run left: {child} sleep 300" in err.decode(), err.decode()[-2000:]
    assert not os.path.exists(scratch)  # the reaper has exited: stderr is closed


FAILING = """
import os

def test_fails():
    open(os.path.join(os.environ["TANK_LOG_TEST_SCRATCH"], "left"), "w").close()
    open("scratch", "w").write(os.environ["TANK_LOG_TEST_SCRATCH"])
    assert False
"""


def test_a_failed_run_removes_its_scratch_directory_as_it_ends(tmp_path):
    (tmp_path / "test_inner.py").write_text(FAILING)
    env = {k: v for k, v in os.environ.items() if k != "TANK_LOG_TEST_RUN"}
    env["PYTHONPATH"] = HERE
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    scratch = (tmp_path / "scratch").read_text()
    assert scratch.startswith(tempfile.gettempdir()) and not os.path.exists(scratch)


TMP = "/tmp"  # a JVM's java.io.tmpdir unless told otherwise, and so Spark's local directories; hadoop.tmp.dir's parent
SCRATCH_KINDS = ("spark-", "blockmgr-", "artifacts-", "liblz4-java", "snappy-", "hadoop-")


def scratch_names(directory: str) -> set[str]:
    """The entries of `directory` named as a JVM's temporary files are."""
    return {n for n in os.listdir(directory) if n.startswith(SCRATCH_KINDS)}


def mapped_files(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
    except OSError:
        return set()


@pytest.mark.spark
@pytest.mark.slow
def test_a_sigkilled_spark_jvm_leaves_its_temporary_files_in_the_runs_scratch_not_in_tmp(tmp_path):
    """A job's JVM SIGKILLed mid-run, as the reaper or a test ends one: no shutdown hook runs, and what it made stays
    where it made it — the run's scratch directory, none of it in /tmp."""
    scratch = os.environ[SCRATCH]
    base = many_small_partitions(tmp_path / "many", 100)
    cmd = [sys.executable, os.path.join(ROOT, "jobs", "compact.py"), "--master", "local[2]", "--in-driver-max-bytes=0"]
    before_tmp, before_scratch = scratch_names(TMP), scratch_names(scratch)
    job = subprocess.Popen(
        [*cmd, "--data-dir", base, "--broker-stopped"],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:  # the JVM runs tasks: it has unpacked and loaded lz4-java's library (broadcasts are compressed)
            # a process exiting (or before its exec) has an empty command line: only its pid
            jvms = [
                int(line.split()[0])
                for line in session_processes(job.pid)
                if line.split()[1:2] and line.split()[1].endswith("/java")
            ]
            libs = {pid: {f for f in mapped_files(pid) if "liblz4-java" in f} for pid in jvms}
            jvm = next((p for p, found in libs.items() if found), None)
            if jvm is not None:
                break
            assert job.poll() is None and time.monotonic() < deadline, "the job's JVM never ran a task"
            time.sleep(0.05)
        files = mapped_files(jvm)
        os.kill(jvm, signal.SIGKILL)
        job.wait(timeout=120)
    finally:
        kill_session(job.pid)
    assert [f for f in files if os.path.dirname(f) == TMP] == []
    assert all(f.startswith(scratch + os.sep) for f in libs[jvm]), libs[jvm]
    made = scratch_names(scratch) - before_scratch  # among them the job's, left by its SIGKILLed JVM
    assert {n.split("-")[0] for n in made} >= {"spark", "blockmgr", "liblz4"}, made
    assert scratch_names(TMP) - before_tmp == set()  # (what another program made meanwhile would show here too)
