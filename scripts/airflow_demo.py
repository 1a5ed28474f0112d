"""The demo Airflow's REST API for scripts/airflow-demo.sh (run with the environment of its env.sh):

python scripts/airflow_demo.py ready   until the API server serves and the DAG processor has parsed every DAG
python scripts/airflow_demo.py wait    until no run of a tank-log DAG is queued or running; then one line per run
                                       that finished since the last `wait`, with what its reports say; exit 1 if
                                       one of those runs failed, 2 if a run waits on a paused DAG
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

DAG_IDS = (
    "tank_compaction_nightly",
    "tank_retention_hourly",
    "tank_index_verify_weekly",
    "tank_export_adhoc",
    "tank_export_nightly",
    "tank_maintenance_window",
)
SERVICES = ("api-server", "scheduler", "dag-processor")  # started by scripts/airflow-demo.sh start
PORT = int(os.environ.get("AIRFLOW__API__PORT", "8080"))
WORK = os.environ.get("TANK_LOG_AIRFLOW_DIR", ".airflow")
REPORTS = os.environ.get("AIRFLOW_VAR_TANK_LOG_REPORTS", os.path.join(WORK, "reports"))
MARK = os.path.join(WORK, "run", "last-wait")  # when the last `wait` returned: older runs were shown then
SETTLE_S = 5.0  # quiet this long before `wait` returns: the run an export's Asset event starts comes a moment later


class Api:
    def __init__(self) -> None:
        self.base = f"http://127.0.0.1:{PORT}"
        self.token: str | None = None

    def get(self, path: str) -> Any:
        if self.token is None:
            with urllib.request.urlopen(f"{self.base}/auth/token", timeout=30) as r:
                self.token = json.load(r)["access_token"]
        req = urllib.request.Request(f"{self.base}/api/v2/{path}", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)


def ready(timeout: float = 300) -> int:
    """Until the API answers and lists every DAG (the DAG processor parsed the DAG file)."""
    api, deadline, seen = Api(), time.monotonic() + timeout, set()
    while time.monotonic() < deadline:
        for service in SERVICES:  # one that exited will not come back: say so at once
            pidfile = os.path.join(WORK, "run", f"{service}.pid")
            try:
                os.kill(int(open(pidfile).read()), 0)
            except (OSError, ValueError):
                print(f"airflow-demo: {service} exited: see {WORK}/logs/{service}.log", file=sys.stderr)
                return 1
        try:
            seen = {d["dag_id"] for d in api.get("dags?limit=100")["dags"]}
            if seen >= set(DAG_IDS):
                return 0
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            pass  # not serving yet
        time.sleep(1)
    missing = sorted(set(DAG_IDS) - seen)
    print(
        f"airflow-demo: after {timeout:.0f} s the API on port {PORT} lists no DAG(s) {', '.join(missing)}: "
        f"see {WORK}/logs/api-server.log and dag-processor.log",
        file=sys.stderr,
    )
    return 1


def file_name(text: str) -> str:
    """As the DAGs name a run's report files (airflow/dags/tank_log_dags.py, `file_name`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace(":", ""))


def _report_line(path: str) -> str:
    try:
        with open(path) as fh:
            report = json.load(fh)
    except (OSError, ValueError) as err:
        return f"{os.path.basename(path)}: unreadable: {err}"
    if "steps" in report:  # the maintenance window's report: what each step did
        steps = report["steps"]
        done = [f"{k}: {(v or {}).get('detail', 'did not succeed')}" for k, v in steps.items() if k != "maintain"]
        job = steps.get("maintain") or {}
        done.insert(1, f"maintain: {job.get('status', 'did not succeed')} ({job.get('report')})")
        return f"{os.path.basename(path)}: broker {report.get('broker')}: " + "; ".join(done)
    summary = json.dumps(report.get("summary"), separators=(",", ":"))
    error = f", error: {report['error']}" if report.get("error") else ""
    return f"{os.path.basename(path)}: {report.get('job')} {report.get('status')}{error}: {summary}"


def wait(timeout: float = 1800) -> int:
    api, deadline = Api(), time.monotonic() + timeout
    since = open(MARK).read().strip() if os.path.exists(MARK) else ""
    quiet_since: float | None = None
    while True:
        runs = {dag: api.get(f"dags/{dag}/dagRuns?limit=100")["dag_runs"] for dag in DAG_IDS}
        active = [(dag, r) for dag, rs in runs.items() for r in rs if r["state"] in ("queued", "running")]
        paused = {dag for dag, _ in active if api.get(f"dags/{dag}")["is_paused"]}
        if paused:
            print(
                f"airflow-demo: runs of paused DAG(s) {', '.join(sorted(paused))} stay queued: "
                f"unpause them (airflow dags unpause DAG_ID)",
                file=sys.stderr,
            )
            return 2
        if active:
            quiet_since = None
            if time.monotonic() > deadline:
                print(
                    f"airflow-demo: still running after {timeout:.0f} s: "
                    + ", ".join(f"{dag} {r['dag_run_id']}" for dag, r in active),
                    file=sys.stderr,
                )
                return 1
            time.sleep(2)
            continue
        quiet_since = quiet_since or time.monotonic()
        if time.monotonic() - quiet_since >= SETTLE_S:
            break
        time.sleep(2)
    finished = sorted(
        ((r["end_date"] or "", dag, r) for dag, rs in runs.items() for r in rs if (r["end_date"] or "") > since),
        key=lambda x: x[0],
    )
    failed = 0
    for _, dag, run in finished:
        print(f"{dag} {run['dag_run_id']} ({run['run_type']}): {run['state']}")
        for path in sorted(glob.glob(os.path.join(REPORTS, f"*{file_name(run['dag_run_id'])}*.json"))):
            print("    " + _report_line(path))
        if run["state"] != "success":
            failed += 1
            logs = os.path.join(os.environ.get("AIRFLOW_HOME", ""), "logs", f"dag_id={dag}")
            print(f"    failed: task logs in {logs}")
    os.makedirs(os.path.dirname(MARK), exist_ok=True)
    with open(MARK, "w") as fh:
        fh.write(max([since, *(end for end, _, _ in finished)]) or datetime.now(UTC).isoformat())
    if not finished:
        print("no DAG run finished since the last wait")
    return 1 if failed else 0


if __name__ == "__main__":
    verbs = {"ready": ready, "wait": wait}
    if len(sys.argv) != 2 or sys.argv[1] not in verbs:
        print(f"usage: python scripts/airflow_demo.py {{{'|'.join(verbs)}}}", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(verbs[sys.argv[1]]())
    except (OSError, urllib.error.URLError) as err:  # HTTPError is a URLError
        print(
            f"airflow-demo: the Airflow API on 127.0.0.1:{PORT} did not answer ({err}): is it running?"
            " (bash scripts/airflow-demo.sh start)",
            file=sys.stderr,
        )
        sys.exit(1)
