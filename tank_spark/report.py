"""A run's JSON report (`--report`): what was asked, where the time went, how it ended; and its Prometheus metrics."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from tank_log import __version__

if TYPE_CHECKING:
    pass

log = logging.getLogger("tank_log.job")


def write_report(path: str | None, report: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class RunReport:
    """One run's JSON report (`--report`): what was asked, where the time went (`timings`, phase by phase), how it
    ended. Every exit path ends it with `end`, so every report has `status`, `finished`, `duration_s` and
    `timings` (the phases it got through)."""

    def __init__(self, job: str) -> None:
        self.doc: dict[str, Any] = {"job": job, "tank_log_version": __version__, "started": _now()}
        self.timings: dict[str, float] = {}
        self._t0 = self._phase = time.monotonic()
        self.metrics_path: str | None = None  # where `end` also writes the run's Prometheus metrics

    def phase_done(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self._phase, 3)
        self._phase = now

    def end(self, path: str | None, status: str, **fields: Any) -> None:
        """Set how the run ended (and `fields`: summary, partitions, error) and write the report to `path`."""
        duration = round(time.monotonic() - self._t0, 3)
        self.doc.update(status=status, finished=_now(), duration_s=duration, timings=self.timings, **fields)
        write_report(path, self.doc)
        if self.metrics_path:
            from tank_log.metrics import write_report_metrics

            write_report_metrics(self.metrics_path, self.doc)


def report_arg(argv: list[str] | None) -> str | None:
    argv = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(argv):
        if a == "--report" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--report="):
            return a.split("=", 1)[1]
    return None


def count_by(results: list[dict[str, Any]], key: str = "status") -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        value = str(r.get(key))
        out[value] = out.get(value, 0) + 1
    return out
