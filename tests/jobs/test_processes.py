"""tank_log/jobs/processes.py: a plan's tasks in local (forked, real) worker processes."""

import os
import signal
import threading
import time
from dataclasses import dataclass

import pytest
from conftest import signal_thread

from tank_log.errors import RunFailed
from tank_log.jobs.processes import run_in_processes
from tank_log.jobs.stopping import Interrupted


@dataclass(frozen=True)
class Item:
    """Stands for a PartitionTask (what `interrupted_entry` reads)."""

    partition: int
    topic: str = "t"
    path: str = "/nowhere"
    base_path: str = "/"


def where_it_ran(item: Item) -> dict:
    time.sleep(0.05)
    return {"partition": item.partition, "status": "ok", "pid": os.getpid(), "ignores": _ignored_signals()}


def _ignored_signals() -> list[str]:
    return [s.name for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is signal.SIG_IGN]


def fails_on_3(item: Item) -> dict:
    if item.partition == 3:
        raise ValueError("bad partition 3")
    return where_it_ran(item)


def dies_on_2(item: Item) -> dict:
    if item.partition == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return where_it_ran(item)


def test_results_come_back_in_order_from_as_many_worker_processes_as_asked():
    items = [Item(i) for i in range(9)]
    seen = []
    results = run_in_processes(items, 2, where_it_ran, on_finished=seen.append)
    assert sorted(r["partition"] for r in seen) == list(range(9))  # each as it finished
    assert [r["partition"] for r in results] == list(range(9))
    pids = {r["pid"] for r in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(r["ignores"] == ["SIGINT", "SIGTERM"] for r in results)  # only the driver decides when to stop
    assert run_in_processes([], 2, where_it_ran) == []


def test_a_task_error_fails_the_run():
    with pytest.raises(ValueError, match="bad partition 3"):
        run_in_processes([Item(i) for i in range(6)], 2, fails_on_3)


def test_a_worker_that_dies_fails_the_run_with_a_clear_error_and_no_hang():
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match="a process of the driver's pool died while running partitions"):
        run_in_processes([Item(i) for i in range(6)], 2, dies_on_2)
    assert time.monotonic() - t0 < 30


def signals_the_driver_then_waits_for_its_stop(item: Item) -> dict:
    """The first partition sends the driver's main thread SIGINT once it runs (the signal comes while a partition
    is running, whatever the machine's speed), then runs on until the driver has stopped the run (a worker sees the
    stop at once: `processes._stop`); any other partition that starts leaves a mark in `item.path`."""
    from tank_log.jobs import processes

    if item.partition == 0:
        signal_thread(os.getppid(), os.getppid(), signal.SIGINT)  # the pool forks its workers from the driver
        deadline = time.monotonic() + 120  # bounds a hang only
        while not processes._stop.is_set():
            assert time.monotonic() < deadline, "the driver never stopped the run"
            time.sleep(0.01)
    else:
        open(os.path.join(item.path, f"started-{item.partition}"), "w").close()
    return where_it_ran(item)


def test_ctrl_c_drains_the_running_partition_and_starts_no_new_one(tmp_path):
    """SIGINT to the driver's main thread while the first partition runs: it finishes, the others are reported
    interrupted, and none of them started."""
    items = [Item(i, path=str(tmp_path)) for i in range(8)]
    with pytest.raises(Interrupted) as stop:
        run_in_processes(items, 1, signals_the_driver_then_waits_for_its_stop)
    statuses = [r["status"] for r in stop.value.results]
    assert statuses == ["ok"] + ["interrupted"] * 7, statuses  # the one running at the signal finished
    assert os.listdir(tmp_path) == []  # the queued partitions did not run


def test_a_task_under_the_hold_waits_there_until_the_hold_is_removed(tmp_path, monkeypatch):
    """The test hook `TANK_LOG_TASK_HOLD`: a task on a partition under the directory the hold file names announces
    PATH.ready and waits while the file exists; the others do not wait."""
    hold = str(tmp_path / "hold")
    with open(hold, "w") as fh:
        fh.write(str(tmp_path / "held"))
    monkeypatch.setenv("TANK_LOG_TASK_HOLD", hold)
    seen_held = []

    def release() -> None:
        deadline = time.monotonic() + 60  # bounds a hang only
        while not os.path.exists(hold + ".ready") and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_held.append(os.path.exists(hold + ".ready"))
        os.unlink(hold)

    releaser = threading.Thread(target=release)
    releaser.start()
    items = [Item(0, path=str(tmp_path / "free" / "t" / "0")), Item(1, path=str(tmp_path / "held" / "t" / "1"))]
    results = run_in_processes(items, 1, where_it_ran)
    releaser.join()
    assert [r["status"] for r in results] == ["ok", "ok"] and seen_held == [True]
