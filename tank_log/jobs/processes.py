"""A plan's partition tasks in a pool of local worker processes: the Spark jobs' small runs (`in_driver_max_bytes`,
tank_spark/runner.py) and `tank-log compact`/`maintain`.

Forked workers (spawned where the OS has no fork) run `PartitionTask.run` and send back report entries, which come
back in plan order; `on_finished` sees each one as it arrives (progress lines, the CLI's JSON lines). It behaves as a
Spark run does: the caller's process family counts as ours in the holder check, and on Ctrl-C/SIGTERM the run
drains (`stopping`). The workers ignore both signals (a terminal's Ctrl-C reaches the whole process group), so only
the caller decides: no new partition starts, the running ones finish, and are killed after the grace period
(crash-safe). A task's exception, or a worker that dies, fails the run as a failed Spark task does. A worker never
outlives the process that started the pool: when that one dies, even by SIGKILL (an orchestrator's timeout, the OOM
killer), its workers are killed too (`exit_with_parent`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tank_log.errors import RunFailed
from tank_log.jobs.planning import run_task
from tank_log.jobs.progress import Progress, interrupted_entry
from tank_log.jobs.stopping import Interrupted, drain, handling
from tank_log.storage.holders import also_ours


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_in_processes(
    tasks: Sequence[Any],
    processes: int,
    fn: Callable[[Any], dict[str, Any]] = run_task,
    what: str = "partitions",
    on_finished: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """`fn(task)` for every task (by default `PartitionTask.run`) in up to `processes` workers; entries in order.

    Raises:
        Interrupted: Ctrl-C/SIGTERM; it holds what finished and `interrupted` entries for the rest.
        RunFailed: a worker died.
    """
    if not tasks:
        return []
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(
        max(1, min(processes, len(tasks))),
        mp_context=context,
        initializer=_start_worker,
        initargs=(stop, (socket.gethostname(), os.getpid()), os.getpid()),
    )
    results: dict[int, dict[str, Any]] = {}
    signals = _StopSignals()
    try:
        with signals.counted():
            # every worker forks at the first submit, before the progress bar's thread exists
            futures = {pool.submit(_run, fn, task): i for i, task in enumerate(tasks)}
            with Progress(what, len(tasks)) as progress:

                def finished(f: Future[dict[str, Any]]) -> None:
                    results[futures[f]] = r = _result(f, what)
                    progress.finished(r)
                    if on_finished:
                        on_finished(r)

                pending = set(futures)
                while pending and not signals.count:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for f in sorted(done, key=futures.__getitem__):
                        finished(f)
                if pending:  # Ctrl-C or SIGTERM: drain
                    stop.set()  # the workers start no new task
                    for f in pending:
                        f.cancel()
                    running = [f for f in pending if not f.cancelled()]
                    if not drain(lambda timeout: signals.finished_within(running, timeout)):
                        _kill_workers(pool)
                    for f in running:
                        if f.done() and f.exception() is None:
                            finished(f)
                    raise Interrupted([results.get(i) or interrupted_entry(t) for i, t in enumerate(tasks)])
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # running partitions finish (or were killed above)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(len(tasks))]


class _StopSignals:
    """SIGINT and SIGTERM counted while a run waits for its workers, not raised: an exception a signal handler raises
    inside `concurrent.futures.wait`, which takes every future's lock in turn, can leave one held, and the pool's
    thread then hangs on it (found by the CLI's Ctrl-C test)."""

    def __init__(self) -> None:
        self.count = 0

    def _handler(self, signum: int, frame: Any) -> None:
        self.count += 1

    def counted(self) -> contextlib.AbstractContextManager[None]:
        return handling(self._handler, signal.SIGINT, signal.SIGTERM)

    def finished_within(self, fs: list[Future[dict[str, Any]]], timeout: float) -> bool:
        """Whether `fs` finish within `timeout`; False at once when another signal comes (cancel them now)."""
        seen, deadline = self.count, time.monotonic() + timeout
        while self.count == seen and time.monotonic() < deadline:
            if not wait(fs, timeout=0.2).not_done:
                return True
        return False


def _result(f: Future[dict[str, Any]], what: str) -> dict[str, Any]:
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


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that forked it exits
PARENT_POLL_S = 0.5  # where the OS has no parent-death signal, how often a worker checks that its parent lives


def killed_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux `PR_SET_PDEATHSIG`, kept across exec: also
    a `preexec_fn` for a child such as spark-submit). The parent is the thread that forked this process: it must
    outlive the child's useful life. False where the OS has no such signal."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)


def exit_with_parent(parent: int) -> None:
    """Make this process die when `parent` dies, whatever kills it: SIGKILL on Linux (`killed_with_parent`; the pool
    forks its workers from the thread that runs it, which outlives them), elsewhere a thread polling the parent pid.
    A parent already gone before this call is caught too. A worker or driver killed mid-partition is crash-safe: the
    next run repairs the partition."""
    if not killed_with_parent():
        _watch_parent(parent)  # no parent-death signal here (or a sandbox refused it): poll instead
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _start_worker(stop: Any, driver: tuple[str, int], parent: int) -> None:
    global _stop, _driver
    _stop, _driver = stop, driver
    exit_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver drains; a worker never dies mid-partition on a signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


HOLD = "TANK_LOG_TASK_HOLD"  # test hook, PATH: while the file PATH exists, a task on a partition under the directory
# it names announces PATH.ready and waits (at most 5 minutes): a test stops or kills a run at a known point


def _hold(task: Any) -> None:
    path = os.environ.get(HOLD)
    if not path:
        return
    try:
        with open(path) as fh:
            under = fh.read().strip()
    except FileNotFoundError:
        return
    if not under or not str(getattr(task, "path", "")).startswith(under.rstrip(os.sep) + os.sep):
        return
    open(path + ".ready", "w").close()
    deadline = time.monotonic() + 300
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)


def _run(fn: Callable[[Any], dict[str, Any]], task: Any) -> dict[str, Any]:
    if _stop.is_set():  # queued before the stop: not started
        return interrupted_entry(task)
    _hold(task)
    with also_ours(*_driver):  # the driver (its command line names the base path) and its family are not holders
        return fn(task)
