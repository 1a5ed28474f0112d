"""Delete expired RO segments of delete-policy topics.

python -m tank_spark.entry_points.retention --help
spark-submit $(tank-log job-path retention) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.retention import main

if __name__ == "__main__":
    exit_process(main())
