"""The Airflow guide's local demo, run from the guide's own commands: the `bash` blocks of docs/guides/airflow.md,
section "Run every DAG locally", in order, in a real shell. They set up Airflow, start the API server, the
scheduler, the DAG processor and a local broker (the stand-in), unpause the DAGs and trigger each of the six, waiting
for each. Every run must succeed and its report must say what it did; the last block stops every process."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from airflow_harness import DAG_IDS, Airflow
from conftest import ROOT, free_port, kill_session, session_processes

pytest.importorskip("airflow")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

GUIDE = os.path.join(ROOT, "docs", "guides", "airflow.md")
SECTION = "## Run every DAG locally"


def guide_blocks() -> list[str]:
    """The `bash` code blocks of the guide's local demo section, in order."""
    text = open(GUIDE).read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else len(text)]
    return re.findall(r"^```bash\n(.*?)^```$", section, flags=re.S | re.M)


def run_blocks(blocks: list[str], env: dict[str, str], log: str, timeout: float) -> str:
    """The blocks as one bash script that stops at the first failing command; its output."""
    script = "set -euo pipefail\n" + "\n".join(blocks)
    with open(log, "a") as out:
        r = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    output = open(log).read()
    assert r.returncode == 0, output[-6000:]
    return output


def _serves(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def _report(reports: str, job: str, run_id: str) -> dict:
    tag = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id.replace(":", ""))
    with open(os.path.join(reports, f"{job}-{tag}.json")) as fh:
        return dict(json.load(fh))


def test_the_guides_local_demo_runs_every_dag_successfully(tmp_path):
    blocks = guide_blocks()
    assert len(blocks) >= 5 and blocks[-1].strip() == "bash scripts/airflow-demo.sh stop", blocks
    steps = "\n".join(blocks)
    for dag_id in DAG_IDS:  # the guide triggers every DAG
        assert f"airflow dags trigger {dag_id}" in steps, dag_id
    work = str(tmp_path / "af")
    # where the guide says `.airflow`, this test's directory; its own ports; the test suite's venv is installed
    blocks = [b.replace("source .airflow/env.sh", f"source {work}/env.sh") for b in blocks]
    assert f"source {work}/env.sh" in "\n".join(blocks)
    port, broker_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TANK_", "PYTEST"))}
    env.update(
        TANK_LOG_AIRFLOW_DIR=work,
        TANK_LOG_AIRFLOW_PORT=str(port),
        TANK_LOG_DEMO_BROKER_PORT=str(broker_port),
        TANK_LOG_AIRFLOW_SKIP_INSTALL="1",
        SPARK_SUBMIT_OPTS=os.environ.get("SPARK_SUBMIT_OPTS", ""),
    )
    log = str(tmp_path / "guide.log")
    run_dir = os.path.join(work, "run")
    try:
        out = run_blocks(blocks[:-1], env, log, timeout=1500)
        with open(os.path.join(work, "env.sh")) as fh:
            assert f"AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:{port}/execution/" in fh.read()
        af = Airflow(work, port, {"AIRFLOW_HOME": os.path.join(work, "home")})
        runs = {dag_id: af.runs(dag_id) for dag_id in DAG_IDS}
        for dag_id, dag_runs in runs.items():  # one run each, the one triggered by hand, and it succeeded
            assert [(r["run_type"], r["state"]) for r in dag_runs] == [("manual", "success")], (dag_id, dag_runs)
            assert f"{dag_id} {dag_runs[0]['dag_run_id']} (manual): success" in out  # `wait` said so
        run = {dag_id: dag_runs[0]["dag_run_id"] for dag_id, dag_runs in runs.items()}
        reports = os.path.join(work, "reports")

        adhoc = _report(reports, "export_delta", run["tank_export_adhoc"])
        assert adhoc["status"] == "ok" and adhoc["summary"]["by_status"] == {"exported": 3}  # orders' 3 partitions
        nightly = _report(reports, "export_delta", run["tank_export_nightly"])
        assert nightly["status"] == "ok"
        assert nightly["summary"]["by_status"] == {"exported": 3, "up-to-date": 3}  # only what was new
        upkeep = _report(reports, "export_upkeep", run["tank_export_nightly"])
        assert upkeep["status"] == "ok"
        optimize, vacuum = upkeep["summary"]["upkeep"]
        assert (optimize["operation"], vacuum["operation"]) == ("optimize", "vacuum")
        assert optimize["files_before"] > optimize["files_after"]  # the two exports' small files, compacted
        assert vacuum["files_after"] == vacuum["files_before"]  # 168 h: nothing removed is that old
        from deltalake import DeltaTable, QueryBuilder

        lake = DeltaTable(os.path.join(work, "lake"))
        counts = QueryBuilder().register("t", lake).execute("select topic, count(*) from t group by topic").read_all()
        assert sorted(counts.column(0).to_pylist()) == ["clicks", "orders", "profiles"]
        exported = adhoc["summary"]["rows"] + nightly["summary"]["rows"]
        assert sum(counts.column(1).to_pylist()) == exported > 0

        retention = _report(reports, "retention", run["tank_retention_hourly"])
        assert retention["status"] == "ok"  # after the exports: it deletes what the lake received, and only that
        assert retention["summary"]["segments_deleted"] > 0 and retention["summary"]["data_loss_partitions"] == 0
        assert retention["summary"]["kept_unexported_segments"] == 0
        assert 0 < retention["summary"]["messages_deleted"] < exported

        compact = _report(reports, "compact", run["tank_compaction_nightly"])
        assert compact["status"] == "ok" and compact["summary"]["by_status"]["compacted"] == 2  # profiles' partitions
        assert 0 < compact["summary"]["bytes_after"] < compact["summary"]["bytes_before"]
        verify = _report(reports, "rebuild_indexes", run["tank_index_verify_weekly"])
        assert verify["status"] == "ok" and verify["summary"]["by_status"] == {"clean": verify["summary"]["partitions"]}

        window = _report(reports, "window-demo-broker", run["tank_maintenance_window"])
        assert {step: s["done"] for step, s in window["steps"].items() if step != "maintain"} == dict.fromkeys(
            ("stop", "start", "ready", "verify"), True
        ), window
        assert window["steps"]["maintain"]["status"] == "ok"
        maintain = _report(reports, "maintain-demo-broker", run["tank_maintenance_window"])
        assert maintain["status"] == "ok" and maintain["summary"]["by_status"] == {"maintained": 6}
        assert _serves(broker_port)  # the window started the broker again
    finally:
        sessions = []
        for f in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
            if f.endswith(".pid"):
                sessions.append(int(open(os.path.join(run_dir, f)).read()))
        try:
            before = len(open(log).read()) if os.path.exists(log) else 0
            stopped = run_blocks(blocks[-1:], env, log, timeout=120)[before:]  # the guide's stop
            assert "SIGKILL" not in stopped, stopped  # every service and the broker ended on its signal
            left = {sid: session_processes(sid) for sid in sessions}
            assert left == dict.fromkeys(sessions, []), left
            assert not _serves(port) and not _serves(broker_port)
        finally:
            for sid in sessions:
                kill_session(sid)


ADOPTER = """
import ctypes, json, os, socket, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: adopt the orphans; never reap them
demo, port = sys.argv[1], int(sys.argv[2])
subprocess.run(["bash", demo, "broker-start"], check=True, stdout=subprocess.DEVNULL)
deadline = time.monotonic() + 60
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        assert time.monotonic() < deadline, "the broker does not serve"
        time.sleep(0.1)
pid = int(open(os.path.join(os.environ["TANK_LOG_AIRFLOW_DIR"], "run", "broker.pid")).read())
start = time.monotonic()
r = subprocess.run(["bash", demo, "stop"], capture_output=True, text=True, check=True)
print(json.dumps([pid, time.monotonic() - start, r.stdout, r.stderr]))
"""


def test_with_tank_bin_the_demo_broker_runs_that_binary_and_stops_it_with_sigint(tmp_path):
    """`TANK_BIN=... setup` makes broker-start run `$TANK_BIN -p broker-data -l 127.0.0.1:PORT` in a session of its
    own, and broker-stop send it SIGINT (TANK's clean shutdown). TANK is not built on this machine: TANK_BIN here is a
    script that refuses any other command line and then becomes (exec, the same pid) the stand-in broker."""
    tank = tmp_path / "tank"
    tank.write_text(
        "#!/bin/sh\n"
        '[ "$#" = 4 ] && [ "$1" = -p ] && [ -d "$2" ] && [ "$3" = -l ] || { echo "usage: tank -p BASE -l ADDR";'
        " exit 64; }\n"
        'case "$4" in 127.0.0.1:*) ;; *) echo "not loopback: $4"; exit 64 ;; esac\n'
        'exec python -m tank_log.tools.standin_broker -p "$2" --port "${4#127.0.0.1:}"\n'
    )
    tank.chmod(0o755)
    work, broker_port = str(tmp_path / "af"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TANK_", "PYTEST"))}
    env.update(
        TANK_LOG_AIRFLOW_DIR=work,
        TANK_LOG_AIRFLOW_PORT=str(free_port()),
        TANK_LOG_DEMO_BROKER_PORT=str(broker_port),
        TANK_LOG_AIRFLOW_SKIP_INSTALL="1",
        TANK_BIN=str(tank),
    )

    def demo(*args: str) -> str:
        r = subprocess.run(
            ["bash", os.path.join(ROOT, "scripts", "airflow-demo.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout

    demo("setup")
    del env["TANK_BIN"]  # from now on, env.sh says which broker
    pid = None
    try:
        assert f"{tank} on 127.0.0.1:{broker_port}" in demo("broker-start")
        deadline = time.monotonic() + 30
        while not _serves(broker_port):
            assert time.monotonic() < deadline, open(os.path.join(work, "logs", "broker.log")).read()
            time.sleep(0.1)
        pid = int(open(os.path.join(work, "run", "broker.pid")).read())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().split(b"\0")
        assert b"tank_log.tools.standin_broker" in cmdline and os.path.join(work, "broker-data").encode() in cmdline
        assert os.getsid(pid) == pid  # its own session: not a child of whatever started it
        assert "SIGINT" in demo("broker-stop")
        deadline = time.monotonic() + 20
        while session_processes(pid):
            assert time.monotonic() < deadline, session_processes(pid)
            time.sleep(0.1)
        assert not _serves(broker_port)

        # `stop` under a parent that adopts the orphaned broker and never reaps it (a container's PID 1 may not): the
        # broker exits on SIGINT and stays a zombie, which `stop` must count as gone, not wait out its grace period
        r = subprocess.run(
            [sys.executable, "-c", ADOPTER, os.path.join(ROOT, "scripts", "airflow-demo.sh"), str(broker_port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        pid, took, out, err = json.loads(r.stdout)
        assert "stopped the demo broker" in out and not err, (out, err)
        assert took < 10, f"stop took {took:.1f} s"  # the old stop waited out its 15 s on the zombie
        assert not session_processes(pid) and not _serves(broker_port)
        assert not os.path.exists(os.path.join(work, "run", "broker.pid"))
    finally:
        if pid is not None:
            kill_session(pid)
