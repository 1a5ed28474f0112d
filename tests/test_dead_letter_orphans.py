"""The dead-letter table's orphans (tank_spark/export/dead_letters.py, orphans.py): the files of a run killed after
writing its dead letters and before their commit are removed by a later run past the orphan horizon, by the rules
of the table's own sweep (nothing committed, nothing younger than the horizon), and reported beside it. Delta and
Iceberg; the export runs in the driver (no JVM): killed as `jobs/export_delta.py`, rerun in this process."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_typed_export import BAD_SEQS, SMALL, config, export, mixed_values, rows, write_topic

from tank_log.lakehouse import TableLocation
from tank_spark.export.dead_letters import commit_dead_letters, dead_letter_orphans
from tank_spark.export.orphans import RunTooOld
from tank_spark.export.plan import ExportSettings, PartitionPlan
from tank_spark.export.run_id import new_run_id


def prepared(*argv: str) -> tuple[ExportSettings, list[PartitionPlan]]:
    """A run's settings and plans, as the job makes them before it starts."""
    from tank_spark.context import build_context
    from tank_spark.export import job
    from tank_spark.job_options import job_parser

    parser = job_parser("export_delta", "")
    job.add_options(parser)
    args = parser.parse_args(list(argv))
    settings, plans, _ = job._prepare(build_context("export_delta", args), args)
    return settings, plans


def stored(table: str, fmt: str) -> tuple[set[str], set[str]]:
    """The table's data files as stored, and those its snapshot references."""
    location = TableLocation.of(table, {}, fmt)
    t = location.existing()
    return {f.rel for f in location.data_files()}, t.referenced_files()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_later_run_removes_the_dead_letters_of_a_run_killed_before_their_commit(tmp_path, fmt):
    base, table, dead = str(tmp_path / "data"), str(tmp_path / "t"), str(tmp_path / "t_dead_letters")
    write_topic(base, "clicks", mixed_values())
    write_topic(base, "views", mixed_values())
    write_topic(base, "pages", mixed_values())
    cfg = config(tmp_path, value_format="avro", value_schema_file=SMALL, value_schema_ids={1: SMALL},
                 value_wire="confluent")  # fmt: skip
    args = ["--config", cfg, "--data-dir", base, "--table", table, "--format", fmt]
    assert export(*args, "--topics", "clicks") == 0  # dead letters committed
    committed, _ = stored(dead, fmt)
    assert committed

    # a run dies after writing the files of both tables, before either commit
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_CRASH="before-commit")
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", *args]
    r = subprocess.run([*job, "--topics", "views"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 137, r.stderr[-2000:]
    crashed_at = time.monotonic()
    files, referenced = stored(dead, fmt)
    crashed = files - committed
    crashed_bytes = sum(os.path.getsize(os.path.join(dead, f)) for f in crashed)
    assert crashed and not crashed & referenced and referenced == committed
    assert rows(dead, "topic,partition,seq", fmt) == [("clicks", 0, s) for s in sorted(BAD_SEQS)]

    # within the horizon (12 h): left alone, as a run in flight's would be
    assert export(*args, "--topics", "pages", "--report", str(tmp_path / "r1.json")) == 0
    swept = json.load(open(tmp_path / "r1.json"))["summary"]["dead_letter_orphans"]
    assert (swept["files"], swept["recent_files"]) == (0, len(crashed))
    files, referenced = stored(dead, fmt)
    assert crashed <= files and not crashed & referenced
    committed = referenced

    # the killed run started over a second ago, longer than a 1 s horizon: a dry run says its files would go ...
    time.sleep(max(0.0, 1.5 - (time.monotonic() - crashed_at)))
    settings, plans = prepared(*args, "--topics", "views", "--orphan-horizon=1s")
    dry: dict = {}
    dead_letter_orphans(settings, dry, dry_run=True)
    assert (dry["dead_letter_orphans"]["files"], dry["dead_letter_orphans"]["dry_run"]) == (len(crashed), True)
    assert stored(dead, fmt)[0] == files
    # ... and a run that old does not commit dead letters, which a sweep may have taken
    old_run = new_run_id(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2))
    with pytest.raises(RunTooOld):
        commit_dead_letters(settings, TableLocation.of(dead, {}, fmt).existing(), [], plans, old_run)
    assert stored(dead, fmt) == (files, committed)

    # the next run removes them, nothing else
    assert export(*args, "--topics", "views", "--orphan-horizon=1s", "--report", str(tmp_path / "r2.json")) == 0
    summary = json.load(open(tmp_path / "r2.json"))["summary"]
    swept = summary["dead_letter_orphans"]
    assert (swept["files"], swept["recent_files"], len(swept["runs"]), swept["dry_run"]) == (len(crashed), 0, 1, False)
    assert swept["bytes"] == crashed_bytes
    assert summary["orphans"]["files"] > 0 and summary["orphans"]["runs"] == swept["runs"]  # the same killed run
    after, referenced = stored(dead, fmt)
    assert not crashed & after and committed <= after and after == referenced  # exactly those, no other
    topics = ("clicks", "pages", "views")
    assert sorted(rows(dead, "topic,partition,seq", fmt)) == sorted((t, 0, s) for t in topics for s in BAD_SEQS)
    main = rows(table, "topic,partition,seq", fmt)
    every = sorted((t, p, s) for t in topics for p in (0, 1) for s in range(1, 9))
    assert sorted(main + rows(dead, "topic,partition,seq", fmt)) == every  # each message once, in one table
