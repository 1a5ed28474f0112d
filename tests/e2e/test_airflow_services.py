"""The DAGs under Airflow's real services, as an operator runs them: an API server, a scheduler with the
LocalExecutor and a DAG processor, started from the project's virtualenv under a temporary AIRFLOW_HOME (SQLite).
Through the REST API: every DAG triggered by hand succeeds (a run triggered by hand has no logical date in Airflow 3:
`ts_nodash` and its kin are undefined there); a scheduled run happens and a task that fails once is retried and then
succeeds; a job task hung past its execution_timeout is killed with every process of its job, the data it touched
is before-or-after, and the next run succeeds. Every process the test starts is stopped by its process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import (
    ROOT,
    free_port,
    kill_session,
    many_small_partitions,
    session_processes,
    standin_broker,
    start_standin,
    wait_for_port,
)

from tank_log.maintenance.verify import verify_path
from tank_log.tools.demo import write_demo

pytest.importorskip("airflow")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

BIN = os.path.dirname(sys.executable)
DAG_IDS = (
    "tank_compaction_nightly",
    "tank_retention_hourly",
    "tank_index_verify_weekly",
    "tank_export_adhoc",
    "tank_export_nightly",
    "tank_maintenance_window",
)
JOB_TIMEOUT_S = 40  # the compaction DAG's job task here: far above a run on this data, so only a hung run meets it


class Airflow:
    """The running services and a REST client of their API."""

    def __init__(self, work: str, port: int, env: dict[str, str]):
        self.work, self.port, self.env = work, port, env
        self.sessions: list[int] = []
        self._token: str | None = None

    def start(self, *command: str) -> None:
        name = command[0]
        log = open(os.path.join(self.work, f"{name}.log"), "w")  # noqa: SIM115 (the process keeps it)
        proc = subprocess.Popen(
            [os.path.join(BIN, "airflow"), *command],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.sessions.append(proc.pid)

    def stop(self) -> None:
        """Every service by its process group (SIGTERM, then SIGKILL), and whatever is left of their sessions."""
        for sid in self.sessions:
            try:
                os.killpg(sid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while any(session_processes(s) for s in self.sessions) and time.monotonic() < deadline:
            time.sleep(0.2)
        for sid in self.sessions:
            kill_session(sid)

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        if self._token is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/auth/token", timeout=30) as r:
                self._token = json.load(r)["access_token"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v2/{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self.api("POST", f"dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return str(run["dag_run_id"])

    def runs(self, dag_id: str) -> list[dict]:
        return list(self.api("GET", f"dags/{dag_id}/dagRuns?limit=50")["dag_runs"])

    def tasks(self, dag_id: str, run_id: str) -> dict[str, dict]:
        path = f"dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances?limit=100"
        out = {}
        for ti in self.api("GET", path)["task_instances"]:
            key = ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti
        return out

    def wait(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        """The run's final state (success or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.api("GET", f"dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}")
            if run["state"] in ("success", "failed"):
                return str(run["state"])
            time.sleep(1)
        raise AssertionError(f"{dag_id} {run_id} not finished after {timeout} s: {self.tasks(dag_id, run_id)}")

    def explain(self, dag_id: str, run_id: str) -> str:
        """Task states and the end of each task's log, for an assertion message."""
        out = []
        for key, ti in self.tasks(dag_id, run_id).items():
            out.append(f"{key}: {ti['state']} (try {ti['try_number']})")
        logs = os.path.join(self.env["AIRFLOW_HOME"], "logs")
        for root, _, files in os.walk(logs):
            for f in files:
                if f"run_id={run_id}" in root:
                    out.append(f"--- {root}/{f}\n" + open(os.path.join(root, f), errors="replace").read()[-3000:])
        return "\n".join(out)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("airflow_services"))
    port = free_port()
    many = many_small_partitions(os.path.join(work, "many"), 300)  # a job long enough to be caught mid-run
    conf = os.path.join(work, "job.yaml")
    with open(conf, "w") as fh:  # `demo` is created by the retry test, while its first try waits for a retry
        json.dump({"data_dirs": [os.path.join(work, "demo"), many], "export": {"table": f"{work}/lake"}}, fh)
    brokers = [standin_broker(work, name, write_demo(os.path.join(work, f"broker-{name}"))) for name in "ab"]
    hosts = os.path.join(work, "hosts.yaml")
    with open(hosts, "w") as fh:
        json.dump({"maintenance_window": {"spark_master": "local[1]"}, "brokers": brokers}, fh)
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": os.path.join(work, "home"),
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(ROOT, "airflow", "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "tank-log-test-secret-" + "x" * 48,
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW_VAR_TANK_LOG_HOME": ROOT,
            "AIRFLOW_VAR_TANK_LOG_CONFIG": conf,
            "AIRFLOW_VAR_TANK_LOG_REPORTS": os.path.join(work, "reports"),
            "AIRFLOW_VAR_TANK_LOG_BROKER_STOPPED": "true",
            "PATH": BIN + os.pathsep + env.get("PATH", ""),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "TANK_LOG_WINDOW_CONFIG": hosts,
            "TANK_LOG_DAG_RETRIES": "0",
            "TANK_LOG_DAG_RETRY_DELAY_S": "2",
            # by hand only, but for the hourly retention, whose scheduled run (and its retry) is tested
            "TANK_COMPACTION_NIGHTLY_SCHEDULE": "none",
            "TANK_INDEX_VERIFY_WEEKLY_SCHEDULE": "none",
            "TANK_EXPORT_NIGHTLY_SCHEDULE": "none",
            "TANK_MAINTENANCE_WINDOW_SCHEDULE": "none",
            "TANK_RETENTION_HOURLY_RETRIES": "1",
            "TANK_COMPACTION_NIGHTLY_TIMEOUT_S": str(JOB_TIMEOUT_S),
        }
    )
    migrate = subprocess.run(
        [os.path.join(BIN, "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600
    )
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    af = Airflow(work, port, env)
    try:
        for command in (("api-server",), ("scheduler",), ("dag-processor",)):
            af.start(*command)
        wait_for_port(port, "the Airflow API server", timeout=180)
        deadline = time.monotonic() + 180
        while {d["dag_id"] for d in af.api("GET", "dags?limit=100")["dags"]} != set(DAG_IDS):
            assert time.monotonic() < deadline, "the DAG processor did not parse the DAGs"
            time.sleep(1)
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
    fails (the data directory does not exist yet), the retry configured for it (RETRIES=1) succeeds."""
    af = airflow
    _unpause(af, "tank_retention_hourly")
    deadline = time.monotonic() + 180
    while not (runs := af.runs("tank_retention_hourly")):
        assert time.monotonic() < deadline, "no scheduled run"
        time.sleep(1)
    (run,) = runs
    assert run["run_type"] == "scheduled"
    while af.tasks("tank_retention_hourly", run["dag_run_id"])["run_retention"]["state"] != "up_for_retry":
        assert time.monotonic() < deadline, af.explain("tank_retention_hourly", run["dag_run_id"])
        time.sleep(0.5)
    write_demo(os.path.join(af.work, "demo"))  # what the first try missed
    state = af.wait("tank_retention_hourly", run["dag_run_id"])
    assert state == "success", af.explain("tank_retention_hourly", run["dag_run_id"])
    ti = af.tasks("tank_retention_hourly", run["dag_run_id"])["run_retention"]
    assert ti["try_number"] == 2


MANUAL = [
    ("tank_compaction_nightly", None),
    ("tank_retention_hourly", None),
    ("tank_index_verify_weekly", None),
    ("tank_export_adhoc", {"topics": "orders", "destination": "{work}/adhoc-lake"}),
    ("tank_export_nightly", None),
    ("tank_maintenance_window", None),
]


@pytest.mark.parametrize("dag_id,conf", MANUAL, ids=[d for d, _ in MANUAL])
def test_every_dag_triggered_by_hand_succeeds(airflow, dag_id, conf):
    af = airflow
    if not os.path.exists(os.path.join(af.work, "demo")):
        write_demo(os.path.join(af.work, "demo"))
    _unpause(af, dag_id)
    if conf:
        conf = {k: v.format(work=af.work) for k, v in conf.items()}
    run_id = af.trigger(dag_id, conf)
    assert run_id.startswith("manual__")
    state = af.wait(dag_id, run_id, timeout=600)
    assert state == "success", af.explain(dag_id, run_id)
    reports = os.listdir(os.path.join(af.work, "reports"))
    tag = run_id.replace(":", "").replace("+", "_")
    assert any(tag in r for r in reports), (tag, reports)  # named from the run id
    if dag_id == "tank_export_adhoc":
        from deltalake import DeltaTable, QueryBuilder

        table = DeltaTable(f"{af.work}/adhoc-lake")
        topics = QueryBuilder().register("t", table).execute("select distinct topic from t").read_all()
        assert topics.column(0).to_pylist() == ["orders"]
        # the export's Asset event runs retention (it frees what the export delivered)
        deadline = time.monotonic() + 120
        while not (after := [r for r in af.runs("tank_retention_hourly") if r["run_type"] == "asset_triggered"]):
            assert time.monotonic() < deadline, "no retention run after the export"
            time.sleep(1)
        assert af.wait("tank_retention_hourly", after[0]["dag_run_id"]) == "success"


def _job_processes(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line holds `marker`: spark-submit's JVM, the job's driver, its workers."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and int(pid) != os.getpid():
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


def test_a_job_hung_past_its_timeout_is_killed_with_every_process_and_the_next_run_succeeds(airflow):
    """The compaction's driver and its workers hang mid-run (SIGSTOP, as on a stuck disk): Airflow's
    execution_timeout kills spark-submit, and the driver and its workers die with it within seconds. `tank-log
    repair` brings what they touched to before-or-after; the next run succeeds."""
    af = airflow
    many = os.path.join(af.work, "many")
    if not os.path.exists(os.path.join(af.work, "demo")):
        write_demo(os.path.join(af.work, "demo"))
    _unpause(af, "tank_compaction_nightly")
    hung = many_small_partitions(os.path.join(af.work, "hung"), 300)  # dirty: work on every partition
    with open(os.path.join(af.work, "job.yaml")) as fh:
        conf = json.load(fh)
    conf["data_dirs"].append(hung)
    with open(os.path.join(af.work, "job.yaml"), "w") as fh:
        json.dump(conf, fh)
    run_id = af.trigger("tank_compaction_nightly")
    marker = "jobs/compact.py"
    deadline = time.monotonic() + 120
    while not (drivers := [p for p, _ in _job_processes(marker) if _is_python(p)]):  # spark-submit's Python child
        assert time.monotonic() < deadline, af.explain("tank_compaction_nightly", run_id)
        time.sleep(0.01)
    (driver,) = drivers
    deadline = time.monotonic() + 30
    while not (workers := _children(driver)) and time.monotonic() < deadline:  # its pool, mid-run
        time.sleep(0.002)
    for pid in [driver, *workers]:
        os.kill(pid, signal.SIGSTOP)
    assert workers, "the driver started no workers"
    t0 = time.monotonic()
    state = af.wait("tank_compaction_nightly", run_id, timeout=JOB_TIMEOUT_S + 120)
    assert state == "failed", af.explain("tank_compaction_nightly", run_id)
    assert time.monotonic() - t0 >= JOB_TIMEOUT_S - 10  # it was the timeout that ended it
    deadline = time.monotonic() + 5
    while (left := _job_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left
    for base in (os.path.join(af.work, "demo"), many, hung):
        r = subprocess.run([os.path.join(BIN, "tank-log"), "repair", base], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not [p for p in verify_path(base) if p.severity == "error"]
    run_id = af.trigger("tank_compaction_nightly")
    state = af.wait("tank_compaction_nightly", run_id, timeout=600)
    assert state == "success", af.explain("tank_compaction_nightly", run_id)
