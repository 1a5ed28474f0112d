"""Two runs of ours on one base path coordinate through the partition lock: the second waits for nothing it does
not need, skips what the first holds (exit 0, "another tank-log run (pid N) holds it"), never exits 3 and never
tells the user to stop the broker; no lock file stays behind (storage/locking.py, storage/holders.py)."""

import json
import os
import subprocess
import sys
import threading

import pytest
from conftest import Detached, many_small_partitions

from tank_log.storage.locking import LOCK_NAME, PartitionLock

CLI = [sys.executable, "-m", "tank_log.tools.cli"]

HOLD = """
import sys, time
from tank_log.storage.locking import PartitionLock
with PartitionLock(sys.argv[2], "test-holder"):  # its command line names the base path, as a job's does
    print("ready", flush=True)
    sys.stdin.read()
"""


def _leftovers(base):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(base) for f in files if f.startswith(".tank-log"))


def test_a_partition_another_run_of_ours_holds_is_skipped_with_exit_0(tmp_path):
    base = many_small_partitions(tmp_path / "base", 3)
    held = os.path.join(base, "kv", "0")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, base, held], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run([*CLI, "compact", base, "--broker-stopped"], capture_output=True, text=True, timeout=300)
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stop the broker" not in r.stdout + r.stderr
    entries = {e["partition"]: e for e in map(json.loads, r.stdout.splitlines())}
    assert entries[0]["status"] == "skipped" and not entries[0]["held_by"]
    assert entries[0]["reason"] == f"locked: another tank-log run (pid {holder.pid}, test-holder) holds it"
    assert entries[1]["status"] == entries[2]["status"] == "compacted"
    assert _leftovers(base) == []


@pytest.mark.slow
@pytest.mark.parametrize("verbs", [("compact", "compact"), ("maintain", "maintain"), ("maintain", "compact")])
def test_two_runs_on_one_base_path_both_succeed(tmp_path, verbs):
    for attempt in range(3):
        base = many_small_partitions(tmp_path / f"base{attempt}", 4)
        runs = [
            subprocess.Popen(
                [*CLI, verb, base, "--broker-stopped", "--force", "--processes", "2"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for verb in verbs
        ]
        outs = [(p.communicate(timeout=300), p.returncode) for p in runs]
        for (out, err), code in outs:
            assert code == 0, err[-3000:]
            assert "stop the broker" not in out + err
        statuses = [
            {e["partition"]: e["status"] for e in map(json.loads, out.splitlines()) if "partition" in e}
            for (out, _), _ in outs
        ]
        for p in range(4):  # each partition was compacted (maintained) by one of them
            assert {s[p] for s in statuses} & {"compacted", "maintained"}, statuses
        assert _leftovers(base) == []


def test_a_process_holding_a_run_marker_is_another_run_not_the_broker(tmp_path):
    from tank_log.storage.holders import held_reason, partition_holders

    base = many_small_partitions(tmp_path / "base", 1)
    code = "import sys, time\nfrom tank_log.storage.locking import run_marker\nwith run_marker([sys.argv[1]]):\n"
    code += "    print('ready', flush=True)\n    time.sleep(60)\n"
    p = Detached([sys.executable, "-c", code, base], os.environ)  # not our child: ours are never holders
    try:
        held = partition_holders(os.path.join(base, "kv", "0"))
        assert [(h.pid, h.tank_log_run) for h in held] == [(p.pid, True)]
        assert held_reason(held) == f"another tank-log run (pid {p.pid}) holds it"
        assert _leftovers(base) == []  # the marker is unlinked at once
    finally:
        p.kill()


def test_the_lock_file_goes_with_its_last_holder_and_a_waiter_relocks_the_new_one(tmp_path):
    first = PartitionLock(tmp_path).acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(PartitionLock(tmp_path, blocking=True).acquire()))
    waiter.start()
    threading.Event().wait(0.2)  # the waiter opened the file and blocks on it
    first.release()
    waiter.join(10)
    lock = got[0]
    assert os.fstat(lock._fd).st_ino == os.stat(tmp_path / LOCK_NAME).st_ino  # the file at the path, not the old one
    with pytest.raises(Exception, match="another tank-log run"):
        PartitionLock(tmp_path).acquire()
    lock.release()
    assert not os.path.exists(tmp_path / LOCK_NAME)


def test_a_hold_lets_its_own_steps_lock_the_partition_and_nobody_else(tmp_path):
    from tank_log.storage.locking import holding

    with holding(tmp_path, "maintain"):
        with PartitionLock(tmp_path, "compact"):  # a step of the holding run, same thread: passes through
            assert os.path.exists(tmp_path / LOCK_NAME)
        assert os.path.exists(tmp_path / LOCK_NAME)  # the step's end does not let go of the hold
        errors = []
        t = threading.Thread(target=lambda: errors.append(_try_lock(tmp_path)))
        t.start()
        t.join(10)
        assert errors and "another tank-log run" in errors[0] and "maintain" in errors[0]
    assert not os.path.exists(tmp_path / LOCK_NAME)
    PartitionLock(tmp_path).acquire().release()  # free again


def _try_lock(path) -> str:
    try:
        PartitionLock(path).acquire().release()
        return "acquired"
    except Exception as err:
        return str(err)
