"""How a job's run stops when it is told to (Ctrl-C, an orchestrator's SIGTERM): it drains. No new partition starts,
the running ones finish within `STOP_GRACE_S` (a second Ctrl-C cuts that short; cut partitions are crash-safe and
the next run repairs them), and `Interrupted` carries the report entry of every task. The same whether the tasks run
on Spark's executors (tank_spark's `runner.run_on_executors`) or in local processes (`processes.run_in_processes`: a
Spark job's small run, the CLI)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from tank_log.errors import TankLogError

log = logging.getLogger("tank_log.job")

STOP_GRACE_S = 60.0  # after Ctrl-C/SIGTERM, how long running partitions may finish before they are cancelled


class Interrupted(TankLogError):
    """The run was stopped (SIGINT, SIGTERM) while partitions ran: `results` has the report entry of every task —
    what finished, and `interrupted` entries for the rest."""

    def __init__(self, results: list[dict[str, Any]]):
        super().__init__(f"interrupted with {sum(r['status'] != 'interrupted' for r in results)} partitions done")
        self.results = results


class Terminated(KeyboardInterrupt):
    """SIGTERM (an orchestrator stopping the run), handled like Ctrl-C."""


def on_sigterm(signum: int, frame: Any) -> None:
    """The driver's SIGTERM handler: raise `Terminated` in the main thread, where the run waits for its tasks."""
    raise Terminated()


def stop_while_starting(job: str) -> None:
    """A job process's signal handling from its first instant (its entry point's first statements), until the run
    installs the drain's (`tank_spark.runner.run_job`, before it parses its command line): SIGTERM or Ctrl-C while
    the process only imports its modules ends it at once, with one line and exit 130 (`exits.EXIT_INTERRUPTED`).
    Without it, a stop in the first seconds killed the process by the signal: exit 143 and nothing said, or a
    traceback through whatever was being imported."""

    def stop(signum: int, frame: FrameType | None) -> None:
        how = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        os.write(2, f"{job}: interrupted ({how}) while starting, before any work; a rerun does the work\n".encode())
        os._exit(130)  # exits.EXIT_INTERRUPTED, not imported: nothing heavier than `signal` runs before this

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


@contextlib.contextmanager
def handling(handler: Callable[[int, FrameType | None], Any] | signal.Handlers, *signums: int) -> Iterator[None]:
    """`handler` for the signals `signums` while the block runs, then their previous handlers again. Only the main
    thread may set handlers (and Python runs them there), so in another thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def sigint_raises() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C raises KeyboardInterrupt (and the run drains) instead of PySpark's SIGINT handler, which cancels every
    job at once — killing partitions mid-write."""
    return handling(signal.default_int_handler, signal.SIGINT)


def drain(wait: Callable[[float], bool]) -> bool:
    """After a stop: log it, then `wait(timeout)` up to `STOP_GRACE_S` (or until a second Ctrl-C) for the running
    partitions; `wait` returns whether they have finished. True when they did; otherwise the caller cancels them.

    `wait` must wait on an Event (or futures), not `Thread.join`: in Python 3.11 a join interrupted by a signal
    handler's exception marks the still-running thread stopped (`_wait_for_tstate_lock`, bpo-45274's fix), so the
    drain would end at once and the run would be torn down under a partition mid-swap (CI at f4671da)."""
    log.warning(
        "interrupted: finishing the running partitions and starting no new ones (up to %.0f s; Ctrl-C again to "
        "cancel them now: crash-safe, the next run repairs them)",
        STOP_GRACE_S,
    )
    finished = False
    with contextlib.suppress(KeyboardInterrupt):
        finished = wait(STOP_GRACE_S)
    if not finished:
        log.warning("cancelling the partitions still running")
    return finished
