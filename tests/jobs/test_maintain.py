"""One maintenance task per partition — repair → retention → compaction → indexes → final verify — leaves the
same files as the single-purpose jobs run one after the other, with one report entry naming each step."""

import os
import shutil

from conftest import Detached, tree_digest

from tank_log.jobs.compaction import plan_compaction, record_cleanup_marks
from tank_log.jobs.config import JobConfig
from tank_log.jobs.indexes import plan_index_run
from tank_log.jobs.maintain import STEPS, plan_maintenance, record_maintenance_marks, summarize
from tank_log.jobs.retention import clamp_cleanup_marks, plan_retention_run
from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.tools.demo import write_demo

STOPPED = JobConfig(broker_stopped=True)


def _maintain(base, **kw):
    tasks, left_out = plan_maintenance([base], None, STOPPED, dry_run=kw.pop("dry_run", False), **kw)
    results = [t.run() for t in tasks]
    record_maintenance_marks(results)
    return results + left_out


def test_maintenance_equals_the_single_jobs_one_after_the_other(tmp_path):
    base = write_demo(str(tmp_path / "a"), now_ms=1_790_000_000_000)
    other = shutil.copytree(base, str(tmp_path / "b"))
    results = _maintain(base)
    assert {(r["topic"], r["status"]) for r in results} == {
        ("clicks", "maintained"),
        ("orders", "maintained"),
        ("profiles", "maintained"),
    }
    by = {(r["topic"], r["partition"]): r["steps"] for r in results}
    assert list(by[("orders", 0)]) == list(STEPS)
    assert (
        by[("orders", 0)]["retention"]["status"] == "deleted" and by[("orders", 0)]["compaction"]["status"] == "skipped"
    )
    assert (
        by[("profiles", 0)]["compaction"]["status"] == "compacted"
        and by[("profiles", 0)]["verify"]["status"] == "clean"
    )
    summary = summarize(results)
    assert summary["steps"]["verify"] == {"clean": 6} and summary["segments_deleted"] > 0

    for plan, bookkeeping in (
        (plan_retention_run([other], None, STOPPED, dry_run=False), clamp_cleanup_marks),
        (plan_compaction([other], None, STOPPED, dry_run=False), record_cleanup_marks),
        (plan_index_run([other], None, STOPPED, dry_run=False, salvage=False), lambda results: None),
    ):
        bookkeeping([t.run() for t in plan[0]])
    assert tree_digest(base) == tree_digest(other)  # the same files, byte for byte
    assert read_cleanup_log(base) == read_cleanup_log(other)


def test_dry_run_changes_nothing_and_a_held_partition_is_skipped_whole(tmp_path):
    import sys

    base = write_demo(str(tmp_path / "a"))
    before = tree_digest(base)
    results = _maintain(base, dry_run=True)
    assert {r["status"] for r in results} == {"dry-run"} and tree_digest(base) == before
    profiles0 = os.path.join(base, "profiles", "0")
    hold = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)", profiles0]
    holder = Detached(hold, dict(os.environ))
    try:
        results = {(r["topic"], r["partition"]): r for r in _maintain(base)}
    finally:
        holder.kill()
    held = results[("profiles", 0)]
    assert held["status"] == "skipped" and f"pid {holder.pid}" in held["steps"]["repair"]["reason"]
    assert {s["status"] for s in held["steps"].values()} == {"skipped"}
    assert results[("profiles", 1)]["status"] == "maintained"


def test_every_step_runs_under_one_hold_of_the_lock_and_a_locked_partition_is_skipped_whole(tmp_path, monkeypatch):
    """No other run comes between the steps: while the final verify reads the partition, another run's lock of it
    fails. A partition another run holds is skipped with the holder named, no step run."""
    import threading

    import tank_log.jobs.maintain as maintain
    from tank_log.errors import PartitionLocked
    from tank_log.storage.locking import PartitionLock

    base = write_demo(str(tmp_path / "a"), now_ms=1_790_000_000_000)
    seen = []
    verify = maintain._verify

    def verify_while_another_run_tries(part):
        def other_run():
            try:
                PartitionLock(part.path, "other").acquire().release()
                seen.append("got it")
            except PartitionLocked as err:
                seen.append(str(err))

        t = threading.Thread(target=other_run)  # another thread: not inside this one's hold
        t.start()
        t.join()
        return verify(part)

    monkeypatch.setattr(maintain, "_verify", verify_while_another_run_tries)
    results = _maintain(base)
    assert {r["status"] for r in results} == {"maintained"}
    assert seen and all(s.startswith("another tank-log run") and "maintain" in s for s in seen), seen

    monkeypatch.setattr(maintain, "_verify", verify)
    tasks, _ = plan_maintenance([base], {"orders"}, STOPPED, dry_run=False)
    with PartitionLock(tasks[0].path, "other-job"):
        entry = tasks[0].run()
    assert entry["status"] == "skipped"
    assert entry["steps"]["repair"]["reason"].startswith("locked: another tank-log run")
    assert "other-job" in entry["steps"]["repair"]["reason"]
    assert {entry["steps"][s]["reason"] for s in STEPS[1:]} == {"not run: repair skipped"}


def test_the_final_verify_scans_each_topic_once_not_once_per_partition(tmp_path, monkeypatch):
    """Every partition's final verify includes its topic's problems: scanning the topic for each of them made a run
    quadratic in a topic's partitions (1,500 empty partitions: 29 s, now 2.5 s)."""
    import tank_log.jobs.maintain as maintain

    base = tmp_path / "base"
    for p in range(200):
        (base / "t" / str(p)).mkdir(parents=True)
    (base / "t" / "config").write_text("log.segment.bytes=4kb\n")
    scans = []
    real = maintain.scan_topic
    monkeypatch.setattr(maintain, "scan_topic", lambda *a, **k: scans.append(a) or real(*a, **k))
    maintain._scanned_topic_problems.cache_clear()
    results = _maintain(str(base))
    assert len(results) == 200 and {r["status"] for r in results} <= {"maintained", "skipped"}
    assert len(scans) == 1
    (base / "t" / "config").write_text("log.segment.bytes=oops\n")  # a topic that changes is scanned again
    _maintain(str(base))
    assert len(scans) == 2
