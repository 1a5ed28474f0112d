"""The partition jobs' tasks in the driver's own processes, without Spark, when their partitions are small.

Spark costs seconds before a partition is touched and after the last: the JVM, the first job's Python workers, the
stop (5-7 s of a run on this project's bench host, against ~0.5 s to compact a 107 MB partition; bench/RESULTS.md).
The data of a partition job is on the driver's host anyway (`build_context` checks its data dirs), so a run whose
partitions hold at most `in_driver_max_bytes` of segment data (the job config's top-level key, or
`--in-driver-max-bytes`; 0 = always Spark) runs its tasks in a pool of forked processes instead, one per core the
master allows (`local[N]`: N; `local[*]` and cluster masters: the CPUs this process may use).

It behaves as `runner.run_on_executors` does: results in plan order, a progress line per partition as it finishes,
the driver's family counted as ours by the holder check, and on Ctrl-C/SIGTERM the drain of `stopping`. The workers
ignore both signals (a terminal's Ctrl-C reaches the whole process group), so only the driver decides: it starts no
new partition and waits for the running ones, then kills them after the grace period. A task's exception, or a
worker that dies, fails the run as a failed Spark task does.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import socket
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tank_log.errors import RunFailed
from tank_log.jobs.planning import PartitionTask, run_task
from tank_log.jobs.progress import Progress, interrupted_entry
from tank_log.storage.datadir import partitions_at
from tank_log.storage.holders import also_ours
from tank_spark.stopping import Interrupted, drain, sigint_raises
from tank_spark.tasks import usable_cpus

log = logging.getLogger("tank_log.job")

_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")  # local, local[N], local[*], local[N,F], local[*,F]


def driver_processes(master: str) -> int:
    """How many processes run a job's tasks in the driver: the cores of a local master, else this host's CPUs."""
    m = _LOCAL.match(master.strip())
    if m and m.group(1) and m.group(1) != "*":
        return max(1, int(m.group(1)))
    if m and not m.group(1):  # plain `local`: one core
        return 1
    return usable_cpus()


def segment_bytes(tasks: list[PartitionTask], limit: int) -> int | None:
    """The segment data (logs, RO and active) of the tasks' partitions, or None once it passes `limit`."""
    total = 0
    for task in tasks:
        for part in partitions_at(task.path):
            total += sum(s.size for s in part.segments)
        if total > limit:
            return None
    return total


def run_in_driver(
    tasks: list[Any], processes: int, fn: Callable[[Any], dict] = run_task, what: str = "partitions"
) -> list[dict]:
    """`fn(task)` for every task (by default `PartitionTask.run`) in `processes` forked workers; results in order.

    Raises:
        Interrupted: Ctrl-C/SIGTERM; it holds what finished and `interrupted` entries for the rest.
    """
    if not tasks:
        return []
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(
        max(1, min(processes, len(tasks))),
        mp_context=context,
        initializer=_start_worker,
        initargs=(stop, (socket.gethostname(), os.getpid())),
    )
    results: dict[int, dict] = {}
    try:
        # every worker forks at the first submit, before the progress bar's thread exists
        futures: dict[Future, int] = {pool.submit(_run, fn, task): i for i, task in enumerate(tasks)}
        with Progress(what, len(tasks)) as progress, sigint_raises():
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for f in sorted(done, key=futures.__getitem__):
                        results[futures[f]] = r = _result(f, what)
                        progress.finished(r)
            except KeyboardInterrupt:
                stop.set()  # the workers start no new task
                for f in pending:
                    f.cancel()
                running = [f for f in pending if not f.cancelled()]
                if not drain(lambda timeout: not wait(running, timeout).not_done):
                    _kill_workers(pool)
                for f in running:
                    if f.done() and not f.cancelled() and f.exception() is None:
                        results[futures[f]] = r = f.result()
                        progress.finished(r)
                raise Interrupted([results.get(i) or interrupted_entry(t) for i, t in enumerate(tasks)]) from None
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # running partitions finish (or were killed above)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(len(tasks))]


def _result(f: Future, what: str) -> dict:
    """A finished task's entry.

    Raises:
        RunFailed: a worker died (a crash, the kernel's OOM killer): the pool is lost, as a job whose Spark task
            failed is.
    """
    try:
        return f.result()
    except BrokenProcessPool:
        raise RunFailed(
            f"a process of the driver's pool died while running {what}; what it was changing is crash-safe (the "
            "next run repairs it)"
        ) from None


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL the pool's workers (crash-safe: the next run's repair completes or undoes a partition cut short).
    `_processes` is the executor's table of its workers; the public API has no way to stop a running call."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()


_stop: Any = None  # the run's stop Event, in each worker
_driver: tuple[str, int] = ("", 0)


def _start_worker(stop: Any, driver: tuple[str, int]) -> None:
    global _stop, _driver
    _stop, _driver = stop, driver
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver drains; a worker never dies mid-partition on a signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _run(fn: Callable[[Any], dict], task: Any) -> dict:
    if _stop.is_set():  # queued before the stop: not started
        return interrupted_entry(task)
    with also_ours(*_driver):  # the driver (its command line names the base path) and its family are not holders
        return fn(task)
