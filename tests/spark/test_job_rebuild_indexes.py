"""jobs/rebuild_indexes.py end to end on local Spark."""

import json
import os

from conftest import FIXTURES, copy_tree, data_dir, run_job_script, tree_digest


def run_job(*args, **kw):
    """The job on Spark's executors unless `where="driver"` (its default on data this small): the dry run and the
    rerun that follow the test's real run take the driver."""
    return run_job_script("rebuild_indexes", *args, **kw)


def test_verify_rebuild_salvage(tmp_path):
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    rebuilt = os.path.join(FIXTURES, "D_index_rebuild", "rebuilt", "A_multi")
    targets = ["small/0/1.index", "events/1/1.index", "seqgap/0/3379.index"]
    os.unlink(os.path.join(base, targets[0]))
    open(os.path.join(base, targets[1]), "wb").write(b"")  # a 0-byte RO index: the broker aborts on it
    open(os.path.join(base, targets[2]), "wb").write(b"\x01" * 16)
    active = os.path.join(base, "events", "2", "5394_1795261032.log")
    with open(active, "ab") as fh:
        fh.write(b"\x90\x03\x01")  # a torn bundle at the end of the active segment

    before = tree_digest(base, include_lock=True)
    r = run_job("--data-dir", base, "--dry-run", "--report", str(tmp_path / "dry.json"), where="driver")
    assert r.returncode == 1, r.stderr[-3000:]  # the torn tail needs --salvage: not clean
    assert tree_digest(base, include_lock=True) == before

    r = run_job("--data-dir", base, "--broker-stopped", "--salvage", "--report", str(tmp_path / "run.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.load(open(tmp_path / "run.json"))
    parts = {(p["topic"], p["partition"]): p for p in report["partitions"]}
    assert parts[("small", 0)]["status"] == "fixed" and parts[("retained", 0)]["status"] == "clean"
    assert "index-empty" in {f["code"] for f in parts[("events", 1)]["found"]}
    assert [a["action"] for a in parts[("events", 2)]["actions"]] == ["salvaged"]
    assert report["summary"]["indexes_rebuilt"] == 3
    for rel in targets:
        assert open(os.path.join(base, rel), "rb").read() == open(os.path.join(rebuilt, rel), "rb").read()

    r = run_job("--data-dir", base, "--broker-stopped", "--report", str(tmp_path / "again.json"), where="driver")
    assert r.returncode == 0
    assert {p["status"] for p in json.load(open(tmp_path / "again.json"))["partitions"]} == {"clean"}
