"""Run inside a subprocess with AIRFLOW_HOME set: inspect the DAGs or run one with dag.test()."""

import json
import os
import sys

from airflow.dag_processing.dagbag import DagBag

DAGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "airflow", "dags")


def inspect() -> dict:
    bag = DagBag(dag_folder=DAGS)
    out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
    for dag_id, dag in bag.dags.items():
        out["dags"][dag_id] = {
            "tasks": sorted(t.task_id for t in dag.tasks),
            "schedule": str(dag.schedule),
            "max_active_runs": dag.max_active_runs,
            "params": sorted(dag.params.keys()),
            "retries": sorted({t.retries for t in dag.tasks}),
            "timeouts": sorted(str(t.execution_timeout) for t in dag.tasks if t.execution_timeout),
            "doc": bool(dag.doc_md),
            "upstream_of_publish": sorted(dag.get_task("publish_report").upstream_task_ids)
            if dag.has_task("publish_report")
            else [],
            "queues": {t.task_id: t.queue for t in dag.tasks},
            "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
            "trigger_rules": {t.task_id: getattr(t.trigger_rule, "value", t.trigger_rule) for t in dag.tasks},
        }
    return out


def run(dag_id: str, conf: str | None = None) -> dict:
    """One dag.test() run: its state, each task instance's state (`task[map index]` when mapped), and the
    return values (XCom) of the tasks named `report`."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=DAGS)
    dag = bag.get_dag(dag_id)
    dr = dag.test(run_conf=json.loads(conf) if conf else None)
    tis = {
        (ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): str(ti.state)
        for ti in dr.get_task_instances()
    }
    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=dr.run_id, dag_ids=dag_id, key="return_value")).all()
        xcom = {
            f"{x.task_id}[{x.map_index}]": XComModel.deserialize_value(x) for x in rows if x.task_id.endswith("report")
        }
    return {"state": str(dr.state), "tasks": tis, "xcom": xcom}


if __name__ == "__main__":
    result = inspect() if sys.argv[1] == "inspect" else run(*sys.argv[2:])
    print("PROBE-RESULT " + json.dumps(result, default=str))
