"""The jobs' entry points, installed with the package: each module runs one job.

    python -m tank_spark.entry_points.compact --data-dir PATH ...              # local Spark
    spark-submit $(tank-log job-path compact) --data-dir PATH ...      # any master

`jobs/*.py` in a source checkout are the same entry points for spark-submit without an install. Their names and
paths are `tank_log.jobs.entry_points` (the command line needs them without Spark).
"""

from tank_log.jobs.entry_points import NAMES, job_path

__all__ = ["NAMES", "job_path"]
