"""The Spark-free job layer: the planning loop, task bodies and the driver's `.cleanup.log` bookkeeping."""

from __future__ import annotations

import pickle

import pytest
from conftest import data_dir, load_dump

from tank_log.errors import NothingMatched
from tank_log.jobs.compaction import cleanup_mark_of, plan_compaction, record_cleanup_marks
from tank_log.jobs.config import JobConfig, parse_job_config
from tank_log.jobs.indexes import plan_index_run
from tank_log.jobs.maintain import plan_maintenance
from tank_log.jobs.planning import left_out, select_partitions
from tank_log.jobs.retention import plan_retention_run
from tank_log.maintenance.outcome import Status
from tank_log.storage.cleanup_marks import read_cleanup_log

STOPPED = JobConfig(broker_stopped=True)


def test_select_partitions_covers_every_partition_and_filters_topics():
    base = data_dir("A_multi")
    every = [(s.partition.topic, s.partition.id) for s in select_partitions([base])]
    assert sorted(every) == sorted(load_dump("A_multi"))
    topic = every[0][0]
    only = [(s.partition.topic, s.partition.id) for s in select_partitions([base], {topic})]
    assert only and all(t == topic for t, _ in only)
    with pytest.raises(NothingMatched, match=r"unknown topic\(s\) no-such-topic: .* hold\(s\) events, retained"):
        select_partitions([base], {"no-such-topic"})
    assert select_partitions([base], {"no-such-topic"}, require_match=False) == []  # the data source's read


def test_nothing_matched_names_what_was_asked_and_what_exists(tmp_path):
    """An empty dir, a non-TANK dir (a copy of /etc), a topic typo or a config topic that does not exist is an
    error, not a green run with 0 partitions."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NothingMatched, match="not a TANK base path: it is empty"):
        select_partitions([str(empty)])
    etc = tmp_path / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "ssh" / "sshd_config").write_text("x")
    (etc / "hosts").write_text("x")
    with pytest.raises(NothingMatched, match="directories ssh hold no partition directories"):
        select_partitions([str(etc)])
    base = data_dir("A_multi")
    with pytest.raises(NothingMatched, match=r"topic\(s\) ordres named in the job config do not exist"):
        select_partitions([base], named_in_config={"ordres": None})
    with pytest.raises(NothingMatched):  # one good dir does not hide a bad one
        select_partitions([base, str(empty)])


def test_left_out_entries_are_skipped_with_the_reason():
    sel = select_partitions([data_dir("A_multi")])[0]
    entry = left_out(sel.partition, "because")
    assert entry["status"] == Status.SKIPPED == "skipped" and entry["reason"] == "because"


def test_compaction_tasks_pickle_run_and_record_marks(fixture_copy):
    base = fixture_copy("E_before")  # a `delete` topic: compacted through the job config's override
    config = parse_job_config(
        {"broker_stopped": True, "compaction": {"force": True, "topics": {"kv": {"policy": "cleanup"}}}}
    )
    assert plan_compaction([base], None, STOPPED, dry_run=False)[0] == []  # the broker config alone: delete
    tasks, skipped = plan_compaction([base], None, config, dry_run=False)
    assert tasks and not skipped
    task = pickle.loads(pickle.dumps(tasks[0]))  # what Spark ships to an executor
    result = task.run()
    assert result["status"] == "compacted" and result["base_path"] == base and result["plan"]
    assert cleanup_mark_of(result) == result["range_last"]
    record_cleanup_marks([result])
    assert read_cleanup_log(base)[(result["topic"], result["partition"])] == result["range_last"]
    # a second run finds nothing to drop, and still records the mark (from the status and range, not the reason)
    again = plan_compaction([base], None, config, dry_run=False)[0][0].run()
    assert again["status"] == "nothing-to-do" and cleanup_mark_of(again) == result["range_last"]


def test_every_planner_sizes_its_tasks_by_their_segment_logs(fixture_copy):
    """`data_bytes` (what `needs_executors` sums against `in_driver_max_bytes`) is each partition's .log/.ilog
    bytes as the plan's scan listed them: indexes and other files do not count, and nothing is listed again."""
    import os

    base = fixture_copy("E_before")

    def log_bytes(path: str) -> int:
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith((".ilog", ".log")))

    compact_kv = parse_job_config({"broker_stopped": True, "compaction": {"topics": {"kv": {"policy": "cleanup"}}}})
    plans = {
        "indexes": plan_index_run([base], None, STOPPED, dry_run=True, salvage=False),
        "compaction": plan_compaction([base], None, compact_kv, dry_run=True),
        "retention": plan_retention_run([base], None, STOPPED, dry_run=True),  # kv is a `delete` topic
        "maintenance": plan_maintenance([base], None, STOPPED, dry_run=True),
    }
    for what, (tasks, _) in plans.items():
        assert tasks, what
        for t in tasks:
            assert t.data_bytes == log_bytes(t.path) > 0, (what, t.path)
            assert pickle.loads(pickle.dumps(t)).data_bytes == t.data_bytes  # it travels to the executors


def test_no_mark_for_dry_runs_failures_or_untouched_ranges():
    assert cleanup_mark_of({"status": "dry-run", "range_last": 9}) is None
    assert cleanup_mark_of({"status": "failed", "range_last": 9}) is None
    assert cleanup_mark_of({"status": "nothing-to-do", "range_last": None}) is None


def test_retention_and_index_tasks_plan_every_partition():
    base = data_dir("A_multi")
    tasks, skipped = plan_retention_run([base], None, STOPPED, dry_run=True)
    assert len(tasks) + len(skipped) == len(load_dump("A_multi"))
    results = [t.run() for t in tasks]
    assert all(r["status"] in ("nothing-to-do", "dry-run") for r in results)
    index_tasks, extra = plan_index_run([base], None, STOPPED, dry_run=True, salvage=False)
    assert len(index_tasks) == len(load_dump("A_multi")) and not extra
    assert {t.run()["status"] for t in index_tasks} <= {"clean", "dry-run"}


def test_no_compactable_topic_is_not_an_error_but_is_said(caplog):
    """An installation without cleanup-policy topics plans nothing and says so (the job exits 0)."""
    tasks, skipped = plan_compaction([data_dir("A_multi")], None, STOPPED, dry_run=True)
    assert tasks == [] and skipped and all(s["status"] == "skipped" for s in skipped)
    assert "nothing to compact" in caplog.text


def test_a_partition_gone_or_unlistable_since_the_plan_is_reported_and_the_others_run(tmp_path):
    """A partition deleted between planning and its task (the broker dropped its topic mid-run) is skipped, one that
    cannot be listed any more is failed with the reason; neither raises, so the run's other partitions are done
    and the driver's bookkeeping takes every entry (this used to fail the whole run, in the driver's processes and
    on Spark's executors alike)."""
    import shutil

    from conftest import many_small_partitions

    from tank_log.jobs.processes import run_in_processes

    base = many_small_partitions(tmp_path / "many", 4)
    tasks, _ = plan_compaction([base], None, STOPPED, dry_run=False)
    shutil.rmtree(tasks[1].path)
    shutil.rmtree(tasks[2].path)
    with open(tasks[2].path, "w") as fh:  # no longer a partition directory
        fh.write("x")
    results = run_in_processes(tasks, 2)
    assert [r["status"] for r in results] == ["compacted", "skipped", "failed", "compacted"]
    assert results[1]["reason"] == "gone since the run was planned (deleted)"
    assert "is a file, not a directory" in results[2]["error"] and results[2]["base_path"] == base
    record_cleanup_marks(results)
    assert set(read_cleanup_log(base)) == {("kv", 0), ("kv", 3)}
