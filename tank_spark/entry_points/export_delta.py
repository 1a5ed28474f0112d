"""Export new messages to a Delta table, exactly once.

python -m tank_spark.entry_points.export_delta --help
spark-submit $(tank-log job-path export_delta) ...
"""

import sys

from tank_spark.export.job import main

if __name__ == "__main__":
    sys.exit(main())
