"""jobs/compact.py end to end on local Spark (a real subprocess, as an orchestrator runs it)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, WHERE, copy_tree, data_dir, load_dump, many_small_partitions, run_job_script, tree_digest

from tank_log.maintenance.verify import verify_path
from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.tools.demo import write_demo

JOB = os.path.join(ROOT, "jobs", "compact.py")


def run_job(*args, **kw):
    """The job on Spark's executors unless `where="driver"` (its default on data this small): dry runs and reruns
    that follow a test's real run take the driver."""
    return run_job_script("compact", *args, **kw)


def by_key(report):
    return {(p["topic"], p["partition"]): p for p in report["partitions"]}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return make_scenario(tmp_path_factory.mktemp("job"))


def make_scenario(root):
    """demo data + E_before (a `delete` topic compacted through a job-config override) + a B2 copy with one
    corrupt RO segment."""
    demo = write_demo(str(root / "demo"))
    e = copy_tree(data_dir("E_before"), str(root / "e"))
    b2 = copy_tree(data_dir("B2_compaction_live"), str(root / "b2"))
    os.unlink(os.path.join(b2, ".cleanup.log"))  # its marks say "clean": make both partitions due again
    bad = os.path.join(b2, "kvlive", "0", "121-7887_1795261097.ilog")
    with open(bad, "r+b") as fh:  # the first bundle's flags: bit 7 + codec 3 (bytes inside a message set
        flags_at = 1 if fh.read(1)[0] < 0x80 else 2  # cannot be detected: TANK has no checksums, §3.1)
        fh.seek(flags_at)
        fh.write(b"\xc3")
    conf = root / "job.yaml"
    conf.write_text("compaction:\n  topics:\n    kv: {policy: cleanup}\n")
    return root, demo, e, b2, str(conf)


def test_mixed_run_reports_partial_failure(scenario):
    root, demo, e, b2, conf = scenario
    corrupt_before = tree_digest(os.path.join(b2, "kvlive", "0"))
    report_path = str(root / "r1.json")
    r = run_job(
        "--data-dir",
        demo,
        "--data-dir",
        e,
        "--data-dir",
        b2,
        "--config",
        conf,
        "--broker-stopped",
        "--report",
        report_path,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert " INFO SparkContext" not in r.stderr  # Spark's start-up INFO lines are quiet by default
    assert "tank_log.progress: [1/" in r.stderr  # a line per partition as it finishes
    report = json.load(open(report_path))
    parts = by_key(report)
    assert report["status"] == "partial-failure"
    timings = report["timings"]  # the run's split, phase by phase, adds up to its duration
    assert set(timings) == {"prepare_s", "spark_start_s", "execute_s", "spark_stop_s"}
    assert min(timings.values()) >= 0 and abs(sum(timings.values()) - report["duration_s"]) < 0.1
    damaged = parts[("kvlive", 0)]  # refused by the readers' completeness check: named (file @offset), not written
    said = f"{damaged.get('reason') or ''} {damaged.get('error') or ''}"
    assert damaged["status"] == "needs-attention" and "121-7887_1795261097.ilog @" in said, damaged
    assert parts[("kvlive", 1)]["status"] == "nothing-to-do"  # compacted by the broker already
    assert parts[("kvlive", 1)]["reason"] == "no message would be dropped"
    for key in [("profiles", 0), ("profiles", 1), ("kv", 0)]:
        p = parts[key]
        assert p["status"] == "compacted", p
        assert p["messages_after"] < p["messages_before"] and p["bytes_after"] < p["bytes_before"]
        assert p["duration_s"] >= 0 and p["distinct_keys"] > 0
    assert parts[("orders", 0)]["status"] == "skipped"
    assert tree_digest(os.path.join(b2, "kvlive", "0")) == corrupt_before  # a failed partition is untouched
    assert [p for p in verify_path(e) if p.severity == "error"] == []
    assert [p for p in verify_path(demo) if p.severity == "error"] == []
    assert read_cleanup_log(e) == {("kv", 0): 8058}
    assert set(read_cleanup_log(demo)) == {("profiles", 0), ("profiles", 1)}
    survivors = [m for m in load_dump("E_after")[("kv", 0)] if m[0] <= 8058]
    assert parts[("kv", 0)]["messages_after"] == len(survivors)


def test_a_small_run_goes_to_the_driver_processes_and_equals_the_executors(tmp_path):
    """Below `in_driver_max_bytes` (the default 1gb) the job starts no Spark: the driver runs the partitions in one
    process per core of the master. Same data, same marks, same report entries as on Spark's executors, including
    the corrupt partition's failure."""
    runs = {}
    source = make_scenario(tmp_path / "source")[0]
    for where in ("executors", "driver"):
        root = copy_tree(str(source), str(tmp_path / where))
        demo, e, b2, conf = (os.path.join(root, name) for name in ("demo", "e", "b2", "job.yaml"))
        report_path = os.path.join(root, "r.json")
        dirs = ["--data-dir", demo, "--data-dir", e, "--data-dir", b2, "--config", conf]
        r = run_job(*dirs, "--broker-stopped", "--report", report_path, where=where)
        assert r.returncode == 1, r.stderr[-3000:]
        report = json.load(open(report_path))
        assert report["executed_on"] == where and ("spark" in report) == (where == "executors")
        entries = {  # where the copy lives and how long it took aside
            k: {f: str(v).replace(root, "ROOT") for f, v in p.items() if f != "duration_s"}
            for k, p in by_key(report).items()
        }
        runs[where] = (entries, [tree_digest(d) for d in (demo, e, b2)], [read_cleanup_log(d) for d in (demo, e)], r)
    assert runs["driver"][0] == runs["executors"][0]
    assert runs["driver"][1] == runs["executors"][1] and runs["driver"][2] == runs["executors"][2]
    err = runs["driver"][3].stderr
    assert "in 2 process(es) of the driver's" in err and "tank_log.progress: [1/" in err
    report = json.load(open(report_path))
    assert set(report["timings"]) == {"prepare_s", "execute_s", "spark_stop_s"}
    # local[1]: one process; over the limit: Spark
    demo = write_demo(str(tmp_path / "one"))
    r = run_job("--data-dir", demo, "--broker-stopped", where="driver", master="local[1]")
    assert r.returncode == 0 and "in 1 process(es) of the driver's" in r.stderr, r.stderr[-3000:]
    demo = write_demo(str(tmp_path / "over"))
    report_path = str(tmp_path / "over.json")
    r = run_job(
        "--data-dir", demo, "--broker-stopped", "--in-driver-max-bytes=100kb", "--report", report_path, where="driver"
    )
    assert r.returncode == 0 and json.load(open(report_path))["executed_on"] == "executors", r.stderr[-3000:]


def test_second_run_has_nothing_to_do(scenario):
    root, demo, e, b2, conf = scenario
    before = tree_digest(demo)
    report_path = str(root / "r2.json")
    args = ["--data-dir", demo, "--data-dir", e, "--config", conf, "--broker-stopped"]
    r = run_job(*args, "--report", report_path, where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.load(open(report_path))
    assert {p["status"] for p in report["partitions"]} == {"nothing-to-do", "skipped"}
    assert tree_digest(demo) == before


def test_dry_run_changes_nothing(tmp_path):
    demo = write_demo(str(tmp_path / "demo"))
    before = tree_digest(demo, include_lock=True)
    report_path = str(tmp_path / "r.json")
    r = run_job("--data-dir", demo, "--dry-run", "--broker-stopped", "--report", report_path, where="driver")
    assert r.returncode == 0, r.stderr[-3000:]
    assert tree_digest(demo, include_lock=True) == before
    parts = by_key(json.load(open(report_path)))
    assert parts[("profiles", 0)]["status"] == "dry-run"
    assert 0 < parts[("profiles", 0)]["messages_after"] < parts[("profiles", 0)]["messages_before"]


@pytest.mark.parametrize(
    "args,config,needle",
    [
        (["--data-dir", "/nonexistent/tank"], None, "data directory not found"),
        ([], None, "no data directory"),
        (["--data-dir", "."], "compaction:\n  bundle_bytes: 1GB\n", "compaction.bundle_bytes"),
        (["--data-dir", "."], "compaction:\n  colour: red\n", "unknown key"),
        (["--data-dir", ".", "--tombstone-retention", "5m"], None, "--tombstone-retention"),
        (["--data-dir", ".", "--no-such-flag"], None, "unrecognized arguments"),
        # nothing matched is an error, not a green run with 0 partitions
        (["--data-dir", "{empty}"], None, "not a TANK base path: it is empty"),
        (["--data-dir", "{etc}"], None, "directories ssh hold no partition directories"),
        (["--data-dir", "{demo}", "--topics", "profils"], None, "unknown topic(s) profils"),
        (["--data-dir", "{demo}"], "compaction:\n  topics:\n    ordres: {policy: cleanup}\n", "ordres named in"),
    ],
)
def test_usage_errors_exit_2_with_a_report(tmp_path, args, config, needle):
    report_path = str(tmp_path / "r.json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "etc" / "ssh").mkdir(parents=True)
    paths = {"empty": tmp_path / "empty", "etc": tmp_path / "etc", "demo": write_demo(str(tmp_path / "demo"))}
    args = [a.format(**paths) for a in args]
    if config:
        (tmp_path / "c.yaml").write_text(config)
        args = [*args, "--config", str(tmp_path / "c.yaml")]
    r = run_job(*args, "--report", report_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr
    report = json.load(open(report_path))
    assert report["status"] == "usage-error" and needle in report["error"]
    assert report["duration_s"] >= 0 and isinstance(report["timings"], dict)  # every report ends the same way


@pytest.mark.parametrize("where", ["executors", "driver"])
@pytest.mark.parametrize("stop", ["sigterm-to-the-main-thread", "ctrl-c-to-the-process-group"])
def test_sigterm_writes_the_report_with_what_finished_and_the_rerun_completes(tmp_path, stop, where):
    """Ctrl-C/SIGTERM: running partitions finish, no new one starts; the report lists what finished and what
    was interrupted; the data stays consistent. Stopped by SIGTERM to the driver's main thread, waiting for the job
    (CI found a partition left mid-swap when a signal interrupted the driver's Thread.join, which then marks the
    thread stopped), and by Ctrl-C in a terminal (SIGINT to the whole process group: the driver and Spark's JVM)."""
    import signal
    import time

    from conftest import signal_thread

    base = many_small_partitions(tmp_path / "many", 300)  # on local[1]: long enough to be stopped midway
    kv = os.path.join(base, "kv")
    before = {p: sorted(os.listdir(os.path.join(kv, p))) for p in os.listdir(kv) if p.isdigit()}
    report_path = str(tmp_path / "r.json")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, JOB, "--master", "local[1]", *WHERE[where], "--data-dir", base, "--broker-stopped"]
    proc = subprocess.Popen(
        [*cmd, "--report", report_path], stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    lines = []
    for line in proc.stderr:  # wait for the first Spark task's partitions (4 tasks on local[1]), then stop the run
        lines.append(line)
        if "tank_log.progress: [75/300]" in line:
            time.sleep(0.2)  # the driver waits for the job again
            if stop == "sigterm-to-the-main-thread":
                signal_thread(proc.pid, proc.pid, signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGINT)
            break
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=300) == 130, "".join(lines)[-3000:]
    err = "".join(lines)
    assert "Traceback" not in err and "compact: interrupted;" in err
    report = json.load(open(report_path))
    by_status = report["summary"]["by_status"]
    assert report["status"] == "interrupted" and sum(by_status.values()) == 300
    assert report["duration_s"] > 0 and "prepare_s" in report["timings"]
    finished = sum(n for status, n in by_status.items() if status != "interrupted")
    assert finished >= 1 and by_status.get("interrupted", 0) >= 1, by_status
    assert f"{finished} partition(s) finished" in err
    log = "".join(line for line in lines if "tank_log.progress" not in line and not line.startswith("  "))
    assert not [p for p in verify_path(base) if p.severity == "error"], log[-6000:]  # the log, not the list of done
    # the drain let the running partition finish before the report was written: the disk agrees with the report
    changed = {p for p, names in before.items() if sorted(os.listdir(os.path.join(kv, p))) != names}
    compacted = {str(e["partition"]) for e in report["partitions"] if e["status"] == "compacted"}
    assert changed == compacted and len(compacted) == finished, (sorted(changed ^ compacted), log[-6000:])
    r = run_job("--data-dir", base, "--broker-stopped", where="driver")  # the rerun compacts the rest
    assert r.returncode == 0, r.stderr[-3000:]
    parts = read_cleanup_log(base)
    assert len(parts) == 300


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_a_live_broker_process_makes_the_job_skip_its_partitions_even_with_broker_stopped(tmp_path, where):
    """A process whose command line names the base path (the broker runs as `tank -p BASE`) holds every
    partition: the job skips them, naming it, changes nothing, and exits 3 (the work was not done)."""
    from conftest import Detached

    demo = write_demo(str(tmp_path / "demo"))
    before = tree_digest(demo)
    broker = Detached(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)", "-p", demo], dict(os.environ)
    )
    try:
        report_path = str(tmp_path / "r.json")
        r = run_job("--data-dir", demo, "--broker-stopped", "--report", report_path, where=where)
        assert r.returncode == 3, r.stderr[-3000:]  # done partially: the profiles partitions needed work
        assert "done partially" in r.stderr.strip().splitlines()[-1]
        parts = [p for p in json.load(open(report_path))["partitions"] if p["topic"] == "profiles"]
        assert parts and all(p["status"] == "skipped" and f"pid {broker.pid}" in p["reason"] for p in parts)
        assert tree_digest(demo) == before
    finally:
        broker.kill()
    r = run_job("--data-dir", demo, "--broker-stopped", where="driver")
    assert r.returncode == 0 and tree_digest(demo) != before  # once it exited, the job proceeds
