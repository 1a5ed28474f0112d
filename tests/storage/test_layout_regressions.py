"""Regressions fixed by the restructure (issue: one concept, one home): misnamed files, all-digit topic and base
names, duplicate YAML keys, the CLI's exit codes."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import ROOT, copy_tree, data_dir, tree_digest

from tank_log.errors import JobConfigError, SegmentNameError, TankFormatError, UsageError
from tank_log.jobs.config import load_job_config, parse_job_config
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.maintenance.indexes import IndexJobOptions, maintain_partition
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention
from tank_log.storage.datadir import classify_path, partitions_at
from tank_log.storage.repair import repair_partition
from tank_log.storage.segment import Segment
from tank_log.tools.cli import exit_code_for


def _kv_with_misnamed_file(tmp_path) -> str:
    base = copy_tree(data_dir("E_before"), str(tmp_path / "base"))
    (pdir,) = [os.path.join(r, "") for r, _, files in os.walk(base) if any(f.endswith(".ilog") for f in files)]
    with open(os.path.join(pdir, "01-5.ilog"), "wb") as fh:
        fh.write(b"\x00")
    return pdir.rstrip("/")


def test_misnamed_file_makes_mutating_jobs_report_needs_attention(tmp_path):
    pdir = _kv_with_misnamed_file(tmp_path)
    before = tree_digest(pdir)
    part = partitions_at(pdir)[0]
    res = compact_partition(part, CompactionOptions(broker_stopped=True, force=True))
    assert res.status == "needs-attention" and "01-5.ilog" in res.reason and res.error is None
    res = apply_retention(part, RetentionRules(segments_count=2), RetentionOptions(broker_stopped=True))
    assert res.status == "needs-attention" and "01-5.ilog" in res.reason
    res = maintain_partition(part, IndexJobOptions(broker_stopped=True))
    assert res.status == "needs-attention" and any("01-5.ilog" in p["path"] for p in res.unfixed)
    assert repair_partition(pdir).action == "none"  # repair no longer crashes on the name
    assert tree_digest(pdir) == before


def test_segment_name_errors_carry_the_file_path(tmp_path):
    path = tmp_path / "01-5.ilog"
    path.write_bytes(b"")
    with pytest.raises(SegmentNameError) as e:
        Segment(str(path))
    assert e.value.path == str(path) and "<buffer>" not in str(e.value)


def test_all_digit_topic_names_are_topics(tmp_path):
    base = str(tmp_path / "base")
    os.makedirs(base)
    src = data_dir("E_before")
    topic = next(e for e in os.listdir(src) if not e.startswith("."))
    shutil.copytree(os.path.join(src, topic), os.path.join(base, "2024"))
    assert classify_path(base) == "base"
    assert classify_path(os.path.join(base, "2024")) == "topic"
    assert classify_path(os.path.join(base, "2024", "0")) == "partition"
    parts = partitions_at(base)
    assert [(p.topic, p.id) for p in parts] == [("2024", 0)] and parts[0].segments


def test_a_base_path_whose_name_is_digits_is_a_base(tmp_path):
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "1"))
    assert classify_path(base) == "base"
    assert {p.topic for p in partitions_at(base)} == {t for t in os.listdir(base) if not t.startswith(".")}


def test_a_directory_with_segments_and_subdirectories_is_refused(tmp_path):
    pdir = copy_tree(os.path.join(data_dir("E_before")), str(tmp_path / "x"))
    (seg_dir,) = [r for r, _, files in os.walk(pdir) if any(f.endswith(".ilog") for f in files)]
    os.makedirs(os.path.join(seg_dir, "sub"))
    with pytest.raises(UsageError, match="ambiguous"):
        classify_path(seg_dir)


def test_job_config_rejects_duplicate_and_unknown_keys(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("export:\n  table: a\nexport:\n  table: b\n")
    with pytest.raises(JobConfigError, match="duplicate key 'export'"):
        load_job_config(str(cfg))
    cfg.write_text("compaction:\n  force: true\n  force: false\n")
    with pytest.raises(JobConfigError, match="duplicate key 'force'"):
        load_job_config(str(cfg))
    with pytest.raises(JobConfigError, match="indexes"):
        parse_job_config({"indexes": {}})
    load_job_config(os.path.join(ROOT, "conf", "cluster.yaml"))  # the shipped example is valid


def test_cli_exit_codes_separate_usage_from_data_errors():
    assert exit_code_for(UsageError("bad flag")) == 2
    assert exit_code_for(JobConfigError("bad config")) == 2
    assert exit_code_for(FileNotFoundError("no such path")) == 2
    assert exit_code_for(TankFormatError("bad bundle", "x", 3)) == 1
    assert exit_code_for(ValueError("sequence numbers must increase")) == 1  # a data validation error, not usage
