"""Compact keyed (cleanup-policy) partitions.

python -m tank_spark.entry_points.compact --help
spark-submit $(tank-log job-path compact) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.compact import main

if __name__ == "__main__":
    exit_process(main())
