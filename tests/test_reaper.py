"""A test run leaves no process behind, even when pytest itself is SIGKILLed (tests/reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import HERE

INNER = """
import subprocess, time

def test_leaves_a_detached_process(tmp_path_factory):
    child = subprocess.Popen(["setsid", "sleep", "300"])  # its own session: no process group kill reaches it
    open({pidfile!r} + ".tmp", "w").write(str(child.pid))
    __import__("os").rename({pidfile!r} + ".tmp", {pidfile!r})
    time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sigkilled_run_leaves_no_process(tmp_path):
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
    child = int(open(pidfile).read())
    assert alive(child)
    run.send_signal(signal.SIGKILL)
    _, err = run.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        raise AssertionError(f"process {child} outlived its SIGKILLed test run")
    assert f"ended 1 processes the test run left: {child} sleep 300" in err.decode(), err.decode()[-2000:]
