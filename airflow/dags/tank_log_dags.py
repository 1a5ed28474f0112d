"""Airflow 3 DAGs that schedule the tank-log jobs through spark-submit.

- `tank_compaction_nightly`  — jobs/compact.py every night (02:30);
- `tank_retention_hourly`    — jobs/retention.py every hour;
- `tank_index_verify_weekly` — jobs/rebuild_indexes.py (verify + rebuild, salvage off) every Sunday;
- `tank_export_adhoc`        — jobs/export_delta.py on demand, with params topics, destination, since;
- `tank_export_nightly`      — jobs/export_delta.py every night (01:15; TANK_LOG_EXPORT_SCHEDULE), then the table's
                               upkeep: --upkeep-only --optimize --vacuum (Variable tank_log_vacuum_retention [168h]).

Each DAG runs the job with SparkSubmitOperator (the job's exit code decides the task state: 0 done, 1 some
partitions failed, 2 usage/config error, 3 done partially: partitions that needed work were skipped because the
broker holds them) and then `publish_report`, which runs even when the job failed: it logs
the JSON report, pushes its summary to XCom and fails unless the report says `ok`.

Airflow Variables (read when a task runs; defaults in brackets):
  tank_log_home      repository/installation holding jobs/ and conf/   [the parent of this dags folder's parent]
  tank_log_config    job configuration file                             [{home}/conf/local.yaml]
  tank_log_reports   directory for the JSON run reports                 [{home}/reports]
  tank_log_py_files  zip shipping tank_log + tank_spark to executors    [empty: installed on the executors]
  tank_log_broker_stopped  "true" when maintenance windows stop the broker (adds --broker-stopped) ["false"]
Connection: `spark_default` (conn type spark; host = the master, e.g. local[2], yarn, spark://host:7077).
Environment (read when the DAG file is parsed): TANK_LOG_DAG_RETRIES (default 2) and TANK_LOG_DAG_RETRY_DELAY_S
(default 600) set the tasks' retries; `airflow dags test` waits out the retry delay of a failed task, so the demo
(scripts/airflow-demo.sh) sets retries to 0. Per DAG, `<DAG ID>_SCHEDULE` (a cron expression, a preset such as
@hourly, or `none`: by hand only), `<DAG ID>_RETRIES` and `<DAG ID>_TIMEOUT_S` (its job task's execution_timeout)
override the defaults, e.g. TANK_COMPACTION_NIGHTLY_SCHEDULE="0 1 * * *" for a site whose window starts at 01:00.
A missing Spark connection fails the task at once, saying so.

Runs triggered by hand (UI, CLI, REST API) have no logical date in Airflow 3: everything a run names (reports) is
named from its run_id (`RUN_TAG`), never from `ts_nodash`, `ts` or `ds`. When Airflow kills a job task (its
execution_timeout, a manual stop), it kills spark-submit, and the job's driver and its processes die with it.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, task
from airflow.task.trigger_rule import TriggerRule

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HOME = os.path.dirname(os.path.dirname(HERE))
START = datetime(2026, 1, 1)
RETRIES = int(os.environ.get("TANK_LOG_DAG_RETRIES", "2"))  # environment, not a Variable: read at parse time
RETRY_DELAY = timedelta(seconds=int(os.environ.get("TANK_LOG_DAG_RETRY_DELAY_S", "600")))


# The export DAGs' job tasks update this Asset when they succeed; the retention DAG runs after each of them as well as
# on its own schedule, so what an export delivered is freed at once (retention.keep_unexported keeps the rest).
EXPORTED = Asset(name="tank_log_export", uri=os.environ.get("TANK_LOG_EXPORT_ASSET", "tank-log://export"))


def _schedule(dag_id: str, default: str) -> str | None:
    """The DAG's schedule: `<DAG ID>_SCHEDULE` from the environment (`none`: triggered by hand only), else `default`."""
    value = os.environ.get(f"{dag_id.upper()}_SCHEDULE", default).strip()
    return None if value.lower() in ("", "none") else value


def _retries(dag_id: str, default: int) -> dict:
    """The DAG's default_args for retries: `<DAG ID>_RETRIES` from the environment, else `default`."""
    return {"retries": int(os.environ.get(f"{dag_id.upper()}_RETRIES", default)), "retry_delay": RETRY_DELAY}


def _timeout(dag_id: str, default: timedelta) -> timedelta:
    """The execution_timeout of the DAG's job task: `<DAG ID>_TIMEOUT_S` from the environment, else `default`."""
    value = os.environ.get(f"{dag_id.upper()}_TIMEOUT_S")
    return timedelta(seconds=float(value)) if value else default


# Variables are read when a task runs (Jinja), never while the DAG file is parsed.
HOME = f"{{{{ var.value.get('tank_log_home', '{DEFAULT_HOME}') }}}}"
CONFIG = (
    f"{{{{ var.value.get('tank_log_config', var.value.get('tank_log_home', '{DEFAULT_HOME}') ~ '/conf/local.yaml') }}}}"
)
REPORTS = f"{{{{ var.value.get('tank_log_reports', var.value.get('tank_log_home', '{DEFAULT_HOME}') ~ '/reports') }}}}"
BROKER_STOPPED = "{{ '--broker-stopped' if var.value.get('tank_log_broker_stopped', 'false') == 'true' else '' }}"


def file_name(text: str) -> str:
    """`text` made safe as part of a file name: `manual__2026-11-24T22:26:52.306386+00:00` →
    `manual__2026-11-24T222652.306386_0000`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace(":", ""))


# What names a run's files. Every run has a run_id; a run triggered by hand (UI, CLI, REST API) has no logical date
# in Airflow 3, so `ts_nodash`, `ts`, `ds` and their kin are undefined there and must not be used.
RUN_TAG = "{{ run_id | file_name }}"
FILTERS = {"file_name": file_name}  # every DAG's user_defined_filters


def _report_path(job: str) -> str:
    return f"{REPORTS}/{job}-{RUN_TAG}.json"


def _common_args(job: str, *, mutating: bool) -> list[str]:
    """Job arguments; an empty rendered argument (e.g. no --broker-stopped) is ignored by the jobs."""
    return ["--config", CONFIG, "--report", _report_path(job), BROKER_STOPPED if mutating else ""]


class TankSparkSubmit(SparkSubmitOperator):
    """spark-submit that fails fast, saying what to do, when its Spark connection is missing (the provider would
    silently fall back to master `yarn`)."""

    def execute(self, context):
        from airflow.sdk import Connection
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            Connection.get(self._conn_id)
        except AirflowNotFoundException as err:
            raise RuntimeError(
                f"no Airflow connection {self._conn_id!r} (conn type spark, host = the master, e.g. local[2] or yarn):"
                f" create it, e.g. `airflow connections add {self._conn_id} --conn-type spark --conn-host 'local[2]'`"
                f" (bash scripts/airflow-demo.sh sets up a local Airflow with it) — {err}"
            ) from None
        return super().execute(context)


def _spark_submit(
    job: str, args: list[str], timeout: timedelta, task_id: str | None = None, **kwargs
) -> SparkSubmitOperator:
    return TankSparkSubmit(
        task_id=task_id or f"run_{job}",
        application=f"{HOME}/jobs/{job}.py",
        application_args=args,
        conn_id="spark_default",
        py_files="{{ var.value.get('tank_log_py_files', '') }}",
        name=f"tank-log-{job}",
        execution_timeout=timeout,
        env_vars={"PYTHONPATH": HOME},
        doc_md=f"spark-submit jobs/{job}.py; exit 0 = done, 1 = partitions failed (see the report), 2 = usage error, "
        "3 = partitions needing work skipped because the broker holds them.",
        **kwargs,
    )


@task(trigger_rule=TriggerRule.ALL_DONE)
def publish_report(report_path: str) -> dict:
    """Surface the job's JSON report (logs + XCom); fail unless the run was clean."""
    try:
        with open(report_path) as fh:
            report = json.load(fh)
    except FileNotFoundError:
        raise RuntimeError(f"the job wrote no report at {report_path} (it did not start?)") from None
    print(json.dumps({k: report.get(k) for k in ("job", "status", "error", "duration_s", "summary")}, indent=2))
    for p in report.get("partitions", []):
        if p.get("status") in ("failed", "needs-attention"):
            print(f"{p.get('topic')}/{p.get('partition')}: {p.get('status')}: {p.get('error') or p.get('unfixed')}")
    if report.get("status") != "ok":  # e.g. partial: the error names the partitions skipped and who holds them
        raise RuntimeError(f"{report.get('job')} finished with status {report.get('status')}: {report.get('error')}")
    return {"status": report["status"], "summary": report.get("summary")}


def _maintenance_dag(
    dag_id: str,
    job: str,
    schedule: str,
    timeout: timedelta,
    doc: str,
    extra_args: list[str] | None = None,
    after: Asset | None = None,
) -> DAG:
    cron = _schedule(dag_id, schedule)
    timetable = (
        AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=[after])
        if after is not None and cron is not None
        else cron
    )
    with DAG(
        dag_id=dag_id,
        schedule=timetable,
        start_date=START,
        catchup=False,
        max_active_runs=1,  # the job mutates partitions: never two runs at once
        default_args=_retries(dag_id, RETRIES),
        tags=["tank-log"],
        doc_md=doc,
        user_defined_filters=FILTERS,
    ) as dag:
        run = _spark_submit(job, [*_common_args(job, mutating=True), *(extra_args or [])], _timeout(dag_id, timeout))
        run >> publish_report(_report_path(job))
    return dag


compaction = _maintenance_dag(
    "tank_compaction_nightly",
    "compact",
    "30 2 * * *",
    timedelta(hours=4),
    "Nightly compaction of `log.cleanup.policy=cleanup` topics (jobs/compact.py). Mutations need the broker "
    "stopped (docs/FORMAT.md §9): set Variable tank_log_broker_stopped=true when the window stops it; otherwise "
    "live partitions are refused and reported.",
)

retention = _maintenance_dag(
    "tank_retention_hourly",
    "retention",
    "@hourly",
    timedelta(minutes=50),
    "Hourly retention (jobs/retention.py), and after every successful export (Asset tank_log_export): deletes "
    "expired RO segments by count, size and age; with retention.keep_unexported, only what the table received.",
    after=EXPORTED,
)

index_verify = _maintenance_dag(
    "tank_index_verify_weekly",
    "rebuild_indexes",
    "0 4 * * 0",
    timedelta(hours=6),
    "Weekly verification of every segment and index (jobs/rebuild_indexes.py, salvage off): rebuilds bad indexes, "
    "repairs interrupted compactions, fails the run when something needs a human.",
)


with DAG(
    dag_id="tank_export_adhoc",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=_retries("tank_export_adhoc", min(RETRIES, 1)),
    tags=["tank-log"],
    user_defined_filters=FILTERS,
    params={
        "topics": Param("", type="string", description="comma-separated topics (empty: all)"),
        "destination": Param(
            "", type="string", description="Delta table path or URI (empty: export.table of the config)"
        ),
        "since": Param("", type="string", description="only messages with ts >= this (ISO date/time or ms)"),
    },
    doc_md="Ad hoc, exactly-once export of new messages to a Delta table (jobs/export_delta.py). Re-running it "
    "exports only what is new since the last successful run.",
) as export:
    # an empty param renders an empty argument, which the jobs ignore
    _args = [
        *_common_args("export_delta", mutating=False),
        "{{ ('--topics=' ~ params.topics) if params.topics else '' }}",
        "{{ ('--table=' ~ params.destination) if params.destination else '' }}",
        "{{ ('--since=' ~ params.since) if params.since else '' }}",
    ]
    _run = _spark_submit("export_delta", _args, _timeout("tank_export_adhoc", timedelta(hours=6)), outlets=[EXPORTED])
    _run >> publish_report(_report_path("export_delta"))


with DAG(
    dag_id="tank_export_nightly",
    schedule=_schedule("tank_export_nightly", os.environ.get("TANK_LOG_EXPORT_SCHEDULE", "15 1 * * *")),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=_retries("tank_export_nightly", min(RETRIES, 1)),
    tags=["tank-log"],
    user_defined_filters=FILTERS,
    doc_md="Nightly exactly-once export to the Delta table of the config (export.table), then the table's upkeep "
    "(even when the export failed): remove files of runs that died before their commit, optimize small files into "
    "files of export.target_file_size, vacuum files no version within Variable tank_log_vacuum_retention (168h) "
    "needs. Each step's report is published.",
) as export_nightly:
    _export = _spark_submit(
        "export_delta",
        _common_args("export_delta", mutating=False),
        _timeout("tank_export_nightly", timedelta(hours=6)),
        outlets=[EXPORTED],
    )
    _export >> publish_report(_report_path("export_delta"))
    _upkeep_report = f"{REPORTS}/export_upkeep-{RUN_TAG}.json"
    _upkeep = _spark_submit(
        "export_delta",
        [
            "--config",
            CONFIG,
            "--report",
            _upkeep_report,
            "--upkeep-only",
            "--optimize",
            "--vacuum={{ var.value.get('tank_log_vacuum_retention', '168h') }}",
        ],
        timedelta(hours=2),
        task_id="run_upkeep",
        trigger_rule=TriggerRule.ALL_DONE,
    )
    _export >> _upkeep >> publish_report.override(task_id="publish_upkeep_report")(_upkeep_report)


# ---- tank_maintenance_window: stop → maintain → start, per broker host --------------------------------------------
#
# A mapped task instance runs on its operator's queue (Airflow sets a mapped instance's queue from `partial`, never
# per index), so the brokers are grouped by `queue` when the DAG file is parsed — one mapped task group per queue —
# and mapped over the brokers of that queue when the run starts (dynamic task mapping: brokers added to a queue
# need no DAG change). The window's config is therefore read from the environment at parse time, not a Variable.
WINDOW_CONFIG = os.environ.get("TANK_LOG_WINDOW_CONFIG", os.path.join(DEFAULT_HOME, "conf", "hosts.yaml"))
WINDOW_STEPS = ("stop", "maintain", "start", "ready", "verify")


def _window_broker(name: str, config=None):
    """The broker `name` of the window's config (loaded unless given)."""
    from tank_log.jobs.config import load_job_config

    (broker,) = [b for b in (config or load_job_config(WINDOW_CONFIG)).brokers if b.name == name]
    return broker


def _window_reports() -> str:
    """Where the window's job and window reports go (Variables tank_log_reports, tank_log_home)."""
    from airflow.sdk import Variable

    home = Variable.get("tank_log_home", default=DEFAULT_HOME)
    return Variable.get("tank_log_reports", default=os.path.join(home, "reports"))


def _window_layout() -> tuple[list[str | None], bool]:
    """The brokers' queues in config order (None = the default queue) and whether the window rolls. When the config
    does not load, the default queue's group alone: the run's check_config task then fails, saying why, and the DAG
    keeps the shape most configs give it (a parse that briefly fails must not remove a running window's tasks)."""
    try:  # the other DAGs of this file must not depend on tank_log being importable where the file is parsed
        from tank_log.jobs.config import load_job_config

        config = load_job_config(WINDOW_CONFIG)
    except (ImportError, ValueError):  # JobConfigError is a ValueError
        return [None], False
    return list(dict.fromkeys(b.queue for b in config.brokers)), config.window.rolling


def _same_index(step: str, key: str = "return_value"):
    """An XCom of `step` of this broker's window (the same map index of the same group)."""
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    group = ti.task_id.rpartition(".")[0]
    return ti.xcom_pull(task_ids=f"{group}.{step}", key=key, map_indexes=ti.map_index)


@task
def check_config() -> dict:
    """Load and validate the window's config; fail unless it lists brokers."""
    from tank_log.jobs.config import load_job_config

    config = load_job_config(WINDOW_CONFIG)
    if not config.brokers:
        raise RuntimeError(f"{WINDOW_CONFIG}: no `brokers:` to maintain (see conf/hosts.yaml)")
    return {"config": WINDOW_CONFIG, "brokers": [b.name for b in config.brokers], "rolling": config.window.rolling}


@task
def brokers_on(queue: str | None) -> list[str]:
    """The names of the brokers whose worker listens on `queue`."""
    from tank_log.jobs.config import load_job_config

    return [b.name for b in load_job_config(WINDOW_CONFIG).brokers if b.queue == queue]


@task
def stop(broker: str) -> dict:
    """Stop the broker and wait until nothing holds its data dirs (fail after stop_timeout: the job then does not
    run, and `start` leaves a broker that still runs alone)."""
    from airflow.sdk import get_current_context

    from tank_log.jobs import window

    get_current_context()["ti"].xcom_push(key="stop_issued", value=True)
    return window.stop(_window_broker(broker)).to_dict()


@task
def maintain(broker: str, run_id: str | None = None) -> dict:
    """spark-submit jobs/maintain.py --broker-stopped on this host's data dirs (master: maintenance_window.
    spark_master, local[*] by default); the report's summary is the return value."""
    import subprocess

    from airflow.sdk import Variable, get_current_context

    from tank_log.jobs.config import load_job_config
    from tank_log.jobs.processes import killed_with_parent
    from tank_log.jobs.window import window_source

    config = load_job_config(WINDOW_CONFIG)
    b = _window_broker(broker, config)
    home = Variable.get("tank_log_home", default=DEFAULT_HOME)
    report_path = os.path.join(_window_reports(), f"maintain-{broker}-{file_name(run_id or 'run')}.json")
    py_files = Variable.get("tank_log_py_files", default="")
    cmd = ["spark-submit", "--master", config.window.spark_master, *(["--py-files", py_files] if py_files else [])]
    cmd += [os.path.join(home, "jobs", "maintain.py"), "--config", b.job_config or WINDOW_CONFIG, "--broker-stopped"]
    cmd += [arg for d in b.data_dirs for arg in ("--data-dir", d)] + ["--report", report_path]
    cmd += ["--source", window_source(b)]  # the lakehouse guard reads this broker's recorded versions
    print("running:", " ".join(cmd), flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")])))
    # killed with this task whatever kills it (its timeout, a manual stop, SIGKILL); the job's driver dies with it
    code = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, check=False, preexec_fn=killed_with_parent).returncode
    try:
        with open(report_path) as fh:
            report = json.load(fh)
    except FileNotFoundError:
        report = {}
    summary = {"report": report_path, "exit_code": code, **{k: report.get(k) for k in ("status", "error", "summary")}}
    print(json.dumps(summary, indent=2))
    get_current_context()["ti"].xcom_push(key="job_report", value=summary)  # for the window's report, also on failure
    if code != 0:
        status, error = report.get("status"), report.get("error")
        raise RuntimeError(f"broker {broker}: maintain: exit code {code}, status {status}: {error} ({report_path})")
    return summary


@task(trigger_rule=TriggerRule.ALL_DONE)
def start(broker: str) -> dict:
    """Start the broker whenever its stop was issued, also when the job failed; never a second one next to a broker
    that did not stop."""
    from tank_log.jobs import window

    if not _same_index("stop", "stop_issued"):
        return {"broker": broker, "step": "start", "done": False, "detail": "its stop was never issued"}
    return window.start(_window_broker(broker)).to_dict()


@task(trigger_rule=TriggerRule.ALL_DONE)
def ready(broker: str) -> dict:
    """Wait until the broker's ready_check accepts connections (also after a failed start: it may serve anyway)."""
    from tank_log.jobs import window

    return window.wait_ready(_window_broker(broker)).to_dict()


@task(trigger_rule=TriggerRule.ALL_DONE)
def verify(broker: str) -> dict:
    """`tank-log verify` of the broker's data dirs, whatever happened before."""
    from tank_log.jobs import window

    return window.verify(_window_broker(broker)).to_dict()


@task(trigger_rule=TriggerRule.ALL_DONE)
def window_report(broker: str, run_id: str | None = None) -> dict:
    """The window's report of this broker (logs, XCom and `window-BROKER-RUN.json` beside the job reports); fails
    naming the steps that did not succeed."""
    steps = {step: _same_index(step) for step in WINDOW_STEPS}
    report = {"broker": broker, "steps": steps, "job_report": _same_index("maintain", "job_report")}
    print(json.dumps(report, indent=2, default=str))
    reports = _window_reports()
    os.makedirs(reports, exist_ok=True)
    with open(os.path.join(reports, f"window-{broker}-{file_name(run_id or 'run')}.json"), "w") as fh:
        json.dump(report, fh, indent=2, default=str)
    failed = [step for step, result in steps.items() if result is None]
    if failed:
        raise RuntimeError(f"broker {broker}: step(s) {', '.join(failed)} did not succeed (see their logs)")
    return report


def _window_group(queue: str | None):
    """The window of the brokers on one queue, mapped over them."""
    from airflow.sdk import task_group

    key = "".join(c if c.isalnum() or c in "-_" else "_" for c in queue) if queue else "default"
    on_queue = {"queue": queue} if queue else {}

    @task_group(group_id=f"window_{key}")
    def window_of(broker: str):
        steps = [
            stop.override(**on_queue, execution_timeout=timedelta(hours=1))(broker),
            maintain.override(**on_queue, execution_timeout=_timeout("tank_maintenance_window", timedelta(hours=6)))(
                broker
            ),
            start.override(**on_queue, execution_timeout=timedelta(hours=1))(broker),
            ready.override(**on_queue, execution_timeout=timedelta(hours=1))(broker),
            verify.override(**on_queue, execution_timeout=timedelta(hours=2))(broker),
            window_report.override(**on_queue, task_id="report")(broker),
        ]
        for before, after in zip(steps, steps[1:], strict=False):
            before >> after

    names = brokers_on.override(task_id=f"brokers_{key}")(queue)
    return names, window_of.expand(broker=names)


with DAG(
    dag_id="tank_maintenance_window",
    schedule=_schedule("tank_maintenance_window", "0 3 * * *"),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=_retries("tank_maintenance_window", RETRIES),
    tags=["tank-log"],
    user_defined_filters=FILTERS,
    doc_md="Nightly maintenance window of every broker host (config: $TANK_LOG_WINDOW_CONFIG, `brokers:`): stop "
    "the broker → wait until nothing holds its data → jobs/maintain.py --broker-stopped → start it (always, once "
    "its stop was issued) → wait until it serves → verify → report. With `maintenance_window.rolling: true` one "
    "queue (host) at a time, stopping at the first failed window. See README, Production deployment.",
) as maintenance_window:
    _checked = check_config()
    _previous = None
    _queues, _rolls = _window_layout()
    for _queue in _queues:
        _names, _group = _window_group(_queue)
        _checked >> _names
        if _previous is not None and _rolls:
            _previous >> _names
        _previous = _group
