"""The export never records a version past a hole, so retention's `keep_unexported` guard can trust the table.

An RO segment truncated in the middle (its name says it ends at 4682, the content at 4382): the export used to commit
8,196 rows, record seq 8496 and exit 0; seqs 4383..4682 were in neither place, a re-export after the segment was
restored said "up-to-date", and retention then deleted the segment."""

import json
import os
import shutil

import pytest
from conftest import data_dir, load_dump, run_job_script
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
