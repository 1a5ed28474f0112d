"""Airflow's real services for the tests and the fleet soak (bench/fleet.py): an API server, a scheduler with the
LocalExecutor and a DAG processor, started from the project's virtualenv under a temporary AIRFLOW_HOME (SQLite),
and a client of their REST API. Every process started is stopped by its process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from conftest import ROOT, kill_session, load_script, session_processes, wait_for_port

BIN = os.path.dirname(sys.executable)
DAG_IDS = load_script(os.path.join("scripts", "airflow_demo.py")).DAG_IDS  # the DAGs' ids, in one place


def airflow_env(
    work: str, port: int, *, config: str, hosts: str, scheduled: tuple[str, ...] = (), **overrides: str
) -> dict[str, str]:
    """The services' environment: the project's DAGs, the job config `config` (Variable tank_log_config) and the
    window's `hosts`; every DAG but those `scheduled` by hand only (schedule "none"), no retries; `overrides` last."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": os.path.join(work, "home"),
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(ROOT, "airflow", "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",  # the LocalExecutor's worker processes (~130 MiB each; 32 by default)
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
            # a loaded machine (a soak of many hosts) parses slowly: a parse cut off by the default timeouts (30 s,
            # 50 s) is an import error and the DAG's tasks change under a running window
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "180",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW_VAR_TANK_LOG_HOME": ROOT,
            "AIRFLOW_VAR_TANK_LOG_CONFIG": config,
            "AIRFLOW_VAR_TANK_LOG_REPORTS": os.path.join(work, "reports"),
            "AIRFLOW_VAR_TANK_LOG_BROKER_STOPPED": "true",
            "PATH": BIN + os.pathsep + env.get("PATH", ""),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "TANK_LOG_WINDOW_CONFIG": hosts,
            "TANK_LOG_DAG_RETRIES": "0",
            "TANK_LOG_DAG_RETRY_DELAY_S": "2",
            **{f"{dag.upper()}_SCHEDULE": "none" for dag in DAG_IDS if dag not in scheduled},
            **overrides,
        }
    )
    return env


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


def start_services(work: str, port: int, env: dict[str, str]) -> Airflow:
    """`airflow db migrate`, then the API server, the scheduler and the DAG processor; returns once every DAG is
    parsed (the caller stops them: `Airflow.stop`, also when this raises)."""
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
    except BaseException:
        af.stop()
        raise
    return af
