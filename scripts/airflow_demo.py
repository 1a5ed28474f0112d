"""The demo Airflow's REST API for scripts/airflow-demo.sh (run with the environment of its env.sh):

python scripts/airflow_demo.py ready   until the API server serves and the DAG processor has parsed every DAG
python scripts/airflow_demo.py wait    until no run of a tank-log DAG is queued or running and no Asset event
                                       waits to start one; then one line per run that finished since the last
                                       `wait`, with what its reports say; exit 1 if one of those runs failed, 2 if a
                                       run waits on a paused DAG
python scripts/airflow_demo.py stop    SIGTERM to each service's process group, then SIGINT to the broker; returns
                                       once no process of their sessions is left (SIGKILL after GRACE_S, said on
                                       stderr)
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
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
POLL_S = 0.2  # the API answers a poll in milliseconds
GRACE_S = 30.0  # what `stop` gives a session to exit after its signal, before SIGKILL


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
            if _pid(service) is None:
                print(f"airflow-demo: {service} exited: see {WORK}/logs/{service}.log", file=sys.stderr)
                return 1
        try:
            seen = {d["dag_id"] for d in api.get("dags?limit=100")["dags"]}
            if seen >= set(DAG_IDS):
                return 0
        except (OSError, urllib.error.URLError, KeyError, ValueError):
            pass  # not serving yet
        time.sleep(POLL_S)
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
    """Until no run of DAG_IDS is queued or running and none is about to be: an export's Asset event queues a run
    of each unpaused DAG scheduled on it (Airflow's AssetDagRunQueue) when the export's task succeeds, before the
    export's run ends; the scheduler creates that run and deletes the queued event in one transaction. So when one
    look saw no active run, and a later look saw no queued event and then no active run, none is to come."""
    api, deadline = Api(), time.monotonic() + timeout
    since = open(MARK).read().strip() if os.path.exists(MARK) else ""
    on_assets = [dag for dag in DAG_IDS if api.get(f"dags/{dag}/details").get("asset_expression")]
    was_quiet = not on_assets  # without a DAG on assets, one look without an active run is enough
    while True:
        queued = [dag for dag in on_assets if api.get(f"dags/{dag}/assets/queuedEvents")["total_entries"]]
        runs = api.get("dags/~/dagRuns?state=queued&state=running&limit=100")["dag_runs"]
        active = [r for r in runs if r["dag_id"] in DAG_IDS]
        if not active and not queued and was_quiet:
            break
        was_quiet = not active
        paused = {dag for dag in {r["dag_id"] for r in active} | set(queued) if api.get(f"dags/{dag}")["is_paused"]}
        if paused:
            print(
                f"airflow-demo: runs of paused DAG(s) {', '.join(sorted(paused))} stay queued: "
                f"unpause them (airflow dags unpause DAG_ID)",
                file=sys.stderr,
            )
            return 2
        if time.monotonic() > deadline:
            waiting = [f"{r['dag_id']} {r['dag_run_id']}" for r in active]
            waiting += [f"{dag} (a queued Asset event)" for dag in queued]
            print(f"airflow-demo: still running after {timeout:.0f} s: " + ", ".join(waiting), file=sys.stderr)
            return 1
        time.sleep(POLL_S)
    runs_of = {dag: api.get(f"dags/{dag}/dagRuns?limit=100")["dag_runs"] for dag in DAG_IDS}
    finished = sorted(
        ((r["end_date"] or "", dag, r) for dag, rs in runs_of.items() for r in rs if (r["end_date"] or "") > since),
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


def _live(sessions: set[int]) -> dict[int, list[str]]:
    """The live processes of each session, as `pid command line`. A zombie has exited: it holds nothing, and only
    its parent's wait() removes it, which an orphan's adopter (a container's PID 1) may never do."""
    found: dict[int, list[str]] = {sid: [] for sid in sessions}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            if fields[0] in ("Z", "X") or int(fields[3]) not in found:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            found[int(fields[3])].append(f"{name} {command[:100]}")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


def _pid(name: str) -> int | None:
    """The session named by run/NAME.pid (its leader's pid: every process of the demo starts with `setsid`) while a
    process of it lives. A pid file outliving its session may name a pid given since to another process: the leader
    must have started before its pid file was written. (While a session has members, Linux gives its id to no new
    process: a leader gone and its children not is still the demo's session.)"""
    path = os.path.join(WORK, "run", f"{name}.pid")
    try:
        with open(path) as fh:
            sid = int(fh.read())
        written = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    if not _live({sid})[sid]:
        return None
    try:
        with open(f"/proc/{sid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # starttime: clock ticks after boot
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return sid  # the leader is gone (or a zombie): its session's members are left
    started = boot + ticks / os.sysconf("SC_CLK_TCK")
    return sid if started <= written + 2 else None  # btime is whole seconds


def _stop(sessions: dict[str, int], sig: signal.Signals) -> list[str]:
    """`sig` to each session's process group; then, once no process of theirs lives or after GRACE_S, SIGKILL to
    every process left in them; what had to be killed."""
    for pid in sessions.values():
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_S
    left = _live(set(sessions.values()))
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _live(set(sessions.values()))
    killed = []
    for name, pid in sessions.items():
        for line in left[pid]:
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
                killed.append(f"{name}: {line}")
            except ProcessLookupError:
                pass
    return killed


def stop() -> int:
    """The services (SIGTERM: each ends its own children, e.g. the scheduler its LocalExecutor workers, which ignore
    SIGTERM and leave when the scheduler's executor ends), then the broker (SIGINT, its clean shutdown)."""
    services = {name: pid for name in SERVICES if (pid := _pid(name)) is not None}
    killed = _stop(services, signal.SIGTERM)
    for name in SERVICES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(WORK, "run", f"{name}.pid"))
    if services:
        print(f"stopped {' '.join(services)}")
    broker = _pid("broker")
    if broker is not None:
        killed += _stop({"broker": broker}, signal.SIGINT)
        print("stopped the demo broker")
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(WORK, "run", "broker.pid"))
    for line in killed:
        print(f"airflow-demo: SIGKILL after {GRACE_S:.0f} s: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    verbs = {"ready": ready, "wait": wait, "stop": stop}
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
