"""Retention that never outruns the lakehouse (`retention.keep_unexported`): with real Delta tables written by the
export job (a local path and the loopback S3 server), retention deletes only RO segments whose last seq the table
holds, reports what it keeps back, deletes anyway past `max_holdback` (status data-loss, exact seq ranges, exit 1),
and deletes nothing when the table cannot be read."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_job_script
from test_job_export import Lake
from test_job_export import run_job as run_export

from tank_log.format.bundle import Message
from tank_log.storage.datadir import partitions_at
from tank_log.storage.writer import write_segment

pytestmark = pytest.mark.spark
TANK_LOG = [sys.executable, "-m", "tank_log.tools.cli"]


def _segment(pdir: str, first: int, n: int, *, active: bool = False, step: int = 1) -> None:
    """n messages from seq `first` (every `step`-th seq: a compacted segment has gaps); RO segments are named by their
    range, as the broker does."""
    msgs = [
        Message(first + i * step, 1_700_000_000_000 + first + i, b"k%d" % i, b"v%d" % (first + i)) for i in range(n)
    ]
    write_segment(pdir, msgs, active=active, ts=1_700_000_000 + first)


GUARDED_LIMITS = {"retention": {"topics": {"logs": {"segments_count": 2}}}}


def _job_config(base: str) -> str:
    """The job config of a guarded topic: its limit (keep 2 RO segments) is tank-log's, not the broker's, which would
    delete segments the table lacks at its next roll (the guard refuses such a topic: needs-attention)."""
    path = os.path.join(os.path.dirname(base), f"{os.path.basename(base)}-job.json")
    with open(path, "w") as fh:
        json.dump(GUARDED_LIMITS, fh)
    return path


def _logs(base: str, ro: list[tuple[int, int]], active: int, step: int = 1) -> str:
    """Topic `logs` (delete policy; the job config keeps 2 RO segments), partition 0: RO segments (first, n), then
    the active one."""
    pdir = os.path.join(base, "logs", "0")
    os.makedirs(pdir, exist_ok=True)
    _job_config(base)
    for first, n in ro:
        _segment(pdir, first, n, step=step)
    _segment(pdir, active, 10, active=True, step=step)
    return pdir


def _roll(pdir: str, firsts: list[int], active: int) -> None:
    """The broker rolled: the active segment is sealed, more RO segments, a new active one."""
    (old,) = [f for f in os.listdir(pdir) if f.endswith(".log")]
    part = partitions_at(pdir)[0]
    last = max(m.seq for m in part.active.messages())
    os.rename(os.path.join(pdir, old), os.path.join(pdir, f"{part.active.base}-{last}_{part.active.name.ts}.ilog"))
    for first in firsts:
        _segment(pdir, first, 10)
    _segment(pdir, active, 10, active=True)


def _retention(base, tmp_path, name, *flags, env=None):
    report = tmp_path / f"{name}.json"
    r = run_job_script(
        "retention",
        "--data-dir",
        base,
        "--broker-stopped",
        "--report",
        str(report),
        "--config",
        _job_config(base),
        *flags,
        where="driver",
        env_extra=env,
    )
    return r, json.loads(report.read_text())


def _files(pdir):
    return sorted(f for f in os.listdir(pdir) if not f.startswith("."))  # not the lock file of a run


def _ro(pdir):
    return [(s.base, s.last) for s in partitions_at(pdir)[0].ro]


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    return Lake(tmp_path, request.getfixturevalue("s3_server") if request.param == "s3" else None)


def test_retention_keeps_what_the_table_lacks_until_the_export_catches_up(tmp_path, lake):
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    r = run_export("--data-dir", base, "--table", lake.uri, *lake.flags, env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]  # the table holds 1..40
    _roll(pdir, [41, 51, 61], 71)  # 41..70 RO, 71..80 active: the table lacks 41..80
    guard = ["--keep-unexported", lake.uri, *lake.flags]  # --storage-option as for the export

    # dry run: the same decision, nothing deleted
    before = _files(pdir)
    r, rep = _retention(base, tmp_path, "dry", *guard, "--dry-run", env=lake.env)
    assert r.returncode == 0 and _files(pdir) == before

    r, rep = _retention(base, tmp_path, "behind", *guard, env=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]
    (p,) = rep["partitions"]
    assert p["status"] == "deleted" and p["exported_last"] == 40
    assert [d["base"] for d in p["deleted"]] == [1, 11, 21, 31]  # the limit wanted 1..50 gone (2 RO kept)
    assert p["kept_unexported"]["segments"] == 1 and p["kept_unexported"]["first_seq"] == 41
    assert p["kept_unexported"]["last_seq"] == 50 and p["kept_unexported"]["bytes"] > 0
    assert _ro(pdir) == [(41, 50), (51, 60), (61, 70)]
    assert "logs/0: kept 1 segments (" in r.stderr and f"seqs 41..50) not yet in {lake.uri}" in r.stderr
    assert rep["summary"]["kept_unexported_segments"] == 1

    r = run_export("--data-dir", base, "--table", lake.uri, *lake.flags, env_extra=lake.env)
    assert r.returncode == 0, r.stderr[-3000:]  # caught up: 1..80
    r, rep = _retention(base, tmp_path, "caught-up", *guard, env=lake.env)
    assert r.returncode == 0 and rep["partitions"][0]["kept_unexported"] is None
    assert _ro(pdir) == [(51, 60), (61, 70)]

    # the export stops; the broker keeps rolling; past the bound retention deletes anyway and says so
    _roll(pdir, [81, 91, 101], 111)  # the table lacks 81..120
    r, rep = _retention(base, tmp_path, "bound", *guard, "--max-holdback-size", "100", env=lake.env)
    assert r.returncode == 1
    (p,) = rep["partitions"]
    assert p["status"] == "data-loss" and p["deleted_unexported"] == [[81, 90]]  # the table holds up to 80
    assert [d["base"] for d in p["deleted"]] == [51, 61, 71, 81]
    assert _ro(pdir) == [(91, 100), (101, 110)]
    assert rep["status"] == "partial-failure" and rep["summary"]["data_loss_partitions"] == 1


def test_an_unreadable_table_deletes_nothing(tmp_path):
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10), (31, 10)], 41)
    before = _files(pdir)
    r, rep = _retention(base, tmp_path, "missing", "--keep-unexported", str(tmp_path / "no-table"))
    assert r.returncode == 1 and rep["partitions"][0]["status"] == "needs-attention"
    assert "nothing deleted" in rep["partitions"][0]["reason"] and _files(pdir) == before
    # a Delta table that is no tank-log export (no seq column)
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "other"), pa.table({"topic": ["logs"], "partition": [0]}))
    r, rep = _retention(base, tmp_path, "schema", "--keep-unexported", str(tmp_path / "other"))
    assert r.returncode == 1 and "not a tank-log export" in rep["partitions"][0]["reason"]
    assert _files(pdir) == before
    # the same through the configuration (and `tank-log maintain`)
    conf = tmp_path / "job.yaml"
    guard = {"keep_unexported": {"table": str(tmp_path / "no-table")}}
    conf.write_text(json.dumps({"retention": {**GUARDED_LIMITS["retention"], **guard}}))
    r = subprocess.run(
        [*TANK_LOG, "maintain", base, "--broker-stopped", "--config", str(conf)], capture_output=True, text=True
    )
    entries = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 1 and entries[0]["steps"]["retention"]["status"] == "needs-attention"
    assert _files(pdir) == before


def test_a_guarded_topic_the_broker_deletes_from_by_itself_needs_attention(tmp_path):
    """keep_unexported cannot keep what the broker's own retention deletes at its next roll (§5): a guarded topic
    whose config lets the broker delete by age, size or count is reported, naming the topic and the key, by the
    retention job, `tank-log maintain` and `tank-log verify --config`; nothing is deleted by us meanwhile."""
    lake = Lake(tmp_path)
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10), (31, 10)], 41)
    assert run_export("--data-dir", base, "--table", lake.uri).returncode == 0
    _roll(pdir, [51], 61)  # the table lacks 41..
    with open(os.path.join(base, "logs", "config"), "w") as fh:
        fh.write("log.retention.secs=3days\n")
    before = _files(pdir)
    r, rep = _retention(base, tmp_path, "broker", "--keep-unexported", lake.uri)
    assert r.returncode == 1, r.stderr[-3000:]
    (p,) = rep["partitions"]
    assert p["status"] == "needs-attention"
    assert "topic logs:" in p["reason"] and "log.retention.secs=259200" in p["reason"]
    conf = tmp_path / "guarded.json"
    conf.write_text(json.dumps({"retention": {**GUARDED_LIMITS["retention"], "keep_unexported": {"table": lake.uri}}}))
    r = subprocess.run(
        [*TANK_LOG, "maintain", base, "--broker-stopped", "--config", str(conf)], capture_output=True, text=True
    )
    (entry,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 1 and entry["steps"]["retention"]["status"] == "needs-attention"
    assert "log.retention.secs=259200" in entry["steps"]["retention"]["reason"]
    r = subprocess.run([*TANK_LOG, "verify", base, "--config", str(conf)], capture_output=True, text=True)
    assert r.returncode == 1 and "[broker-retention]" in r.stdout and "log.retention.secs=259200" in r.stdout
    assert subprocess.run([*TANK_LOG, "verify", base], capture_output=True).returncode == 0  # no guard, no problem
    assert _files(pdir) == before


def test_compacted_and_imported_partitions(tmp_path):
    """Seq gaps (a compacted partition): a segment goes once the table holds its last seq, whatever seqs it lacks
    inside; an imported partition is judged by the versions the export recorded in its table."""
    lake = Lake(tmp_path)
    base = str(tmp_path / "base")
    _logs(base, [(1, 5), (11, 5), (21, 5), (31, 5)], 41, step=2)  # seqs 1,3,5,7,9; 11,...
    r = run_export("--data-dir", base, "--table", lake.uri)
    assert r.returncode == 0, r.stderr[-3000:]
    r, rep = _retention(base, tmp_path, "gaps", "--keep-unexported", lake.uri)
    assert r.returncode == 0 and [d["base"] for d in rep["partitions"][0]["deleted"]] == [1, 11]
    assert rep["partitions"][0]["kept_unexported"] is None

    new = str(tmp_path / "imported")
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "jobs", "import_delta.py"),
            "--master",
            "local[1]",
            "--data-dir",
            new,
            "--table",
            lake.uri,
            "--segment-bytes",
            "200",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    _roll(os.path.join(new, "logs", "0"), [61, 71], 81)  # the new cluster's broker appended: the table lacks 61..
    r, rep = _retention(new, tmp_path, "imported", "--keep-unexported", lake.uri)
    assert r.returncode == 0, r.stderr[-3000:]
    (p,) = rep["partitions"]
    assert p["status"] == "deleted" and p["exported_last"] == 59 and p["kept_unexported"] is None
    assert [d["base"] for d in p["deleted"]] == [1] and _ro(os.path.join(new, "logs", "0")) == [(61, 70), (71, 80)]
