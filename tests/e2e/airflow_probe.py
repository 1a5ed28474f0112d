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
            "upstream_of_publish": sorted(dag.get_task("publish_report").upstream_task_ids),
        }
    return out


def run(dag_id: str) -> dict:
    bag = DagBag(dag_folder=DAGS)
    dag = bag.get_dag(dag_id)
    dr = dag.test()
    tis = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    xcom = None
    return {"state": str(dr.state), "tasks": tis, "xcom": xcom}


if __name__ == "__main__":
    result = inspect() if sys.argv[1] == "inspect" else run(sys.argv[2])
    print("PROBE-RESULT " + json.dumps(result, default=str))
