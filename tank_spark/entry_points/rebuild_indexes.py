"""Verify and rebuild indexes, repair, salvage.

python -m tank_spark.entry_points.rebuild_indexes --help
spark-submit $(tank-log job-path rebuild_indexes) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.rebuild_indexes import main

if __name__ == "__main__":
    exit_process(main())
