"""No process of a run outlives its driver: SIGKILL the CLI or a job's driver (an orchestrator's timeout, the OOM
killer) at several points of a multi-partition run, and within 2 s no process of the run is left; `tank-log repair`
then brings every partition to before-or-after, and an immediate rerun is not refused as held."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, kill_session, many_small_partitions, session_processes, wait_session_gone

from tank_log.maintenance.verify import verify_path

CLI = [sys.executable, "-m", "tank_log.tools.cli"]
GONE_WITHIN_S = 2.0

pytestmark = pytest.mark.alone  # "within 2 s" is measured with no other test beside it


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except FileNotFoundError:
        return []


def _kill_while_workers_run(cmd: list[str], delay: float, env: dict | None = None) -> tuple[float, list[str]]:
    """Start `cmd` in its own session, wait until its worker processes run, then `delay` s more, SIGKILL it: how
    long its session took to be gone, and what was still alive then."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not [c for c in _children(proc.pid) if _is_python(c)]:  # the pool's forked workers
            assert proc.poll() is None, f"{cmd} ended before its workers started"
            assert time.monotonic() < deadline, "no workers"
            time.sleep(0.01)
        time.sleep(delay)
        assert proc.poll() is None, "the run finished before the kill: give it more partitions"
        assert len(session_processes(proc.pid)) >= 2  # the driver and its workers, seen by the check below
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return wait_session_gone(proc.pid, 10)
    finally:
        kill_session(proc.pid)


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def _repaired_and_rerun(base: str) -> None:
    r = subprocess.run([*CLI, "repair", base], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [p for p in verify_path(base) if p.severity == "error"]
    r = subprocess.run([*CLI, "compact", base, "--broker-stopped"], capture_output=True, text=True, timeout=300)
    entries = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    held = [e for e in entries if e.get("held_by") or e["status"] == "skipped"]
    assert r.returncode == 0 and not held, (r.stderr[-2000:], held[:3])


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.15, 0.4, 0.9])
def test_cli_killed_mid_run_leaves_no_process(tmp_path, delay):
    base = many_small_partitions(tmp_path / "many", 250)
    # a last topic whose task waits at the pool's hold (TANK_LOG_TASK_HOLD): however fast the other 250 partitions
    # go, the run is still running when the kill comes, at whichever point of it the delay lands
    shutil.copytree(os.path.join(base, "kv", "0"), os.path.join(base, "zz", "0"))
    shutil.copy(os.path.join(base, "kv", "config"), os.path.join(base, "zz", "config"))
    hold = tmp_path / "hold"
    hold.write_text(os.path.join(base, "zz"))
    env = dict(os.environ, TANK_LOG_TASK_HOLD=str(hold))
    cmd = [*CLI, "compact", base, "--broker-stopped", "--processes", "2"]
    took, left = _kill_while_workers_run(cmd, delay, env)
    hold.unlink()
    assert left == [], f"alive {took:.1f} s after the kill: {left}"
    assert took < GONE_WITHIN_S
    _repaired_and_rerun(base)


@pytest.mark.slow
@pytest.mark.spark
def test_job_in_the_drivers_processes_killed_mid_run_leaves_no_process(tmp_path):
    """The maintain job as an operator runs it (its small run in the driver's forked processes): the driver, its
    workers and its JVM are gone within 2 s of the driver's SIGKILL."""
    base = many_small_partitions(tmp_path / "many", 250)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, os.path.join(ROOT, "jobs", "maintain.py"), "--master", "local[2]", "--data-dir", base]
    took, left = _kill_while_workers_run([*cmd, "--broker-stopped"], random.Random(5).uniform(0.1, 0.6), env)
    assert left == [], f"alive {took:.1f} s after the kill: {left}"
    assert took < GONE_WITHIN_S
    _repaired_and_rerun(base)


@pytest.mark.slow
@pytest.mark.spark
def test_the_driver_dies_with_a_killed_spark_submit(tmp_path):
    """spark-submit's JVM killed alone (the OOM killer picks the largest process; an orchestrator that kills only the
    process it started): the job's Python driver, its child, and the driver's workers die with it within 2 s."""
    base = many_small_partitions(tmp_path / "many", 500)
    bin_dir = os.path.dirname(sys.executable)  # spark-submit finds its Spark through the venv's python
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    cmd = [
        submit,
        "--master",
        "local[2]",
        os.path.join(ROOT, "jobs", "compact.py"),
        "--data-dir",
        base,
        "--broker-stopped",
    ]
    proc = subprocess.Popen(
        [*cmd, "--broker-stopped"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # the JVM's Python child (the driver) runs its pool
            running = [int(line.split()[0]) for line in session_processes(proc.pid) if "compact.py" in line]
            drivers = [p for p in running if _is_python(p) and [c for c in _children(p) if _is_python(c)]]
            if drivers:
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the driver's pool never ran"
            time.sleep(0.005)
        with open(f"/proc/{drivers[0]}/stat") as fh:
            jvm = int(fh.read().rsplit(")", 1)[1].split()[1])
        assert "java" in os.readlink(f"/proc/{jvm}/exe")
        os.kill(jvm, signal.SIGKILL)  # the JVM only
        proc.wait()
        took, left = wait_session_gone(proc.pid, 10)
        assert left == [], f"alive {took:.1f} s after the JVM's kill: {left}"
        assert took < GONE_WITHIN_S
    finally:
        kill_session(proc.pid)
    _repaired_and_rerun(base)
