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


HANDLER_AT_FIRST_HEAVY_IMPORT = """
import runpy, signal, sys
seen = {}

def hook(event, args):  # the SIGTERM handler in place when the job's modules start to load
    if event == "import" and args[0] in ("tank_log.jobs.exits", "tank_spark.runner") and args[0] not in seen:
        seen[args[0]] = signal.getsignal(signal.SIGTERM)

sys.addaudithook(hook)
how, target = sys.argv[1:3]
sys.argv = [target, "--help"]
try:
    if how == "path":
        sys.path.insert(0, target.rsplit("/", 1)[0])
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print({k: getattr(v, "__qualname__", str(v)) for k, v in seen.items()}, file=sys.stderr)
"""


def _job_scripts():
    jobs = os.path.join(ROOT, "jobs")
    scripts = [("path", os.path.join(jobs, f)) for f in sorted(os.listdir(jobs)) if f[0] != "_"]
    entry_points = os.path.join(ROOT, "tank_spark", "entry_points")
    names = sorted(f[:-3] for f in os.listdir(entry_points) if f[0] != "_" and f.endswith(".py"))
    return scripts + [("module", f"tank_spark.entry_points.{n}") for n in names]


@pytest.mark.parametrize(("how", "target"), _job_scripts(), ids=lambda x: os.path.basename(str(x)))
def test_every_job_handles_a_stop_from_its_first_instant(how, target):
    """A job's SIGTERM handler is in place before the job loads its modules (it was installed only after the
    command line and the plan, ~2 s in: a stop then killed the process by the signal, exit 143, nothing said)."""
    r = subprocess.run(
        [sys.executable, "-c", HANDLER_AT_FIRST_HEAVY_IMPORT, how, target],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    seen = eval(r.stderr.strip().splitlines()[-1])  # noqa: S307 (our own repr of a dict of names)
    assert seen, r.stderr[-3000:]
    assert all("stop_while_starting" in v or v == "on_sigterm" for v in seen.values()), seen


def _sigterm_caught(pid) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        caught = next(int(x.split()[1], 16) for x in fh if x.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_stop_in_a_jobs_first_seconds_exits_130_with_a_line(tmp_path, delay):
    """SIGTERM at any point of a job's start (as soon as its interpreter runs the script, while it imports, parses
    and plans, or once its partitions run): exit 130 and one line saying it was interrupted, no traceback (it was 143
    and nothing). A stop that lands once partitions run is followed by the list of those that finished."""
    from tank_log.tools.demo import write_demo

    base = write_demo(str(tmp_path / "demo"))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "compact.py"), "--data-dir", base, "--dry-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    while not _sigterm_caught(proc.pid):  # the script's first statements ran
        assert proc.poll() is None
    if delay:
        import time

        time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    said = [line for line in err.strip().splitlines() if line.startswith("compact: interrupted")]
    assert "Traceback" not in err and len(said) == 1, err[-3000:]


STOPPED_WHILE_PLANNING = """
import os, signal, sys, time
from tank_spark.runner import run_job

def prepare(ctx, args):
    os.kill(os.getpid(), signal.SIGTERM)  # an orchestrator's stop while the job reads its config and plans
    time.sleep(30)
    raise AssertionError("not stopped")

sys.exit(run_job("plan-stop", "a job stopped while it plans", lambda p: None, prepare, lambda c, p, s: ([], {})))
"""


def test_a_stop_while_a_job_plans_is_an_interruption_not_a_crash(tmp_path):
    """SIGTERM while the run reads its options and plans (before its partitions run): exit 130, one line, the report
    written, no traceback."""
    from tank_log.tools.demo import write_demo

    base = write_demo(str(tmp_path / "demo"))
    report_path = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_PLANNING, "--data-dir", base, "--report", str(report_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 130, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "plan-stop: interrupted" in r.stderr.strip().splitlines()[-1]
    report = json.loads(report_path.read_text())
    assert report["status"] == "interrupted" and report["partitions"] == []
