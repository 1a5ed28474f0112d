"""The Airflow 3 DAGs under real Airflow: they import, have the expected shape, and one runs end to end with the
real spark-submit on local[2]."""

import json
import os
import shutil
import subprocess
import sys

import pytest

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


def test_dags_import_with_the_expected_shape(airflow_env):
    out, _ = probe(airflow_env, "inspect")
    assert out["errors"] == {}
    dags = out["dags"]
    assert set(dags) == {
        "tank_compaction_nightly",
        "tank_retention_hourly",
        "tank_index_verify_weekly",
        "tank_export_adhoc",
    }
    assert dags["tank_compaction_nightly"]["tasks"] == ["publish_report", "run_compact"]
    assert dags["tank_retention_hourly"]["tasks"] == ["publish_report", "run_retention"]
    assert dags["tank_index_verify_weekly"]["tasks"] == ["publish_report", "run_rebuild_indexes"]
    assert dags["tank_export_adhoc"]["tasks"] == ["publish_report", "run_export_delta"]
    assert dags["tank_export_adhoc"]["params"] == ["destination", "since", "topics"]
    for dag_id in ("tank_compaction_nightly", "tank_retention_hourly", "tank_index_verify_weekly"):
        assert dags[dag_id]["max_active_runs"] == 1 and dags[dag_id]["retries"] == [0]  # TANK_LOG_DAG_RETRIES
        assert dags[dag_id]["timeouts"] and dags[dag_id]["doc"]
    assert dags["tank_compaction_nightly"]["schedule"] == "30 2 * * *"
    assert dags["tank_retention_hourly"]["schedule"] == "@hourly"
    assert dags["tank_index_verify_weekly"]["schedule"] == "0 4 * * 0"
    assert dags["tank_export_adhoc"]["schedule"] == "None"
    for d in dags.values():
        assert d["upstream_of_publish"] and d["upstream_of_publish"][0].startswith("run_")


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
    env = dict(
        airflow_env,
        AIRFLOW_VAR_TANK_LOG_HOME=ROOT,
        AIRFLOW_VAR_TANK_LOG_CONFIG=str(conf),
        AIRFLOW_VAR_TANK_LOG_REPORTS=str(tmp_path / "reports"),
    )
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
    """#13: without `spark_default` the provider silently fell back to master yarn and failed obscurely."""
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
    """#13: one command sets up a local Airflow (connection, variables, dags folder, reserialize) and runs a DAG."""
    env = dict(os.environ, TANK_LOG_AIRFLOW_DIR=str(tmp_path / "af"))
    r = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "airflow-demo.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "tank_compaction_nightly" in r.stdout and '"status": "ok"' in r.stdout
