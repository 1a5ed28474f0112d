"""Under pytest-xdist, every worker starts with its slowest tests: the run ends on short ones, not on a 2-minute
test that one worker starts while the other has nothing left to do.

pytest-xdist's `worksteal` sends each worker a contiguous share of the collected items (the first half to the first
of two workers), and a worker that runs out steals the end of another's queue. So the items are ordered as lanes, one
per worker, each from its slowest to its fastest, with equal expected seconds (longest first onto the least loaded
lane); a lane is as long as the share xdist sends its worker. The tests of a module that use its module-scoped
fixtures (Airflow's services, a Spark cluster) stay together in one lane, in their own order, so they are set up
once. Tests marked `alone` (no other test beside them, tests/run_locks.py) go to the end of their lane, where the
other worker runs short tests and waits little for them.

Each test's expected seconds are this checkout's last measure of it (pytest's cache, written by every run), else
tests/durations.json's (measured on a 2-core machine in 2 workers, rewritten by a whole run with `--store-durations`),
else a guess from its markers. Only the order changes: what runs, and where each test's fixtures come from, does not.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import pytest

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
STORED_FROM_S = 0.5  # the file lists the tests that took at least this long (setup, call and teardown)
GUESS_S = {"spark": 8.0, "slow": 3.0}  # a test the file does not list: by its first marker found here
GUESS_OTHER_S = 0.1
CACHE_KEY = "tank-log/durations"
WORKERINPUT_KEY = "tank_log_durations"
_KNOWN = pytest.StashKey[dict[str, float]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's seconds (those of at least {STORED_FROM_S} s) to tests/durations.json at the end",
    )


class _Recorder:
    """Each test's seconds (setup, call and teardown) as the controller gets the reports: at the end, into pytest's
    cache (this checkout's last measure of each test that ran), and with `--store-durations` into the file."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seen: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seen[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        measured = {k: round(v, 1) for k, v in sorted(self.seen.items())}
        cache = getattr(self.config, "cache", None)
        if cache is not None and measured:
            cache.set(CACHE_KEY, {**(cache.get(CACHE_KEY, None) or {}), **measured})
        if self.config.getoption("store_durations"):
            tmp = FILE + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({k: v for k, v in measured.items() if v >= STORED_FROM_S}, fh, indent=0, sort_keys=True)
                fh.write("\n")
            os.replace(tmp, FILE)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run in one process
        config.pluginmanager.register(_Recorder(config), "tank-log-durations")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: the controller configures each worker it starts
def pytest_configure_node(node: Any) -> None:
    """Every worker orders by the seconds the controller read once: each reading the cache itself, two workers could
    see it before and after another run in this checkout rewrote it, collect in different orders, and xdist would
    stop the run."""
    config = node.config
    if config.stash.get(_KNOWN, None) is None:
        config.stash[_KNOWN] = known_seconds(config)
    node.workerinput[WORKERINPUT_KEY] = config.stash[_KNOWN]


def known_seconds(config: pytest.Config) -> dict[str, float]:
    """The file's seconds, overridden by this checkout's last measures (pytest's cache) where it has some."""
    try:
        with open(FILE) as fh:
            known = {k: float(v) for k, v in json.load(fh).items()}
    except FileNotFoundError:
        known = {}
    cache = getattr(config, "cache", None)
    cached = cache.get(CACHE_KEY, None) if cache is not None else None
    if isinstance(cached, dict):
        known.update({k: float(v) for k, v in cached.items() if isinstance(v, (int, float))})
    return known


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


def _lightest_single(lane: list[list[pytest.Item]]) -> int | None:
    """The index of the lane's last unit of one test, not `alone` if it has one."""
    singles = [i for i, unit in enumerate(lane) if len(unit) == 1]
    plain = [i for i in singles if not lane[i][0].get_closest_marker("alone")]
    return (plain or singles or [None])[-1]


def lanes(items: list[pytest.Item], known: dict[str, float], workers: int) -> list[list[pytest.Item]]:
    """The items as one lane per worker: each slowest first, `alone` units last, lengths the shares xdist sends."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:  # the tests of a module that share its module-scoped fixtures: one unit; the others alone
        module = item.module.__name__ if isinstance(item, pytest.Function) else ""
        units.setdefault(f"{module} (shared)" if module and _shared_scope(item) else item.nodeid, []).append(item)
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
    # a lane must be exactly as long as its worker's share: a shorter one would hand that worker the next lane's
    # slowest tests, a longer one its own last tests (a shared-fixture unit, `alone` ones) to the next worker first.
    # Single light tests move between lanes (the fastest, from the end, `alone` ones last; a unit is never split).
    shares = _shares(len(items), workers)
    count = [sum(map(len, lane)) for lane in out]
    for w in range(workers - 1):
        while count[w] != shares[w]:
            give, take = (w, w + 1) if count[w] > shares[w] else (max(range(w + 1, workers), key=count.__getitem__), w)
            i = _lightest_single(out[give])
            if i is None:  # only shared-fixture units left there: the share's end goes as it is
                break
            out[take].append(out[give].pop(i))
            count[give], count[take] = count[give] - 1, count[take] + 1
    return [[i for unit in lane for i in unit] for lane in out]


@pytest.hookimpl(trylast=True)  # after conftest.py has marked the Spark and slow tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    workers = int(workerinput["workercount"]) if workerinput else 0
    if workers < 2:  # (a worker's own `dist` option reads "no": the lanes are cut for worksteal's shares)
        return
    known = workerinput.get(WORKERINPUT_KEY)  # the controller's (pytest_configure_node)
    if known is None:
        known = known_seconds(config)
    items[:] = [i for lane in lanes(items, known, workers) for i in lane]
