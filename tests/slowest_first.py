"""Under pytest-xdist, every worker starts with its slowest tests: the run ends on short ones, not on a 2-minute
test that one worker starts while the other has nothing left to do.

pytest-xdist's `worksteal` sends each worker a contiguous share of the collected items (the first half to the first
of two workers), and a worker that runs out steals the end of another's queue. So the items are ordered as lanes, one
per worker, each from its slowest to its fastest, with equal expected seconds (longest first onto the least loaded
lane); a lane is as long as the share xdist sends its worker. Tests that share a module-scoped fixture (Airflow's
services, a Spark cluster) stay together in one lane, in their own order, so it is set up once. Tests marked `alone`
(no other test beside them, tests/run_locks.py) go to the end of their lane, where the other worker runs short tests
and waits little for them.

Each test's expected seconds come from tests/durations.json, measured on the reference machine (2 cores, 2 workers)
and rewritten by a whole run with `--store-durations`; a test not in it is guessed from its markers. Only the order
changes: what runs, and where each test's fixtures come from, does not.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
STORED_FROM_S = 0.5  # the file lists the tests that took at least this long (setup, call and teardown)
GUESS_S = {"spark": 8.0, "slow": 3.0}  # a test the file does not list: by its first marker found here
GUESS_OTHER_S = 0.1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's seconds (those of at least {STORED_FROM_S} s) to tests/durations.json at the end",
    )


class _Recorder:
    """Each test's seconds (setup, call and teardown), as the controller gets the reports; the file at the end."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seen[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        stored = {k: round(v, 1) for k, v in sorted(self.seen.items()) if v >= STORED_FROM_S}
        tmp = FILE + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(stored, fh, indent=0, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, FILE)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "tank-log-store-durations")


def expected_seconds(item: pytest.Item, known: dict[str, float]) -> float:
    if item.nodeid in known:
        return known[item.nodeid]
    for marker, seconds in GUESS_S.items():
        if item.get_closest_marker(marker) is not None:
            return seconds
    return GUESS_OTHER_S


def _shares(n: int, workers: int) -> list[int]:
    """How many of `n` items worksteal sends each idle worker at the start (xdist/scheduler/worksteal.py)."""
    out = []
    for i in range(workers):
        out.append(n // (workers - i))
        n -= out[-1]
    return out


def _shared_scope(item: pytest.Item) -> bool:
    """Whether the test uses a fixture set up once for its module (or class, or package)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "class", "package") for ds in defs for d in ds)


def lanes(items: list[pytest.Item], known: dict[str, float], workers: int) -> list[list[pytest.Item]]:
    """The items as one lane per worker: each slowest first, `alone` units last, lengths the shares xdist sends."""
    units: dict[str, list[pytest.Item]] = {}
    module = {i.nodeid: i.module.__name__ if isinstance(i, pytest.Function) else "" for i in items}
    shared = {module[i.nodeid] for i in items if _shared_scope(i)} - {""}
    for item in items:
        key = module[item.nodeid]
        units.setdefault(key if key in shared else item.nodeid, []).append(item)
    weight = {key: sum(expected_seconds(i, known) for i in unit) for key, unit in units.items()}
    order = sorted(units, key=lambda key: -weight[key])  # stable: equal weights keep the collection order
    out: list[list[list[pytest.Item]]] = [[] for _ in range(workers)]
    totals = [0.0] * workers
    for key in order:
        lane = totals.index(min(totals))
        out[lane].append(units[key])
        totals[lane] += weight[key]
    for lane in out:  # `alone` units last, in their order
        lane.sort(key=lambda unit: any(i.get_closest_marker("alone") for i in unit))
    flat = [[i for unit in lane for i in unit] for lane in out]
    # a lane shorter than its worker's share would hand that worker the next lane's slowest tests: fill it up with
    # the fastest single tests of the longer lanes (from their ends)
    shares = _shares(len(items), workers)
    for w in range(workers - 1):
        while len(flat[w]) < shares[w]:
            donor = max((d for d in range(workers) if d != w), key=lambda d: len(flat[d]) - shares[d])
            flat[w].append(flat[donor].pop())
    return flat


@pytest.hookimpl(trylast=True)  # after conftest.py has marked the Spark and slow tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    workers = int(workerinput["workercount"]) if workerinput else 0
    if workers < 2:  # (a worker's own `dist` option reads "no": the lanes are cut for worksteal's shares)
        return
    try:
        with open(FILE) as fh:
            known = {k: float(v) for k, v in json.load(fh).items()}
    except FileNotFoundError:
        known = {}
    items[:] = [i for lane in lanes(items, known, workers) for i in lane]
