"""The jobs' entry points, installed with the package: each module runs one job.

    python -m tank_spark.entry_points.compact --data-dir PATH ...              # local Spark
    spark-submit $(tank-log job-path compact) --data-dir PATH ...      # any master

`jobs/*.py` in a source checkout are the same entry points for spark-submit without an install.
"""

import os

NAMES = ("maintain", "compact", "retention", "rebuild_indexes", "export_delta", "import_delta")  # the modules here


def job_path(name: str) -> str:
    """The file spark-submit runs for job `name` (one of NAMES)."""
    if name not in NAMES:
        raise ValueError(f"unknown job {name!r} (jobs: {', '.join(NAMES)})")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
