"""Ends every process a test run started once the run is gone, however it ended (SIGKILL included).

tests/conftest.py starts this script when pytest starts, with pytest's pid and a marker that it puts in the
environment every process started by the tests inherits (`TANK_LOG_TEST_RUN`). The script waits until pytest has
exited, then SIGKILLs every process that still carries the marker: Airflow's services, brokers started through
`setsid`, Spark JVMs, job subprocesses — whatever their session, process group or parent. It prints one line naming
what it ended, on pytest's standard error. Then it removes the run's scratch directory, where the JVMs it ended (and
others) left their temporary files.

    python tests/reaper.py PYTEST_PID MARKER SCRATCH_DIR
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

ENV = "TANK_LOG_TEST_RUN"
GRACE_S = 5.0  # what ends by itself once pytest is gone (a Spark gateway JVM reading its closed stdin) is not reaped


def marked(marker: str) -> dict[int, str]:
    """The live processes (not zombies) whose environment carries `ENV=marker`: pid → command line."""
    needle = f"{ENV}={marker}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                found[int(name)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
        except OSError:  # gone, or not ours to read
            continue
    return found


def reap(marker: str, rounds: int = 20) -> dict[int, str]:
    """SIGKILL the marked processes until none is left (a process may fork while its siblings die); what was ended."""
    ended: dict[int, str] = {}
    for _ in range(rounds):
        left = marked(marker)
        if not left:
            break
        for pid, command in left.items():
            try:
                os.kill(pid, signal.SIGKILL)
                ended[pid] = command
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    return ended


def main(argv: list[str]) -> int:
    parent, marker, scratch = int(argv[1]), argv[2], argv[3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the run reaches its process group: outlive it
    while os.getppid() == parent:  # re-parented once pytest has exited, however it exited
        time.sleep(0.5)
    deadline = time.monotonic() + GRACE_S
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = reap(marker)
    shutil.rmtree(scratch, ignore_errors=True)  # once nothing of the run can write there any more
    if ended:
        names = ", ".join(f"{pid} {command}" for pid, command in sorted(ended.items())[:8])
        more = f" and {len(ended) - 8} more" if len(ended) > 8 else ""
        print(f"tests/reaper.py: ended {len(ended)} processes the test run left: {names}{more}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
