"""Tests marked `alone` run with no other test beside them, when the suite runs in pytest-xdist workers.

Such a test measures real processes against deadlines: a job that Airflow kills at its timeout while the rerun must
finish within it, processes gone within 2 s of their driver. Beside another worker's Spark job those margins go.

Every test holds the run's gate file shared, an `alone` test holds it exclusively (`flock`). Both pass a turnstile
file first, and an `alone` test keeps it while it waits and runs, so once it waits, the other worker starts nothing
new. The controller makes the lock files' directory and removes it at the end.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

ENV = "TANK_LOG_TEST_LOCKS"  # the lock files' directory, inherited by the workers
MADE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: times real processes against deadlines; no other test runs beside it")
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):  # the controller
        os.environ[ENV] = config.stash[MADE] = tempfile.mkdtemp(prefix="tank-log-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(MADE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    directory = os.environ.get(ENV) if hasattr(item.config, "workerinput") else None
    if directory is None:  # one process: nothing runs beside a test
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with (
        open(os.path.join(directory, "turnstile"), "a") as turnstile,
        open(os.path.join(directory, "gate"), "a") as gate,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # the locks go with the files when they close
