"""The Airflow 3 DAGs under real Airflow: they import, have the expected shape, and one runs end to end with the
real spark-submit on local[2]."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from airflow_harness import DAG_IDS

from tank_log.format.bundle import Message
from tank_log.storage.datadir import scan_data_dir
from tank_log.storage.writer import write_segment

pytest.importorskip("airflow")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository (tests/e2e → ../..)
PROBE = os.path.join(HERE, "airflow_probe.py")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(ROOT, "airflow", "dags"),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),  # spark-submit of the venv
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "TANK_LOG_DAG_RETRIES": "0",  # dag.test() would otherwise wait out the retry delay of a failed task
        }
    )
    r = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return env


def probe(env, *args, timeout=900):
    r = subprocess.run([sys.executable, PROBE, *args], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [x for x in r.stdout.splitlines() if x.startswith("PROBE-RESULT ")]
    assert lines, (r.returncode, r.stdout[-3000:], r.stderr[-5000:])
    return json.loads(lines[-1][len("PROBE-RESULT ") :]), r


def job_env(airflow_env, conf, tmp_path) -> dict:
    """The Airflow environment with the Variables of a DAG run: this checkout, the job config, a reports directory."""
    return dict(
        airflow_env,
        AIRFLOW_VAR_TANK_LOG_HOME=ROOT,
        AIRFLOW_VAR_TANK_LOG_CONFIG=str(conf),
        AIRFLOW_VAR_TANK_LOG_REPORTS=str(tmp_path / "reports"),
    )


def test_dags_import_with_the_expected_shape(airflow_env):
    out, _ = probe(airflow_env, "inspect")
    assert out["errors"] == {}
    dags = out["dags"]
    assert set(dags) == set(DAG_IDS)
    assert dags["tank_compaction_nightly"]["tasks"] == ["publish_report", "run_compact"]
    assert dags["tank_retention_hourly"]["tasks"] == ["publish_report", "run_retention"]
    assert dags["tank_index_verify_weekly"]["tasks"] == ["publish_report", "run_rebuild_indexes"]
    assert dags["tank_export_adhoc"]["tasks"] == ["publish_report", "run_export_delta"]
    assert dags["tank_export_adhoc"]["params"] == ["destination", "since", "topics"]
    for dag_id in ("tank_compaction_nightly", "tank_retention_hourly", "tank_index_verify_weekly"):
        assert dags[dag_id]["max_active_runs"] == 1 and dags[dag_id]["retries"] == [0]  # TANK_LOG_DAG_RETRIES
        assert dags[dag_id]["timeouts"] and dags[dag_id]["doc"]
    assert dags["tank_compaction_nightly"]["schedule"] == "30 2 * * *"
    hourly = dags["tank_retention_hourly"]["schedule"]  # hourly, and after every export (the Asset)
    assert hourly.startswith("AssetOrTimeSchedule") and "tank_log_export" in hourly and "'0 * * * *'" in hourly
    assert dags["tank_index_verify_weekly"]["schedule"] == "0 4 * * 0"
    assert dags["tank_export_adhoc"]["schedule"] == "None"
    nightly = dags["tank_export_nightly"]
    assert nightly["schedule"] == "15 1 * * *" and nightly["max_active_runs"] == 1
    assert nightly["tasks"] == ["publish_report", "publish_upkeep_report", "run_export_delta", "run_upkeep"]
    assert nightly["upstream"]["run_upkeep"] == ["run_export_delta"]
    assert nightly["trigger_rules"]["run_upkeep"] == "all_done"
    for dag_id, d in dags.items():
        if dag_id not in ("tank_maintenance_window", "tank_export_nightly"):
            assert d["upstream_of_publish"] and d["upstream_of_publish"][0].startswith("run_")

    # the window of conf/hosts.yaml (the default): one task group per broker host's queue, rolling host by host
    w = dags["tank_maintenance_window"]
    steps = ["stop", "maintain", "start", "ready", "verify", "report"]
    assert w["schedule"] == "0 3 * * *" and w["max_active_runs"] == 1 and w["doc"]
    assert set(w["tasks"]) == {"check_config", "brokers_tank-host-a", "brokers_tank-host-b"} | {
        f"window_tank-host-{h}.{s}" for h in "ab" for s in steps
    }
    for h in "ab":
        assert {w["queues"][f"window_tank-host-{h}.{s}"] for s in steps} == {f"tank-host-{h}"}
        for before, after in zip(steps, steps[1:], strict=False):
            assert f"window_tank-host-{h}.{before}" in w["upstream"][f"window_tank-host-{h}.{after}"]
        for s in ("start", "ready", "verify", "report"):  # run whatever happened before
            assert w["trigger_rules"][f"window_tank-host-{h}.{s}"] == "all_done"
    assert "window_tank-host-a.report" in w["upstream"]["brokers_tank-host-b"]  # rolling


def test_the_window_keeps_its_default_group_when_its_config_does_not_load(airflow_env, tmp_path):
    """A parse that briefly cannot load the hosts file (being rewritten, a slow disk) must not change the shape of a
    window DAG a run is executing: the soak saw a run's tasks killed as "not found" after such a parse. The default
    queue's group stays; the run's check_config fails, saying why."""
    out, _ = probe(dict(airflow_env, TANK_LOG_WINDOW_CONFIG=str(tmp_path / "missing.yaml")), "inspect")
    w = out["dags"]["tank_maintenance_window"]
    steps = ["stop", "maintain", "start", "ready", "verify", "report"]
    assert set(w["tasks"]) == {"check_config", "brokers_default"} | {f"window_default.{s}" for s in steps}


def _retention_data(root):
    """A topic whose config keeps 2 RO segments, holding 5 + an active one."""
    base = os.path.join(root, "data")
    pdir = os.path.join(base, "logs", "0")
    os.makedirs(pdir)
    with open(os.path.join(base, "logs", "config"), "w") as fh:
        fh.write("retention.segments.count=2\n")
    seq = 1
    for i in range(6):
        msgs = [Message(seq + j, 1_700_000_000_000 + seq + j, None, b"line %d" % (seq + j)) for j in range(10)]
        write_segment(pdir, msgs, active=i == 5, ts=1_700_000_000 + i)
        seq += 10
    return base


def test_retention_dag_end_to_end_and_failure(airflow_env, tmp_path):
    base = _retention_data(str(tmp_path))
    conf = tmp_path / "job.yaml"
    conf.write_text(f"data_dirs: [{base}]\nbroker_stopped: true\n")
    env = job_env(airflow_env, conf, tmp_path)
    out, r = probe(env, "run", "tank_retention_hourly")
    assert out["state"] == "success", (out, r.stdout[-4000:])
    (part,) = scan_data_dir(base).partitions()
    assert [s.base for s in part.ro] == [31, 41] and part.active.base == 51  # the 3 oldest went
    (report,) = os.listdir(tmp_path / "reports")
    rep = json.load(open(tmp_path / "reports" / report))
    assert rep["status"] == "ok" and rep["summary"]["segments_deleted"] == 3

    # the job fails (its data directory is gone): the spark-submit task fails, the report is still surfaced
    shutil.rmtree(base)
    out, r = probe(env, "run", "tank_retention_hourly")
    assert out["state"] == "failed"
    assert out["tasks"]["run_retention"] == "failed" and out["tasks"]["publish_report"] == "failed"


def test_a_missing_spark_connection_fails_fast_and_says_so(airflow_env, tmp_path):
    """Without `spark_default` the provider silently fell back to master yarn and failed obscurely."""
    base = _retention_data(str(tmp_path))
    conf = tmp_path / "job.yaml"
    conf.write_text(f"data_dirs: [{base}]\nbroker_stopped: true\n")
    env = {k: v for k, v in airflow_env.items() if k != "AIRFLOW_CONN_SPARK_DEFAULT"}
    env.update(AIRFLOW_VAR_TANK_LOG_CONFIG=str(conf), AIRFLOW_VAR_TANK_LOG_REPORTS=str(tmp_path / "reports"))
    out, r = probe(env, "run", "tank_retention_hourly")
    assert out["state"] == "failed" and out["tasks"]["run_retention"] == "failed"
    assert "no Airflow connection 'spark_default'" in r.stdout + r.stderr
    assert len(os.listdir(os.path.join(base, "logs", "0"))) == 12  # nothing ran


def test_the_airflow_demo_command_sets_up_airflow_and_runs_the_nightly_dag(tmp_path):
    """One command sets up a local Airflow (connection, variables, dags folder, reserialize) and runs a DAG."""
    env = dict(os.environ, TANK_LOG_AIRFLOW_DIR=str(tmp_path / "af"))
    r = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "airflow-demo.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "tank_compaction_nightly" in r.stdout and '"status": "ok"' in r.stdout


def _window_env(airflow_env, tmp_path, brokers: list[dict], rolling: bool) -> dict:
    conf = tmp_path / "hosts.yaml"
    doc = {"maintenance_window": {"rolling": rolling, "spark_master": "local[1]"}, "brokers": brokers}
    conf.write_text(json.dumps(doc))  # JSON is YAML
    return dict(
        airflow_env,
        TANK_LOG_WINDOW_CONFIG=str(conf),
        AIRFLOW_VAR_TANK_LOG_HOME=ROOT,
        AIRFLOW_VAR_TANK_LOG_REPORTS=str(tmp_path / "reports"),
    )


def _stop_standins(work):
    for f in os.listdir(work):
        if f.endswith(".pid"):
            try:
                os.kill(int(open(os.path.join(work, f)).read()), 9)
            except ProcessLookupError:
                pass


def _serves(entry: dict) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", int(entry["ready_check"].rsplit(":", 1)[1])), timeout=2).close()
        return True
    except OSError:
        return False


def test_maintenance_window_rolling_over_two_brokers(airflow_env, tmp_path):
    """Per broker host, in order: stop → wait until released → maintain → start → ready → verify → report;
    rolling: broker b goes down only once broker a serves again."""
    from conftest import events, standin_broker, start_standin, tree_digest

    from tank_log.maintenance.verify import verify_path
    from tank_log.tools.demo import write_demo

    work = str(tmp_path)
    a = standin_broker(work, "a", write_demo(str(tmp_path / "a")))
    b = standin_broker(work, "b", write_demo(str(tmp_path / "b")))
    a["queue"], b["queue"] = "host-a", "host-b"
    before = {n: tree_digest(e["data_dirs"][0]) for n, e in (("a", a), ("b", b))}
    env = _window_env(airflow_env, tmp_path, [a, b], rolling=True)
    try:
        start_standin(a), start_standin(b)
        out, r = probe(env, "run", "tank_maintenance_window")
        assert out["state"] == "success", (out, r.stdout[-6000:])
        assert events(work) == ["up a", "up b", "down a", "up a", "down b", "up b"]
        for name, entry in (("a", a), ("b", b)):
            base = entry["data_dirs"][0]
            assert tree_digest(base) != before[name]  # maintained while its broker was down
            assert not [p for p in verify_path(base) if p.severity == "error"] and _serves(entry)
            steps = out["xcom"][f"window_host-{name}.report[0]"]["steps"]
            assert list(steps) == ["stop", "maintain", "start", "ready", "verify"]
            assert steps["stop"]["done"] and steps["start"]["done"] and steps["maintain"]["status"] == "ok"
            assert os.path.exists(steps["maintain"]["report"])
        reports = sorted(os.listdir(tmp_path / "reports"))
        assert [f.split("-")[:2] for f in reports] == [
            ["maintain", "a"],
            ["maintain", "b"],
            ["window", "a"],
            ["window", "b"],
        ]
    finally:
        _stop_standins(work)


def test_maintenance_window_failures_restart_what_was_stopped_and_leave_a_stubborn_broker_alone(airflow_env, tmp_path):
    """Broker a's job fails (a corrupt segment): a is started again anyway; broker b will not stop: its data
    is not touched and no second broker is started; the run fails naming broker and step. Both brokers are on the
    default queue: one task group mapped over two brokers."""
    from conftest import events, standin_broker, start_standin, tree_digest

    from tank_log.tools.demo import write_demo

    work = str(tmp_path)
    a = standin_broker(work, "a", write_demo(str(tmp_path / "a")))
    b = standin_broker(work, "b", write_demo(str(tmp_path / "b")), stubborn=True, stop_timeout="3s")
    pdir = os.path.join(a["data_dirs"][0], "profiles", "0")
    seg = sorted(f for f in os.listdir(pdir) if f.endswith(".ilog"))[0]
    with open(os.path.join(pdir, seg), "r+b") as fh:
        fh.write(b"\xff" * 16)
    before_b = tree_digest(b["data_dirs"][0])
    env = _window_env(airflow_env, tmp_path, [a, b], rolling=False)
    try:
        start_standin(a), start_standin(b)
        out, r = probe(env, "run", "tank_maintenance_window")
        t = out["tasks"]
        assert out["state"] == "failed", out
        assert t["window_default.maintain[0]"] == "failed" and t["window_default.start[0]"] == "success"
        assert t["window_default.ready[0]"] == "success" and t["window_default.report[0]"] == "failed"
        assert t["window_default.stop[1]"] == "failed" and t["window_default.maintain[1]"] == "upstream_failed"
        assert t["window_default.start[1]"] == "success" and t["window_default.report[1]"] == "failed"
        assert [e for e in events(work) if e.endswith(" a")] == ["up a", "down a", "up a"]
        assert [e for e in events(work) if e.endswith(" b")] == ["up b"]  # never stopped, never a second one
        assert tree_digest(b["data_dirs"][0]) == before_b and _serves(a) and _serves(b)
        window_a = json.load(open(next((tmp_path / "reports").glob("window-a-*.json"))))
        assert window_a["steps"]["maintain"] is None and window_a["job_report"]["status"] == "partial-failure"
        assert window_a["steps"]["start"]["done"] and window_a["steps"]["verify"] is None
        window_b = json.load(open(next((tmp_path / "reports").glob("window-b-*.json"))))
        assert window_b["steps"]["start"]["detail"].startswith("not started: it still runs")
        log = r.stdout + r.stderr
        assert "broker a: step(s) maintain, verify did not succeed" in log
        assert "broker b: stop: still held after 3 s" in log
    finally:
        _stop_standins(work)


def test_export_dag_to_an_s3_destination(airflow_env, tmp_path, s3_server):
    """The ad hoc export DAG takes an s3:// destination (endpoint in the job config's storage_options,
    credentials in the workers' environment); the table read back equals the fixture's dump."""
    from conftest import copy_tree, data_dir, load_dump, new_bucket
    from deltalake import DeltaTable

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    new_bucket(s3_server, "dag-lake")
    conf = tmp_path / "job.yaml"
    options = {"AWS_ENDPOINT_URL": s3_server["endpoint"], "AWS_ALLOW_HTTP": "true"}
    conf.write_text(json.dumps({"data_dirs": [base], "export": {"storage_options": options}}))
    env = dict(job_env(airflow_env, conf, tmp_path), **s3_server["env"])
    run_conf = {"destination": "s3://dag-lake/events", "topics": "events"}
    out, r = probe(env, "run", "tank_export_adhoc", json.dumps(run_conf))
    assert out["state"] == "success", (out, r.stdout[-4000:])
    t = DeltaTable("s3://dag-lake/events", storage_options={**s3_server["env"], **options}).to_pyarrow_table()
    got = sorted(zip(t["partition"].to_pylist(), t["seq"].to_pylist(), t["value"].to_pylist(), strict=True))
    want = sorted(
        (p, seq, v) for (topic, p), msgs in load_dump("A_multi").items() if topic == "events" for seq, _, _, v in msgs
    )
    assert got == want
