"""Nightly maintenance per partition: repair, retention, compaction, indexes, final verify.

python -m tank_spark.entry_points.maintain --help
spark-submit $(tank-log job-path maintain) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.maintain import main

if __name__ == "__main__":
    exit_process(main())
