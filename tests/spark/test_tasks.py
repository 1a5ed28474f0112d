"""tank_spark/tasks.py: work run in the driver's threads when no Spark starts (`in_threads`)."""

import threading
import time

import pytest

from tank_log.jobs.processes import usable_cpus
from tank_spark.tasks import driver_processes, in_threads

CPUS = usable_cpus()


def test_items_run_at_once_one_thread_per_cpu_and_come_back_in_order():
    parties = min(CPUS, 4)
    barrier = threading.Barrier(parties, timeout=10)  # sequential runs would break it: BrokenBarrierError
    threads = set()

    def task(it):
        for i, item in it:
            threads.add(threading.current_thread().name)
            if i < parties:
                barrier.wait()
            yield (i, item * 2)

    assert in_threads(list(range(9)), task, CPUS) == [(i, i * 2) for i in range(9)]
    if CPUS > 1:
        assert len(threads) == parties and all(t.startswith("tank-task") for t in threads)


def test_a_task_runs_once_per_thread_over_its_share_not_once_per_item():
    """A task's set-up (the import opens the table's dataset, whose cost grows with the table's files) is paid
    once per thread: once per item made the import in the driver grow with partitions × files."""
    calls = []

    def task(it):
        calls.append(threading.current_thread().name)
        for i, item in it:
            time.sleep(0.01)
            yield (i, item)
            yield (i, -item)

    items = list(range(1, 41))
    assert in_threads(items, task, 2) == [x for i, item in enumerate(items) for x in ((i, item), (i, -item))]
    assert len(calls) <= 2


def test_one_thread_runs_the_items_in_order_in_the_callers_thread():
    """`threads` = 1 (e.g. --master local[1]): no pool, the items one after another."""
    seen = []

    def task(it):
        for i, item in it:
            seen.append((i, threading.current_thread()))
            yield item

    assert in_threads(list("abc"), task, 1) == ["a", "b", "c"]
    assert seen == [(0, threading.current_thread()), (1, threading.current_thread()), (2, threading.current_thread())]


def test_an_error_cancels_the_items_not_started_and_waits_for_the_running_ones():
    started, finished = [], []

    def task(it):
        for i, _ in it:
            started.append(i)
            if i == 0:
                raise ValueError("bad range 0")
            time.sleep(0.2)
            finished.append(i)
            yield i

    with pytest.raises(ValueError, match="bad range 0"):
        in_threads(list(range(50)), task, CPUS)
    assert sorted(finished) == sorted(i for i in started if i != 0)  # nothing left running
    assert len(started) < 50  # the rest never started


@pytest.mark.parametrize(
    "master, processes",
    [
        ("local", 1),
        ("local[1]", 1),
        ("local[3]", 3),
        ("local[3,2]", 3),
        ("local[*]", usable_cpus()),
        ("local[*,4]", usable_cpus()),
        ("spark://127.0.0.1:7077", usable_cpus()),
        ("yarn", usable_cpus()),
    ],
)
def test_the_master_says_how_many_processes(master, processes):
    assert driver_processes(master) == processes
