"""Test hooks of the export, set through the environment: pause a run at its commit (a test kills it there or lets
a concurrent run commit first), or make the driver die after writing its files (the delta-spark engine, which
commits partition by partition: after its first partition's commit)."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

HOLD_BEFORE_COMMIT = "TANK_LOG_EXPORT_HOLD"  # PATH: wait before the commit
HOLD_AFTER_COMMIT = "TANK_LOG_EXPORT_HOLD_AFTER"  # PATH: wait after the commit (continuous: before Spark records it)
CRASH = "TANK_LOG_EXPORT_CRASH"  # "before-commit": the driver dies after the files are written (engine spark: after
# the first partition's commit, before the others')


def hold(env: str) -> None:
    """With `env`=PATH: announce PATH.ready, then wait until PATH exists (at most 5 minutes)."""
    path = os.environ.get(env)
    if not path:
        return
    open(path + ".ready", "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)


def crash_before_commit(files: int) -> None:
    if os.environ.get(CRASH) == "before-commit":
        log.error("%s=before-commit: dying after writing %d files, before the commit", CRASH, files)
        os._exit(137)


def crash_after_first_partition() -> None:
    if os.environ.get(CRASH) == "before-commit":
        log.error("%s=before-commit: dying after one partition's commit, before the others'", CRASH)
        os._exit(137)
