""" "the broker is stopped" is verified, not trusted — with real processes holding a partition: a file open,
an index mapped, a command line naming the base path. Each makes the mutation skip the partition (even with
--broker-stopped) and leave every byte; dry runs report it and proceed; once the process exits, the job proceeds."""

import glob
import os
import subprocess
import sys

import pytest
from conftest import Detached, tree_digest

from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.maintenance.outcome import Status
from tank_log.storage.datadir import partitions_at
from tank_log.storage.holders import holders, partition_holders
from tank_log.tools.demo import write_demo

HOLD = {
    "open": "import os, time; f = open(os.environ['HOLD'], 'rb'); print('ready', flush=True); time.sleep(600)",
    "mmap": (  # mapped only: Python's mmap keeps a dup of the fd, closed here too
        "import mmap, os, time; t = os.environ['HOLD']; f = open(t, 'rb'); "
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); f.close(); "
        "[os.close(int(fd)) for fd in os.listdir('/proc/self/fd') if os.path.realpath(f'/proc/self/fd/{fd}') == t]; "
        "print('ready', flush=True); time.sleep(600)"
    ),
    "command": "import time; print('ready', flush=True); time.sleep(600)",
}


@pytest.fixture
def profiles0(tmp_path):
    base = write_demo(str(tmp_path / "demo"))
    return base, next(p for p in partitions_at(base, ["profiles"]) if p.id == 0)


def _start(kind, base, part):
    target = part.ro[0].path if kind == "open" else part.ro[0].index_path
    args = [sys.executable, "-c", HOLD[kind]] + (["-p", base] if kind == "command" else [])
    return Detached(args, dict(os.environ, HOLD=target))


@pytest.mark.parametrize("kind,how", [("open", "has "), ("mmap", "maps "), ("command", "names ")])
def test_a_process_holding_the_partition_makes_mutations_skip_it(profiles0, kind, how):
    base, part = profiles0
    before = tree_digest(part.path)
    proc = _start(kind, base, part)
    try:
        (held,) = partition_holders(part.path)
        assert held.pid == proc.pid and held.how.startswith(how) and sys.executable in held.command
        assert holders([os.path.join(base, "orders")]) == [] or kind == "command"  # only what it holds
        res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
        assert res.status == Status.SKIPPED and f"pid {proc.pid}" in res.reason and res.held_by
        assert tree_digest(part.path) == before
        dry = compact_partition(part, CompactionOptions(force=True, broker_stopped=True, dry_run=True))
        assert dry.status == Status.DRY_RUN and dry.held_by and f"pid {proc.pid}" in dry.held_by[0]
    finally:
        proc.kill()
    res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
    assert res.status == Status.COMPACTED and res.held_by is None


def test_repair_cli_skips_a_held_partition(profiles0, tmp_path):
    base, part = profiles0
    temp = os.path.join(part.path, ".x.tank-log-0123456789ab.tmp")  # repair would delete it
    open(temp, "w").close()
    proc = _start("open", base, part)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tank_log.tools.cli", "repair", part.path], capture_output=True, text=True
        )
        assert r.returncode == 1 and '"action": "skipped"' in r.stdout and f"pid {proc.pid}" in r.stdout
        assert os.path.exists(temp)
    finally:
        proc.kill()


def test_our_own_process_and_children_are_not_holders(profiles0):
    base, part = profiles0
    with open(part.ro[0].path, "rb"):
        assert partition_holders(part.path) == []  # this test process holds it: ours


def test_the_spark_driver_of_this_task_is_ours_on_its_host(profiles0):
    """A Spark driver on the executor's host names the base path on its command line (`--data-dir BASE`) and, in
    local mode, is the executors' ancestor; on a cluster it is not: the task tells its executor who sent it."""
    import socket

    from tank_log.storage.holders import also_ours

    base, part = profiles0
    driver = _start("command", base, part)  # stands for `spark-submit jobs/compact.py --data-dir BASE`
    try:
        assert [h.pid for h in partition_holders(part.path)] == [driver.pid]
        with also_ours(socket.gethostname(), driver.pid):
            assert partition_holders(part.path) == []
        with also_ours("another-host", driver.pid):  # a pid of another host means nothing here
            assert [h.pid for h in partition_holders(part.path)] == [driver.pid]
    finally:
        driver.kill()


def test_a_mapped_index_is_found_under_any_directory_name_and_only_there(tmp_path):
    """A base path with a newline in its name (`maps` writes it as `\\012`) still finds the process mapping one of
    its indexes; partition 1 is not held by a process mapping partition 10's index (the same leading characters)."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition

    base = str(tmp_path / "odd\nbase")
    msgs = [Message(s, 1_700_000_000_000 + s, b"k", b"v%d" % s) for s in range(1, 41)]
    for pid in (1, 10):
        write_partition(os.path.join(base, "t", str(pid)), msgs, segment_bytes=200)
    index10 = sorted(glob.glob(os.path.join(base, "t", "10", "*.index")))[0]
    proc = Detached([sys.executable, "-c", HOLD["mmap"]], dict(os.environ, HOLD=os.path.realpath(index10)))
    try:
        (held,) = partition_holders(os.path.join(base, "t", "10"))
        assert held.pid == proc.pid and held.how.startswith("maps ") and "\n" not in held.how
        assert partition_holders(os.path.join(base, "t", "1")) == []
    finally:
        proc.kill()
