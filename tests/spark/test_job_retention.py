"""jobs/retention.py end to end on local Spark over more than 100 partitions."""

import json
import os

import pytest
from conftest import run_job_script, tree_digest

from tank_log.format.bundle import Message
from tank_log.storage.datadir import scan_data_dir
from tank_log.storage.writer import write_segment

DAY = 86400
OLD = 1_700_000_000  # 2023: older than every limit below


def run_job(*args, **kw):
    """The job on Spark's executors unless `where="driver"` (its default on data this small): the dry run and the
    rerun that follow the test's real run take the driver."""
    return run_job_script("retention", *args, **kw)


def write_part(pdir, n_ro=4, per=20):
    os.makedirs(pdir)
    seq = 1
    for i in range(n_ro + 1):
        msgs = [Message(seq + j, (OLD + i * DAY) * 1000 + j, b"k%d" % j, b"v" * 50) for j in range(per)]
        write_segment(pdir, msgs, active=i == n_ro, ts=OLD + i * DAY)
        seq += per


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ret") / "data")
    # 100 partitions, keep 2 RO segments
    os.makedirs(os.path.join(root, "many"))
    with open(os.path.join(root, "many", "config"), "w") as fh:
        fh.write("retention.segments.count=2\n")
    for p in range(100):
        write_part(os.path.join(root, "many", str(p)))
    # a topic TTL from the job config only, aged by message ts, including a legacy-named front segment
    write_part(os.path.join(root, "ttl", "0"))
    front = sorted(f for f in os.listdir(os.path.join(root, "ttl", "0")) if f.endswith(".ilog"))[0]
    os.rename(os.path.join(root, "ttl", "0", front), os.path.join(root, "ttl", "0", front.split("_")[0] + ".ilog"))
    # a cleanup topic: untouched unless the job config says otherwise
    os.makedirs(os.path.join(root, "kv"))
    with open(os.path.join(root, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\nretention.segments.count=2\n")
    for p in range(3):
        write_part(os.path.join(root, "kv", str(p)))
    return root


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    path = tmp_path_factory.mktemp("conf") / "retention.yaml"
    path.write_text("retention:\n  topics:\n    ttl: {max_age: 1day, time_basis: message}\n")
    return str(path)


def test_dry_run_then_real_run_then_nothing(base, conf, tmp_path):
    before = tree_digest(base, include_lock=True)
    job = ["--data-dir", base, "--config", conf]
    r = run_job(*job, "--dry-run", "--report", str(tmp_path / "dry.json"), where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    assert tree_digest(base, include_lock=True) == before  # byte-identical
    dry = json.load(open(tmp_path / "dry.json"))
    assert dry["summary"]["would_delete_segments"] == 100 * 2 + 4

    r = run_job(*job, "--broker-stopped", "--report", str(tmp_path / "run.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.load(open(tmp_path / "run.json"))
    parts = {(p["topic"], p["partition"]): p for p in report["partitions"]}
    assert len(parts) == 104 and report["status"] == "ok"
    for p in range(100):
        res = parts[("many", p)]
        assert res["status"] == "deleted" and res["segments_deleted"] == 2 and res["messages_deleted"] == 40
        assert res["first_seq_after"] == 41 and "retention.segments.count" in res["deleted"][0]["reason"]
    ttl = parts[("ttl", 0)]
    assert ttl["status"] == "deleted" and ttl["segments_deleted"] == 4  # every RO segment, the legacy one too
    assert all("newest message ts" in d["reason"] for d in ttl["deleted"])
    assert {parts[("kv", p)]["status"] for p in range(3)} == {"skipped"}
    dd = scan_data_dir(base)
    for part in dd.partitions():
        assert part.active is not None  # the active segment always survives
        if part.topic == "many":
            assert [s.base for s in part.ro] == [41, 61]
        if part.topic == "kv":
            assert len(part.ro) == 4
    assert report["summary"]["segments_deleted"] == 204

    r = run_job(*job, "--broker-stopped", "--report", str(tmp_path / "again.json"), where="driver")
    assert r.returncode == 0
    again = json.load(open(tmp_path / "again.json"))
    assert {p["status"] for p in again["partitions"]} == {"nothing-to-do", "skipped"}


def test_bad_time_basis_is_a_usage_error(base):
    r = run_job("--data-dir", base, "--time-basis", "mtime")
    assert r.returncode == 2 and "time-basis" in r.stderr
