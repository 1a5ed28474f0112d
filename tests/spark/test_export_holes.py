"""The export never records a version past a hole, so retention's `keep_unexported` guard can trust the table.

An RO segment truncated in the middle (its name says it ends at 4682, the content at 4382): the export used to commit
8,196 rows, record seq 8496 and exit 0; seqs 4383..4682 were in neither place, a re-export after the segment was
restored said "up-to-date", and retention then deleted the segment."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, data_dir, load_dump, run_job_script
from deltalake import DeltaTable
from test_job_export import run_job as run_export

from tank_log.lakehouse import recorded_version

SEGMENT = "2829-4682_1795261032.ilog"


def _base(tmp_path):
    """`events/1` of A_multi as `t/0`, its segment 2829-4682 truncated at byte 30000 (a bundle cut in two)."""
    base = tmp_path / "base"
    pdir = base / "t" / "0"
    shutil.copytree(os.path.join(data_dir("A_multi"), "events", "1"), pdir)
    for f in os.listdir(pdir):
        os.chmod(pdir / f, 0o644)
    (base / "t" / "config").write_text("retention.segments.count=1\n")
    os.truncate(pdir / SEGMENT, 30000)
    return str(base), pdir


def _rows(table):
    d = DeltaTable(table).to_pyarrow_table(columns=["seq", "value"]).to_pydict()
    return sorted(zip(d["seq"], d["value"], strict=True))


def _want(upto):
    return [(seq, value) for seq, _, _, value in load_dump("A_multi")[("events", 1)] if seq <= upto]


def _export(base, table, report, *flags, executors):
    r = run_export("--data-dir", base, "--table", table, "--report", report, *flags, executors=executors)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r, json.load(open(report))["partitions"][0]


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_a_truncated_segment_stops_the_recorded_version_before_its_hole(tmp_path, where):
    base, pdir = _base(tmp_path)
    table, report = str(tmp_path / "table"), str(tmp_path / "r.json")
    on_executors = where == "executors"
    r, p = _export(base, table, report, executors=on_executors)
    assert r.returncode == 1, r.stderr[-3000:]
    assert p["status"] == "failed" and p["exported_to_seq"] == 4382
    hole = f"{pdir / SEGMENT} @27826: seqs 4383..4682 not read"
    assert p["error"].startswith(hole) and hole in r.stderr
    assert recorded_version(DeltaTable(table), table, "t", 0)[1] == 4382
    assert _rows(table) == _want(4382)

    # skip: nothing of the partition, nothing recorded
    skip_table = str(tmp_path / "skip")
    r, p = _export(base, skip_table, str(tmp_path / "s.json"), "--on-corruption", "skip", executors=on_executors)
    assert r.returncode == 1 and p["status"] == "failed" and p["error"].startswith(hole)
    assert recorded_version(DeltaTable(skip_table), skip_table, "t", 0)[1] is None and _rows(skip_table) == []

    # retention with the guard keeps the damaged segment: the table does not hold its seqs
    r = run_job_script("retention", "--data-dir", base, "--broker-stopped", "--keep-unexported", table, where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    assert os.path.exists(pdir / SEGMENT)

    # the segment restored: the next run exports the rest, exactly once
    shutil.copyfile(os.path.join(data_dir("A_multi"), "events", "1", SEGMENT), pdir / SEGMENT)
    r, p = _export(base, table, report, executors=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert p["status"] == "exported" and p["from_seq"] == 4383
    assert _rows(table) == _want(10**9)


def _continuous(base, tmp_path, table, mode):
    args = ["--data-dir", base, "--table", table, "--checkpoint", str(tmp_path / f"ck-{mode}"), "--continuous"]
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *args,
         "--trigger-interval", "1s", "--on-data-loss", mode, "--report", str(tmp_path / f"{mode}.json")],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"), stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"{mode}.log", "w"), start_new_session=True,
    )  # fmt: skip


def _caught_up(table):
    try:
        rows = _rows(table)
    except Exception:  # the table is being created
        return False
    return bool(rows) and rows[-1][0] == 8496


def test_the_continuous_export_fails_on_a_hole_or_skips_it_saying_so(tmp_path):
    base, pdir = _base(tmp_path)
    hole = f"{pdir / SEGMENT} @27826: seqs 4383..4682 not read"

    # both runs at once (each into its own table; the data is only read): the test waits for one JVM start, not two
    failing = _continuous(base, tmp_path, str(tmp_path / "fail-table"), "fail")
    table = str(tmp_path / "skip-table")
    job = _continuous(base, tmp_path, table, "skip")

    try:
        _fail_then_skip(failing, job, table, tmp_path, hole)
    finally:
        for proc in (failing, job):
            if proc.poll() is None:  # a failed check: nothing of it outlives the test
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert _rows(table) == [r for r in _want(10**9) if not 4383 <= r[0] <= 4682]
    (lost,) = json.load(open(tmp_path / "skip.json"))["summary"]["data_loss"]
    assert (lost["topic"], lost["partition"], lost["from_seq"], lost["to_seq"]) == ("t", 0, 4383, 4682)
    assert lost["hole"].startswith(hole)


def _fail_then_skip(failing, job, table, tmp_path, hole):
    # fail (the default): the query stops before committing the batch, exit 1, naming the hole
    assert failing.wait(600) == 1, open(tmp_path / "fail.log").read()[-3000:]
    log = open(tmp_path / "fail.log").read()
    assert "could not be read (a hole)" in log and hole in log
    assert _rows(str(tmp_path / "fail-table")) == []

    # skip: every other seq is exported, the hole's range is reported with its file and offset
    deadline = time.monotonic() + 600
    while not _caught_up(table):
        assert job.poll() is None and time.monotonic() < deadline, open(tmp_path / "skip.log").read()[-3000:]
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGTERM)
    assert job.wait(120) == 0, open(tmp_path / "skip.log").read()[-3000:]


def _layout_damage(tmp_path, kind):
    """events/1 of A_multi as t/0: 1005-2828 and 2829-4682 compacted into one `1005-4682` output whose second input
    was resurrected next to it (`overlap`, FORMAT.md §6.4), or 1005-2828 deleted with its index left (`lost`)."""
    pdir = tmp_path / "base" / "t" / "0"
    shutil.copytree(os.path.join(data_dir("A_multi"), "events", "1"), pdir)
    for f in os.listdir(pdir):
        os.chmod(pdir / f, 0o644)
    lost = pdir / "1005-2828_1795261032.ilog"
    if kind == "overlap":
        (pdir / "1005-4682_1795261032.ilog").write_bytes(lost.read_bytes() + (pdir / SEGMENT).read_bytes())
    lost.unlink()
    return str(tmp_path / "base"), pdir


@pytest.mark.parametrize(("kind", "where"), [("overlap", "executors"), ("lost", "driver")])
def test_overlaps_and_lost_segments_are_holes_for_the_export(tmp_path, kind, where):
    """Over an overlap (a compaction input resurrected next to its output) the export committed seqs 2829..4682
    twice (1,854 duplicated rows), exit 0; over an RO segment lost beside its index it recorded seq 8496 with seqs
    1005..2828 never exported, exit 0. Now: exit 1 naming the file and the seqs; nothing of an overlapping
    partition is exported, and the recorded version stops before a lost segment."""
    base, pdir = _layout_damage(tmp_path, kind)
    table, report = str(tmp_path / "table"), str(tmp_path / "r.json")
    r, p = _export(base, table, report, executors=where == "executors")
    assert r.returncode == 1, r.stderr[-3000:]
    assert p["status"] == "failed"
    if kind == "overlap":
        assert p["error"].startswith(f"{pdir / SEGMENT}: seqs 1..8496 not read ([overlap] RO range 2829-4682 overlaps")
        assert p["exported_to_seq"] is None and _rows(table) == []
        assert recorded_version(DeltaTable(table), table, "t", 0)[1] is None
    else:
        assert p["error"].startswith(f"{pdir / '1005.index'}: seqs 1005..2828 not read ([lost-segment]")
        assert p["exported_to_seq"] == 1004 and _rows(table) == _want(1004)
        assert recorded_version(DeltaTable(table), table, "t", 0)[1] == 1004


def test_the_continuous_export_skips_a_renumbering_hole_without_committing_its_rows(tmp_path):
    """A bundle duplicated in the middle of an RO segment renumbers every message after it: with --on-data-loss skip
    the continuous export committed those rows (seqs the broker never gave them) and recorded past the hole. Now
    nothing of the segment is committed, and the loss names the file and seqs."""
    from tank_log.storage.segment import Segment

    base = tmp_path / "base"
    pdir = base / "t" / "0"
    shutil.copytree(os.path.join(data_dir("A_multi"), "events", "1"), pdir)
    for f in os.listdir(pdir):
        os.chmod(pdir / f, 0o644)
    path = pdir / SEGMENT
    data, h = path.read_bytes(), list(Segment(str(path)).bundles())[3]
    path.write_bytes(data[: h.offset + h.size] + data[h.offset :])
    table = str(tmp_path / "skip-table")
    job = _continuous(str(base), tmp_path, table, "skip")
    deadline = time.monotonic() + 600
    while not _caught_up(table):
        assert job.poll() is None and time.monotonic() < deadline, open(tmp_path / "skip.log").read()[-3000:]
        time.sleep(1)
    os.killpg(job.pid, signal.SIGTERM)
    assert job.wait(120) == 0, open(tmp_path / "skip.log").read()[-3000:]
    assert _rows(table) == [r for r in _want(10**9) if not 2829 <= r[0] <= 4682]
    (lost,) = json.load(open(tmp_path / "skip.json"))["summary"]["data_loss"]
    assert (lost["topic"], lost["partition"], lost["from_seq"], lost["to_seq"]) == ("t", 0, 2829, 4682)
    assert lost["hole"].startswith(f"{path} @") and "seqs 2829..4682 not read" in lost["hole"]
