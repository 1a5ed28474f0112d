""" "the broker is stopped" is verified, not trusted — with real processes holding a partition: a file open,
an index mapped, a command line naming the base path. Each makes the mutation skip the partition (even with
--broker-stopped) and leave every byte; dry runs report it and proceed; once the process exits, the job proceeds."""

import glob
import json
import os
import subprocess
import sys
import time

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


NO_ARGV = (  # execs Python with no arguments at all (argc 0): /proc/<pid>/cmdline is empty; it reads its script on fd 0
    "import ctypes, os, sys; fd = os.open(os.environ['BODY'], os.O_RDONLY); os.dup2(fd, 0); "
    "env = [f'{k}={v}'.encode() for k, v in os.environ.items()]; "
    "ctypes.CDLL(None).execve(sys.executable.encode(), (ctypes.c_char_p * 1)(None), "
    "(ctypes.c_char_p * (len(env) + 1))(*env, None))"
)


def _start_unnamed(part, tmp_path):
    """A process holding the partition's first RO segment open whose command line cannot be read."""
    body = tmp_path / "body.py"
    body.write_text(HOLD["open"])
    proc = Detached([sys.executable, "-c", NO_ARGV], dict(os.environ, HOLD=part.ro[0].path, BODY=str(body)))
    with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
        assert fh.read().strip(b"\0") == b""
    return proc


def test_a_holder_without_a_command_line_is_named_by_what_proc_says(profiles0, tmp_path, monkeypatch):
    """A live process that holds the partition and has no command line is a holder (it may write), watched for a
    while and then reported by its name and executable, never as a blank `pid N ()`."""
    from tank_log.storage import holders as module

    monkeypatch.setattr(module, "UNNAMED_WAIT_S", 0.3, raising=False)
    base, part = profiles0
    proc = _start_unnamed(part, tmp_path)
    try:
        (held,) = partition_holders(part.path)
        assert held.pid == proc.pid and held.how == f"has {part.ro[0].path} open" and not held.tank_log_run
        assert held.command.startswith("[python") and "without a command line" in held.command
        assert f"pid {proc.pid} ()" not in str(held)
        res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
        assert res.status == Status.SKIPPED and "without a command line" in res.reason
    finally:
        proc.kill()


def test_a_holder_that_exits_while_it_is_looked_at_is_not_a_holder(profiles0, tmp_path, monkeypatch):
    """A process that cannot be named when it is found holding the partition (the kernel drops an exiting process's
    command line before its descriptors) is looked at again: once it is gone it holds nothing, and the mutation
    proceeds (it is not the broker). Deterministic: the wait before the second look is where it exits."""
    from tank_log.storage import holders as module

    base, part = profiles0
    proc = _start_unnamed(part, tmp_path)
    waits = []

    def exits_meanwhile(seconds):
        waits.append(seconds)
        proc.kill()  # returns once it is a zombie or reaped

    monkeypatch.setattr(module, "_pause", exits_meanwhile, raising=False)
    try:
        assert partition_holders(part.path) == []
        assert len(waits) == 1
        res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
        assert res.status == Status.COMPACTED and res.held_by is None
    finally:
        proc.kill()


LEADER_EXITS = (  # the main thread exits, another keeps the file open: /proc/<pid> is a zombie's, the task's is not
    "import ctypes, os, threading, time; f = open(os.environ['HOLD'], 'rb'); "
    "threading.Thread(target=time.sleep, args=(600,)).start(); print('ready', flush=True); "
    "ctypes.CDLL(None).pthread_exit(None)"
)


def test_a_process_whose_main_thread_exited_still_holds_its_files(profiles0):
    """/proc/<pid>/fd and cmdline are empty when the main thread has exited; the files are under the live thread."""
    base, part = profiles0
    proc = Detached([sys.executable, "-c", LEADER_EXITS], dict(os.environ, HOLD=part.ro[0].path))
    try:
        (held,) = partition_holders(part.path)
        assert held.pid == proc.pid and held.how == f"has {part.ro[0].path} open"
        assert held.command.startswith(f"{sys.executable} -c import ctypes")
        res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
        assert res.status == Status.SKIPPED and f"pid {proc.pid}" in res.reason
    finally:
        proc.kill()


def test_one_scan_serves_many_partitions_and_sees_what_started_or_changed_since(tmp_path):
    """Checks of many partitions share one look at every process; a process started since is seen by the next
    check, and what a process that existed at the scan opened since is seen once the scan's age bound has passed."""
    from tank_log.storage import holders as module

    topic = tmp_path / "base" / "t"
    for pid in range(300):
        (topic / str(pid)).mkdir(parents=True)
    (topic / "7" / "1_1.ilog").write_bytes(b"")
    scans = []
    real = module._Scan.__init__

    def counted(self):
        scans.append(1)
        real(self)

    module._scan = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module._Scan, "__init__", counted)
        t0 = time.monotonic()
        assert all(partition_holders(topic / str(p)) == [] for p in range(300))
        assert len(scans) <= 1 + (time.monotonic() - t0) / module.RESCAN_S
    opener = (  # opens the file once told to (a file appears), after the scan has seen it holding nothing
        "import os, time; e = os.environ; print('ready', flush=True)\n"
        "while not os.path.exists(e['GO']): time.sleep(0.01)\n"
        "f = open(e['HOLD'], 'rb'); open(e['GO'] + '.done', 'w').close(); time.sleep(600)"
    )
    target, go = str(topic / "7" / "1_1.ilog"), str(tmp_path / "go")
    existing = Detached([sys.executable, "-c", opener], dict(os.environ, HOLD=target, GO=go))
    assert partition_holders(topic / "7") == []  # a fresh scan: it exists and holds nothing
    late = Detached([sys.executable, "-c", HOLD["open"]], dict(os.environ, HOLD=target))  # started after the scan
    try:
        assert [h.pid for h in partition_holders(topic / "7")] == [late.pid]  # seen by the next check
        scan = module._scan
        open(go, "w").close()
        while not os.path.exists(go + ".done"):
            time.sleep(0.01)
        time.sleep(max(0.0, scan.taken + scan.max_age - time.monotonic()) + 0.05)
        assert sorted(h.pid for h in partition_holders(topic / "7")) == sorted([late.pid, existing.pid])
    finally:
        late.kill()
        existing.kill()


KILLS_ON_SECOND_LOOK = """
import os, sys, time
from tank_log.storage import holders
def exits_meanwhile(seconds):  # the holder exits while the run waits to look at it again
    os.kill(int(os.environ["VICTIM"]), 9)
    fds = f"/proc/{os.environ['VICTIM']}/fd"
    while os.path.isdir(fds) and os.listdir(fds):  # until it has closed its files (a zombie) or is gone
        time.sleep(0.01)
holders._pause = exits_meanwhile
from tank_log.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_that_meets_an_exiting_holder_it_cannot_name_is_not_told_to_stop_the_broker(tmp_path):
    """What a second run of ours met on a loaded machine: a process of the first run, exiting, still had a file of
    the partition open but no command line (`pid N ()`); the run skipped the partition and exited 3, telling the
    operator to stop the broker. It looks again; the process is gone; the partition is compacted; exit 0."""
    from conftest import many_small_partitions

    from tank_log.storage.datadir import partitions_at

    base = many_small_partitions(tmp_path / "base", 2)
    part = next(p for p in partitions_at(base) if p.id == 0)
    proc = _start_unnamed(part, tmp_path)
    try:
        r = subprocess.run(
            [sys.executable, "-c", KILLS_ON_SECOND_LOOK, "compact", base, "--broker-stopped", "--processes", "1"],
            capture_output=True, text=True, timeout=300, env=dict(os.environ, VICTIM=str(proc.pid)),
        )  # fmt: skip
    finally:
        proc.kill()
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "stop the broker" not in r.stdout + r.stderr
    entries = {e["partition"]: e for e in map(json.loads, r.stdout.splitlines())}
    assert entries[0]["status"] == entries[1]["status"] == "compacted" and not entries[0]["held_by"]


EXECS_LATER = (  # a fork's child before it execs the broker: here, a process that execs when told to (a file appears)
    "import os, sys, time; e = os.environ; print('ready', flush=True)\n"
    "while not os.path.exists(e['GO']): time.sleep(0.01)\n"
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', '-p', e['BASE']])"
)


def test_a_young_process_that_execs_the_broker_after_the_scan_is_seen_by_the_next_check(profiles0, tmp_path):
    """A process the scan saw before it exec'd (`tank -p BASE` is started so) is seen by the next check, without
    waiting for the scan to be renewed."""
    from tank_log.storage import holders as module

    base, part = profiles0
    go = str(tmp_path / "go")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "RESCAN_S", 600.0)  # the scan stays: only the second look at young processes can see it
        mp.setattr(module, "SETTLE_S", 600.0)  # young however slowly the machine started it
        module._scan = None
        proc = Detached([sys.executable, "-c", EXECS_LATER], dict(os.environ, GO=go, BASE=base))
        try:
            assert partition_holders(part.path) == []
            open(go, "w").close()
            while b"-p" not in open(f"/proc/{proc.pid}/cmdline", "rb").read():
                time.sleep(0.01)
            time.sleep(module.NEW_S)
            (held,) = partition_holders(part.path)
            assert held.pid == proc.pid and held.how == f"names {os.path.realpath(base)} on its command line"
        finally:
            proc.kill()
            module._scan = None


def test_a_partition_held_only_by_exiting_processes_does_not_ask_to_stop_the_broker():
    from tank_log.storage.holders import Holder, held_reason

    exiting = Holder(
        7, "[python3] /usr/bin/python3.11 without a command line: exiting", "has /b/t/0/1.ilog open", False, True
    )
    broker = Holder(8, "tank -p /b", "names /b on its command line")
    assert held_reason([exiting]).startswith("held by a process that is exiting (its files go when it ends")
    assert "stop the broker" not in held_reason([exiting])
    assert held_reason([exiting, broker]) == f"held by another process (stop the broker first, §9 rule 1): {broker}"


def test_a_forked_child_checks_with_a_scan_and_a_lock_of_its_own(tmp_path):
    """A worker forked while another thread of the driver was inside a check neither waits for a lock nobody in it
    holds nor takes its parent's family for its own."""
    import signal

    from tank_log.storage import holders as module

    partition_holders(tmp_path)
    with module._scan_lock:  # held by "another thread" while the fork happens
        pid = os.fork()
        if pid == 0:  # the child
            signal.alarm(30)
            ok = partition_holders(tmp_path) == [] and module._scan.owner == os.getpid()
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
