"""What a run says while it works: one line per partition as it finishes (the CLI and the Spark driver), a progress
bar on an interactive terminal (rich; off when stderr is not a terminal), and the line of a run cut short."""

from __future__ import annotations

import logging
import sys
from typing import Any

from tank_log.maintenance.outcome import Status

log = logging.getLogger("tank_log.progress")


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def describe(r: dict[str, Any]) -> str:
    """One line for a partition's report entry: what was done (or would be, in a dry run), or why not."""
    where = f"{r.get('topic')}/{r.get('partition')}" if r.get("topic") is not None else r.get("path", "?")
    status = r.get("status")
    would = status == "dry-run"
    if "steps" in r:  # maintenance: each step in one line
        steps = ", ".join(f"{name} {s.get('status')}" for name, s in r["steps"].items())
        return f"{where}: {status} ({steps})"
    if "segments_before" in r and "messages_after" in r and status in ("compacted", "dry-run"):  # compaction
        what = (
            f"{r.get('segments_before')} segments, {_n(r.get('bytes_before'))} bytes, "
            f"{_n(r.get('messages_before'))} messages → {_n(r.get('messages_after'))} messages"
        )
        if not would:
            what += f" in {r.get('segments_after')} segments, {_n(r.get('bytes_after'))} bytes"
        return f"{where}: {'would compact' if would else 'compacted'} {what}"
    if "segments_deleted" in r and status in ("deleted", "dry-run"):  # retention
        what = (
            f"{r['segments_deleted']} segments ({_n(r.get('bytes_deleted'))} bytes, "
            f"{_n(r.get('messages_deleted'))} messages)"
        )
        return f"{where}: {'would delete' if would else 'deleted'} {what}"
    if "rows" in r and status in ("exported", "dry-run"):  # export
        rng = f" (seq {r.get('first_row_seq')}..{r.get('last_row_seq')})" if r.get("rows") else ""
        return f"{where}: {'would export' if would else 'exported'} {_n(r['rows'])} rows{rng}"
    if "actions" in r and status in ("fixed", "dry-run"):  # index maintenance
        acts = ", ".join(a.get("action", "?") for a in r["actions"]) or "nothing"
        return f"{where}: {'would do' if would else 'did'}: {acts}"
    detail = r.get("error") or r.get("reason") or ""
    return f"{where}: {status}{': ' + detail if detail else ''}"


class Progress:
    """Per-partition lines (logged) and, on a terminal, a progress bar over `total` partitions."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done = what, total, 0
        self._bar = None
        if total and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                "{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
            )
            self._task = self._bar.add_task(what, total=total)
            self._bar.start()

    def finished(self, result: dict[str, Any]) -> None:
        self.done += 1
        log.info("[%d/%d] %s", self.done, self.total, describe(result))
        if self._bar is not None:
            self._bar.advance(self._task)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def interrupted_message(what: str, results: list[dict[str, Any]]) -> str:
    """What a run stopped by Ctrl-C/SIGTERM prints: the partitions that finished, one line each."""
    done = [describe(r) for r in results if r.get("status") != Status.INTERRUPTED]
    return "".join([f"{what}: interrupted; {len(done)} partition(s) finished:", *(f"\n  {d}" for d in done)])


INTERRUPTED_REASON = (
    "not finished when the run was interrupted (crash-safe: the next run's repair completes or undoes a partial change)"
)


def task_entry(task: Any, status: Status, **fields: Any) -> dict[str, Any]:
    """The report entry of a task's partition (a `PartitionTask`) that its operation did not produce."""
    return {
        "topic": task.topic,
        "partition": task.partition,
        "path": task.path,
        "base_path": task.base_path,
        "status": str(status),
        **fields,
    }


def interrupted_entry(task: Any) -> dict[str, Any]:
    """The report entry of a partition a run did not finish (a `PartitionTask`)."""
    return task_entry(task, Status.INTERRUPTED, reason=INTERRUPTED_REASON)
