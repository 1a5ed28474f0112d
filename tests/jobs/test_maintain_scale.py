"""The nightly maintenance grows linearly with a host's partitions: every extra partition costs the same file system
operations (listings, opens, renames, removals) under the base path, whatever the host's size, and one look at
`/proc` serves every step (repair, retention, compaction, indexes, verify) of every partition of a run. A step that
scanned its topic, its base path or `/proc` once per partition made a run quadratic (bench/RESULTS.md, "Host
scale"); counting operations, not seconds, keeps this test exact on a loaded machine."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise

import pytest
from conftest import FIXTURES

from tank_log.jobs.config import JobConfig
from tank_log.jobs.maintain import _scanned_topic_problems, plan_maintenance, record_maintenance_marks
from tank_log.storage import holders

KEYED = os.path.join(FIXTURES, "E_compaction_exact", "before", "data", "kv", "0")  # 7 RO segments: compacted
RETAINED = os.path.join(FIXTURES, "A_multi", "data", "small", "0")  # 6 RO segments: retention deletes 3

_counting: list[tuple[str, Counter[str]]] = []  # (base path, counts) while a run is counted


def _audit(event: str, args: tuple[object, ...]) -> None:
    if not _counting or event not in ("open", "os.listdir", "os.scandir", "os.rename", "os.remove", "os.mkdir"):
        return
    base, counts = _counting[-1]
    path = args[0] if args else None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if isinstance(path, str) and os.path.abspath(path).startswith(base):
        counts[event] += 1


sys.addaudithook(_audit)  # for the whole session: a cheap no-op unless `_counting`


@contextmanager
def counted(base: str) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    _counting.append((os.path.abspath(base) + os.sep, counts))
    try:
        yield counts
    finally:
        _counting.pop()


def host(root: str, per_topic: int) -> str:
    """A base path of two topics of `per_topic` partitions each, copies of real brokers' partitions: `kv` (cleanup
    policy: compaction rewrites it) and `small` (delete policy, at most 3 segments: retention deletes from it)."""
    base = os.path.join(root, f"base-{per_topic}")
    for topic, template, config in (
        ("kv", KEYED, "log.segment.bytes=64kb\nlog.cleanup.policy=cleanup\n"),
        ("small", RETAINED, "log.segment.bytes=4kb\nretention.segments.count=3\n"),
    ):
        for p in range(per_topic):
            shutil.copytree(template, os.path.join(base, topic, str(p)))
        with open(os.path.join(base, topic, "config"), "w") as fh:
            fh.write(config)
    return base


def test_each_partition_costs_the_same_operations_whatever_the_hosts_size(tmp_path, monkeypatch):
    scans = []
    real_scan = holders._Scan.__init__

    def scan(self: holders._Scan) -> None:
        scans.append(1)
        real_scan(self)

    monkeypatch.setattr(holders._Scan, "__init__", scan)
    monkeypatch.setattr(holders, "RESCAN_S", 1e9)  # the freshness bound (a rescan a second) is time, not data
    costs, statuses = [], set()
    for per_topic in (2, 4, 6):
        base = host(str(tmp_path), per_topic)
        holders._scan = None
        _scanned_topic_problems.cache_clear()
        scans.clear()
        with counted(base) as ops:
            tasks, _ = plan_maintenance([base], None, JobConfig(broker_stopped=True), dry_run=False)
            results = [t.run() for t in tasks]
            record_maintenance_marks(results)
        assert len(results) == 2 * per_topic
        statuses |= {(r["topic"], s, r["steps"][s]["status"]) for r in results for s in ("retention", "compaction")}
        assert len(scans) == 1, f"{per_topic} partitions a topic: {len(scans)} looks at /proc, one serves the run"
        costs.append(ops)
    # every step did its work: compaction rewrote kv, retention deleted from small
    assert ("kv", "compaction", "compacted") in statuses and ("small", "retention", "deleted") in statuses
    # two more partitions a topic cost the same each time: linear, with the per-run and per-topic work constant
    first, second = (Counter({k: later[k] - earlier[k] for k in later | earlier}) for earlier, later in pairwise(costs))
    assert first == second, f"operations under the base for 2, 4, 6 partitions a topic: {[dict(c) for c in costs]}"
    assert first["open"] > 0 and first["os.rename"] > 0 and first["os.remove"] > 0


@pytest.fixture(autouse=True)
def _fresh_scan() -> Iterator[None]:
    yield
    holders._scan = None  # the next test's checks look afresh
