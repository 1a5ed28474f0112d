"""How a run ends, for an orchestrator: its exit code, and the line that says why when it is not 0.

- 0: every partition done, or needing nothing, or skipped because another run of ours holds its lock;
- 1: a partition failed or needs attention (or the run failed);
- 2: a usage error (flags, configuration, a path that does not exist);
- 3: done partially: a partition that needed work was skipped because a live process (the broker) holds it. A broker
  that runs around the clock would otherwise make a nightly run skip every partition, every night, and exit 0;
- 130: interrupted (Ctrl-C, SIGTERM): what finished is reported, the rest is crash-safe.

A job's process ends with `exit_process`: the code it chose, whatever native libraries do at interpreter teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import Any, NoReturn

from tank_log.maintenance.outcome import FAILING, Status

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def held_by(entry: dict[str, Any]) -> list[str]:
    """The live processes that kept a partition's run from starting (its repair step's, for maintenance)."""
    if entry.get("status") != Status.SKIPPED:
        return []
    holders = entry.get("held_by") or (entry.get("steps") or {}).get("repair", {}).get("held_by")
    return list(holders or [])


def missed(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of partitions that needed work but were skipped because a live process holds them."""
    return [r for r in results if r.get("needs_work") and held_by(r)]


def exit_code(results: list[dict[str, Any]]) -> int:
    """1 when a partition failed or needs attention, else 3 when one that needed work was skipped as held, else 0."""
    if any(r.get("status") in FAILING for r in results):
        return EXIT_FAILED
    return EXIT_PARTIAL if missed(results) else EXIT_OK


def missed_message(job: str, results: list[dict[str, Any]]) -> str:
    """The last line of a run that skipped partitions needing work: which, and who holds them."""
    skipped = missed(results)
    named = "; ".join(f"{r.get('topic')}/{r.get('partition')} held by {', '.join(held_by(r))}" for r in skipped[:10])
    more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
    return (
        f"{job}: done partially (exit {EXIT_PARTIAL}): {len(skipped)} partition(s) needed work but were skipped "
        f"because a live process holds them (stop the broker, or run in its maintenance window): {named}{more}"
    )


def exit_process(code: int) -> NoReturn:
    """End this process with `code` as Python's own exit does — its thread pools stopped and its other non-daemon
    threads joined, its exit handlers run (logging's flush, Spark's), its output flushed — but without the
    interpreter's teardown.

    In that teardown an Arrow thread still finishing a scan through delta-rs's filesystem (a Python object) can drop
    the last reference to it, ask a finalizing interpreter for the GIL and abort the process ("terminate called
    without an active exception", exit 134; apache/arrow#34314): a job that had done its work, or refused a table
    with exit 2, would report a crash. Seen in 1 of 20 and 1 of 108 refused imports here; 0 of 150 since.
    """
    # what Py_Exit runs before the teardown, in its order: threading's exit hooks (they tell thread pools'
    # idle workers to stop) and a join of the non-daemon threads, then the exit handlers
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
