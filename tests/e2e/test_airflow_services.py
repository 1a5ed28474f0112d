"""The DAGs under Airflow's real services, as an operator runs them: an API server, a scheduler with the
LocalExecutor and a DAG processor, started from the project's virtualenv under a temporary AIRFLOW_HOME (SQLite).
Through the REST API: a DAG triggered by hand with a run conf succeeds (a run triggered by hand has no logical date
in Airflow 3: `ts_nodash` and its kin are undefined there) and its Asset event triggers retention; a scheduled run
happens and a task that fails once is retried and then succeeds; a job task hung past its execution_timeout is
killed with every process of its job, the data it touched is before-or-after, and the next run succeeds. Every DAG
triggered by hand is the guide's demo (test_airflow_demo.py). Every process the test starts is stopped by its
process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime

import pytest
from airflow_harness import BIN, Airflow, airflow_env, start_services
from conftest import free_port, load_fleet, many_small_partitions, standin_broker, start_standin

from tank_log.maintenance.verify import verify_path
from tank_log.storage.fsutil import atomic_write
from tank_log.tools.demo import write_demo

pytest.importorskip("airflow")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB_TIMEOUT_S = 40  # the compaction DAG's job task here: far above a run on this data, so only a hung run meets it


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("airflow_services"))
    port = free_port()
    conf = os.path.join(work, "job.yaml")
    with open(conf, "w") as fh:  # `demo` is created by the retry test, while its first try waits for a retry
        json.dump({"data_dirs": [os.path.join(work, "demo")], "export": {"table": f"{work}/lake"}}, fh)
    brokers = [standin_broker(work, name, write_demo(os.path.join(work, f"broker-{name}"))) for name in "ab"]
    hosts = os.path.join(work, "hosts.yaml")
    with open(hosts, "w") as fh:
        json.dump({"maintenance_window": {"spark_master": "local[1]"}, "brokers": brokers}, fh)
    env = airflow_env(
        work,
        port,
        config=conf,
        hosts=hosts,
        scheduled=("tank_retention_hourly",),  # its scheduled run (and its retry) is tested
        TANK_RETENTION_HOURLY_RETRIES="1",
        TANK_COMPACTION_NIGHTLY_TIMEOUT_S=str(JOB_TIMEOUT_S),
        TANK_LOG_TASK_HOLD=os.path.join(work, "hold"),  # the hung-job test holds a task of its run there
    )
    af = start_services(work, port, env)
    try:
        for entry in brokers:
            start_standin(entry)
        af.brokers = brokers  # type: ignore[attr-defined]
        yield af
    finally:
        af.stop()
        for f in os.listdir(work):
            if f.endswith(".pid"):
                try:
                    os.kill(int(open(os.path.join(work, f)).read()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def _unpause(af: Airflow, dag_id: str) -> None:
    af.api("PATCH", f"dags/{dag_id}", {"is_paused": False})


def test_a_scheduled_run_retries_a_failed_task_then_succeeds(airflow):
    """The hourly retention is due as soon as it is unpaused (catchup off: the last interval). Its job's first try
    fails (the data directory does not exist yet), the retry configured for it (RETRIES=1) succeeds.

    Whatever the machine's speed, the retry cannot come before the data: the DAG is paused again while its first try
    runs (a paused DAG's running try goes on; its retry is not queued), the data is written once that try has failed,
    and only then is the DAG unpaused."""
    af = airflow
    dag = "tank_retention_hourly"
    _unpause(af, dag)
    deadline = time.monotonic() + 300  # bounds a hang only
    while not (runs := af.runs(dag)):
        assert time.monotonic() < deadline, "no scheduled run"
        time.sleep(0.2)
    (run,) = runs
    assert run["run_type"] == "scheduled"
    run_id = run["dag_run_id"]

    def job_try(*states: str | None) -> dict:
        """The job task once it is in one of `states`."""
        while (ti := af.tasks(dag, run_id)["run_retention"])["state"] not in states:
            assert time.monotonic() < deadline, af.explain(dag, run_id)
            time.sleep(0.2)
        return dict(ti)

    job_try("queued", "running", "up_for_retry")  # its first try
    af.api("PATCH", f"dags/{dag}", {"is_paused": True})
    ti = job_try("up_for_retry", "failed", "success")
    assert (ti["state"], ti["try_number"]) == ("up_for_retry", 1), af.explain(dag, run_id)  # the retry waits
    write_demo(os.path.join(af.work, "demo"))  # what the first try missed
    _unpause(af, dag)
    state = af.wait(dag, run_id)
    assert state == "success", af.explain(dag, run_id)
    assert af.tasks(dag, run_id)["run_retention"]["try_number"] == 2


def test_a_run_triggered_by_hand_with_conf_succeeds_and_its_asset_runs_retention(airflow):
    """The ad hoc export triggered by hand with its run conf (a run triggered by hand has no logical date in Airflow
    3: the report is named from the run id); the Asset event it emits triggers retention, which frees what the
    export delivered. (Every DAG triggered by hand under these services is the guide's demo, test_airflow_demo.)"""
    af = airflow
    if not os.path.exists(os.path.join(af.work, "demo")):
        write_demo(os.path.join(af.work, "demo"))
    _unpause(af, "tank_export_adhoc")
    run_id = af.trigger("tank_export_adhoc", {"topics": "orders", "destination": f"{af.work}/adhoc-lake"})
    assert run_id.startswith("manual__")
    state = af.wait("tank_export_adhoc", run_id, timeout=600)
    assert state == "success", af.explain("tank_export_adhoc", run_id)
    reports = os.listdir(os.path.join(af.work, "reports"))
    tag = run_id.replace(":", "").replace("+", "_")
    assert any(tag in r for r in reports), (tag, reports)  # named from the run id
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(f"{af.work}/adhoc-lake")
    topics = QueryBuilder().register("t", table).execute("select distinct topic from t").read_all()
    assert topics.column(0).to_pylist() == ["orders"]
    deadline = time.monotonic() + 120
    while not (after := [r for r in af.runs("tank_retention_hourly") if r["run_type"] == "asset_triggered"]):
        assert time.monotonic() < deadline, "no retention run after the export"
        time.sleep(1)
    assert af.wait("tank_retention_hourly", after[0]["dag_run_id"]) == "success"


def _job_processes(marker: str) -> list[tuple[int, str]]:
    """Live processes of this test run whose command line holds `marker`: spark-submit's JVM, the job's driver, its
    workers (another run's jobs on the same host are not this test's)."""
    run = f"TANK_LOG_TEST_RUN={os.environ['TANK_LOG_TEST_RUN']}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as fh:
                ours = run in fh.read().split(b"\0")
        except OSError:
            continue
        if marker in cmd and ours and state != "Z" and int(pid) != os.getpid():
            out.append((int(pid), cmd))
    return out


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


@pytest.mark.alone  # the healthy rerun must finish within the timeout the hung one runs past
def test_a_job_hung_past_its_timeout_is_killed_with_every_process_and_the_next_run_succeeds(airflow):
    """The compaction's driver and its workers hang mid-run (SIGSTOP, as on a stuck disk): Airflow's
    execution_timeout kills spark-submit, and the driver and its workers die with it within seconds. `tank-log
    repair` brings what they touched to before-or-after; the next run succeeds."""
    af = airflow
    if not os.path.exists(os.path.join(af.work, "demo")):
        write_demo(os.path.join(af.work, "demo"))
    _unpause(af, "tank_compaction_nightly")
    hung = many_small_partitions(os.path.join(af.work, "hung"), 300)  # long enough to be caught mid-run
    with open(os.path.join(af.work, "job.yaml")) as fh:
        conf = json.load(fh)
    conf["data_dirs"].append(hung)
    with open(os.path.join(af.work, "job.yaml"), "w") as fh:
        json.dump(conf, fh)
    hold = os.path.join(af.work, "hold")  # TANK_LOG_TASK_HOLD: a task on a partition under `hung` waits there
    with open(hold, "w") as fh:
        fh.write(hung)
    run_id = af.trigger("tank_compaction_nightly")
    marker = "jobs/compact.py"
    deadline = time.monotonic() + 300  # bounds a hang only
    while not os.path.exists(
        hold + ".ready"
    ):  # a worker of the driver's pool holds a task: mid-run, whatever the speed
        assert time.monotonic() < deadline, af.explain("tank_compaction_nightly", run_id)
        time.sleep(0.05)
    drivers = [p for p, _ in _job_processes(marker) if _is_python(p) and _children(p)]  # spark-submit's Python child
    assert len(drivers) == 1, (_job_processes(marker), af.explain("tank_compaction_nightly", run_id))
    (driver,) = drivers
    workers = _children(driver)  # its pool, one of them held
    for pid in [driver, *workers]:
        os.kill(pid, signal.SIGSTOP)
    os.unlink(hold)  # the stopped run cannot go on; the next run is not held
    state = af.wait("tank_compaction_nightly", run_id, timeout=JOB_TIMEOUT_S + 120)
    assert state == "failed", af.explain("tank_compaction_nightly", run_id)
    job = af.tasks("tank_compaction_nightly", run_id)["run_compact"]
    assert job["state"] == "failed", af.explain("tank_compaction_nightly", run_id)
    ran = datetime.fromisoformat(job["end_date"]) - datetime.fromisoformat(job["start_date"])
    # Airflow's own dates: the timeout counts from the task's start, however late the workers appeared
    assert ran.total_seconds() >= JOB_TIMEOUT_S, (ran, af.explain("tank_compaction_nightly", run_id))
    deadline = time.monotonic() + 5
    while (left := _job_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left
    for base in (os.path.join(af.work, "demo"), hung):
        r = subprocess.run([os.path.join(BIN, "tank-log"), "repair", base], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not [p for p in verify_path(base) if p.severity == "error"]
    run_id = af.trigger("tank_compaction_nightly")
    state = af.wait("tank_compaction_nightly", run_id, timeout=600)
    assert state == "success", af.explain("tank_compaction_nightly", run_id)


def test_a_fleet_of_brokers_over_nights_with_faults_keeps_every_invariant(airflow, tmp_path):
    """bench/fleet.py's short mode under the running services: 2 broker hosts whose stand-ins keep appending, 3
    nights (the second one's maintenance window through the DAG under the scheduler), every host's export into one
    Delta table on the S3 server (one host also continuously), retention with keep_unexported, and faults: a job's
    driver and the CLI killed mid-run, a broker that will not stop, an export off, two exports at once, the
    continuous export killed. Every invariant holds after every night."""
    fleet = load_fleet()
    hosts = airflow.env["TANK_LOG_WINDOW_CONFIG"]
    with open(hosts, "rb") as fh:
        saved = fh.read()
    faults = ["0:h0:kill-job", "0:h1:stubborn", "1:h0:export-off", "1:h1:double-export", "2:h1:kill-cli"]
    faults += ["2:h0:kill-continuous", "2:h0:kill-export"]
    argv = ["--short", "--fault-rate", "0", "--night-s", "1", "--workdir", str(tmp_path / "fleet"), "--seed", "3"]
    try:
        out = fleet.main([*argv, *(f"--force-fault={f}" for f in faults)], airflow=airflow, hosts_file=hosts)
    finally:
        atomic_write(hosts, saved)  # the dag-processor parses the DAGs meanwhile
    assert out["violations"] == dict.fromkeys(out["violations"], 0), out["reproductions"]
    assert out["nights"] == 3 and out["through_airflow"] == 1 and out["hosts"] == 2
    # volume follows --night-s and the stand-ins' rate (2 hosts, 3 nights of 1 s: ~6,000 messages here): the soak
    # produced, exported most of it despite the faults, and compacted the cleanup topics
    assert out["produced"] > 2_000 and out["exported"] > out["produced"] // 2 and out["compacted_away"] > 0
    assert out["kills"] >= 3 and out["faults_total"] == len(faults), out["faults"]


def test_a_fleet_of_real_brokers_keeps_every_invariant(airflow, tmp_path):
    """bench/fleet.py's short mode with every host the real TANK broker (TANK_BIN, TANK_CLI; skipped without them):
    the messages go through the broker's produce path, the broker compacts its `cleanup` topics and applies its own
    retention to an unguarded topic, each host's broker is SIGKILLed mid-append once, the second night's window runs
    through the DAG under the scheduler (each host's maintain job with its own configuration). After every night what
    the broker serves equals `tank-log dump`, and every invariant holds."""
    from real_broker import binaries

    found = binaries()
    if isinstance(found, str):
        pytest.skip(found)
    fleet = load_fleet()
    hosts = airflow.env["TANK_LOG_WINDOW_CONFIG"]
    with open(hosts, "rb") as fh:
        saved = fh.read()
    faults = ["0:h0:kill-job", "1:h1:stubborn", "2:h1:kill-step"]
    argv = ["--short", "--fault-rate", "0", "--night-s", "3", "--workdir", str(tmp_path / "fleet"), "--seed", "5"]
    argv += ["--tank", found[0], "--tank-cli", found[1], "--broker-kill-every", "2"]
    try:
        out = fleet.main([*argv, *(f"--force-fault={f}" for f in faults)], airflow=airflow, hosts_file=hosts)
    finally:
        atomic_write(hosts, saved)  # the dag-processor parses the DAGs meanwhile
    assert out["violations"] == dict.fromkeys(out["violations"], 0), out["reproductions"]
    assert out["nights"] == 3 and out["through_airflow"] == 1 and out["hosts"] == 2
    assert out["broker_kills"] == 3 and out["faults"]["kill-broker"] == 3, out["faults"]  # h0 nights 0, 2; h1 night 1
    assert out["served_compared"] > 1_000 and out["produced"] > 2_000 and out["compacted_away"] > 0
    assert out["deleted_by_broker_unguarded"] > 0
