"""Import a Delta table (a tank-log export) into TANK partitions.

python -m tank_spark.entry_points.import_delta --help
spark-submit $(tank-log job-path import_delta) ...
"""

from tank_log.jobs.exits import exit_process
from tank_spark.import_delta import main

if __name__ == "__main__":
    exit_process(main())
