"""An export run's id: its start time (UTC, to the second) and a random suffix, e.g. `20261122T020000-1a2b3c4d`.

It names every Parquet file the run writes (`part-<run id>-<task>-<n>.parquet`) and is recorded in the run's Delta
commit (`tank-log.run` in the commit info), so a file whose run never committed is recognisable as an orphan
(`orphans.py`)."""

from __future__ import annotations

import datetime as dt
import re
import uuid

from tank_log.lakehouse.table import RUN_KEY

COMMIT_KEY = RUN_KEY  # the commit metadata field holding the run id
_FORMAT = "%Y%m%dT%H%M%S"
_FILE = re.compile(r"part-(?P<run>\d{8}T\d{6}-[0-9a-f]{8})-\d{5}-\d+-\d{4,}\.parquet")


def new_run_id(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime(_FORMAT) + "-" + uuid.uuid4().hex[:8]


def is_run_id(value: object) -> bool:
    return isinstance(value, str) and bool(re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{8}", value))


def started_ms(run_id: str) -> int:
    """When the run started, in ms since the epoch."""
    start = dt.datetime.strptime(run_id[:15], _FORMAT).replace(tzinfo=dt.UTC)
    return int(start.timestamp() * 1000)


def file_name(run_id: str, task: str, n: int) -> str:
    """The name of the run's `n`th file written by Spark task `task` (`<partition id:05d>-<attempt>`)."""
    return f"part-{run_id}-{task}-{n:04d}.parquet"


def run_of(name: str) -> str | None:
    """The run id in a data file's name (its last path element); None for files another writer named."""
    m = _FILE.fullmatch(name.rpartition("/")[2])
    return m.group("run") if m else None
