"""Export new messages to a Delta table, exactly once.

python -m tank_spark.entry_points.export_delta --help
spark-submit $(tank-log job-path export_delta) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.export.job import main

if __name__ == "__main__":
    exit_process(main())
