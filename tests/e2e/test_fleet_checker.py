"""The fleet soak's own measurements (bench/fleet.py): a checker that misreads is worse than none."""

import os
import subprocess
import sys
import time

from conftest import load_fleet

CHILD = "import time; b = bytearray({mb} << 20); b[::4096] = b'\\1' * len(b[::4096]); time.sleep(0.6)"


def test_a_runs_peak_rss_is_its_own_not_the_soaks():
    """wait4's ru_maxrss of a child started by a large process reads as large as that process (Linux counts the
    address space before the exec): the soak, whose checker had grown to 907 MiB, flagged every small run of a night
    as past its bound. The peak is the run's own tree's, within a few MiB either way."""
    fleet = load_fleet()
    grown = bytearray(600 << 20)
    grown[::4096] = b"\1" * len(grown[::4096])
    del grown
    assert fleet._hwm_kib(os.getpid()) > 600 << 10

    out = {}
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD.format(mb=150)!r}])"
    for mb, code in ((20, CHILD.format(mb=20)), (200, CHILD.format(mb=200)), (150, grandchild)):
        ran = fleet.Ran("x", "h", [], spawner_hwm_kib=fleet._hwm_kib(os.getpid()))
        proc = subprocess.Popen([sys.executable, "-c", code])
        while True:
            pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            ran.sampled_kib = max(ran.sampled_kib, fleet._tree_hwm_kib(proc.pid))
            time.sleep(0.05)
        assert usage.ru_maxrss > 600 << 10  # what the soak read before
        out[mb] = fleet._peak_rss_kib(ran, usage.ru_maxrss) >> 10
    assert all(mb <= peak < mb + 60 for mb, peak in out.items()), out  # 150: a grandchild's, its parent is small
