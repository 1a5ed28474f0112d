"""A run that skipped work because the broker holds the partitions is not a success: exit 3 (done partially), with
the partitions and their holders in the report and the last line; a held partition that needed nothing, or one
locked by another run of ours, keeps exit 0 (jobs/exits.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, many_small_partitions, run_job_script, standin_broker, start_standin

CLI = [sys.executable, "-m", "tank_log.tools.cli"]


@pytest.fixture
def held_base(tmp_path):
    """Four compactable partitions, and a stand-in broker holding every file of the base path."""
    base = many_small_partitions(tmp_path / "base", 4)
    entry = standin_broker(str(tmp_path), "b", base)
    holder = {"pid": start_standin(entry)}
    yield base, holder
    os.kill(holder["pid"], signal.SIGINT)


def _compact(base, *flags):
    return subprocess.run([*CLI, "compact", base, *flags], capture_output=True, text=True, timeout=300)


def test_cli_compaction_skipping_work_held_by_the_broker_exits_3(held_base, tmp_path):
    base, holder = held_base
    for flags in ((), ("--broker-stopped",)):
        r = _compact(base, *flags)
        assert r.returncode == 3, r.stderr[-2000:]
        entries = [json.loads(x) for x in r.stdout.splitlines()]
        assert [e["status"] for e in entries] == ["skipped"] * 4 and all(e["needs_work"] for e in entries)
        last = r.stderr.strip().splitlines()[-1]
        assert "done partially (exit 3): 4 partition(s) needed work" in last and f"pid {holder['pid']}" in last
    os.kill(holder["pid"], signal.SIGINT)  # the broker stops: the work is done
    subprocess.run(["sh", "-c", f"while kill -0 {holder['pid']} 2>/dev/null; do sleep 0.05; done"], timeout=30)
    r = _compact(base, "--broker-stopped")
    assert r.returncode == 0 and {json.loads(x)["status"] for x in r.stdout.splitlines()} == {"compacted"}
    holder["pid"] = start_standin(standin_broker(str(tmp_path), "b2", base))  # held again, but nothing to do
    r = _compact(base, "--broker-stopped")
    entries = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr[-2000:]
    assert {e["status"] for e in entries} == {"skipped"} and not any(e["needs_work"] for e in entries)


@pytest.mark.spark
def test_jobs_and_maintain_skipping_work_held_by_the_broker_exit_3(held_base, tmp_path):
    base, _ = held_base
    for job in ("compact", "maintain"):
        report = tmp_path / f"{job}.json"
        r = run_job_script(job, "--data-dir", base, "--broker-stopped", "--report", str(report), where="driver")
        assert r.returncode == 3, r.stderr[-3000:]
        rep = json.loads(report.read_text())
        assert rep["status"] == "partial" and len(rep["summary"]["skipped_needing_work"]) == 4
        assert "done partially" in rep["error"]  # what the DAGs' publish_report fails with
        assert "done partially" in r.stderr.strip().splitlines()[-1]
    r = subprocess.run([*CLI, "maintain", base, "--broker-stopped"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and "done partially" in r.stderr


STOPPED_WHILE_SETTING_UP = """
import os, signal, sys, time
from tank_spark.runner import run_job

def execute(ctx, prepared, spark):
    os.kill(os.getpid(), signal.SIGTERM)  # an orchestrator's stop while the job sets up, outside any drain
    time.sleep(30)
    raise AssertionError("not stopped")

sys.exit(run_job("setup-stop", "a job stopped while it sets up", lambda p: None, lambda c, a: None, execute,
                 needs_spark=lambda c, p: False))
"""


def test_a_stop_while_a_job_sets_up_is_an_interruption_not_a_crash(tmp_path):
    """SIGTERM that lands before any partition runs (while Spark starts, or a continuous export registers its
    source) ends the run as interrupted: exit 130, one line, the report written, no traceback."""
    from tank_log.tools.demo import write_demo

    base = write_demo(str(tmp_path / "demo"))
    report_path = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_SETTING_UP, "--data-dir", base, "--report", str(report_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 130, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "setup-stop: interrupted" in r.stderr
    report = json.loads(report_path.read_text())
    assert report["status"] == "interrupted" and report["partitions"] == []


EXITING = """
import atexit, sys, threading, time
from tank_log.jobs.exits import exit_process

class Teardown:
    def __del__(self):  # a module global: deleted only in the interpreter's teardown
        print("teardown", flush=True)

kept = Teardown()
atexit.register(lambda: print("exit handler"))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(2)  # left open: its idle workers wait for work until told to stop
pool.submit(time.sleep, 0)
sys.stdout.write("buffered ")  # not flushed yet
exit_process(2) if sys.argv[1] == "exit_process" else sys.exit(2)
"""


@pytest.mark.parametrize("how", ["exit_process", "sys.exit"])
def test_a_job_process_ends_as_python_does_but_skips_the_teardown(how):
    """A job's process (jobs/*.py) ends with its code after its threads (a thread pool left open too), its exit
    handlers and its output, as `sys.exit` does; only the interpreter's teardown, where an Arrow thread can abort the
    process, is not run."""
    r = subprocess.run([sys.executable, "-c", EXITING, how], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    teardown = "teardown\n" if how == "sys.exit" else ""
    assert r.stdout == "buffered thread done\nexit handler\n" + teardown


def test_every_job_script_ends_its_process_with_exit_process():
    scripts = [os.path.join(ROOT, "jobs", f) for f in os.listdir(os.path.join(ROOT, "jobs")) if f[0] != "_"]
    entry_points = os.path.join(ROOT, "tank_spark", "entry_points")
    scripts += [os.path.join(entry_points, f) for f in os.listdir(entry_points) if f[0] != "_"]
    for script in scripts:
        with open(script) as f:
            assert "exit_process(main())" in f.read(), script
