"""A directory (any non-regular file) where a segment or index should be. Before: verify showed only that entry,
compaction failed mid-swap leaving `.old` files, repair crashed, retention deleted a log and then failed with a
report claiming a deletion that did not happen, stats printed no table."""

import os
import subprocess
import sys

from conftest import tree_digest

from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.maintenance.outcome import Status
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention
from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import partitions_at
from tank_log.tools.demo import write_demo

CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def _dir_instead_of(path: str) -> None:
    os.unlink(path)
    os.mkdir(path)
    open(os.path.join(path, "x"), "w").close()


def _partition(base: str, topic: str, pid: int):
    return next(p for p in partitions_at(base, [topic]) if p.id == pid)


def test_non_regular_files_block_every_mutation_before_anything_changes(tmp_path):
    base = write_demo(str(tmp_path / "demo"))
    orders0, clicks0 = _partition(base, "orders", 0), _partition(base, "clicks", 0)
    odd_index = orders0.ro[1].index_path
    _dir_instead_of(odd_index)
    _dir_instead_of(clicks0.ro[0].index_path)
    profiles0 = _partition(base, "profiles", 0)
    with open(profiles0.ro[0].path, "ab") as fh:  # another problem elsewhere in the tree
        fh.write(b"garbage")
    before = tree_digest(base)

    problems = verify_path(base)  # every problem of the tree, not only the first
    codes = {(p.code, os.path.relpath(p.path, base)) for p in problems if p.severity == "error"}
    assert ("not-a-file", os.path.relpath(odd_index, base)) in codes
    assert ("not-a-file", os.path.relpath(clicks0.ro[0].index_path, base)) in codes
    assert any(p.code != "not-a-file" and "profiles" in p.path for p in problems)

    res = compact_partition(_partition(base, "orders", 0), CompactionOptions(force=True, broker_stopped=True))
    assert res.status == Status.NEEDS_ATTENTION and odd_index in res.reason
    rules = RetentionRules(segments_count=1)
    ret = apply_retention(_partition(base, "clicks", 0), rules, RetentionOptions(broker_stopped=True))
    assert ret.status == Status.NEEDS_ATTENTION and ret.deleted == [] and ret.segments_deleted == 0
    assert tree_digest(base) == before  # nothing was touched, no `.old` file, no log deleted

    r = subprocess.run([*CLI, "repair", base], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert '"action": "needs-attention"' in r.stdout and odd_index in r.stdout
    assert tree_digest(base) == before

    os.rename(odd_index, odd_index + ".moved-away")  # what the operator does: then the job proceeds
    os.rename(odd_index + ".moved-away", os.path.join(os.path.dirname(odd_index), ".moved-away"))
    res = compact_partition(_partition(base, "orders", 0), CompactionOptions(force=True, broker_stopped=True))
    assert res.status == Status.COMPACTED, res


def test_stats_reports_every_partition_and_fails_on_a_malformed_one(tmp_path):
    base = write_demo(str(tmp_path / "demo"))
    seg = _partition(base, "orders", 1).ro[0]
    with open(seg.path, "r+b") as fh:  # the first bundle's flags: an unknown codec (mid-file: data follows)
        flags_at = 1 if fh.read(1)[0] < 0x80 else 2
        fh.seek(flags_at)
        fh.write(b"\xc3")
    r = subprocess.run([*CLI, "stats", base], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    rows = [line.split()[:2] for line in r.stdout.splitlines()[1:]]
    assert len(rows) == 6 and ["orders", "2"] in rows  # the table has every partition
    assert f"orders/1: {seg.path} @" in r.stderr
